"""What ``agentops/settings.py`` is written with: typed reads of the environment, each returning
the default for an unset or empty variable and refusing a malformed value at start-up with
ImproperlyConfigured (naming the variable and what it takes), and the entries of beat's schedule."""
from __future__ import annotations

import importlib.util
import json
import os
import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

from celery.schedules import schedule
from django.core.exceptions import ImproperlyConfigured

LABEL_KEY = re.compile(r"[a-z][a-z0-9_-]{0,62}")
RATE_DIMENSIONS = {"requests_per_minute", "input_tokens_per_minute", "output_tokens_per_minute"}


def env_str(name: str, default: str) -> str:
    return os.environ.get(name, default)


def env_int(name: str, default: int, *, at_least: int | None = None, what: str = "") -> int:
    """A whole number; with ``at_least``, refused below it (``what`` says what it must be then)."""
    return int(_env_number(name, default, int, "a whole number", at_least, what))


def env_float(name: str, default: float, *, at_least: float | None = None, what: str = "") -> float:
    """A number; with ``at_least``, refused below it (``what`` says what it must be then)."""
    return _env_number(name, default, float, "a number", at_least, what)


def _env_number(name: str, default: float, parse: Callable[[str], float], noun: str, at_least: float | None,
                what: str) -> float:
    raw = os.environ.get(name)
    if raw is None or raw == "":
        value = default
    else:
        try:
            value = parse(raw)
        except ValueError:
            raise ImproperlyConfigured(f"{name}={raw!r} is not {noun}; set it to e.g. {default}.") from None
    if at_least is not None and value < at_least:
        shown, bound = (value, at_least) if parse is int else (f"{value:g}", f"{at_least:g}")
        raise ImproperlyConfigured(f"{name}={shown} must be {what or f'at least {bound}'}.")
    return value


def env_choice(name: str, default: str, choices: tuple[str, ...]) -> str:
    """One of ``choices``."""
    value = env_str(name, default)
    if value not in choices:
        raise ImproperlyConfigured(f"{name}={value!r} must be {', '.join(choices[:-1])} or {choices[-1]}.")
    return value


def env_bool(name: str, default: bool) -> bool:
    raw = os.environ.get(name)
    if raw is None or raw == "":
        return default
    if raw.lower() in {"1", "true", "yes", "on"}:
        return True
    if raw.lower() in {"0", "false", "no", "off"}:
        return False
    raise ImproperlyConfigured(f"{name}={raw!r} is not a boolean; use true or false.")


def env_json_object(name: str, default: dict[str, Any]) -> dict[str, Any]:
    raw = os.environ.get(name)
    if raw is None or raw == "":
        return default
    try:
        value = json.loads(raw)
    except json.JSONDecodeError as exc:
        raise ImproperlyConfigured(f"{name} is not JSON ({exc.msg}); set it to a JSON object.") from None
    if not isinstance(value, dict):
        raise ImproperlyConfigured(f"{name} must be a JSON object, not {type(value).__name__}.")
    return value


def env_concurrency_keys(name: str) -> dict[str, int]:
    """A JSON object of concurrency keys ("tenant:<tenant>", "kind:<kind>", "tenant:*", "kind:*")
    and their caps (whole numbers of at least 1)."""
    table = env_json_object(name, {})
    for key, cap in table.items():
        if (not re.fullmatch(r"(tenant|kind):\S.*", str(key)) or not isinstance(cap, int) or isinstance(cap, bool)
                or cap < 1):
            raise ImproperlyConfigured(f"{name}[{key!r}]: keys are tenant:<tenant> or kind:<kind> (or tenant:*, "
                                       "kind:*), values whole numbers of at least 1.")
    return table


def agent_template_dirs(modules: list[str]) -> list[Path]:
    """The ``templates`` folder of each kind's package, found without importing the package."""
    dirs = []
    for module in modules:
        try:
            spec = importlib.util.find_spec(module)
        except ModuleNotFoundError:
            spec = None
        if spec is None:
            raise ImproperlyConfigured(f"AGENTOPS_AGENT_MODULES lists {module!r}, which is not an importable "
                                       "module on this host; fix the name or install its package.")
        dirs += [Path(loc) / "templates" for loc in spec.submodule_search_locations or []
                 if (Path(loc) / "templates").is_dir()]
    return dirs


WEBHOOK_SOURCE = re.compile(r"[a-z0-9][a-z0-9-]{0,39}")  # a webhook source's name


def webhook_secrets(name: str) -> dict[str, str]:
    """One source=secret list; a source named twice is refused (a second secret is a previous one)."""
    secrets: dict[str, str] = {}
    for pair in filter(None, (p.strip() for p in env_str(name, "").split(","))):
        source, _, secret = pair.partition("=")
        if not WEBHOOK_SOURCE.fullmatch(source) or len(secret) < 32:
            raise ImproperlyConfigured(
                f"{name} must be source=secret pairs separated by commas: a source of 1-40 lowercase "
                "letters, digits or dashes, and a secret of at least 32 characters.")
        if source in secrets:
            raise ImproperlyConfigured(
                f"{name} names the source {source!r} twice; give each source one secret there, and put the "
                "secret being rotated out in AGENTOPS_WEBHOOK_PREVIOUS_SECRETS.")
        secrets[source] = secret
    return secrets


def webhook_rotation_checked(current: dict[str, str], previous: dict[str, str],
                             unversioned: frozenset[str]) -> None:
    """A previous secret needs a different current one; an unversioned source needs a secret."""
    for source, secret in previous.items():
        if current.get(source) in (None, secret):
            raise ImproperlyConfigured(
                f"AGENTOPS_WEBHOOK_PREVIOUS_SECRETS gives the source {source!r} a previous secret, but "
                + ("AGENTOPS_WEBHOOK_SECRETS has no current one for it; add it there." if source not in current else
                   "it is the same as its current secret; remove it from AGENTOPS_WEBHOOK_PREVIOUS_SECRETS."))
    if not unversioned <= current.keys():
        raise ImproperlyConfigured(
            "AGENTOPS_WEBHOOK_UNVERSIONED_SOURCES names sources without a secret in AGENTOPS_WEBHOOK_SECRETS: "
            + ", ".join(sorted(unversioned - current.keys())) + ".")


def env_names(name: str) -> list[str]:
    """A list of names separated by commas; spaces around each and empty ones dropped."""
    return [item.strip() for item in env_str(name, "").split(",") if item.strip()]


def env_rate_limits(name: str) -> dict[str, dict[str, float]]:
    """Per-minute limits by scope: a JSON object whose values hold requests_per_minute,
    input_tokens_per_minute and output_tokens_per_minute, each a number above 0."""
    table = env_json_object(name, {})
    for scope, limits in table.items():
        if not isinstance(limits, dict) or set(limits) - RATE_DIMENSIONS or not all(
                isinstance(v, int | float) and v > 0 for v in limits.values()):
            raise ImproperlyConfigured(
                f"{name}[{scope!r}] must be an object of requests_per_minute, input_tokens_per_minute and "
                "output_tokens_per_minute, each a number above 0.")
    return table


def env_label_keys(name: str, *, most: int) -> list[str]:
    """At most ``most`` launch label keys separated by commas, no two alike once - is read as _."""
    keys = env_names(name)
    if any(not LABEL_KEY.fullmatch(key) for key in keys) or len(keys) > most \
            or len({key.replace("-", "_") for key in keys}) < len(keys):
        raise ImproperlyConfigured(
            f"{name}={os.environ.get(name, '')!r} must name at most {most} label keys separated by commas, each of "
            "lowercase letters, digits, _ and -, starting with a letter (e.g. team,env), no two alike once - is "
            "read as _.")
    return keys


def beat_sweep(name: str, seconds: float, *, expires: float | None = None) -> dict[str, Any]:
    """Beat's entry for the sweep ``agentops.beat.<name>`` every ``seconds``; a message that waited
    longer than ``expires`` (default: one interval) is stale, and the next tick replaces it."""
    return {"task": f"agentops.beat.{name}", "schedule": schedule(seconds),
            "options": {"expires": float(seconds if expires is None else expires)}}
