"""Scheduling the notifications of approval waits: when a wait opens (``hooks.approval_opened``,
in the wait's transaction), and before it expires (the ``remind_approvals`` sweep).

Each notification is a ``notify_approvers`` activity (``approval_notify_ensure``) under the
pseudo-node ``NOTIFY_NODE`` and
node visit 0 ("no visit"): no handler asks for it, so the engine never replays it, the replay
check does not see it, leaving a node does not void it, and its failure is recorded on the
workflow without failing it (a waiting workflow does not advance on it). Ending the workflow
(complete, fail, cancel, a new goal) voids it like all live work: nobody is left to decide.
"""
from __future__ import annotations

from datetime import datetime, timedelta
from typing import Any

from django.conf import settings
from django.db import transaction
from django.db.models import Exists, OuterRef, Value
from django.db.models.functions import Concat

from workflows import clock, engine, registry
from workflows.features.notifications.activity import NOTIFY_ACTIVITY, OPENED, REMINDER, NotifyInput
from workflows.models import Activity, Timer, Wait, Workflow
from workflows.services.common import workflow_lock
from workflows.services.failures import row_isolated
from workflows.services.steps import activity_schedule

# Notification activities are recorded under this pseudo-node and visit ("no visit"); no handler
# replays them (this module's docstring says what that implies).
NOTIFY_NODE = "NOTIFY"
NOTIFY_VISIT = 0
NOTIFY_SUFFIX = {OPENED: "/notify", REMINDER: "/remind"}


def approval_notify_ensure(workflow: Workflow, wait: Wait, *, purpose: str, now: datetime) -> tuple[Activity, bool]:
    """Schedule the notification of ``wait``'s approvers for ``purpose``, once; the caller holds
    the workflow's row lock (the wait's own transaction, or the reminder sweep's).

    Idempotent: the operation id is derived from the wait's (``<wait>/notify``, ``<wait>/remind``),
    looked up under the row lock; the unique constraint on ``Activity.operation_id`` backs it.
    Returns (activity, created).
    """
    operation_id = f"{wait.operation_id}{NOTIFY_SUFFIX[purpose]}"
    found = Activity.objects.filter(operation_id=operation_id).first()
    if found is not None:
        return found, False
    command = engine.ScheduleActivity(operation_id=operation_id, name=NOTIFY_ACTIVITY, input=registry.activity_type(
        NOTIFY_ACTIVITY).encode_input(NotifyInput(wait_id=wait.pk, purpose=purpose)))
    return activity_schedule(workflow=workflow, command=command, now=now, node=NOTIFY_NODE,
                             node_visit=NOTIFY_VISIT), True


def approval_opened_notify(sender: Any, *, workflow: Workflow, wait: Wait, now: datetime, **kwargs: Any) -> None:
    """``hooks.approval_opened``'s receiver: tell the new wait's approvers, by an activity of its
    own committed with the wait; its failure never blocks the workflow."""
    approval_notify_ensure(workflow, wait, purpose=OPENED, now=now)


def approval_reminders_schedule_due() -> int:
    """Schedule one reminder for each open approval wait expiring within
    AGENTOPS_APPROVAL_REMINDER_HOURS that has none yet (its expiry timer, index
    ``timer_pending_fire_idx``). Safe at any moment, any number of times: the reminder's
    operation id is derived from the wait and checked under the workflow's row lock.
    """
    hours = settings.AGENTOPS_APPROVAL_REMINDER_HOURS
    if hours <= 0:
        return 0
    now = clock.now()
    reminder_id = Concat(OuterRef("wait__operation_id"), Value(NOTIFY_SUFFIX[REMINDER]))
    reminded = Activity.objects.filter(operation_id=reminder_id)
    due = Timer.objects.filter(
        status=Timer.Status.PENDING, purpose=Timer.Purpose.EXPIRE, fire_at__gt=now,
        fire_at__lte=now + timedelta(hours=hours), wait__kind=Wait.Kind.APPROVAL, wait__status=Wait.Status.OPEN,
    ).exclude(Exists(reminded)).order_by("fire_at")
    rows = dict(due.values_list("wait_id", "workflow_id")[: settings.AGENTOPS_SWEEP_BATCH_SIZE])
    return sum(
        row_isolated("remind_approvals", pk, lambda pk: approval_reminder_ensure(wait_id=pk),
                     workflow_id=lambda pk: rows[pk])
        for pk in rows
    )


def approval_reminder_ensure(*, wait_id: int) -> bool:
    """Schedule the expiry reminder of one open approval wait; True when this call did.

    Idempotent: see ``approval_notify_ensure``; a wait decided meanwhile is skipped.
    """
    workflow_id = Wait.objects.filter(pk=wait_id).values_list("workflow_id", flat=True).first()
    if workflow_id is None:
        return False
    with transaction.atomic():
        workflow = workflow_lock(workflow_id)
        wait = Wait.objects.get(pk=wait_id)
        now = clock.now()
        if wait.status != Wait.Status.OPEN or (wait.expires_at is not None and wait.expires_at <= now):
            return False
        if workflow.is_terminal or workflow.intent_version != wait.intent_version:
            return False
        return approval_notify_ensure(workflow, wait, purpose=REMINDER, now=now)[1]
