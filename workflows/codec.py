"""Typed values to JSON and back: the inputs and results of activities, and durable state.

Activities take one input object and return one result; both are stored as JSON. Dataclasses
are the typed form (nested dataclasses, lists and dicts of them included), each field checked
against its annotation by pydantic (lax, as for JSON: ``"7"`` is the int 7, ``5`` is no str),
both ways: a value built with a wrongly typed field is refused before it is stored, and a stored
value that no longer fits is refused when it is read. TypedDicts stay dicts, with their keys
declared as dataclasses rebuilt (so typed state round-trips); dicts and other JSON values pass
through as they are.
"""
from __future__ import annotations

import dataclasses
import functools
import types
import typing
from collections.abc import Mapping
from typing import Any

import pydantic

from workflows.errors import InvalidInput

# How much of a refused value an error message quotes.
QUOTED_CHARS = 80


def to_json(value: Any) -> Any:
    """``value`` with every dataclass turned into a dict and every tuple into a list."""
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return {f.name: to_json(getattr(value, f.name)) for f in dataclasses.fields(value)}
    if isinstance(value, Mapping):
        return {key: to_json(item) for key, item in value.items()}
    if isinstance(value, list | tuple):
        return [to_json(item) for item in value]
    return value


def supported(tp: Any) -> bool:
    """True for the types an activity may take or return: a dataclass, a TypedDict, dict, Any or None."""
    origin = typing.get_origin(tp) or tp
    return (
        tp is Any or tp is None or tp is type(None) or typing.is_typeddict(tp)
        or (isinstance(tp, type) and dataclasses.is_dataclass(tp))
        or origin in (dict, Mapping) or _optional_of(tp) is not None
    )


def from_json(tp: Any, data: Any, *, what: str) -> Any:
    """Rebuild a value of type ``tp`` from its JSON. Fields a dataclass does not declare are
    ignored and missing fields take their defaults, so a type may gain fields with defaults
    while older recorded values still load. Each field is checked against its annotation
    (``leaf_validator``). Raises InvalidInput when the JSON does not fit, naming each field that
    does not, what it should be and what it holds."""
    problems: list[str] = []
    value = _decode(tp, data, path="", problems=problems)
    if problems:
        raise InvalidInput(f"{what} does not fit {getattr(tp, '__name__', tp)}: {'; '.join(problems)}.")
    return value


def check(value: Any, *, what: str) -> None:
    """Refuse a dataclass value (nested ones included) whose fields do not fit their annotations:
    ``X(name=5, n="seven")`` is built without complaint, so its JSON is checked before it is
    stored. Raises InvalidInput naming each field that does not fit."""
    tp = type(value)
    if dataclasses.is_dataclass(tp):
        from_json(tp, to_json(value), what=what)


def _decode(tp: Any, data: Any, *, path: str, problems: list[str]) -> Any:
    inner = _optional_of(tp)
    if inner is not None:
        return None if data is None else _decode(inner, data, path=path, problems=problems)
    if isinstance(tp, type) and dataclasses.is_dataclass(tp):
        if not isinstance(data, Mapping):
            problems.append(f"{path or 'the value'}: a JSON object for {tp.__name__} is expected "
                            f"(got {type(data).__name__})")
            return None
        hints = typing.get_type_hints(tp)
        values = {f.name: _decode(hints.get(f.name, Any), data[f.name], path=f"{path}{f.name}.", problems=problems)
                  for f in dataclasses.fields(tp) if f.name in data}
        missing = [f"{path}{f.name}" for f in dataclasses.fields(tp) if f.name not in data and f.init
                   and f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING]
        problems.extend(f"{name}: missing" for name in missing)
        return None if problems else tp(**values)
    if typing.is_typeddict(tp) and isinstance(data, Mapping):
        # A TypedDict stays a dict; its keys declared as dataclasses (or lists, dicts of them) are rebuilt.
        hints = _typeddict_hints(tp)
        return {key: _decode(hints[key], item, path=f"{path}{key}.", problems=problems) if key in hints else item
                for key, item in data.items()}
    origin, args = typing.get_origin(tp), typing.get_args(tp)
    if origin in (list, tuple) and args and isinstance(data, list):
        items = [_decode(args[0], item, path=f"{path}{i}.", problems=problems) for i, item in enumerate(data)]
        return tuple(items) if origin is tuple else items
    if origin in (dict, Mapping) and len(args) == 2 and isinstance(data, Mapping):
        return {key: _decode(args[1], item, path=f"{path}{key}.", problems=problems) for key, item in data.items()}
    validator = leaf_validator(tp)
    if validator is None:
        return data
    try:
        return validator.validate_python(data)
    except pydantic.ValidationError as exc:
        problems.append(f"{path.rstrip('.') or 'the value'}: {mismatches(exc)}")
        return None


@functools.cache
def _typeddict_hints(tp: Any) -> dict[str, Any]:
    """The keys of a TypedDict whose values need rebuilding (a dataclass somewhere in the type)."""
    try:
        hints = typing.get_type_hints(tp)
    except (NameError, TypeError):  # a hint only a type checker can resolve: the values stay as stored
        return {}
    return {key: hint for key, hint in hints.items() if _holds_dataclass(hint)}


def _holds_dataclass(tp: Any) -> bool:
    if isinstance(tp, type) and dataclasses.is_dataclass(tp):
        return True
    if typing.is_typeddict(tp):
        return bool(_typeddict_hints(tp))
    return any(_holds_dataclass(arg) for arg in typing.get_args(tp))


@functools.cache
def leaf_validator(tp: Any) -> pydantic.TypeAdapter[Any] | None:
    """pydantic's validator of a field type that is no dataclass, list or dict of one (str, int,
    a Literal, an enum, ``list[str]``...), built once per type; None where JSON passes as it is:
    ``Any``, a TypedDict (pydantic reads ``typing.TypedDict`` only from Python 3.12), or a type
    pydantic has no schema for."""
    if tp is Any or typing.is_typeddict(tp) or tp in (dict, list, object):
        return None
    try:
        return pydantic.TypeAdapter(tp)
    except (pydantic.PydanticSchemaGenerationError, pydantic.PydanticUserError, NameError, TypeError):
        return None


def mismatches(error: pydantic.ValidationError) -> str:
    """What each mismatch should be, and what it holds."""
    return "; ".join(
        f"{''.join(f'[{part}]' for part in e['loc'])}{' ' if e['loc'] else ''}{e['msg'].lower()} "
        f"(got {repr(e.get('input'))[:QUOTED_CHARS]})"
        for e in error.errors(include_url=False)
    )


def _optional_of(tp: Any) -> Any:
    """``X`` for ``X | None`` (or ``Optional[X]``), else None."""
    if typing.get_origin(tp) in (typing.Union, types.UnionType):
        args = [a for a in typing.get_args(tp) if a is not type(None)]
        if len(args) == 1 and len(typing.get_args(tp)) == 2:
            return args[0]
    return None
