"""Running activity attempts: claim under a lease, execute, record the result exactly once."""
from __future__ import annotations

import enum
import logging
import random
import threading
import time
import uuid
from collections.abc import Sequence
from datetime import datetime, timedelta
from typing import Any

from django.conf import settings
from django.db import transaction

from agentops import telemetry
from workflows import clock, doorbells, faults, registry, statestore
from workflows.activity_context import ActivityContext
from workflows.errors import BudgetDeferred, BudgetExhausted, InvalidInput, Permanent, Refused, Throttled
from workflows.leases import Claim
from workflows.models import Activity, ActivityAttempt, Commitment, Workflow
from workflows.services.budgets import pause_for_budget_locked
from workflows.services.common import (
    event_record,
    event_seq_take,
    events_batched,
    events_insert,
    json_checked,
    release_ensure,
    workflow_lock,
    workflow_save,
)
from workflows.services.progress import progress_record_once, progress_validate
from workflows.services.steps import (
    COMPENSATION_NODE,
    ChainSlot,
    attempt_start,
    commitment_compensated_by,
    lease_expiry,
    throttled_streak,
)
from workflows.services.workflows import advance_locked
from workflows.sql import row_exists, row_update

logger = logging.getLogger("agentops.activities")


class RunOutcome(enum.StrEnum):
    RECORDED = "recorded"
    RETRY_SCHEDULED = "retry_scheduled"
    FAILED = "failed"
    DEFERRED = "deferred"
    THROTTLED = "throttled"
    PAUSED = "paused"
    SKIPPED = "skipped"
    STALE = "stale"


# Set by the worker at start (agentops/celery.py): on a threads pool, I/O-bound activities chain
# for AGENTOPS_IO_ACTIVITY_CHAIN_SECONDS; set when the worker begins to shut down: no new chains.
io_chain_seconds: float | None = None
shutting_down = threading.Event()


def activity_run_if_runnable(*, activity_id: int, worker: str = "", task_id: str = "") -> RunOutcome:
    """Claim the next attempt, run it, record its outcome; then run the workflow's next
    activity too, for as long as AGENTOPS_ACTIVITY_CHAIN_SECONDS allows (an I/O-bound one on a
    threads-pool worker: AGENTOPS_IO_ACTIVITY_CHAIN_SECONDS), and not once the worker is
    shutting down.

    Idempotent: the claim is a conditional UPDATE on (status=scheduled, attempt), so a
    duplicate doorbell finds nothing to claim; the write-back is fenced by
    (attempt, lease_token), so an attempt whose lease was taken over records nothing.
    A chained activity is claimed in the transaction that records the result before it
    (no doorbell): if this process dies, its lease runs out and the lease sweep retries it.
    """
    claim = activity_claim_if_runnable(activity_id=activity_id, worker=worker, task_id=task_id)
    if claim is None:
        return RunOutcome.SKIPPED
    window = settings.AGENTOPS_ACTIVITY_CHAIN_SECONDS
    if io_chain_seconds is not None and registry.activity_type(claim.name).io_bound:
        window = io_chain_seconds
    chain_until = time.monotonic() + window
    while True:
        outcome, next_claim = _attempt_run(claim, worker=worker, task_id=task_id, chain_until=chain_until)
        if next_claim is None:
            return outcome
        claim = next_claim


def _attempt_run(claim: Claim, *, worker: str, task_id: str, chain_until: float) -> tuple[RunOutcome, Claim | None]:
    """Run one claimed attempt and record its outcome; also the claim of the next activity
    when the result's advance scheduled one before ``chain_until``."""
    spec = registry.activity_type(claim.name)
    ctx = ActivityContext(claim=claim, lease=DatabaseLease())
    with telemetry.span(f"activity {claim.name}", workflow_id=claim.workflow_id, attributes={
            "agentops.workflow.id": claim.workflow_id, "agentops.activity.name": claim.name,
            "agentops.operation_id": claim.operation_id, "agentops.attempt": claim.attempt,
            "agentops.worker": worker}) as span:
        ctx.faultpoint("activity.after_claim")
        try:
            result = _execute(spec, ctx)
        except Exception as exc:
            logger.info("activity.attempt.failed", extra={"operation_id": claim.operation_id, "attempt": claim.attempt})
            telemetry.failed(span, exc)
            outcome = activity_failure_record_if_current(claim=claim, error=exc)
            telemetry.annotate(span, {"agentops.attempt.outcome": str(outcome)})
            return outcome, None
        ctx.faultpoint("activity.before_writeback")
        chain = (ChainSlot(worker=worker, task_id=task_id, io_bound=spec.io_bound)
                 if time.monotonic() < chain_until and not shutting_down.is_set() else None)
        outcome = activity_result_record_if_current(claim=claim, result=result, reconciled=ctx.reconciled, chain=chain)
        telemetry.annotate(span, {"agentops.attempt.outcome": str(outcome), "agentops.reconciled": ctx.reconciled})
    return outcome, chain.claim if chain is not None else None


def _execute(spec: registry.ActivityType[Any, Any], ctx: ActivityContext) -> Any:
    if ctx.claim.previous_attempt_lost:
        found = spec.reconcile_json(ctx, ctx.claim.input)
        if found is not None:
            ctx.reconciled = True
            return found
    return spec.execute(ctx, ctx.claim.input)


class DatabaseLease:
    """The lease of an attempt running on a worker: each call is a fenced write (see the services below)."""

    def heartbeat(self, claim: Claim, detail: str) -> bool:
        return activity_heartbeat_if_current(claim=claim, detail=detail)

    def checkpoint(self, claim: Claim, state: dict[str, Any], detail: str,
                   notes: Sequence[tuple[str, dict[str, Any]]] = ()) -> bool:
        return activity_checkpoint_if_current(claim=claim, state=state, detail=detail, notes=notes)

    def note(self, claim: Claim, kind: str, data: dict[str, Any]) -> bool:
        return activity_note_if_current(claim=claim, kind=kind, data=data)

    def adopt_release(self, claim: Claim, release: dict[str, Any], why: str) -> bool:
        return workflow_release_adopt_if_current(claim=claim, release=release, why=why)


@transaction.atomic
def activity_claim_if_runnable(*, activity_id: int, worker: str, task_id: str) -> Claim | None:
    """Start attempt n+1 if the activity is scheduled and due; None otherwise (recorded as ignored).

    Idempotent: conditional UPDATE on (status=scheduled, attempt, due) under the workflow's row lock.
    """
    try:
        # get(), not first(): ordering a query over the activity's many columns costs more than the read.
        activity = Activity.objects.get(pk=activity_id)
    except Activity.DoesNotExist:
        logger.warning("activity.doorbell.unknown", extra={"activity_id": activity_id})
        return None
    now = clock.now()
    workflow = workflow_lock(activity.workflow_id)
    spec = registry.activity_type(activity.name)
    # A paused workflow (e.g. out of budget) starts no new attempts until a person resumes it;
    # compensations still run: they undo effects and spend no budget.
    paused = workflow.status == Workflow.Status.PAUSED and activity.node != COMPENSATION_NODE
    previous = activity.attempt
    activity.attempt, activity.lease_token = previous + 1, uuid.uuid4().hex
    claimed = not paused and Activity.objects.filter(
        pk=activity_id, status=Activity.Status.SCHEDULED, attempt=previous, next_attempt_at__lte=now
    ).update(
        status=Activity.Status.RUNNING, attempt=activity.attempt, lease_token=activity.lease_token,
        lease_expires_at=lease_expiry(spec, now), heartbeat_at=now,
    )
    if not claimed:
        current = Activity.objects.values_list("status", flat=True).get(pk=activity_id)
        event_record(workflow=workflow, kind="activity.doorbell_ignored", at=now, operation_id=activity.operation_id,
                     status="workflow paused" if paused else current, worker=worker)
        return None
    previous_lost = previous > 0 and activity.attempts.filter(
        number=previous, status=ActivityAttempt.Status.LOST
    ).exists()
    return attempt_start(workflow, activity, worker=worker, task_id=task_id, now=now, previous_lost=previous_lost)


def _fence(claim: Claim) -> dict[str, Any]:
    """The activity row, only while this claim still holds the lease: the conditions of every
    write of a running attempt (heartbeat, fence, checkpoint, note, its outcome), which are SQL
    (``workflows.sql``)."""
    return {"id": claim.activity_id, "status": Activity.Status.RUNNING.value, "attempt": claim.attempt,
            "lease_token": claim.lease_token}


def _fenced_update(claim: Claim, values: dict[str, Any]) -> bool:
    """Update the activity row the claim holds; True when it still held it."""
    return bool(row_update(Activity, values, _fence(claim)))


def _fenced_exists(claim: Claim) -> bool:
    """Whether the claim still holds the activity row."""
    return row_exists(Activity, _fence(claim))


def _attempt_finish(claim: Claim, status: str, error: str = "") -> None:
    row_update(ActivityAttempt, {"status": status, "error": error[:2000], "finished_at": clock.now()},
               {"activity": claim.activity_id, "number": claim.attempt})


def _refuse_stale(workflow: Workflow, claim: Claim) -> RunOutcome:
    # An attempt already closed as cancelled (its work voided) keeps that status; a lost one came back.
    ActivityAttempt.objects.filter(
        activity_id=claim.activity_id, number=claim.attempt,
        status__in=(ActivityAttempt.Status.RUNNING, ActivityAttempt.Status.LOST),
    ).update(status=ActivityAttempt.Status.STALE, error="lease was taken over, or its work voided, before the "
             "result was recorded", finished_at=clock.now())
    event_record(workflow=workflow, kind="activity.stale_result_discarded", at=clock.now(),
                 operation_id=claim.operation_id, attempt=claim.attempt)
    logger.warning("activity.stale_writer_rejected", extra={"operation_id": claim.operation_id})
    return RunOutcome.STALE


@transaction.atomic
def activity_result_record_if_current(
    *, claim: Claim, result: Any, reconciled: bool = False, chain: ChainSlot | None = None
) -> RunOutcome:
    """Record the result once and advance the workflow in the same transaction; ``chain``
    receives the claim of the next activity the advance schedules, if any.

    Idempotent: conditional UPDATE on (status=running, attempt, lease_token); a second
    write, or a write by a superseded attempt, updates no row and is recorded as stale.
    """
    workflow = workflow_lock(claim.workflow_id)
    now = clock.now()
    try:
        # Long values are stored once and referenced (workflows.statestore): a check's output
        # tail costs its bytes once, in this result and in every state that keeps it.
        stored = statestore.externalize_checked(result, what=f"The result of activity {claim.name}")
    except Refused as exc:
        return _record_failure_locked(workflow, claim, exc, retryable=False)
    spec = registry.activity_type(claim.name)
    if spec.records_progress:
        try:
            progress_validate(result)
        except Refused as exc:
            return _record_failure_locked(workflow, claim, exc, retryable=False)
    if not _fenced_update(claim, {"status": Activity.Status.SUCCEEDED, "result": stored.value, "error": "",
                                  "completed_at": now, "lease_expires_at": None, "checkpoint": None}):
        return _refuse_stale(workflow, claim)
    _attempt_finish(claim, ActivityAttempt.Status.SUCCEEDED)
    statestore.blobs_store(workflow.pk, stored.blobs, node_visit=workflow.node_visit, now=now)
    if spec.commitment:
        Commitment.objects.get_or_create(
            activity_id=claim.activity_id,
            defaults={"workflow": workflow, "kind": spec.commitment, "compensation": spec.compensation,
                      "data": result if isinstance(result, dict) else {"result": result}, "created_at": now},
        )
    if spec.records_progress:
        sample = progress_record_once(workflow=workflow, operation_id=claim.operation_id, result=result, now=now)
        event_record(workflow=workflow, kind="progress.sampled", at=now, percent=sample.percent,
                     confidence=sample.confidence)
    with events_batched(workflow):
        event_record(workflow=workflow, kind="activity.succeeded", at=now, operation_id=claim.operation_id,
                     attempt=claim.attempt, reconciled=reconciled)
        commitment_compensated_by(workflow, operation_id=claim.operation_id, input=claim.input, now=now)
        advance_locked(workflow, chain=chain)
    faults.faultpoint("transition.before_commit", workflow_id=workflow.pk, operation_id=claim.operation_id)
    return RunOutcome.RECORDED


@transaction.atomic
def activity_failure_record_if_current(*, claim: Claim, error: BaseException) -> RunOutcome:
    """Open a retry window or fail the activity, by its retry policy; fenced like a result."""
    workflow = workflow_lock(claim.workflow_id)
    spec = registry.activity_type(claim.name)
    retryable = not isinstance(error, (Permanent, Refused, *spec.retry.non_retryable))
    return _record_failure_locked(workflow, claim, error, retryable=retryable)


def _record_failure_locked(workflow: Workflow, claim: Claim, error: BaseException, *, retryable: bool) -> RunOutcome:
    now = clock.now()
    spec = registry.activity_type(claim.name)
    message = f"{type(error).__name__}: {error}"
    activity = Activity.objects.get(pk=claim.activity_id)
    if isinstance(error, BudgetExhausted):
        if not _fenced_exists(claim):
            return _refuse_stale(workflow, claim)
        _attempt_finish(claim, ActivityAttempt.Status.FAILED, message)
        pause_for_budget_locked(workflow, activity, error, now=now)
        return RunOutcome.PAUSED
    elif retryable and (claim.attempt < activity.max_attempts or isinstance(error, (BudgetDeferred, Throttled))):
        # The wait the provider or the budget named, else the backoff of throttling or of the retry policy.
        delay = getattr(error, "retry_after_seconds", None) or (
            throttle_backoff_seconds(claim) if isinstance(error, Throttled) else spec.retry.delay_after(claim.attempt))
        # A budget deferral is a wait for money, and throttling a wait for the provider's
        # capacity, not failed tries: both give their attempt back.
        refund = 1 if isinstance(error, (BudgetDeferred, Throttled)) else 0
        updated = _fenced_update(claim, {
            "status": Activity.Status.SCHEDULED, "error": message, "next_attempt_at": now + timedelta(seconds=delay),
            "dispatched_at": None, "lease_expires_at": None, "max_attempts": activity.max_attempts + refund,
        })
        outcome = (RunOutcome.THROTTLED if isinstance(error, Throttled)
                   else RunOutcome.DEFERRED if refund else RunOutcome.RETRY_SCHEDULED)
    else:
        updated = _fenced_update(claim, {"status": Activity.Status.FAILED, "error": message, "completed_at": now,
                                         "lease_expires_at": None})
        outcome = RunOutcome.FAILED
    if not updated:
        return _refuse_stale(workflow, claim)
    _attempt_finish(claim, ActivityAttempt.Status.FAILED, message)
    retry_at = {} if outcome == RunOutcome.FAILED else {
        "retry_at": (now + timedelta(seconds=delay)).isoformat(), "max_attempts": activity.max_attempts + refund}
    event_record(workflow=workflow, kind=f"activity.{outcome.value}", at=now, operation_id=claim.operation_id,
                 attempt=claim.attempt, error=message[:500], **retry_at)
    if outcome == RunOutcome.FAILED and activity.node == COMPENSATION_NODE and (
        workflow.status != Workflow.Status.CANCELLING  # cancellation says so in the workflow's reason
    ):
        # An effect nothing undoes: the admin and `agent show` list the active commitment, and
        # `manage.py agent resume` tries the compensation again.
        event_record(workflow=workflow, kind="compensation.failed", at=now, operation_id=claim.operation_id)
    if outcome == RunOutcome.FAILED:
        advance_locked(workflow)
    return outcome


def throttle_backoff_seconds(claim: Claim) -> float:
    """The wait after a throttled attempt whose provider named none: exponential in the number of
    throttled attempts in a row (this one included), from AGENTOPS_THROTTLE_BACKOFF_SECONDS up to
    AGENTOPS_THROTTLE_BACKOFF_MAX_SECONDS, with "equal jitter" (half fixed, half random) so the
    workflows an overload stopped together do not all come back in the same second."""
    streak = throttled_streak(claim.activity_id, before=claim.attempt)
    ceiling = min(settings.AGENTOPS_THROTTLE_BACKOFF_SECONDS * 2 ** streak,
                  settings.AGENTOPS_THROTTLE_BACKOFF_MAX_SECONDS)
    return float(ceiling / 2 + random.uniform(0, ceiling / 2))


def activity_heartbeat_if_current(*, claim: Claim, detail: str = "") -> bool:
    """Extend the lease of a running attempt. False when the attempt is fenced off or cancelled.

    Idempotent: conditional UPDATE on (status=running, attempt, lease_token).
    """
    return _lease_extend_if_current(claim, now=clock.now(), detail=detail)


def activity_checkpoint_if_current(*, claim: Claim, state: dict[str, Any], detail: str = "",
                                   notes: Sequence[tuple[str, dict[str, Any]]] = ()) -> bool:
    """Save a running attempt's working state for the next attempt to resume from, and extend
    its lease as a heartbeat does; ``notes`` (kind, data), what the attempt did since its last
    checkpoint, are recorded in the same transaction, before the ``activity.checkpointed``
    event, so the history and the resume point never disagree. False, like a heartbeat, when
    the attempt is fenced off or cancelled (nothing is written).

    Idempotent: conditional UPDATE on (status=running, attempt, lease_token); saving again
    replaces the state. Raises InvalidInput (changing nothing) for state that is not a JSON
    object under 1 MB, or a note that is not JSON.
    """
    if not isinstance(state, dict):
        raise InvalidInput(f"A checkpoint of {claim.name} must be a JSON object; got {type(state).__name__}.")
    state = json_checked(state, what=f"The checkpoint of activity {claim.name}")
    now = clock.now()
    events = [*_checked_notes(claim, notes, at=now),
              ("activity.checkpointed", now, _attempt_data(claim, {"detail": detail[:200]}))]
    with transaction.atomic():
        first_seq = event_seq_take(claim.workflow_id, len(events))
        if not _lease_extend_if_current(claim, now=now, detail=detail, checkpoint=state, checkpointed_at=now):
            transaction.set_rollback(True)
            return False
        events_insert(claim.workflow_id, first_seq, events)
    return True


def _attempt_data(claim: Claim, data: dict[str, Any]) -> dict[str, Any]:
    return {"operation_id": claim.operation_id, "attempt": claim.attempt, **data}


def _checked_notes(claim: Claim, notes: Sequence[tuple[str, dict[str, Any]]], *,
                   at: datetime) -> list[tuple[str, datetime, dict[str, Any]]]:
    return [(kind, at, _attempt_data(claim, json_checked(data, what=f"The {kind} note"))) for kind, data in notes]


def _lease_extend_if_current(claim: Claim, *, now: datetime, detail: str, **fields: Any) -> bool:
    """Extend a running attempt's lease, writing ``fields`` too; False when it is fenced off:
    taken over, or its work voided (cancel, a new goal, its node left, the workflow ended), since
    voiding sets the activity's own row cancelled. The conditional UPDATE waits for a voiding
    transaction that holds the row and then sees its outcome, so no check races it."""
    return _fenced_update(claim, {"heartbeat_at": now, "heartbeat_detail": detail[:200],
                                  "lease_expires_at": lease_expiry(registry.activity_type(claim.name), now), **fields})


def activity_lease_expire_if_due(*, activity_id: int) -> bool:
    """Mark a running attempt whose lease ran out as lost; schedule the next attempt or fail.

    Idempotent: conditional UPDATE on (status=running, attempt, lease_token, lease expired).
    """
    now = clock.now()
    row = Activity.objects.filter(pk=activity_id).values("workflow_id").first()
    if row is None:
        return False
    with transaction.atomic():
        workflow = workflow_lock(row["workflow_id"])
        activity = Activity.objects.get(pk=activity_id)
        if activity.status != Activity.Status.RUNNING or activity.lease_expires_at is None:
            return False  # already reaped by another sweep, or finished meanwhile
        fenced = Activity.objects.filter(
            pk=activity_id, status=Activity.Status.RUNNING, attempt=activity.attempt,
            lease_token=activity.lease_token, lease_expires_at__lt=now,
        )
        error = f"attempt {activity.attempt} lost: lease expired at {activity.lease_expires_at:%H:%M:%S}"
        if activity.attempt < activity.max_attempts:
            status = Activity.Status.SCHEDULED
        else:
            status = Activity.Status.FAILED
        if not fenced.update(status=status, error=error, next_attempt_at=now, dispatched_at=now,
                             lease_expires_at=None):
            return False
        activity.attempts.filter(number=activity.attempt).update(
            status=ActivityAttempt.Status.LOST, error=error, finished_at=now
        )
        event_record(workflow=workflow, kind="activity.lease_expired", at=now, operation_id=activity.operation_id,
                     attempt=activity.attempt, next=status)
        if status == Activity.Status.SCHEDULED:
            doorbells.activity_run(activity_id=activity_id, name=activity.name)
        else:
            advance_locked(workflow)
    return True


def activity_note_if_current(*, claim: Claim, kind: str, data: dict[str, Any]) -> bool:
    """Append an event on behalf of a running attempt (e.g. each tool call), fenced like a result.

    Not idempotent: a retried attempt notes its own calls again, under its attempt number.
    """
    events = _checked_notes(claim, [(kind, data)], at=clock.now())
    with transaction.atomic():
        first_seq = event_seq_take(claim.workflow_id, len(events))
        if not _fenced_exists(claim):
            transaction.set_rollback(True)
            return False
        events_insert(claim.workflow_id, first_seq, events)
    return True


def workflow_release_adopt_if_current(*, claim: Claim, release: dict[str, Any], why: str) -> bool:
    """The workflow of a running attempt moves to ``release``: the worker cannot run the recorded
    one (its prompts or tools differ) under the ``revalidate`` policy (``why="worker"``), or a
    sustained overload moves its calls to the fallback model (``why="fallback"``). Recorded as a
    ``release.changed`` event (``where``: why), so the workflow shows what its calls run on.

    Idempotent: a workflow already on that release changes nothing; fenced like a result (False
    once the attempt no longer holds its lease).
    """
    with transaction.atomic():
        workflow = workflow_lock(claim.workflow_id)
        if not _fenced_exists(claim):
            return False
        now = clock.now()
        new = release_ensure(release, at=now)
        if new.pk == workflow.release_id:
            return True
        event_record(workflow=workflow, kind="release.changed", at=now, policy=workflow.release_policy,
                     old=workflow.release.fingerprint, new=new.fingerprint, where=why, model=new.model,
                     operation_id=claim.operation_id, attempt=claim.attempt)
        workflow.release, workflow.release_provisional = new, False
        workflow_save(workflow, "release", "release_provisional", at=now)
    return True
