"""Running activity attempts: claim under a lease, execute, record the result exactly once."""
from __future__ import annotations

import logging
import threading
import time
from collections.abc import Sequence
from datetime import datetime, timedelta
from typing import Any

from django.conf import settings
from django.db import transaction

from workflows import clock, doorbells, faults, lane, registry, statestore, telemetry
from workflows.activity_context import ActivityContext
from workflows.errors import InvalidInput, Refused
from workflows.leases import Claim
from workflows.models import Activity, ActivityAttempt, Commitment, Workflow
from workflows.progress import progress_validate
from workflows.services import lifecycle, slots
from workflows.services.budgets import pause_for_budget_locked
from workflows.services.common import (
    Appended,
    event_record,
    events_batched,
    release_ensure,
    workflow_lock,
    workflow_save,
)
from workflows.services.lifecycle import RunOutcome
from workflows.services.progress import progress_record_once
from workflows.services.steps import (
    COMPENSATION_NODE,
    ChainSlot,
    commitment_compensated_by,
    uncertain_commitments_ensure,
)
from workflows.services.workflows import AdvanceRaised, advance_locked
from workflows.sql import RowWrite, row_get
from workflows.statestore import json_checked
from workflows.tenancy import workflow_tenant

logger = logging.getLogger("agentops.activities")


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
    with lane.turn(new_work=True):  # the activity function runs outside it (_attempt_run)
        claim = activity_claim_if_runnable(activity_id=activity_id, worker=worker, task_id=task_id)
        if claim is None:
            return RunOutcome.SKIPPED
        window = settings.AGENTOPS_ACTIVITY_CHAIN_SECONDS
        if io_chain_seconds is not None and registry.activity_type(claim.name).io_bound:
            window = io_chain_seconds
        chain_until = time.monotonic() + window
        lease = DatabaseLease()
        while True:
            outcome, chained = _attempt_run(claim, lease, worker=worker, task_id=task_id, chain_until=chain_until)
            if chained is None or chained.claim is None:
                return outcome
            claim, lease = chained.claim, DatabaseLease(unsteered_at=chained.unsteered_at)


def _attempt_run(claim: Claim, lease: DatabaseLease, *, worker: str, task_id: str,
                 chain_until: float) -> tuple[RunOutcome, ChainSlot | None]:
    """Run one claimed attempt and record its outcome; also the slot holding the claim of the
    next activity when the result's advance scheduled one before ``chain_until``."""
    spec = registry.activity_type(claim.name)
    ctx = ActivityContext(claim=claim, lease=lease)
    with telemetry.span(f"activity {claim.name}", workflow_id=claim.workflow_id, attributes={
            "agentops.workflow.id": claim.workflow_id, "agentops.activity.name": claim.name,
            "agentops.operation_id": claim.operation_id, "agentops.attempt": claim.attempt,
            "agentops.worker": worker}) as span:
        ctx.faultpoint("activity.after_claim")
        try:
            with lane.waiting():
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
    return outcome, chain


def _execute(spec: registry.ActivityType[Any, Any], ctx: ActivityContext) -> Any:
    if ctx.claim.previous_attempt_lost:
        found = spec.reconcile_json(ctx, ctx.claim.input)
        if found is not None:
            ctx.reconciled = True
            return found
    return spec.execute(ctx, ctx.claim.input)


# How long a checkpoint's word that its workflow has no steer message answers the attempt's next
# steering question (``DatabaseLease.steering``): the next model call's, asked right after it.
STEER_PROBE_SECONDS = 1.0


class DatabaseLease:
    """The lease of an attempt running on a worker: each call is a fenced write (see the services
    below). A checkpoint also tells whether the workflow has any steer message; when it has none,
    the steering question that follows it within STEER_PROBE_SECONDS (the next model call's, on
    every turn of a tool loop) is answered from that, without a statement of its own. So does the
    row lock of the result that chained this attempt (``unsteered_at``), for its first question."""

    def __init__(self, *, unsteered_at: float | None = None) -> None:
        # time.monotonic() of a checkpoint, or of the chaining result's row lock, that found no steer message
        self._unsteered_at = unsteered_at

    @property
    def fence_in_sql(self) -> bool:
        return True

    def heartbeat(self, claim: Claim, detail: str) -> bool:
        return activity_heartbeat_if_current(claim=claim, detail=detail)

    def checkpoint(self, claim: Claim, state: dict[str, Any], detail: str,
                   notes: Sequence[tuple[str, dict[str, Any]]] = ()) -> bool:
        with lane.turn():
            saved = _checkpoint(claim, state, detail, notes, steer_probe=True)
        self._unsteered_at = time.monotonic() if saved.steer_messages is False else None
        return saved.ok

    def note(self, claim: Claim, kind: str, data: dict[str, Any], also: RowWrite | None = None) -> bool:
        with lane.turn():
            return activity_note_if_current(claim=claim, kind=kind, data=data, also=also)

    def adopt_release(self, claim: Claim, release: dict[str, Any], why: str) -> bool:
        with lane.turn():
            return workflow_release_adopt_if_current(claim=claim, release=release, why=why)

    def steering(self, claim: Claim, call: int) -> list[dict[str, Any]] | None:
        from workflows.services.steering import steering_take_if_current

        unsteered_at, self._unsteered_at = self._unsteered_at, None  # answers one question
        if unsteered_at is not None and time.monotonic() - unsteered_at < STEER_PROBE_SECONDS:
            return []
        with lane.turn():
            return steering_take_if_current(claim=claim, call=call)


@transaction.atomic
def activity_claim_if_runnable(*, activity_id: int, worker: str, task_id: str) -> Claim | None:
    """Start attempt n+1 if the activity is scheduled and due; None otherwise (recorded as ignored).

    Idempotent: conditional UPDATE on (status=scheduled, attempt, due) under the workflow's row lock.
    """
    activity = row_get(Activity, activity_id)
    if activity is None:
        logger.warning("activity.doorbell.unknown", extra={"activity_id": activity_id})
        return None
    now = clock.now()
    workflow = workflow_lock(activity.workflow_id)
    spec = registry.activity_type(activity.name)
    # A paused workflow (e.g. out of budget) starts no new attempts until a person resumes it;
    # compensations still run: they undo effects and spend no budget.
    paused = workflow.status == Workflow.Status.PAUSED and activity.node != COMPENSATION_NODE
    previous = activity.attempt
    tenant = workflow_tenant(workflow)
    # A compensation is never held back by a concurrency key: it undoes effects.
    admission = slots.ADMITTED if paused or activity.node == COMPENSATION_NODE else slots.admit(
        workflow, activity, tenant=tenant, now=now)
    if not admission.admitted:
        return None  # waiting for a concurrency slot: rung when one is handed to it
    claimed = not paused and lifecycle.activity_claim_if_due(activity, spec=spec, now=now, tenant=tenant)
    if not claimed:
        current = Activity.objects.values_list("status", flat=True).get(pk=activity_id)
        event_record(workflow=workflow, kind="activity.doorbell_ignored", at=now, operation_id=activity.operation_id,
                     status="workflow paused" if paused else current, worker=worker)
        return None
    previous_lost = previous > 0 and activity.attempts.filter(
        number=previous, status=ActivityAttempt.Status.LOST
    ).exists()
    return lifecycle.attempt_start(workflow, activity, worker=worker, task_id=task_id, now=now,
                                   previous_lost=previous_lost, slot_waited_ms=admission.waited_ms)


def _refuse_stale(workflow: Workflow, claim: Claim) -> RunOutcome:
    lifecycle.attempt_discard(claim, now=clock.now())
    event_record(workflow=workflow, kind="activity.stale_result_discarded", at=clock.now(),
                 operation_id=claim.operation_id, attempt=claim.attempt)
    logger.warning("activity.stale_writer_rejected", extra={"operation_id": claim.operation_id})
    return RunOutcome.STALE


def activity_result_record_if_current(
    *, claim: Claim, result: Any, reconciled: bool = False, chain: ChainSlot | None = None
) -> RunOutcome:
    """Record the result once and advance the workflow in the same transaction; ``chain``
    receives the claim of the next activity the advance schedules, if any.

    Idempotent: conditional UPDATE on (status=running, attempt, lease_token); a second
    write, or a write by a superseded attempt, updates no row and is recorded as stale.

    The advance runs without a savepoint of its own: when the workflow's definition code
    raises, the transaction is rolled back and done again with the savepoint, which keeps the
    result and records the failure (``advance_locked``).
    """
    try:
        return _result_record(claim=claim, result=result, reconciled=reconciled, chain=chain, savepoint=False)
    except AdvanceRaised:
        if chain is not None:  # its claim was rolled back with the rest
            chain.claim, chain.unsteered_at = None, None
        return _result_record(claim=claim, result=result, reconciled=reconciled, chain=chain, savepoint=True)


@transaction.atomic
def _result_record(*, claim: Claim, result: Any, reconciled: bool, chain: ChainSlot | None,
                   savepoint: bool) -> RunOutcome:
    workflow = workflow_lock(claim.workflow_id, advance=True)
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
    visit = lifecycle.activity_succeed_if_current(claim, result=stored.value, now=now, visit=workflow.node_visit)
    if visit is None:
        return _refuse_stale(workflow, claim)
    statestore.blobs_store(workflow.pk, stored.blobs, node_visit=workflow.node_visit, now=now)
    if spec.commitment:
        Commitment.objects.get_or_create(
            activity_id=claim.activity_id,
            defaults={"workflow": workflow, "kind": spec.commitment, "compensation": spec.compensation,
                      "data": result if isinstance(result, dict) else {"result": result}, "created_at": now,
                      # Its attempt was fenced to the current visit, so to the current intent.
                      "intent_version": workflow.intent_version},
        )
    if spec.records_progress:
        sample = progress_record_once(workflow=workflow, operation_id=claim.operation_id, result=result, now=now)
        event_record(workflow=workflow, kind="progress.sampled", at=now, percent=sample.percent,
                     confidence=sample.confidence)
    with events_batched(workflow):
        event_record(workflow=workflow, kind="activity.succeeded", at=now, operation_id=claim.operation_id,
                     attempt=claim.attempt, reconciled=reconciled)
        commitment_compensated_by(workflow, operation_id=claim.operation_id, input=claim.input, now=now)
        advance_locked(workflow, chain=chain, savepoint=savepoint, recorded=visit)
    faults.faultpoint("transition.before_commit", workflow_id=workflow.pk, operation_id=claim.operation_id,
                      activity=claim.name, attempt=claim.attempt)
    return RunOutcome.RECORDED


@transaction.atomic
def activity_failure_record_if_current(*, claim: Claim, error: BaseException) -> RunOutcome:
    """Open a retry window, pause for budget or fail the activity, as ``lifecycle.failure_judge``
    decides; fenced like a result."""
    workflow = workflow_lock(claim.workflow_id)
    return _record_failure_locked(workflow, claim, error, retryable=lifecycle.failure_retryable(claim, error))


def _record_failure_locked(workflow: Workflow, claim: Claim, error: BaseException, *, retryable: bool) -> RunOutcome:
    now = clock.now()
    max_attempts, node = Activity.objects.values_list("max_attempts", "node").get(pk=claim.activity_id)
    verdict = lifecycle.failure_judge(claim, error, retryable=retryable, max_attempts=max_attempts)
    if not lifecycle.failure_apply_if_current(claim, verdict, max_attempts=max_attempts, now=now):
        return _refuse_stale(workflow, claim)
    if verdict.outcome == RunOutcome.PAUSED:
        pause_for_budget_locked(workflow, error, now=now)
        return RunOutcome.PAUSED
    retry_at = {} if verdict.retry_after_seconds is None else {
        "retry_at": (now + timedelta(seconds=verdict.retry_after_seconds)).isoformat(),
        "max_attempts": max_attempts + verdict.refunded}
    event_record(workflow=workflow, kind=f"activity.{verdict.outcome.value}", at=now, operation_id=claim.operation_id,
                 attempt=claim.attempt, error=verdict.message[:500], **retry_at)
    if verdict.outcome == RunOutcome.FAILED:
        if node != COMPENSATION_NODE:
            _failure_may_have_acted(workflow, claim.activity_id, claim.name, now=now)
        if node == COMPENSATION_NODE and workflow.status != Workflow.Status.CANCELLING:
            # An effect nothing undoes: the admin and `agent show` list the active commitment, and
            # `manage.py agent resume` tries the compensation again. (Cancellation says so in the
            # workflow's reason.)
            event_record(workflow=workflow, kind="compensation.failed", at=now, operation_id=claim.operation_id)
        advance_locked(workflow)
    return verdict.outcome


def activity_heartbeat_if_current(*, claim: Claim, detail: str = "") -> bool:
    """Extend the lease of a running attempt. False when the attempt is fenced off or cancelled.

    Idempotent: conditional UPDATE on (status=running, attempt, lease_token).
    """
    return lifecycle.lease_extend_if_current(claim, now=clock.now(), detail=detail)


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
    return bool(_checkpoint(claim, state, detail, notes))


def _checkpoint(claim: Claim, state: dict[str, Any], detail: str, notes: Sequence[tuple[str, dict[str, Any]]], *,
                steer_probe: bool = False) -> Appended:
    if not isinstance(state, dict):
        raise InvalidInput(f"A checkpoint of {claim.name} must be a JSON object; got {type(state).__name__}.")
    state = json_checked(state, what=f"The checkpoint of activity {claim.name}")
    now = clock.now()
    events = [*_checked_notes(claim, notes, at=now),
              ("activity.checkpointed", now, _attempt_data(claim, {"detail": detail[:200]}))]
    return lifecycle.notes_if_current(claim, events, checkpoint=(state, detail, now), steer_probe=steer_probe)


def _attempt_data(claim: Claim, data: dict[str, Any]) -> dict[str, Any]:
    return {"operation_id": claim.operation_id, "attempt": claim.attempt, **data}


def _checked_notes(claim: Claim, notes: Sequence[tuple[str, dict[str, Any]]], *,
                   at: datetime) -> list[tuple[str, datetime, dict[str, Any]]]:
    return [(kind, at, _attempt_data(claim, json_checked(data, what=f"The {kind} note"))) for kind, data in notes]


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
        status = lifecycle.activity_lease_expire(activity, kind=workflow.kind, now=now)
        if status is None:
            return False
        event_record(workflow=workflow, kind="activity.lease_expired", at=now, operation_id=activity.operation_id,
                     attempt=activity.attempt, next=status)
        if status == Activity.Status.SCHEDULED:
            doorbells.activity_run(activity_id=activity_id, name=activity.name)
        else:
            if activity.node != COMPENSATION_NODE:
                _failure_may_have_acted(workflow, activity_id, activity.name, now=now)
            advance_locked(workflow)
    return True


def _failure_may_have_acted(workflow: Workflow, activity_id: int, name: str, *, now: datetime) -> None:
    """An activity that declares a commitment failed: one of its attempts may have acted before it
    failed or was cut off, so the effect is recorded as an uncertain commitment now, in the
    failure's transaction. Whichever way the workflow goes on (its handler may catch the failure),
    that effect is undone: by a cancel, a failure or a new goal as any active commitment is, and
    by its completion (``complete_locked``), since its path went on without it."""
    if registry.activity_type(name).commitment:
        uncertain_commitments_ensure(workflow, now=now, activity_ids=[activity_id])


def activity_note_if_current(*, claim: Claim, kind: str, data: dict[str, Any], also: RowWrite | None = None) -> bool:
    """Append an event on behalf of a running attempt (e.g. each tool call), fenced like a result;
    ``also`` (a model call's charge) is written whether or not the attempt still holds its lease,
    in the same statement on PostgreSQL.

    Not idempotent: a retried attempt notes its own calls again, under its attempt number.
    """
    return bool(lifecycle.notes_if_current(claim, _checked_notes(claim, [(kind, data)], at=clock.now()), also=also))


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
        if not lifecycle.fence_holds(claim):
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
