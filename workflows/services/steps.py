"""The steps every workflow service is made of: schedule, wait, enter a node, finish, wake."""
from __future__ import annotations

import enum
import functools
import time
from collections.abc import Iterable
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from django.db import transaction

from workflows import doorbells, engine, registry, selectors, telemetry
from workflows.installation import idempotency_key_for
from workflows.leases import Claim
from workflows.models import Activity, Commitment, Signal, Wait, Workflow
from workflows.rules import compensation_operation_id
from workflows.services import lifecycle, slots
from workflows.services.common import (
    event_record,
)
from workflows.services.lifecycle import LIVE
from workflows.sql import rows_select
from workflows.statestore import json_checked
from workflows.tenancy import workflow_tenant

MAX_GOAL_CHARS = 10_000
MAX_STEPS_PER_ADVANCE = 100
MAX_HOURS = 24 * 366
# The reason text of a stagnation pause starts with this, for people; code reads ``Workflow.pause_cause``.
STAGNATION_PAUSE_PREFIX = "Stagnating:"
# Compensation activities are recorded under this pseudo-node; no handler replays them.
COMPENSATION_NODE = "CANCEL"


class Outcome(enum.StrEnum):
    """What a call did, so callers never repeat a side effect."""

    APPLIED = "applied"
    ALREADY_APPLIED = "already_applied"
    # A signal no wait received yet: kept, in order, for the next wait of its name.
    QUEUED = "queued"
    NOT_RUNNABLE = "not_runnable"
    SUSPENDED = "suspended"
    HANDLER_FAILED = "handler_failed"


@dataclass(frozen=True)
class Result:
    """What a workflow service did: ``outcome`` for code, ``message`` for a person (the command
    line and the admin show it as it is), and the workflow as the call left it."""

    outcome: Outcome
    message: str
    workflow_id: int
    status: str
    intent_version: int

    def to_json(self) -> dict[str, Any]:
        """The answer of ``agent signal|supersede|cancel|resume --json`` and of the HTTP API."""
        return {"id": self.workflow_id, "outcome": self.outcome.value, "status": self.status,
                "intent_version": self.intent_version, "message": self.message}

    @classmethod
    def of(cls, workflow: Workflow, outcome: Outcome, message: str) -> Result:
        return cls(outcome=outcome, message=message, workflow_id=workflow.pk, status=workflow.status,
                   intent_version=workflow.intent_version)


@dataclass
class ChainSlot:
    """Room for the next activity a result schedules, to be run at once by the worker that
    recorded the result: claimed in the result's own transaction, so no doorbell is sent.
    Only an activity of the same queue as the one that finished (``io_bound`` alike) takes it:
    a prefork process must not sit through a model call, nor a threads worker run CPU work."""

    worker: str
    task_id: str
    io_bound: bool = False
    claim: Claim | None = None
    # time.monotonic() when the row lock of the result that claimed it found no steer message on
    # the workflow: the attempt's first steering question is answered from that (DatabaseLease).
    unsteered_at: float | None = None


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
    node_visit: int | None = None, chain: ChainSlot | None = None,
) -> Activity:
    """Create the activity and ring its doorbell, or, given an empty ``chain`` slot, claim its
    first attempt for the caller instead. ``node`` and ``node_visit`` default to the workflow's
    current ones (a pseudo-node's activities, which no handler replays, pass their own).

    Not idempotent by itself: the caller has seen, under the workflow's row lock, that no
    activity has this operation id (the engine asks only for steps it found unrecorded); the
    unique constraint on ``Activity.operation_id`` refuses a second one.
    """
    spec = registry.activity_type(command.name)
    activity = Activity(
        workflow=workflow, kind=workflow.kind, name=command.name, node=node or workflow.current_node,
        node_visit=workflow.node_visit if node_visit is None else node_visit,
        intent_version=workflow.intent_version,
        input=json_checked(command.input, what=f"Input of activity {command.name}"),
        max_attempts=spec.retry.max_attempts, next_attempt_at=now, dispatched_at=now, created_at=now,
        operation_id=command.operation_id, idempotency_key=idempotency_key_for(command.operation_id),
    )
    slot = chain if chain is not None and chain.claim is None and chain.io_bound == spec.io_bound else None
    tenant = workflow_tenant(workflow) if slot is not None else ""
    if slot is not None and slots.capped(tenant, workflow.kind):
        slot = None  # under a concurrency key: it takes its turn for a slot through its doorbell
    if slot is None:
        lifecycle.activity_insert(activity)
    event_record(workflow=workflow, kind="activity.scheduled", at=now, operation_id=activity.operation_id,
                 name=activity.name)
    if slot is not None:  # inserted with its first attempt, which it records after the event above
        slot.claim = lifecycle.activity_insert_claimed(workflow, activity, spec=spec, now=now, tenant=tenant,
                                                       worker=slot.worker, task_id=slot.task_id)
        slot.unsteered_at = time.monotonic() if workflow.steered_read is False else None
    else:
        doorbells.activity_run(activity_id=activity.pk, name=activity.name)
    return activity


def child_commitments_adopt(workflow: Workflow, *, now: datetime) -> int:
    """Take over the active commitments of ``workflow``'s completed children (a completed child
    keeps them for its parent: ``complete_locked``), oldest first, each recorded
    (``commitment.adopted``) and serving the intent its child was started under. The caller holds
    the workflow's row lock; a completed child changes no more, so its rows need no lock of its own.
    Returns how many it took over.

    Idempotent: a commitment taken over belongs to this workflow, no longer to the child.
    """
    if workflow.child_waits_open is False:
        # Read with the row lock (an advance): no child wait open, so every child's end was
        # collected, and collecting adopts.
        return 0
    handed = list(Commitment.objects.filter(
        status=Commitment.Status.ACTIVE, workflow__parent_id=workflow.pk, workflow__status=Workflow.Status.COMPLETED,
    ).select_related("workflow__parent_wait", "activity").order_by("created_at", "pk"))
    for commitment in handed:
        child = commitment.workflow
        wait = child.parent_wait
        commitment.handed_over_by = child
        commitment.workflow = workflow
        commitment.intent_version = wait.intent_version if wait is not None else workflow.intent_version
        commitment.save(update_fields=["handed_over_by", "workflow", "intent_version"])
        event_record(workflow=workflow, kind="commitment.adopted", at=now, commitment_id=commitment.pk,
                     commitment_kind=commitment.kind, child=child.pk, operation_id=commitment.activity.operation_id)
    return len(handed)


def commitments_compensate_after_children(workflow: Workflow, commitments: Iterable[Commitment], *, now: datetime,
                                          before_intent: int | None = None) -> None:
    """Compensate ``commitments`` now, or, while children (of intents before ``before_intent``, or
    any) are still being cancelled, once they have ended (``compensation.deferred``; the last
    child's end compensates them: ``children.compensations_after_children``)."""
    live = selectors.children_live(workflow, before_intent=before_intent)
    if not live:
        commitments_compensate(workflow, commitments, now=now)
        return
    event_record(workflow=workflow, kind="compensation.deferred", at=now, children=live[:20],
                 why="a child's effects are undone before its parent's")


def parent_ring_on_commit(workflow: Workflow) -> None:
    """A child that ended tells its parent (``children.children_collect_if_finished``), once committed."""
    if workflow.parent_id is not None:
        doorbells.children_collect(workflow_id=workflow.parent_id)


def trace_finished_on_commit(workflow: Workflow) -> None:
    """The workflow's root span (workflows.telemetry), once the final transition has committed."""
    if telemetry.enabled():
        transaction.on_commit(functools.partial(telemetry.workflow_finished, workflow_id=workflow.pk,
                                                kind=workflow.kind, status=workflow.status,
                                                created_at=workflow.created_at))


def live_work_void(workflow: Workflow, *, now: datetime, reason: str, visit: int | None = None) -> list[Commitment]:
    """Cancel the workflow's scheduled and running activities (of node visit ``visit``, or all),
    compensations excepted: work of a left node visit, a superseded intent or an ended workflow
    is no longer wanted. A running attempt finds out at its next fenced call (heartbeat,
    checkpoint, note, ``ActivityContext.fence`` before an effect) and records nothing.

    Returns the commitments recorded for voided activities one of whose attempts may have taken
    effect (see ``uncertain_commitments_ensure``); the caller decides when to compensate them.
    Idempotent: voided activities are no longer live.
    """
    where: dict[str, Any] = {"workflow_id": workflow.pk, "status": LIVE}
    if visit is not None:
        where["node_visit"] = visit
    rows = [(pk, operation_id, status) for pk, operation_id, status, node
            in rows_select(Activity, ("id", "operation_id", "status", "node"), where) if node != COMPENSATION_NODE]
    if not rows:
        return []
    pks = [pk for pk, _, _ in rows]
    lifecycle.activities_void(pks, kind=workflow.kind, reason=reason, now=now)
    for _, operation_id, status in rows:
        event_record(workflow=workflow, kind="activity.voided", at=now, operation_id=operation_id, was=status,
                     reason=reason)
    return uncertain_commitments_ensure(workflow, now=now, activity_ids=pks)


def uncertain_commitments_ensure(
    workflow: Workflow, *, now: datetime, activity_ids: list[int] | None = None
) -> list[Commitment]:
    """Record a commitment (``{"uncertain": true}``) for each unfinished or failed activity that
    declares one and has started an attempt: that attempt may have taken effect before it was
    cut off, so its effect must be compensated like a recorded one.

    Idempotent: an activity has at most one commitment (one-to-one).
    """
    candidates = workflow.activities.filter(commitment__isnull=True, attempt__gt=0).exclude(
        status=Activity.Status.SUCCEEDED
    ).exclude(node=COMPENSATION_NODE)
    if activity_ids is not None:
        candidates = candidates.filter(pk__in=activity_ids)
    created = []
    for activity in candidates:
        spec = registry.activity_type(activity.name)
        if spec.commitment:
            created.append(Commitment.objects.create(
                workflow=workflow, activity=activity, kind=spec.commitment, compensation=spec.compensation,
                data={"uncertain": True}, created_at=now, intent_version=activity.intent_version,
            ))
            event_record(workflow=workflow, kind="commitment.uncertain", at=now,
                         operation_id=activity.operation_id, commitment_kind=spec.commitment)
    return created


def compensation_ensure(workflow: Workflow, commitment: Commitment, *, now: datetime) -> Activity:
    """The compensation activity of ``commitment``, scheduled if absent.

    Idempotent: its operation id is derived from the commitment's (see ``activity_schedule_ensure``).
    """
    return activity_schedule_ensure(
        workflow=workflow, now=now, node=COMPENSATION_NODE,
        command=engine.ScheduleActivity(
            operation_id=compensation_operation_id(commitment.activity.operation_id), name=commitment.compensation,
            input={"operation_id": commitment.activity.operation_id, "data": commitment.data,
                   "idempotency_key": commitment.activity.sent_key, "input": commitment.activity.input,
                   "result": commitment.activity.result},
        ),
    )


def commitments_compensate(workflow: Workflow, commitments: Iterable[Commitment], *, now: datetime) -> None:
    """Schedule the compensation of each commitment at once (cancellation instead goes one at a
    time, newest first: ``advance_cancellation``). The compensation's result closes its
    commitment (``commitment_compensated_by``)."""
    for commitment in commitments:
        compensation_ensure(workflow, commitment, now=now)


def commitment_compensated_by(workflow: Workflow, *, operation_id: str, input: Any, now: datetime) -> None:
    """Close the active commitment that the succeeded activity ``operation_id`` compensates, if
    it is a compensation (its operation id is the one ``compensation_ensure`` derives)."""
    compensated = input.get("operation_id") if isinstance(input, dict) else None
    if not isinstance(compensated, str) or operation_id != compensation_operation_id(compensated):
        return
    commitment = workflow.commitments.filter(status=Commitment.Status.ACTIVE,
                                             activity__operation_id=compensated).first()
    if commitment is not None:
        commitment_close_compensated(workflow, commitment, now=now)


def commitment_close_compensated(workflow: Workflow, commitment: Commitment, *, now: datetime) -> None:
    commitment.compensated(at=now)
    commitment.save(update_fields=["status", "closed_at"])
    event_record(workflow=workflow, kind="commitment.compensated", at=now, commitment_id=commitment.pk)


def signal_consume(workflow: Workflow, wait: Wait, signal: Signal, *, now: datetime) -> None:
    wait.satisfy(at=now, payload=signal.payload)
    wait.save(update_fields=["status", "decided_at", "payload"])
    signal.consumed_by = wait
    signal.save(update_fields=["consumed_by"])
    event_record(workflow=workflow, kind="wait.satisfied", at=now, wait_id=wait.pk, signal=signal.name)


def username_of(user: Any) -> str:
    return getattr(user, "username", "") or ""


def child_outcome(child: Workflow) -> dict[str, Any]:
    """What a child wait records of its child's end (``engine.ChildOutcome`` reads it)."""
    return {"workflow_id": child.pk, "status": child.status,
            "result": child.result if child.status == Workflow.Status.COMPLETED else None,
            "reason": "" if child.status == Workflow.Status.COMPLETED else child.reason[:2000]}



def child_wait_close(workflow: Workflow, wait: Wait, child: Workflow, *, now: datetime) -> None:
    wait.satisfy(at=now, payload=child_outcome(child))
    wait.save(update_fields=["status", "decided_at", "payload"])
    event_record(workflow=workflow, kind="child.finished", at=now, wait_id=wait.pk, operation_id=wait.operation_id,
                 child=child.pk, status=child.status)
