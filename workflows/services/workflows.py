"""Workflow lifecycle: launch, advance, supersede, cancel (with compensation), resume."""
from __future__ import annotations

import enum
import logging
from datetime import datetime, timedelta
from decimal import Decimal
from typing import Any

from django.conf import settings
from django.db import transaction
from django.db.models import Q

from workflows import clock, doorbells, engine, registry, selectors
from workflows.errors import InvalidInput, NotFound, Permanent, TransitionRefused
from workflows.models import Activity, Checkpoint, Commitment, Intent, Signal, Timer, Wait, Workflow
from workflows.services.common import (
    event_record,
    json_checked,
    release_current,
    text_checked,
    workflow_lock,
    workflow_save,
)

logger = logging.getLogger("agentops.workflows")

MAX_GOAL_CHARS = 10_000
MAX_STEPS_PER_ADVANCE = 100
MAX_HOURS = 24 * 366
MAX_BUDGET_USD = Decimal(10) ** 8
# Compensation activities are recorded under this pseudo-node; no handler replays them.
COMPENSATION_NODE = "CANCEL"


class Outcome(enum.StrEnum):
    """What a call did, so callers never repeat a side effect."""

    APPLIED = "applied"
    ALREADY_APPLIED = "already_applied"
    NOT_RUNNABLE = "not_runnable"
    SUSPENDED = "suspended"


def workflow_launch(
    *,
    kind: str,
    goal: str,
    params: dict[str, Any] | None = None,
    user: Any = None,
    release_policy: str = Workflow.ReleasePolicy.REVALIDATE,
    max_hours: float | None = None,
    priority: int = 5,
    budget_total_usd: Decimal | None = None,
    budget_hourly_usd: Decimal | None = None,
    stagnation_policy: str = Workflow.StagnationPolicy.RECORD,
) -> Workflow:
    """Create a workflow with intent v1 and ring its first advance.

    ``max_hours`` sets a durable deadline: past it, beat cancels the workflow.

    Not idempotent: every call launches a new workflow. Raises InvalidInput for an unknown
    kind, bad parameters or a bad goal, and then writes nothing.
    """
    definition = registry.definition(kind)
    goal = text_checked(goal, what="The goal", max_length=MAX_GOAL_CHARS)
    params = json_checked(definition.validate_params(dict(params or {})), what="The parameters")
    if release_policy not in Workflow.ReleasePolicy.values:
        choices = ", ".join(Workflow.ReleasePolicy.values)
        raise InvalidInput(f"Release policy {release_policy!r} is not one of {choices}.")
    if max_hours is None:
        max_hours = definition.default_max_hours
    if max_hours is not None and not 0 < max_hours <= MAX_HOURS:
        raise InvalidInput(f"The time limit must be between 0 and {MAX_HOURS} hours; got {max_hours}.")
    if stagnation_policy not in Workflow.StagnationPolicy.values:
        choices = ", ".join(Workflow.StagnationPolicy.values)
        raise InvalidInput(f"Stagnation policy {stagnation_policy!r} is not one of {choices}.")
    if not 0 <= priority <= 10:
        raise InvalidInput(f"The priority must be a whole number from 0 to 10; got {priority}.")
    for name, value in (("total", budget_total_usd), ("hourly", budget_hourly_usd)):
        if value is not None and not Decimal(0) < value < MAX_BUDGET_USD:
            raise InvalidInput(f"The {name} budget must be a positive amount of USD under {MAX_BUDGET_USD:,}; "
                               f"got {value}.")
    now = clock.now()
    with transaction.atomic():
        workflow = Workflow(
            kind=kind, definition_version=definition.version, current_node=definition.start_node, params=params,
            release=release_current(at=now), release_policy=release_policy, launched_by=user,
            deadline=now + timedelta(hours=max_hours) if max_hours is not None else None, priority=priority,
            budget_total_usd=budget_total_usd, budget_hourly_usd=budget_hourly_usd,
            stagnation_policy=stagnation_policy, stagnation_window_hours=settings.AGENTOPS_STAGNATION_WINDOW_HOURS,
            created_at=now, updated_at=now,
        )
        workflow.start(at=now)
        workflow.save()
        Intent.objects.create(workflow=workflow, version=1, goal=goal, created_by=user, created_at=now)
        event_record(
            workflow=workflow, kind="workflow.launched", at=now, goal=goal, params=params,
            release=workflow.release.fingerprint, by=_username(user),
        )
        doorbells.workflow_advance(workflow_id=workflow.pk)
    logger.info("workflow.launched", extra={"workflow_id": workflow.pk, "kind": kind})
    return workflow


@transaction.atomic
def workflow_advance_if_runnable(*, workflow_id: int) -> Outcome:
    """Run node handlers until the workflow needs something not yet recorded.

    Idempotent: a no-op unless the workflow is running (or cancelling) under its row lock;
    recorded steps are replayed, never re-run, so a duplicate doorbell changes nothing.
    A doorbell for a workflow that no longer exists is a no-op too.
    """
    try:
        workflow = workflow_lock(workflow_id)
    except NotFound:
        logger.warning("workflow.doorbell.unknown", extra={"workflow_id": workflow_id})
        return Outcome.NOT_RUNNABLE
    return advance_locked(workflow)


def advance_locked(workflow: Workflow) -> Outcome:
    """Advance a workflow whose row lock the caller holds."""
    if workflow.status == Workflow.Status.CANCELLING:
        return _advance_cancellation(workflow)
    if workflow.status != Workflow.Status.RUNNING:
        return Outcome.NOT_RUNNABLE
    definition = registry.definition(workflow.kind)
    goal = selectors.current_goal(workflow)
    for _ in range(MAX_STEPS_PER_ADVANCE):
        now = clock.now()
        activities, waits = selectors.recorded_steps(workflow)
        ctx = engine.NodeContext(selectors.snapshot(workflow, goal), activities, waits)
        try:
            decision = engine.step(definition, ctx)
        except engine.ActivityFailed as exc:
            decision = engine.Fail(str(exc))
        except Permanent as exc:
            decision = engine.Fail(str(exc))
        if isinstance(decision, engine.Suspended):
            if decision.commands and _apply(workflow, decision.commands[0], now=now):
                continue
            return Outcome.SUSPENDED
        if isinstance(decision, engine.Goto):
            enter_node(workflow, decision.node, decision.updates, now=now)
            continue
        if isinstance(decision, engine.Complete):
            _complete(workflow, decision.result, now=now)
        else:
            _fail(workflow, decision.reason, now=now)
        return Outcome.APPLIED
    _fail(workflow, f"More than {MAX_STEPS_PER_ADVANCE} node changes without waiting; the definition loops.", now=now)
    return Outcome.APPLIED


def _apply(workflow: Workflow, command: engine.Command, *, now: datetime) -> bool:
    """Persist a new step; True when the handler can run again at once."""
    if isinstance(command, engine.ScheduleActivity):
        activity_schedule_ensure(workflow=workflow, command=command, now=now)
        return False
    return _wait_open(workflow, command, now=now)


def activity_schedule_ensure(
    *, workflow: Workflow, command: engine.ScheduleActivity, now: datetime, node: str = ""
) -> Activity:
    """Create the activity for ``command.operation_id`` if absent and ring its doorbell.

    Idempotent: unique constraint on ``Activity.operation_id``.
    """
    spec = registry.activity_type(command.name)
    activity, created = Activity.objects.get_or_create(
        operation_id=command.operation_id,
        defaults={
            "workflow": workflow, "name": command.name, "node": node or workflow.current_node,
            "node_visit": workflow.node_visit, "intent_version": workflow.intent_version,
            "input": json_checked(command.input, what=f"Input of activity {command.name}"),
            "max_attempts": spec.retry.max_attempts, "next_attempt_at": now, "dispatched_at": now,
            "created_at": now,
        },
    )
    if created:
        event_record(workflow=workflow, kind="activity.scheduled", at=now, operation_id=activity.operation_id,
                     name=activity.name)
        doorbells.activity_run(activity_id=activity.pk)
    return activity


def _wait_open(workflow: Workflow, command: engine.OpenWait, *, now: datetime) -> bool:
    seconds = command.expires_in_seconds
    expires_at = now + timedelta(seconds=seconds) if seconds is not None else None
    wait, created = Wait.objects.get_or_create(
        operation_id=command.operation_id,
        defaults={
            "workflow": workflow, "kind": command.kind, "node": workflow.current_node,
            "node_visit": workflow.node_visit, "intent_version": workflow.intent_version,
            "candidate": json_checked(command.candidate, what="The candidate"),
            "candidate_hash": command.candidate_hash,
            "required_role": command.required_role, "state_versions": command.state_versions,
            "event_name": command.event_name, "expires_at": expires_at, "timeout_policy": command.timeout_policy,
            "created_at": now,
        },
    )
    if not created:
        return False
    if expires_at is not None:
        purpose = Timer.Purpose.WAKE if wait.kind == Wait.Kind.TIMER else Timer.Purpose.EXPIRE
        Timer.objects.create(workflow=workflow, wait=wait, purpose=purpose, fire_at=expires_at,
                             intent_version=workflow.intent_version)
    event_record(workflow=workflow, kind="wait.opened", at=now, wait_id=wait.pk, wait_kind=wait.kind,
                 candidate_hash=wait.candidate_hash, required_role=wait.required_role,
                 expires_at=expires_at.isoformat() if expires_at else None)
    if wait.kind == Wait.Kind.EVENT:
        signal = Signal.objects.filter(workflow=workflow, name=wait.event_name, consumed_by__isnull=True).first()
        if signal is not None:
            _signal_consume(workflow, wait, signal, now=now)
            return True
    workflow.park(at=now)
    workflow_save(workflow, "status", at=now)
    return False


def enter_node(workflow: Workflow, node: str, updates: dict[str, Any], *, now: datetime) -> None:
    previous = workflow.current_node
    workflow.state = json_checked({**workflow.state, **updates}, what=f"State written by node {previous}")
    workflow.enter_node(node, at=now)
    workflow.checkpoint = Checkpoint.objects.create(
        workflow=workflow, node=node, node_visit=workflow.node_visit, intent_version=workflow.intent_version,
        state=workflow.state, created_at=now,
    )
    event_record(workflow=workflow, kind="node.entered", at=now, node=node, previous=previous,
                 visit=workflow.node_visit)
    workflow_save(workflow, "state", "current_node", "node_visit", "checkpoint", at=now)


def _complete(workflow: Workflow, result: Any, *, now: datetime) -> None:
    for commitment in workflow.commitments.filter(status=Commitment.Status.ACTIVE):
        commitment.release(at=now)
        commitment.save(update_fields=["status", "closed_at"])
        event_record(workflow=workflow, kind="commitment.released", at=now, commitment_id=commitment.pk,
                     commitment_kind=commitment.kind)
    workflow.complete(at=now, result=json_checked(result, what="The workflow result"))
    event_record(workflow=workflow, kind="workflow.completed", at=now)
    workflow_save(workflow, "status", "result", at=now)


def _fail(workflow: Workflow, reason: str, *, now: datetime) -> None:
    workflow.fail(at=now, reason=reason)
    event_record(workflow=workflow, kind="workflow.failed", at=now, reason=reason)
    workflow_save(workflow, "status", "reason", at=now)


def wake_locked(workflow: Workflow, *, now: datetime, cause: str) -> None:
    """Resume a waiting or paused workflow and check its behavioral release (per its policy)."""
    workflow.wake(at=now)
    event_record(workflow=workflow, kind="workflow.woken", at=now, cause=cause)
    workflow_save(workflow, "status", at=now)
    doorbells.workflow_advance(workflow_id=workflow.pk)
    # Work parked while the workflow was paused has no doorbell in flight.
    for pk in workflow.activities.filter(status=Activity.Status.SCHEDULED, next_attempt_at__lte=now).values_list(
        "pk", flat=True
    ):
        doorbells.activity_run(activity_id=pk)
    current = release_current(at=now)
    if current.pk == workflow.release_id:
        return
    policy = workflow.release_policy
    event_record(workflow=workflow, kind="release.changed", at=now, policy=policy,
                 old=workflow.release.fingerprint, new=current.fingerprint)
    if policy == Workflow.ReleasePolicy.FAIL:
        _fail(workflow, f"The behavioral release changed from {workflow.release} to {current} while the "
                        "workflow waited, and its release policy is 'fail'.", now=now)
    elif policy == Workflow.ReleasePolicy.REVALIDATE:
        workflow.release = current
        workflow_save(workflow, "release", at=now)
        # A rejection, or an expiry whose policy is fail, is final: the node's handler must see it
        # instead of being sent back to rebuild a candidate and ask again.
        final = workflow.waits.filter(node_visit=workflow.node_visit).filter(
            Q(decision=Wait.Decision.REJECTED) | Q(status=Wait.Status.EXPIRED, timeout_policy="fail")
        )
        if not final.exists():
            enter_node(workflow, registry.definition(workflow.kind).revalidate_node, {}, now=now)


def _signal_consume(workflow: Workflow, wait: Wait, signal: Signal, *, now: datetime) -> None:
    wait.satisfy(at=now, payload=signal.payload)
    wait.version += 1
    wait.save(update_fields=["status", "decided_at", "payload", "version"])
    signal.consumed_by = wait
    signal.save(update_fields=["consumed_by"])
    event_record(workflow=workflow, kind="wait.satisfied", at=now, wait_id=wait.pk, signal=signal.name)


@transaction.atomic
def workflow_signal(*, workflow_id: int, name: str, payload: Any = None, dedupe_key: str = "") -> Outcome:
    """Deliver a named event; it satisfies an open event wait for that name, now or later.

    Idempotent per ``dedupe_key``: unique constraint ``uniq_signal_dedupe``; a repeated key
    returns ALREADY_APPLIED. Without a key, every delivery is a new signal.
    """
    name = text_checked(name, what="The signal name", max_length=100)
    payload = json_checked(payload, what="The signal payload")
    workflow = workflow_lock(workflow_id)
    if workflow.is_terminal:
        raise TransitionRefused(f"Workflow {workflow_id} is {workflow.status}; it takes no more signals.")
    now = clock.now()
    key = dedupe_key or f"auto-{workflow.event_seq + 1}"
    if Signal.objects.filter(workflow=workflow, dedupe_key=key).exists():
        return Outcome.ALREADY_APPLIED
    signal = Signal.objects.create(workflow=workflow, name=name, payload=payload, dedupe_key=key, received_at=now)
    event_record(workflow=workflow, kind="signal.received", at=now, name=name, dedupe_key=key)
    wait = workflow.waits.filter(kind=Wait.Kind.EVENT, status=Wait.Status.OPEN, event_name=name).first()
    if wait is not None:
        _signal_consume(workflow, wait, signal, now=now)
        wake_locked(workflow, now=now, cause=f"signal {name}")
    return Outcome.APPLIED


@transaction.atomic
def workflow_supersede(*, workflow_id: int, goal: str, user: Any = None) -> Intent:
    """Record a new intent version; old waits are invalidated and the workflow revalidates.

    Not idempotent: each call adds an intent version. Timers of the old version stay in
    place and are recorded as ignored when they fire.
    """
    goal = text_checked(goal, what="The goal", max_length=MAX_GOAL_CHARS)
    workflow = workflow_lock(workflow_id)
    if workflow.is_terminal or workflow.status == Workflow.Status.CANCELLING:
        raise TransitionRefused(f"Workflow {workflow_id} is {workflow.status}; its goal can no longer change.")
    now = clock.now()
    old = workflow.intent_version
    Intent.objects.filter(workflow=workflow, version=old).update(superseded_at=now)
    intent = Intent.objects.create(workflow=workflow, version=old + 1, goal=goal, created_by=user, created_at=now)
    workflow.intent_version = old + 1
    workflow_save(workflow, "intent_version", at=now)
    for wait in workflow.waits.filter(status=Wait.Status.OPEN):
        wait.invalidate(at=now)
        wait.save(update_fields=["status", "decided_at"])
        event_record(workflow=workflow, kind="wait.invalidated", at=now, wait_id=wait.pk, reason="intent superseded")
    workflow.activities.filter(status=Activity.Status.SCHEDULED, intent_version=old).update(
        status=Activity.Status.CANCELLED, error=f"intent v{old} superseded", completed_at=now
    )
    event_record(workflow=workflow, kind="intent.superseded", at=now, old=old, new=old + 1, by=_username(user))
    if workflow.status == Workflow.Status.WAITING:
        workflow.wake(at=now)
        workflow_save(workflow, "status", at=now)
    enter_node(workflow, registry.definition(workflow.kind).revalidate_node, {}, now=now)
    doorbells.workflow_advance(workflow_id=workflow.pk)
    return intent


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
    return _cancel_locked(workflow, reason or "cancelled by an operator", by=_username(user), now=clock.now())


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
    return _advance_cancellation(workflow)


def _advance_cancellation(workflow: Workflow) -> Outcome:
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


def _compensations_retry(workflow: Workflow, *, now: datetime) -> int:
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


@transaction.atomic
def workflow_resume(*, workflow_id: int, user: Any = None) -> Outcome:
    """Resume a paused workflow, retry a cancelling workflow's failed compensations, or re-ring
    a running one whose doorbell may be lost.

    Idempotent: resuming a running workflow only rings its doorbell again; only failed
    compensations get new attempts (conditional UPDATE on status=failed).
    Raises TransitionRefused for waiting and terminal workflows, naming what they wait for.
    """
    workflow = workflow_lock(workflow_id)
    now = clock.now()
    if workflow.status == Workflow.Status.PAUSED:
        wake_locked(workflow, now=now, cause=f"resumed by {_username(user) or 'an operator'}")
        return Outcome.APPLIED
    if workflow.status == Workflow.Status.CANCELLING and _compensations_retry(workflow, now=now):
        return Outcome.APPLIED
    if workflow.status in (Workflow.Status.RUNNING, Workflow.Status.CANCELLING):
        doorbells.workflow_advance(workflow_id=workflow.pk)
        return Outcome.ALREADY_APPLIED
    if workflow.status == Workflow.Status.WAITING:
        waits = ", ".join(f"{w.kind} wait {w.pk}" for w in workflow.waits.filter(status=Wait.Status.OPEN))
        raise TransitionRefused(
            f"Workflow {workflow_id} is waiting on {waits or 'a wait'}; decide or signal it instead."
        )
    raise TransitionRefused(f"Workflow {workflow_id} is {workflow.status}; it cannot be resumed.")


def _username(user: Any) -> str:
    return getattr(user, "username", "") or ""
