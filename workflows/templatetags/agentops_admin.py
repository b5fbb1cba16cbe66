"""Template tags of the agentops admin pages."""
from __future__ import annotations

import json
from typing import Any

from django import template

from workflows import clock

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
