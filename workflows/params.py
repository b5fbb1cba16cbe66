"""A kind's launch parameters, declared once as a pydantic model: the same declaration validates a
launch (types, ranges, defaults; a value from ``--param KEY=VALUE`` is text, read as JSON would
be), prints the parameters in ``agent launch --help`` and is the JSON schema an interface can
show (``registry.launch_params_schema``).

A leaf module: the engine imports it, and it imports nothing of the kernel but its errors.
"""
from __future__ import annotations

import json
import typing
from decimal import Decimal
from typing import Any

import pydantic
from pydantic.fields import FieldInfo

from workflows.errors import InvalidInput

# The longest group name an approval's role may be: a Django group's (auth.Group.name), which a
# wait's required_role holds. A kind whose launch takes a role refuses a longer one there.
ROLE_MAX_LENGTH = 150
RANGE_ERRORS = ("greater_than", "greater_than_equal", "less_than", "less_than_equal")
NUMBER_ERRORS = ("int_parsing", "float_parsing", "int_type", "float_type")


class LaunchParams(pydantic.BaseModel):
    """Base of a kind's launch parameters: one typed field each, with ``Field(default,
    description=..., ge=..., le=...)``. Unknown names are refused; text is stripped."""

    model_config = pydantic.ConfigDict(extra="forbid", str_strip_whitespace=True, frozen=True)


def params_validated(kind: str, model: type[LaunchParams], params: dict[str, Any]) -> dict[str, Any]:
    """``params`` as ``model`` reads them, defaults filled in, as JSON; InvalidInput naming each
    parameter that does not fit, and how to give it."""
    try:
        return model.model_validate(params).model_dump(mode="json")
    except pydantic.ValidationError as exc:
        raise InvalidInput(params_refusal(kind, model, exc)) from None


def params_refusal(kind: str, model: type[LaunchParams], error: pydantic.ValidationError) -> str:
    errors = error.errors(include_url=False)
    unknown = sorted(str(e["loc"][0]) for e in errors if e["type"] == "extra_forbidden")
    if unknown:
        return (f"Unknown parameter(s) {', '.join(unknown)} for kind {kind!r}; allowed: "
                f"{', '.join(model.model_fields)}.")
    return " ".join(_refusal(model, e) for e in errors)


def _refusal(model: type[LaunchParams], error: Any) -> str:
    name = str(error["loc"][0]) if error["loc"] else "?"
    field = model.model_fields.get(name)
    given = error.get("input")
    if error["type"] == "missing":
        about = f" ({field.description})" if field is not None and field.description else ""
        return f"Parameter {name} is required{about}: --param {name}=VALUE."
    if field is not None and error["type"] in RANGE_ERRORS:
        about = f": {field.description}" if field.description else ""
        return f"Parameter {name}={given} must be {range_text(field)}{about}."
    if field is not None and error["type"] in NUMBER_ERRORS:
        example = default_text(field) if not field.is_required() else "1"
        return f"Parameter {name} must be a number: --param {name}={example}."
    if error["type"] == "int_from_float":
        return f"Parameter {name}={given} must be a whole number."
    return f"Parameter {name}={given!r}: {error['msg'].lower()}."


def _bounds(field: FieldInfo) -> tuple[tuple[float | None, bool], tuple[float | None, bool]]:
    """(low, inclusive), (high, inclusive) of ``field``: annotated_types' Ge, Gt, Le, Lt, as
    ``Field(ge=..., ...)`` records them."""
    low: tuple[float | None, bool] = (None, True)
    high: tuple[float | None, bool] = (None, True)
    for rule in field.metadata:
        for attr, inclusive in (("ge", True), ("gt", False)):
            if hasattr(rule, attr):
                low = (float(getattr(rule, attr)), inclusive)
        for attr, inclusive in (("le", True), ("lt", False)):
            if hasattr(rule, attr):
                high = (float(getattr(rule, attr)), inclusive)
    return low, high


def range_text(field: FieldInfo, *, short: bool = False) -> str:
    """The range as a person says it: "between 1 and 10", "more than 0 and at most 60", "at least 0";
    ``short``: "1 to 10", "more than 0, at most 60" (the help's)."""
    (low, low_in), (high, high_in) = _bounds(field)
    if low is not None and high is not None and low_in and high_in:
        return f"{_number(low)} to {_number(high)}" if short else f"between {_number(low)} and {_number(high)}"
    parts = []
    if low is not None:
        parts.append(f"{'at least' if low_in else 'more than'} {_number(low)}")
    if high is not None:
        parts.append(f"{'at most' if high_in else 'less than'} {_number(high)}")
    return (", " if short else " and ").join(parts)


def default_text(field: FieldInfo) -> str:
    """The default as one would type it after ``--param NAME=``: 0.5, true, [], '' for empty text."""
    value = field.get_default(call_default_factory=True)
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, float):
        return _number(value)
    if isinstance(value, Decimal):
        return str(value)
    if isinstance(value, str):
        return value if value else "''"
    if value is None:
        return "none"
    return json.dumps(value)


def _number(value: float) -> str:
    return str(int(value)) if value.is_integer() else f"{value:g}"


def params_help(model: type[LaunchParams]) -> list[str]:
    """One line per parameter: ``name=TYPE (default, range): description``."""
    lines = []
    for name, field in model.model_fields.items():
        facts = ["required"] if field.is_required() else [f"default {default_text(field)}"]
        if range_text(field):
            facts.append(range_text(field, short=True))
        about = f": {field.description}" if field.description else ""
        lines.append(f"{name}={_type_name(field.annotation)} ({', '.join(facts)}){about}")
    return lines


def _type_name(tp: Any) -> str:
    if typing.get_origin(tp) is typing.Literal:
        return "|".join(str(a) for a in typing.get_args(tp))
    if typing.get_origin(tp) in (list, dict):
        return "JSON"
    names = {int: "INT", float: "NUMBER", Decimal: "NUMBER", str: "TEXT", bool: "true|false"}
    return names.get(tp, getattr(tp, "__name__", str(tp)))
