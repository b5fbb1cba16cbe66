"""Scheduling the notifications of approval waits: when a wait opens, and before it expires.

Each notification is a ``notify_approvers`` activity under the pseudo-node NOTIFY_NODE and
node visit 0 ("no visit"): no handler asks for it, so the engine never replays it, the replay
check does not see it, leaving a node does not void it, and its failure is recorded on the
workflow without failing it (a waiting workflow does not advance on it). Ending the workflow
(complete, fail, cancel, a new goal) voids it like all live work: nobody is left to decide.
"""
from __future__ import annotations

from datetime import datetime, timedelta

from django.conf import settings
from django.db import transaction
from django.db.models import Exists, OuterRef, Value
from django.db.models.functions import Concat

from workflows import clock, doorbells, registry
from workflows.models import Activity, Timer, Wait, Workflow
from workflows.notifications import NOTIFY_ACTIVITY, OPENED, REMINDER, NotifyInput
from workflows.services.common import event_record, workflow_lock

# Notification activities are recorded under this pseudo-node and visit; no handler replays them.
NOTIFY_NODE = "NOTIFY"
NOTIFY_VISIT = 0
SUFFIX = {OPENED: "/notify", REMINDER: "/remind"}


def notify_operation_id(wait_operation_id: str, purpose: str) -> str:
    return f"{wait_operation_id}{SUFFIX[purpose]}"


def approval_notify_ensure(workflow: Workflow, wait: Wait, *, purpose: str, now: datetime) -> tuple[Activity, bool]:
    """Schedule the notification of ``wait``'s approvers for ``purpose``, once; the caller holds
    the workflow's row lock (the wait's own transaction, or the reminder sweep's).

    Idempotent: the operation id is derived from the wait's (``<wait>/notify``, ``<wait>/remind``),
    looked up under the row lock; the unique constraint on ``Activity.operation_id`` backs it.
    Returns (activity, created).
    """
    operation_id = notify_operation_id(wait.operation_id, purpose)
    found = Activity.objects.filter(operation_id=operation_id).first()
    if found is not None:
        return found, False
    spec = registry.activity_type(NOTIFY_ACTIVITY)
    activity = Activity.objects.create(
        workflow=workflow, name=NOTIFY_ACTIVITY, node=NOTIFY_NODE, node_visit=NOTIFY_VISIT,
        intent_version=workflow.intent_version, input=spec.encode_input(NotifyInput(wait_id=wait.pk, purpose=purpose)),
        max_attempts=spec.retry.max_attempts, next_attempt_at=now, dispatched_at=now, created_at=now,
        operation_id=operation_id,
    )
    event_record(workflow=workflow, kind="activity.scheduled", at=now, operation_id=operation_id,
                 name=NOTIFY_ACTIVITY)
    doorbells.activity_run(activity_id=activity.pk)
    return activity, True


def approval_reminders_schedule_due() -> int:
    """Schedule one reminder for each open approval wait expiring within
    AGENTOPS_APPROVAL_REMINDER_HOURS that has none yet (its expiry timer, index
    ``timer_pending_fire_idx``). Safe at any moment, any number of times: the reminder's
    operation id is derived from the wait and checked under the workflow's row lock.
    """
    from workflows.services.failures import row_isolated  # failures imports the step services

    hours = settings.AGENTOPS_APPROVAL_REMINDER_HOURS
    if hours <= 0:
        return 0
    now = clock.now()
    reminded = Activity.objects.filter(operation_id=Concat(OuterRef("wait__operation_id"), Value(SUFFIX[REMINDER])))
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
