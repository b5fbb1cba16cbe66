"""Cancellation: close waits, void live work, compensate commitments newest first; deadlines."""
from __future__ import annotations

from datetime import datetime
from typing import Any

from django.db import transaction

from workflows import clock, doorbells, registry, selectors
from workflows.errors import TransitionRefused
from workflows.models import Activity, Commitment, Event, Timer, Wait, Workflow
from workflows.services.common import event_record, text_checked, workflow_lock, workflow_save
from workflows.services.lifecycle import activity_reopen, rows_move
from workflows.services.steps import (
    COMPENSATION_NODE,
    Outcome,
    Result,
    child_commitments_adopt,
    commitment_close_compensated,
    compensation_ensure,
    live_work_void,
    parent_ring_on_commit,
    trace_finished_on_commit,
    uncertain_commitments_ensure,
    username_of,
)
from workflows.sql import row_exists


@transaction.atomic
def workflow_cancel(*, workflow_id: int, reason: str = "", user: Any = None, by: str = "") -> Result:
    """Cancel: close waits, void live work, compensate commitments in reverse order, end cancelled.

    Who cancelled is recorded on the ``workflow.cancelling`` and ``workflow.cancelled`` events:
    ``user``'s name, else ``by`` (a caller without a user names itself, e.g. the shell's login).

    The outcome is APPLIED when the workflow ended cancelled in this call, SUSPENDED while
    compensations run. Idempotent: a workflow already cancelling or cancelled returns
    ALREADY_APPLIED. Raises TransitionRefused for a completed or failed workflow.
    """
    reason = text_checked(reason, what="The reason", max_length=2000) if reason.strip() else ""
    workflow = workflow_lock(workflow_id)
    if workflow.status in (Workflow.Status.CANCELLING, Workflow.Status.CANCELLED):
        return Result.of(workflow, Outcome.ALREADY_APPLIED,
                         f"Workflow {workflow_id} was already {workflow.status}; nothing changed.")
    if workflow.is_terminal:
        raise TransitionRefused(f"Workflow {workflow_id} is already {workflow.status}; there is nothing to cancel.")
    who = username_of(user) or by.strip()[:150] or "unknown"
    outcome = _cancel_locked(workflow, reason or f"cancelled by {who}", by=who, now=clock.now())
    if workflow.status == Workflow.Status.CANCELLED:
        return Result.of(workflow, outcome, f"Workflow {workflow_id} is cancelled.")
    return Result.of(workflow, outcome, f"Workflow {workflow_id} is cancelling: its work in flight was stopped, and "
                                        "its active commitments are compensated, newest first, before it ends "
                                        "cancelled.")


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
    _cancel_locked(workflow, f"time limit reached at {workflow.deadline:%Y-%m-%d %H:%M:%S} UTC", by="time limit",
                   now=now)
    return True


def _cancel_locked(workflow: Workflow, reason: str, *, by: str, now: datetime) -> Outcome:
    workflow.request_cancel(at=now, reason=reason)
    workflow_save(workflow, "status", "reason", at=now)
    # A child wait stays open until its child has ended: it records that end, and the cancel waits for it.
    for wait in workflow.waits.filter(status=Wait.Status.OPEN).exclude(kind=Wait.Kind.CHILD):
        wait.cancel(at=now)
        wait.save(update_fields=["status", "decided_at"])
    rows_move(workflow.timers.filter(status=Timer.Status.PENDING), "ignore", note="workflow cancelled")
    # A running attempt is voided too, not awaited: it records nothing, and an effect it still
    # sends after its last fenced check lands on a key that compensation has already closed
    # (the deploy protocol's tombstone), so compensating at once is safe.
    live_work_void(workflow, now=now, reason="workflow cancelled")
    event_record(workflow=workflow, kind="workflow.cancelling", at=now, reason=reason, by=by)
    children_cancel_live(workflow, why=f"was cancelled ({reason[:300]})", by=by, now=now)
    return advance_cancellation(workflow)


def children_cancel_live(workflow: Workflow, *, why: str, by: str, now: datetime, visit: int | None = None,
                         before_intent: int | None = None, operation_ids: list[str] | None = None) -> list[int]:
    """Cancel the children of ``workflow`` that have not ended, nor begun cancelling (those its node
    visit ``visit`` started, or those of intents before ``before_intent``, or those of the child
    waits ``operation_ids``, or all), each as
    ``agent cancel`` would, with the reason "parent workflow N <why>" and ``by`` recorded on the
    child (``workflow.cancelling``) and a ``child.cancelled`` event on the parent. The caller
    holds the parent's row lock; each child is locked after it (always parent first, child
    second: no cycle). Returns the ids cancelled.

    Idempotent: a child already cancelling or ended is left alone.
    """
    if workflow.child_waits_open is False:  # read with the row lock: every node entry asks, most have no children
        return []
    open_child_waits: dict[str, Any] = {"workflow_id": workflow.pk, "kind": Wait.Kind.CHILD, "status": Wait.Status.OPEN}
    if visit is not None:
        open_child_waits["node_visit"] = visit
    if not row_exists(Wait, open_child_waits):
        return []
    waits = Wait.objects.filter(**open_child_waits)
    if before_intent is not None:
        waits = waits.filter(intent_version__lt=before_intent)
    if operation_ids is not None:
        waits = waits.filter(operation_id__in=operation_ids)
    ids = list(Workflow.objects.filter(parent_wait__in=waits.values("pk"), status__in=Workflow.CANCELLABLE)
               .order_by("pk").values_list("pk", flat=True))
    cancelled = []
    for pk in ids:
        child = workflow_lock(pk)
        if child.status not in Workflow.CANCELLABLE:
            continue
        reason = f"parent workflow {workflow.pk} {why}"
        _cancel_locked(child, reason, by=f"parent workflow {workflow.pk} ({by})", now=now)
        event_record(workflow=workflow, kind="child.cancelled", at=now, child=pk, reason=reason, by=by)
        cancelled.append(pk)
    return cancelled


def advance_cancellation(workflow: Workflow) -> Outcome:
    """Once its children have ended (their effects undone first), compensate one commitment at a
    time, newest first; finish when none is active."""
    now = clock.now()
    if selectors.children_live(workflow):
        return Outcome.SUSPENDED  # each child's end rings this workflow again
    # A child that completed before its end was collected hands over what it made: undone too.
    child_commitments_adopt(workflow, now=now)
    uncertain_commitments_ensure(workflow, now=now)
    for commitment in workflow.commitments.filter(status=Commitment.Status.ACTIVE).order_by("-created_at", "-pk"):
        compensation = compensation_ensure(workflow, commitment, now=now)
        if compensation.status == Activity.Status.FAILED:
            _note_failed_compensation(workflow, compensation, now=now)
        if compensation.status != Activity.Status.SUCCEEDED:
            return Outcome.SUSPENDED
        commitment_close_compensated(workflow, commitment, now=now)
    workflow.finish_cancel(at=now)
    asked = Event.objects.filter(workflow=workflow, kind="workflow.cancelling").order_by("-seq").values_list(
        "data", flat=True).first() or {}
    event_record(workflow=workflow, kind="workflow.cancelled", at=now, by=asked.get("by", ""))
    workflow_save(workflow, "status", at=now)
    trace_finished_on_commit(workflow)
    parent_ring_on_commit(workflow)
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
        if not activity_reopen(compensation, max_attempts=compensation.attempt + budget, now=now):
            continue
        event_record(workflow=workflow, kind="compensation.retried", at=now, operation_id=compensation.operation_id)
        doorbells.activity_run(activity_id=compensation.pk, name=compensation.name)
        retried += 1
    return retried
