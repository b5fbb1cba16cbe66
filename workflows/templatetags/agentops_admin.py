"""Template tags of the agentops admin pages."""
from __future__ import annotations

import json
from datetime import datetime
from decimal import Decimal
from typing import Any

from django import template

from workflows import clock
from workflows.admin import display

register = template.Library()


@register.simple_tag
def approvals_waiting_for(user: Any) -> int:
    """How many open approvals ``user`` may decide now (the admin index shows it)."""
    from workflows.admin.approvals import approval_queue

    if not getattr(user, "is_authenticated", False):
        return 0
    return len(approval_queue(user, clock.now())[0])


@register.filter
def as_json(value: Any) -> str:
    """A stored JSON value as JSON (``{"a": 1}``), not as Python's repr (``{'a': 1}``)."""
    return json.dumps(value, sort_keys=True, default=str)


@register.filter
def when(value: datetime | None) -> str:
    """A moment as every admin page writes it: ``2026-12-01 09:14:02 UTC`` ("" for none)."""
    return display.when(value)


@register.filter
def usd(value: Decimal | float | str | None) -> str:
    """An amount of US dollars as every admin page writes it: ``$0.0123`` ("" for none)."""
    return display.usd(value)
