"""The steps every workflow service is made of: schedule, wait, enter a node, finish, wake."""
from __future__ import annotations

import enum
import uuid
from dataclasses import dataclass
from datetime import datetime, timedelta
from decimal import Decimal
from typing import Any

from django.conf import settings
from django.db.models import Q

from workflows import doorbells, engine, registry
from workflows.errors import InvalidInput
from workflows.leases import Claim
from workflows.models import Activity, ActivityAttempt, Checkpoint, Commitment, Signal, Timer, Wait, Workflow
from workflows.services.common import (
    event_record,
    json_checked,
    release_current,
    workflow_save,
)

MAX_GOAL_CHARS = 10_000
MAX_STEPS_PER_ADVANCE = 100
MAX_HOURS = 24 * 366
MAX_BUDGET_USD = Decimal(10) ** 8
# The reason texts of a pause start with these, for people; code reads ``Workflow.pause_cause``.
BUDGET_PAUSE_PREFIX = "Budget exhausted"
STAGNATION_PAUSE_PREFIX = "Stagnating:"
# Compensation activities are recorded under this pseudo-node; no handler replays them.
COMPENSATION_NODE = "CANCEL"


class Outcome(enum.StrEnum):
    """What a call did, so callers never repeat a side effect."""

    APPLIED = "applied"
    ALREADY_APPLIED = "already_applied"
    NOT_RUNNABLE = "not_runnable"
    SUSPENDED = "suspended"
    HANDLER_FAILED = "handler_failed"


@dataclass
class ChainSlot:
    """Room for the next activity a result schedules, to be run at once by the worker that
    recorded the result: claimed in the result's own transaction, so no doorbell is sent."""

    worker: str
    task_id: str
    claim: Claim | None = None


def activity_schedule_ensure(
    *, workflow: Workflow, command: engine.ScheduleActivity, now: datetime, node: str = ""
) -> Activity:
    """Create the activity for ``command.operation_id`` if absent (see ``activity_schedule``).

    Idempotent: looked up by operation id under the workflow's row lock, which every insert of
    the workflow's activities holds; the unique constraint on ``Activity.operation_id`` backs it.
    """
    activity = Activity.objects.filter(operation_id=command.operation_id).first()
    if activity is not None:
        return activity
    return activity_schedule(workflow=workflow, command=command, now=now, node=node)


def activity_schedule(
    *, workflow: Workflow, command: engine.ScheduleActivity, now: datetime, node: str = "",
    chain: ChainSlot | None = None,
) -> Activity:
    """Create the activity and ring its doorbell, or, given an empty ``chain`` slot, claim its
    first attempt for the caller instead.

    Not idempotent by itself: the caller has seen, under the workflow's row lock, that no
    activity has this operation id (the engine asks only for steps it found unrecorded); the
    unique constraint on ``Activity.operation_id`` refuses a second one.
    """
    spec = registry.activity_type(command.name)
    activity = Activity(
        workflow=workflow, name=command.name, node=node or workflow.current_node, node_visit=workflow.node_visit,
        intent_version=workflow.intent_version,
        input=json_checked(command.input, what=f"Input of activity {command.name}"),
        max_attempts=spec.retry.max_attempts, next_attempt_at=now, dispatched_at=now, created_at=now,
        operation_id=command.operation_id,
    )
    slot = chain if chain is not None and chain.claim is None else None
    if slot is not None:
        activity.status, activity.attempt, activity.heartbeat_at = Activity.Status.RUNNING, 1, now
        activity.lease_token, activity.lease_expires_at = uuid.uuid4().hex, lease_expiry(spec, now)
    activity.save(force_insert=True)
    event_record(workflow=workflow, kind="activity.scheduled", at=now, operation_id=activity.operation_id,
                 name=activity.name)
    if slot is not None:
        slot.claim = attempt_start(workflow, activity, worker=slot.worker, task_id=slot.task_id, now=now)
    else:
        doorbells.activity_run(activity_id=activity.pk)
    return activity


def lease_expiry(spec: registry.ActivityType[Any, Any], now: datetime) -> datetime:
    return now + timedelta(seconds=spec.lease_seconds or settings.AGENTOPS_LEASE_SECONDS)


def attempt_start(workflow: Workflow, activity: Activity, *, worker: str, task_id: str, now: datetime,
                  previous_lost: bool = False) -> Claim:
    """Record the attempt an activity row was just claimed for (status running, ``attempt``,
    ``lease_token`` already written) and the fencing token its result must present."""
    ActivityAttempt.objects.create(activity=activity, number=activity.attempt, lease_token=activity.lease_token,
                                   worker=worker, task_id=task_id, started_at=now)
    event_record(workflow=workflow, kind="activity.started", at=now, operation_id=activity.operation_id,
                 attempt=activity.attempt, worker=worker)
    return Claim(
        activity_id=activity.pk, workflow_id=workflow.pk, operation_id=activity.operation_id, name=activity.name,
        attempt=activity.attempt, lease_token=activity.lease_token, input=activity.input,
        previous_attempt_lost=previous_lost, checkpoint=activity.checkpoint,
        definition_version=workflow.definition_version,
    )


# The text fields of ``OpenWait`` that are stored in columns of that name on ``Wait``.
WAIT_TEXT_FIELDS = ("operation_id", "kind", "candidate_hash", "required_role", "event_name", "timeout_policy")


def wait_open(workflow: Workflow, command: engine.OpenWait, *, now: datetime) -> bool:
    """Open the wait ``command`` asks for (True when a signal already satisfied it).

    Raises InvalidInput, before writing anything, for a value longer than its column.
    """
    wait_check_lengths(workflow, command)
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
            signal_consume(workflow, wait, signal, now=now)
            return True
    workflow.park(at=now)
    workflow_save(workflow, "status", at=now)
    return False


def wait_check_lengths(workflow: Workflow, command: engine.OpenWait) -> None:
    """Refuse a text of ``command`` longer than its column (PostgreSQL would raise DataError)."""
    for name in WAIT_TEXT_FIELDS:
        value = getattr(command, name)
        limit = Wait._meta.get_field(name).max_length
        if limit is not None and len(value) > limit:
            raise InvalidInput(
                f"Node {workflow.current_node} of workflow {workflow.pk} opens a {command.kind} wait whose {name} "
                f"is {len(value)} characters long; the limit is {limit}. Shorten it; when it comes from a launch "
                "parameter, the definition's validate_params should refuse it at launch.",
                workflow_id=workflow.pk, field=name,
            )


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


def complete_locked(workflow: Workflow, result: Any, *, now: datetime) -> None:
    for commitment in workflow.commitments.filter(status=Commitment.Status.ACTIVE):
        commitment.release(at=now)
        commitment.save(update_fields=["status", "closed_at"])
        event_record(workflow=workflow, kind="commitment.released", at=now, commitment_id=commitment.pk,
                     commitment_kind=commitment.kind)
    workflow.complete(at=now, result=json_checked(result, what="The workflow result"))
    event_record(workflow=workflow, kind="workflow.completed", at=now)
    workflow_save(workflow, "status", "result", at=now)


def fail_locked(workflow: Workflow, reason: str, *, now: datetime) -> None:
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
        fail_locked(workflow, f"The behavioral release changed from {workflow.release} to {current} while the "
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


def signal_consume(workflow: Workflow, wait: Wait, signal: Signal, *, now: datetime) -> None:
    wait.satisfy(at=now, payload=signal.payload)
    wait.version += 1
    wait.save(update_fields=["status", "decided_at", "payload", "version"])
    signal.consumed_by = wait
    signal.save(update_fields=["consumed_by"])
    event_record(workflow=workflow, kind="wait.satisfied", at=now, wait_id=wait.pk, signal=signal.name)



def username_of(user: Any) -> str:
    return getattr(user, "username", "") or ""

