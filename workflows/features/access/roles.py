"""Approver roles: the Django groups an approval wait names (``ctx.approval(role=...)``).

A role is a group; a member may decide the waits that name it. ``manage.py agent role`` calls
these, so creating the approvers of a new kind needs neither the admin nor ``manage.py shell``.
"""
from __future__ import annotations

from typing import Any

from django.contrib.auth.models import Group
from django.db import transaction

from workflows.errors import InvalidInput, NotFound
from workflows.models import Wait
from workflows.services.steps import Outcome


def _role_name(role: str) -> str:
    name = role.strip()
    limit = Wait._meta.get_field("required_role").max_length or 150
    if not 0 < len(name) <= limit:
        raise InvalidInput(f"A role name is 1–{limit} characters (a Django group name); got {len(name)}.")
    return name


@transaction.atomic
def role_member_add(*, role: str, user: Any) -> Outcome:
    """Make ``user`` a member of ``role`` (the group is created when it does not exist yet).
    Idempotent: ALREADY_APPLIED when they were one."""
    group, _ = Group.objects.get_or_create(name=_role_name(role))
    if group.user_set.filter(pk=user.pk).exists():
        return Outcome.ALREADY_APPLIED
    group.user_set.add(user)
    return Outcome.APPLIED


@transaction.atomic
def role_member_remove(*, role: str, user: Any) -> Outcome:
    """Take ``user`` out of ``role``; ALREADY_APPLIED when they were not a member. NotFound for
    a role that does not exist (a typo must not look like success)."""
    group = Group.objects.filter(name=_role_name(role)).first()
    if group is None:
        raise NotFound(f"No role named {role.strip()!r}; `manage.py agent role list` shows the roles.")
    if not group.user_set.filter(pk=user.pk).exists():
        return Outcome.ALREADY_APPLIED
    group.user_set.remove(user)
    return Outcome.APPLIED
