"""Scheduling the notifications of approval waits: when a wait opens, and before it expires.

Each notification is a ``notify_approvers`` activity (``steps.approval_notify_ensure``, which
``wait_open`` calls for an approval wait) under the pseudo-node ``steps.NOTIFY_NODE`` and
node visit 0 ("no visit"): no handler asks for it, so the engine never replays it, the replay
check does not see it, leaving a node does not void it, and its failure is recorded on the
workflow without failing it (a waiting workflow does not advance on it). Ending the workflow
(complete, fail, cancel, a new goal) voids it like all live work: nobody is left to decide.
"""
from __future__ import annotations

from datetime import timedelta

from django.conf import settings
from django.db import transaction
from django.db.models import Exists, OuterRef, Value
from django.db.models.functions import Concat

from workflows import clock
from workflows.models import Activity, Timer, Wait
from workflows.notifications import REMINDER
from workflows.services.common import workflow_lock
from workflows.services.failures import row_isolated
from workflows.services.steps import NOTIFY_SUFFIX, approval_notify_ensure


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
