"""What every verb of `manage.py agent` shares: argument types, the users and workflows it names, how it prints."""
from __future__ import annotations

import argparse
import getpass
from collections.abc import Callable
from datetime import date
from decimal import Decimal, InvalidOperation
from typing import Any, Protocol

from django.contrib.auth import get_user_model
from django.core.management.base import CommandParser
from rich.console import Console

from workflows import selectors
from workflows.errors import InvalidInput, NotFound
from workflows.models import Workflow
from workflows.services.labels import MAX_LABELS

Verb = Callable[[str, str], CommandParser]  # adds a verb's parser: verb(name, help) (with --json)


class Output(Protocol):
    """What a verb writes with: the command's stdout, its rich console, and ``emit`` (the JSON of
    ``data`` with --json, else ``text``)."""

    stdout: Any
    console: Console

    def emit(self, options: dict[str, Any], data: Any, text: str) -> None: ...


def day(raw: str) -> date:
    """An argparse type: a date as YYYY-MM-DD."""
    try:
        return date.fromisoformat(raw)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{raw!r} is not a date as YYYY-MM-DD") from None


def console_for(stream: Any) -> Console:
    """A rich console on the command's stdout; 120 columns when not a terminal (pipes, logs)."""
    return Console(file=stream, highlight=False, width=None if stream.isatty() else 120)


# The whole-number options and what they may be: an id within PostgreSQL's bigint, a count within what
# one answer holds. Checked before anything runs, so a number out of range is a one-line refusal (exit
# status 2), never a query the database fails on.
NUMBER_RANGES = {
    "id": ("ID", 1, selectors.MAX_ID), "wait_id": ("WAIT_ID", 1, selectors.MAX_ID),
    "workflow": ("--workflow", 1, selectors.MAX_ID), "limit": ("--limit", 1, selectors.MAX_LIST_ROWS),
    "events": ("--events", 0, selectors.MAX_EVENTS), "from_visit": ("--from-visit", 1, 2**31 - 1),
}


def numbers_checked(options: dict[str, Any]) -> None:
    for key, (name, low, high) in NUMBER_RANGES.items():
        value = options.get(key)
        if not isinstance(value, int):
            continue
        if value < low:
            raise InvalidInput(f"{name} must be {low} or more; got {value}." if low == 0 else
                               f"{name} must be at least {low}; got {value}.")
        if value > high:
            raise InvalidInput(f"{name} must be at most {high:,}; got {value}.")


def usd(raw: str) -> Decimal:
    """An argparse type: a positive amount of US dollars."""
    try:
        value = Decimal(raw)
    except InvalidOperation:
        raise argparse.ArgumentTypeError(f"{raw!r} is not an amount of USD, e.g. 12.50") from None
    if not value.is_finite() or value <= 0:
        raise argparse.ArgumentTypeError(f"{raw!r} must be a positive amount of USD")
    return value


def parse_params(pairs: list[str]) -> dict[str, str]:
    params: dict[str, str] = {}
    for pair in pairs:
        key, sep, value = pair.partition("=")
        if not sep or not key.strip():
            raise InvalidInput(f"--param {pair!r} is not KEY=VALUE.")
        if key.strip() in params:
            raise InvalidInput(f"--param {key.strip()} is given twice.")
        params[key.strip()] = value
    return params


LABEL_HELP = (f"a label to find it by (repeatable, at most {MAX_LABELS}): a key of lowercase letters, digits, _ and - "
              "starting with a letter; a value of 1–128 letters, digits and . _ - : / @ +")


def labels_text(labels: dict[str, str]) -> str:
    return ", ".join(f"{key}={value}" for key, value in labels.items())


def user_by_name(username: str) -> Any:
    """The active user named ``username``; a deactivated account may not act (nor log in to the admin)."""
    user_model = get_user_model()
    try:
        user = user_model.objects.get(username=username)
    except user_model.DoesNotExist:
        raise NotFound(f"No user named {username!r}; create one with `manage.py createsuperuser` "
                       "or in the admin.") from None
    if not user.is_active:
        raise InvalidInput(f"User {username!r} is deactivated (Active is off in the admin); act as an active user, "
                           f"or reactivate {username} first.")
    return user


def user_or_none(username: str | None) -> Any:
    return user_by_name(username) if username else None


def workflow_by_id(workflow_id: int) -> Workflow:
    try:
        return Workflow.objects.select_related("release").get(pk=workflow_id)
    except Workflow.DoesNotExist:
        raise NotFound(f"Workflow {workflow_id} does not exist; `manage.py agent list` shows the existing ones.") \
            from None

def shell_login() -> str:
    """Who runs this command, as the operating system names them (recorded when no --user is given)."""
    try:
        return getpass.getuser()
    except (KeyError, OSError):  # no login name for this uid (a container's)
        import os

        return f"uid {os.getuid()}"

