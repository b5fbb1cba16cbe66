"""A kind's launch parameters, declared once as a pydantic model: the same declaration validates a
launch (types, ranges, defaults; a value from ``--param KEY=VALUE`` is text, read as JSON would
be), prints the parameters in ``agent launch --help`` and is the JSON schema an interface can
show (``registry.launch_params_schema``).

A leaf module: the engine imports it, and it imports nothing of the kernel but its errors.
"""
from __future__ import annotations

import typing
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
        low, high = bounds(field)
        about = f": {field.description}" if field.description else ""
        return f"Parameter {name}={given} must be between {_number(low)} and {_number(high)}{about}."
    if field is not None and error["type"] in NUMBER_ERRORS:
        return f"Parameter {name} must be a number: --param {name}={field.default}."
    if error["type"] == "int_from_float":
        return f"Parameter {name}={given} must be a whole number."
    return f"Parameter {name}={given!r}: {error['msg'].lower()}."


def bounds(field: FieldInfo) -> tuple[float | None, float | None]:
    """The lowest and highest value ``field`` allows (None: no bound)."""
    low = high = None
    for rule in field.metadata:  # annotated_types' Ge, Gt, Le, Lt, as Field(ge=..., ...) records them
        low = next((getattr(rule, a) for a in ("ge", "gt") if hasattr(rule, a)), low)
        high = next((getattr(rule, a) for a in ("le", "lt") if hasattr(rule, a)), high)
    return (None if low is None else float(low)), (None if high is None else float(high))


def _number(value: float | None) -> str:
    if value is None:
        return "any"
    return str(int(value)) if value.is_integer() else f"{value:g}"


def params_help(model: type[LaunchParams]) -> list[str]:
    """One line per parameter: ``name=TYPE (default, range): description``."""
    lines = []
    for name, field in model.model_fields.items():
        facts = ["required"] if field.is_required() else [f"default {field.default!r}"]
        low, high = bounds(field)
        if low is not None or high is not None:
            facts.append(f"{_number(low)} to {_number(high)}")
        lines.append(f"{name}={_type_name(field.annotation)} ({', '.join(facts)}): {field.description or ''}".rstrip())
    return lines


def _type_name(tp: Any) -> str:
    if typing.get_origin(tp) is typing.Literal:
        return "|".join(str(a) for a in typing.get_args(tp))
    return {int: "INT", float: "NUMBER", str: "TEXT", bool: "true|false"}.get(tp, getattr(tp, "__name__", str(tp)))
