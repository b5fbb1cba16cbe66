"""Cancellation: close waits, void scheduled work, compensate commitments newest first; deadlines."""
from __future__ import annotations

from datetime import datetime
from typing import Any

from django.db import transaction

from workflows import clock, doorbells, engine, registry
from workflows.errors import TransitionRefused
from workflows.models import Activity, Commitment, Timer, Wait, Workflow
from workflows.services.common import event_record, text_checked, workflow_lock, workflow_save
from workflows.services.steps import COMPENSATION_NODE, Outcome, activity_schedule_ensure, username_of


@transaction.atomic
def workflow_cancel(*, workflow_id: int, reason: str = "", user: Any = None) -> Outcome:
    """Cancel: close waits, void scheduled work, compensate commitments in reverse order, end cancelled.

    Idempotent: a workflow already cancelling or cancelled returns ALREADY_APPLIED.
    Raises TransitionRefused for a completed or failed workflow.
    """
    reason = text_checked(reason, what="The reason", max_length=2000) if reason.strip() else ""
    workflow = workflow_lock(workflow_id)
    if workflow.status in (Workflow.Status.CANCELLING, Workflow.Status.CANCELLED):
        return Outcome.ALREADY_APPLIED
    if workflow.is_terminal:
        raise TransitionRefused(f"Workflow {workflow_id} is already {workflow.status}; there is nothing to cancel.")
    return _cancel_locked(workflow, reason or "cancelled by an operator", by=username_of(user), now=clock.now())


@transaction.atomic
def workflow_deadline_enforce_if_due(*, workflow_id: int) -> bool:
    """Cancel a workflow whose time limit passed (commitments are compensated as for any cancel).

    Idempotent: a no-op unless the workflow is unfinished, not already cancelling, and past its
    deadline under its row lock.
    """
    workflow = workflow_lock(workflow_id)
    now = clock.now()
    if workflow.deadline is None or workflow.deadline > now or workflow.is_terminal:
        return False
    if workflow.status == Workflow.Status.CANCELLING:
        return False
    _cancel_locked(workflow, f"time limit reached at {workflow.deadline:%Y-%m-%d %H:%M:%S} UTC", by="", now=now)
    return True


def _cancel_locked(workflow: Workflow, reason: str, *, by: str, now: datetime) -> Outcome:
    workflow.request_cancel(at=now, reason=reason)
    workflow_save(workflow, "status", "reason", at=now)
    for wait in workflow.waits.filter(status=Wait.Status.OPEN):
        wait.cancel(at=now)
        wait.save(update_fields=["status", "decided_at"])
    workflow.timers.filter(status=Timer.Status.PENDING).update(status=Timer.Status.IGNORED, note="workflow cancelled")
    workflow.activities.filter(status=Activity.Status.SCHEDULED).update(
        status=Activity.Status.CANCELLED, error="workflow cancelled", completed_at=now
    )
    event_record(workflow=workflow, kind="workflow.cancelling", at=now, reason=reason, by=by)
    return advance_cancellation(workflow)


def advance_cancellation(workflow: Workflow) -> Outcome:
    """Compensate one commitment at a time, newest first; finish when none is active.

    Work still running is awaited first: its effect may land after we compensate.
    """
    now = clock.now()
    if workflow.activities.filter(status=Activity.Status.RUNNING).exclude(node=COMPENSATION_NODE).exists():
        return Outcome.SUSPENDED
    _commitments_for_uncertain_effects(workflow, now=now)
    for commitment in workflow.commitments.filter(status=Commitment.Status.ACTIVE).order_by("-created_at", "-pk"):
        compensation = activity_schedule_ensure(
            workflow=workflow, now=now, node=COMPENSATION_NODE,
            command=engine.ScheduleActivity(
                operation_id=f"{commitment.activity.operation_id}/compensate", name=commitment.compensation,
                input={"operation_id": commitment.activity.operation_id, "data": commitment.data},
            ),
        )
        if compensation.status == Activity.Status.FAILED:
            _note_failed_compensation(workflow, compensation, now=now)
        if compensation.status != Activity.Status.SUCCEEDED:
            return Outcome.SUSPENDED
        commitment.compensated(at=now)
        commitment.save(update_fields=["status", "closed_at"])
        event_record(workflow=workflow, kind="commitment.compensated", at=now, commitment_id=commitment.pk)
    workflow.finish_cancel(at=now)
    event_record(workflow=workflow, kind="workflow.cancelled", at=now)
    workflow_save(workflow, "status", at=now)
    return Outcome.APPLIED


def _note_failed_compensation(workflow: Workflow, compensation: Activity, *, now: datetime) -> None:
    """A compensation out of attempts needs a person: say so once, on the workflow."""
    reason = (f"Compensation {compensation.operation_id} ({compensation.name}) failed after "
              f"{compensation.attempt} attempts: {compensation.error}. Fix the cause, then run "
              f"`manage.py agent resume {workflow.pk}` to try it again.")
    if workflow.reason != reason:
        workflow.reason = reason
        event_record(workflow=workflow, kind="compensation.failed", at=now, operation_id=compensation.operation_id)
        workflow_save(workflow, "reason", at=now)


def compensations_retry(workflow: Workflow, *, now: datetime) -> int:
    """Give failed compensations a fresh set of attempts under their retry policy."""
    retried = 0
    for compensation in workflow.activities.filter(node=COMPENSATION_NODE, status=Activity.Status.FAILED):
        budget = registry.activity_type(compensation.name).retry.max_attempts
        Activity.objects.filter(pk=compensation.pk, status=Activity.Status.FAILED).update(
            status=Activity.Status.SCHEDULED, max_attempts=compensation.attempt + budget, next_attempt_at=now,
            dispatched_at=now, completed_at=None,
        )
        event_record(workflow=workflow, kind="compensation.retried", at=now, operation_id=compensation.operation_id)
        doorbells.activity_run(activity_id=compensation.pk)
        retried += 1
    return retried


def _commitments_for_uncertain_effects(workflow: Workflow, *, now: datetime) -> None:
    """An attempt that was lost or cut off may still have taken effect: compensate it too."""
    for activity in workflow.activities.filter(commitment__isnull=True, attempt__gt=0).exclude(
        status=Activity.Status.SUCCEEDED
    ):
        spec = registry.activity_type(activity.name)
        if spec.commitment:
            Commitment.objects.create(
                workflow=workflow, activity=activity, kind=spec.commitment, compensation=spec.compensation,
                data={"uncertain": True}, created_at=now,
            )


