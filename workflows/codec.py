"""Typed values to JSON and back: the inputs and results of activities, and durable state.

Activities take one input object and return one result; both are stored as JSON. Dataclasses
are the typed form (nested dataclasses, lists and dicts of them included); TypedDicts, dicts
and other JSON values pass through as they are.
"""
from __future__ import annotations

import dataclasses
import functools
import types
import typing
from collections.abc import Mapping
from typing import Any

from workflows.errors import InvalidInput


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
    while older recorded values still load. Raises InvalidInput when the JSON does not fit."""
    inner = _optional_of(tp)
    if inner is not None:
        return None if data is None else from_json(inner, data, what=what)
    if isinstance(tp, type) and dataclasses.is_dataclass(tp):
        if not isinstance(data, Mapping):
            raise InvalidInput(f"{what} must be a JSON object for {tp.__name__}; got {type(data).__name__}.")
        hints = typing.get_type_hints(tp)
        values = {}
        for f in dataclasses.fields(tp):
            if f.name in data:
                values[f.name] = _field_from_json(hints.get(f.name, Any), data[f.name], what=f"{what}.{f.name}")
        try:
            return tp(**values)
        except TypeError as exc:
            raise InvalidInput(f"{what} does not fit {tp.__name__}: {exc}.") from None
    if typing.is_typeddict(tp) and isinstance(data, Mapping):
        # A TypedDict stays a dict; its keys declared as dataclasses (or lists, dicts of them) are rebuilt.
        hints = _typeddict_hints(tp)
        return {key: _field_from_json(hints[key], item, what=f"{what}[{key!r}]") if key in hints else item
                for key, item in data.items()}
    return data


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


def _field_from_json(tp: Any, data: Any, *, what: str) -> Any:
    origin, args = typing.get_origin(tp), typing.get_args(tp)
    if origin in (list, tuple) and args and isinstance(data, list):
        items = [from_json(args[0], item, what=f"{what}[{i}]") for i, item in enumerate(data)]
        return tuple(items) if origin is tuple else items
    if origin in (dict, Mapping) and len(args) == 2 and isinstance(data, Mapping):
        return {key: from_json(args[1], item, what=f"{what}[{key!r}]") for key, item in data.items()}
    return from_json(tp, data, what=what)


def _optional_of(tp: Any) -> Any:
    """``X`` for ``X | None`` (or ``Optional[X]``), else None."""
    if typing.get_origin(tp) in (typing.Union, types.UnionType):
        args = [a for a in typing.get_args(tp) if a is not type(None)]
        if len(args) == 1 and len(typing.get_args(tp)) == 2:
            return args[0]
    return None
