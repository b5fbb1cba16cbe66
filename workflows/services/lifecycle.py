"""The activity and attempt lifecycle: every change of ``Activity.status`` and
``ActivityAttempt.status`` is made here, and each is a transition the models declare.

The models declare the transitions (django-fsm; the table in docs/state-machines.md), and a
transition's method only sets fields from its arguments. The hot path never loads a row to call
one: this module issues each as one conditional UPDATE (``workflows.sql``, or the ORM where a
condition is a range) on the transition's declared source states, plus, for a running attempt's,
its fence (attempt, lease_token); it sets the declared target and what the method sets, learned
by running the method's body against a recorder. So no write moves a row along an edge the table
lacks, and an UPDATE that finds no row means another writer moved it first.
tests/workflows/test_lifecycle.py checks the table, and that no other module writes these statuses.

What a failed attempt leads to is decided here too, one question at a time (``failure_judge``):
does it pause the workflow, is the try given back, does it retry, after how long; then it is
applied (``failure_apply_if_current``).
"""
from __future__ import annotations

import enum
import functools
import random
import uuid
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from django.conf import settings
from django.db import models

from workflows import clock, registry, selectors
from workflows.errors import BudgetDeferred, BudgetExhausted, Permanent, Refused, Throttled
from workflows.leases import Claim
from workflows.models import Activity, ActivityAttempt, Timer, UsageEntry, WebhookDelivery, Workflow
from workflows.services import slots
from workflows.services.common import Appended, event_record, events_append_while
from workflows.sql import (
    RowWrite,
    row_exists,
    row_insert,
    row_insert_with,
    row_update,
    row_update_then_select,
    rows_insert,
)

LIVE = (Activity.Status.SCHEDULED, Activity.Status.RUNNING)
# The throttle streak looks this many attempts back.
STREAK_WINDOW = 16


class RunOutcome(enum.StrEnum):
    RECORDED = "recorded"
    RETRY_SCHEDULED = "retry_scheduled"
    FAILED = "failed"
    DEFERRED = "deferred"
    THROTTLED = "throttled"
    PAUSED = "paused"
    SKIPPED = "skipped"
    STALE = "stale"


# --- the declared transitions -------------------------------------------------------------------

@dataclass(frozen=True)
class Declared:
    """One transition as its model declares it: the method's name, the states it leaves, the one it
    reaches, and its body (which only sets fields)."""

    model: type[models.Model]
    name: str
    sources: tuple[str, ...]
    target: str
    method: Callable[..., None]

    @property
    def doc(self) -> str:
        return " ".join((self.method.__doc__ or "").split()).replace("``", "`")


def _value(state: Any) -> str:
    return str(getattr(state, "value", state))


@functools.cache
def declared(model: type[models.Model], name: str) -> Declared:
    """The transition ``name`` of ``model``; AttributeError when the model declares none of that name."""
    meta = getattr(getattr(model, name, None), "_django_fsm", None)
    if meta is None:
        raise AttributeError(f"{model.__name__} declares no transition {name!r}")
    transitions = list(meta.transitions.values())
    targets = {_value(t.target) for t in transitions}
    if len(targets) != 1:
        raise AttributeError(f"{model.__name__}.{name} must have one target, not {sorted(targets)}")
    return Declared(model=model, name=name, sources=tuple(_value(t.source) for t in transitions),
                    target=targets.pop(), method=transitions[0].method)


def declared_all(model: type[models.Model]) -> list[Declared]:
    """Every transition of ``model``'s status, in declaration order."""
    field = model._meta.get_field("status")
    names = dict.fromkeys(t.name for t in field.get_all_transitions(model))  # type: ignore[union-attr]
    return [declared(model, name) for name in names]


class _Writes:
    """Stands in for the row while a transition's method runs: collects what it sets."""


def _changes(transition: Declared, arguments: Mapping[str, Any]) -> dict[str, Any]:
    writes = _Writes()
    transition.method(writes, **arguments)
    return {"status": transition.target, **vars(writes)}


def _status_condition(transition: Declared) -> str | tuple[str, ...]:
    return transition.sources[0] if len(transition.sources) == 1 else transition.sources


def _move(model: type[models.Model], name: str, where: Mapping[str, Any], **arguments: Any) -> int:
    """Transition ``name`` of the rows ``where`` that are in one of its source states, as SQL; the rows moved."""
    return row_moving(model, name, where, **arguments).run()


def row_moving(model: type[models.Model], name: str, where: Mapping[str, Any], **arguments: Any) -> RowWrite:
    """``_move`` as a write not yet made (``row_update_then`` makes two in one statement; a model
    call's charge goes in the statement of its note)."""
    transition = declared(model, name)
    return RowWrite(model, _changes(transition, arguments), {**where, "status": _status_condition(transition)})


def rows_move(rows: models.QuerySet[Any], name: str, **arguments: Any) -> int:
    """Transition ``name`` of those of ``rows`` in one of its source states, as one UPDATE; the
    rows moved. For the machines whose writes live with their services (``Timer``)."""
    return _move_all(rows, name, **arguments)


def _move_all(rows: models.QuerySet[Any], name: str, **arguments: Any) -> int:
    """``_move`` for conditions SQL by hand does not express (ranges, several ids)."""
    transition = declared(rows.model, name)  # type: ignore[arg-type]
    sources = _status_condition(transition)
    rows = rows.filter(status__in=sources) if isinstance(sources, tuple) else rows.filter(status=sources)
    return rows.update(**_changes(transition, arguments))


def transition_table(model: type[models.Model]) -> str:
    """The Markdown table of ``model``'s transitions for docs/state-machines.md (``make docs``)."""
    lines = ["| transition | from | to | when |", "| --- | --- | --- | --- |"]
    lines += [f"| `{t.name}` | {', '.join(t.sources)} | {t.target} | {t.doc} |" for t in declared_all(model)]
    return "\n".join(lines)


DOCS_LEAD = {
    "Activity": "Created `scheduled`, or already claimed (`running`, attempt 1) when the worker that recorded the "
                "result before it takes it (a chain slot). `workflows/services/lifecycle.py` issues every "
                "transition as one conditional UPDATE on its source states; a running attempt's also on its "
                "fence (attempt, lease_token), so a zombie attempt moves nothing.",
    "Timer": "Created `pending` with the wait it serves (its `fire_at` computed once). A beat sweep fires a due "
             "one by a conditional UPDATE (`waits.timer_fire_if_due`), so two beats fire it once; a cancel, a "
             "supersede or a first-of wait won by another branch ignores it, and so does its own firing when "
             "it finds its wait, intent or workflow moved on (`timer.ignored`).",
    "WebhookDelivery": "Created `pending`, one per event and subscription, by the scan of new events. An attempt is "
                       "claimed (`claimed_until`), POSTed outside any transaction and recorded by a conditional "
                       "UPDATE on `pending` and the attempt count (`hooks.webhook_delivery_send_if_claimed`), so "
                       "a late finisher whose claim lapsed records nothing; `redeliver` is a person's "
                       "(CLI, API, admin).",
    "UsageEntry": "Created `reserved`, one per request to a provider, before it leaves the process (its estimate "
                  "held against the budget). The metered call settles it by a conditional UPDATE on its key and "
                  "its sources (`budgets.budget_charge_once`, `budget_release_once`, `budget_uncertain_once`), so "
                  "a request recorded twice is counted once; the lease sweep doubts the reservations of attempts "
                  "that stopped, and a late answer or the provider's usage report settles an uncertain one.",
    "ActivityAttempt": "Created `running` when its activity is claimed (`lifecycle.attempt_start`), and closed by "
                       "the transition its activity takes. `throttled`, `refunded` and `retry_after_seconds` "
                       "say what a failed one led to.",
}


# Commitments change owner without a transition: a child's are handed to its parent.
COMMITMENT_DOCS = """
Created `active` by the activity that made the effect (or, for an attempt cut off mid-effect,
`active` with `{"uncertain": true}`), serving that activity's intent (`intent_version`). A tree of
workflows owns its effects until its root ends:

| the workflow that holds it | its active commitments |
|---|---|
| completes, and is a root | `release`: the outcome (`commitment.released`) |
| completes, and is a child | stay `active`, kept for the parent (`commitment.held_for_parent`) |
| collects a completed child's end, or cancels, fails or takes a new goal with one not yet \
collected | takes them over (`commitment.adopted`: `workflow` becomes the parent, `handed_over_by` \
the child, `intent_version` the intent the parent started the child under) |
| is cancelled | `compensated`, newest first, once its children have ended (a cancelling child undoes its own first) |
| fails | `compensated`, all at once, once its children have ended |
| takes a new goal | those of older intents `compensated`, once those intents' children have ended |

A release change counts the tree's effects: a woken workflow whose own, handed-over or running
children's commitments of its current intent stand keeps course (`release.kept_course`).
"""


def docs_section(model_name: str) -> str:
    """What docs/state-machines.md shows under a model's graph (``make docs``): for the
    lifecycle's two models, timers, webhook deliveries and usage entries, where they start and the
    table of their transitions; for commitments, who owns them as a tree of workflows ends."""
    if model_name == "Commitment":
        return COMMITMENT_DOCS
    model = {"Activity": Activity, "ActivityAttempt": ActivityAttempt, "Timer": Timer,
             "WebhookDelivery": WebhookDelivery, "UsageEntry": UsageEntry}.get(model_name)
    return "" if model is None else f"\n{DOCS_LEAD[model_name]}\n\n{transition_table(model)}\n"


# --- new rows -------------------------------------------------------------------------------------

def lease_expiry(spec: registry.ActivityType[Any, Any], now: datetime) -> datetime:
    return now + timedelta(seconds=spec.lease_seconds or settings.AGENTOPS_LEASE_SECONDS)


def activity_insert(activity: Activity) -> None:
    """Insert a new activity, scheduled."""
    row_insert(activity)


def activity_insert_claimed(workflow: Workflow, activity: Activity, *, spec: registry.ActivityType[Any, Any],
                            now: datetime, tenant: str, worker: str, task_id: str) -> Claim:
    """Insert a new activity already claimed for its first attempt, to run as ``tenant``, and that
    attempt (one statement on PostgreSQL): a chain slot, the worker that scheduled it runs it, with
    no doorbell. Returns the fencing token its result must present, as ``attempt_start``."""
    activity.claim(attempt=1, lease_token=uuid.uuid4().hex, lease_expires_at=lease_expiry(spec, now), at=now,
                   tenant=tenant)
    row_insert_with(activity, ActivityAttempt, _attempt_values(activity, worker=worker, task_id=task_id, now=now),
                    key="activity")
    return _attempt_started(workflow, activity, worker=worker, now=now)


def attempt_start(workflow: Workflow, activity: Activity, *, worker: str, task_id: str, now: datetime,
                  previous_lost: bool = False, slot_waited_ms: int | None = None) -> Claim:
    """Record the attempt an activity row was just claimed for (status running, ``attempt``,
    ``lease_token`` and ``tenant`` already written) and the fencing token its result must present;
    ``slot_waited_ms``: how long it waited for a concurrency slot, when it did."""
    rows_insert(ActivityAttempt, [{"activity": activity.pk,
                                   **_attempt_values(activity, worker=worker, task_id=task_id, now=now)}])
    return _attempt_started(workflow, activity, worker=worker, now=now, previous_lost=previous_lost,
                            slot_waited_ms=slot_waited_ms)


def _attempt_values(activity: Activity, *, worker: str, task_id: str, now: datetime) -> dict[str, Any]:
    return {"number": activity.attempt, "lease_token": activity.lease_token, "worker": worker, "task_id": task_id,
            "started_at": now}


def _attempt_started(workflow: Workflow, activity: Activity, *, worker: str, now: datetime,
                     previous_lost: bool = False, slot_waited_ms: int | None = None) -> Claim:
    """The ``activity.started`` event of an attempt just recorded, and its claim."""
    waited = {} if slot_waited_ms is None else {"slot_waited_ms": slot_waited_ms}
    event_record(workflow=workflow, kind="activity.started", at=now, operation_id=activity.operation_id,
                 attempt=activity.attempt, worker=worker, **waited)
    return Claim(
        activity_id=activity.pk, workflow_id=workflow.pk, operation_id=activity.operation_id,
        idempotency_key=activity.sent_key, name=activity.name,
        attempt=activity.attempt, lease_token=activity.lease_token, input=activity.input,
        previous_attempt_lost=previous_lost, checkpoint=activity.checkpoint,
        definition_version=workflow.definition_version, release=workflow.release.spec(),
        release_policy=workflow.release_policy, release_provisional=workflow.release_provisional,
        fallback_model=workflow.fallback_model, tenant=activity.tenant, kind=workflow.kind,
        priority=workflow.priority,
        budget_limited=workflow.budget_total_usd is not None or workflow.budget_hourly_usd is not None,
        # Only a workflow with a fallback needs the streak: one query less on the hot path.
        throttled_in_a_row=throttled_streak(activity.pk, before=activity.attempt) if workflow.fallback_model else 0,
    )


# --- claiming, and what a running attempt writes ---------------------------------------------------

def activity_claim_if_due(activity: Activity, *, spec: registry.ActivityType[Any, Any], now: datetime,
                          tenant: str) -> bool:
    """Claim the next attempt of ``activity`` (as read) if it is still scheduled, at the attempt
    read, and due, to run as ``tenant``; on success ``activity`` holds the new attempt number,
    lease token and tenant.

    Idempotent: conditional UPDATE on (status=scheduled, attempt, next_attempt_at <= now).
    """
    previous = activity.attempt
    attempt, lease_token = previous + 1, uuid.uuid4().hex
    claimed = _move(Activity, "claim", {"id": activity.pk, "attempt": previous, "next_attempt_at__lte": now},
                    attempt=attempt, lease_token=lease_token, lease_expires_at=lease_expiry(spec, now), at=now,
                    tenant=tenant)
    if claimed:
        activity.attempt, activity.lease_token, activity.tenant = attempt, lease_token, tenant
    return bool(claimed)


def _fence(claim: Claim) -> dict[str, Any]:
    """The activity row only while this claim holds the lease (with status running: the source of
    every transition of a running attempt)."""
    return {"id": claim.activity_id, "attempt": claim.attempt, "lease_token": claim.lease_token}


def _attempt_row(claim: Claim) -> dict[str, Any]:
    return {"activity": claim.activity_id, "number": claim.attempt}


def _running(claim: Claim) -> dict[str, Any]:
    return {**_fence(claim), "status": Activity.Status.RUNNING.value}


def fence_holds(claim: Claim) -> bool:
    """Whether the claim still holds the activity row (running, its attempt and lease token)."""
    return row_exists(Activity, _running(claim))


def lease_extend_if_current(claim: Claim, *, now: datetime, detail: str) -> bool:
    """Extend a running attempt's lease; False when it is fenced off: taken over, or its work
    voided (cancel, a new goal, its node left, the workflow ended), since voiding moves the
    activity's own row. The conditional UPDATE waits for a voiding transaction that holds the row
    and then sees its outcome, so no check races it."""
    return bool(row_update(Activity, _lease_values(claim, now=now, detail=detail), _running(claim)))


def lease_extension(claim: Claim, *, now: datetime, detail: str) -> tuple[dict[str, Any], dict[str, Any]]:
    """What ``lease_extend_if_current`` writes to the activity row, and the condition it writes it
    under: for a statement that extends the lease as its fence (a model request's reservation)."""
    return _lease_values(claim, now=now, detail=detail), _running(claim)


def _lease_values(claim: Claim, *, now: datetime, detail: str | None) -> dict[str, Any]:
    """The lease extended from ``now``, and what the attempt is doing (``detail``; None: kept as is)."""
    values: dict[str, Any] = {"heartbeat_at": now,
                              "lease_expires_at": lease_expiry(registry.activity_type(claim.name), now)}
    return values if detail is None else {**values, "heartbeat_detail": detail[:200]}


def notes_if_current(claim: Claim, events: list[tuple[str, datetime, dict[str, Any]]], *,
                     checkpoint: tuple[dict[str, Any], str, datetime] | None = None,
                     also: RowWrite | None = None, steer_probe: bool = False) -> Appended:
    """Append ``events`` (kind, time, data) to the workflow's history while the claim holds the
    lease, fenced as ``fence_holds`` is but read after the workflow's row lock (a voiding
    transaction holding it has committed by then), and extend the lease as a heartbeat does (its
    detail kept), in the same statement (``events_append_while``); with ``checkpoint`` (state,
    detail, time) the state is saved and the detail written too. False, writing nothing, when the
    attempt is fenced off; ``also`` (a model call's charge) is written either way. ``steer_probe``:
    the answer says whether the workflow has steer messages too (``Appended``)."""
    if checkpoint is not None:
        state, detail, now = checkpoint
        values = {**_lease_values(claim, now=now, detail=detail), "checkpoint": state, "checkpointed_at": now}
    else:
        values = _lease_values(claim, now=clock.now(), detail=None)
    return events_append_while(claim.workflow_id, events, model=Activity, where=_running(claim), values=values,
                               also=also, steer_probe=steer_probe)


def activity_succeed_if_current(claim: Claim, *, result: Any, now: datetime,
                                visit: int) -> list[tuple[Any, ...]] | None:
    """Record the running attempt's result (already in its stored form) on the activity and close
    the attempt; None, writing nothing, when the claim no longer holds the lease. Else the
    activities of the workflow's node visit ``visit`` as they are after it (the columns
    ``selectors.RECORDED_COLUMNS``): the advance that follows reads them, and the same statement
    gives them.

    Idempotent: conditional UPDATE on (status=running, attempt, lease_token).
    """
    rows = row_update_then_select(row_moving(Activity, "succeed", _fence(claim), result=result, at=now),
                                  row_moving(ActivityAttempt, "succeed", _attempt_row(claim), at=now),
                                  selectors.RECORDED_COLUMNS, {"workflow": claim.workflow_id, "node_visit": visit})
    if rows is None:
        return None
    slots.freed(claim.tenant, claim.kind, now=now)
    return rows


def attempt_discard(claim: Claim, *, now: datetime) -> None:
    """A result or failure sent back by an attempt that no longer holds its lease: the attempt is
    stale. One already closed as cancelled (its work voided) keeps that status."""
    _move(ActivityAttempt, "discard", _attempt_row(claim), at=now)


# --- what a failed attempt leads to ----------------------------------------------------------------

@dataclass(frozen=True)
class FailureVerdict:
    """What a failed attempt leads to, decided before anything is written."""

    outcome: RunOutcome  # PAUSED, THROTTLED, DEFERRED, RETRY_SCHEDULED or FAILED
    message: str
    throttled: bool = False
    # Given back to the retry policy: the try does not count against the activity's max_attempts.
    refunded: bool = False
    # The retry window it opens; None when no retry follows (failed, or paused for a person).
    retry_after_seconds: float | None = None


def failure_retryable(claim: Claim, error: BaseException) -> bool:
    """Whether the retry policy allows another try after ``error`` (permanent and refused errors,
    and the activity's own non-retryable ones, end it)."""
    spec = registry.activity_type(claim.name)
    return not isinstance(error, (Permanent, Refused, *spec.retry.non_retryable))


def failure_pauses(error: BaseException) -> bool:
    """Over the total budget: the workflow pauses for a person, the activity waits for them."""
    return isinstance(error, BudgetExhausted)


def failure_refunded(error: BaseException) -> bool:
    """A wait for money (the hourly budget, or the total until a person raises it) or for the
    provider's capacity (429/529) is not a failed try: the attempt is given back."""
    return isinstance(error, (BudgetExhausted, BudgetDeferred, Throttled))


def failure_judge(claim: Claim, error: BaseException, *, retryable: bool, max_attempts: int) -> FailureVerdict:
    """Decide what the failure ``error`` of the attempt ``claim`` leads to, for an activity of
    ``max_attempts`` allowed attempts: pause, retry (given back or not, and when) or fail."""
    message = f"{type(error).__name__}: {error}"
    throttled = isinstance(error, Throttled)
    if failure_pauses(error):
        return FailureVerdict(RunOutcome.PAUSED, message, refunded=True)
    refunded = failure_refunded(error)
    if not retryable or not (refunded or claim.attempt < max_attempts):
        return FailureVerdict(RunOutcome.FAILED, message, throttled=throttled)
    outcome = RunOutcome.THROTTLED if throttled else RunOutcome.DEFERRED if refunded else RunOutcome.RETRY_SCHEDULED
    return FailureVerdict(outcome, message, throttled=throttled, refunded=refunded,
                          retry_after_seconds=retry_delay_seconds(claim, error))


def retry_delay_seconds(claim: Claim, error: BaseException) -> float:
    """The wait the provider or the budget named, else the backoff of throttling or of the retry policy."""
    named = getattr(error, "retry_after_seconds", None)
    if named:
        return float(named)
    if isinstance(error, Throttled):
        return throttle_backoff_seconds(claim)
    return float(registry.activity_type(claim.name).retry.delay_after(claim.attempt))


def failure_apply_if_current(claim: Claim, verdict: FailureVerdict, *, max_attempts: int, now: datetime) -> bool:
    """Move the activity and its attempt as ``verdict`` says; False, writing nothing, when the
    claim no longer holds the lease.

    Idempotent: conditional UPDATE on (status=running, attempt, lease_token).
    """
    given_back = max_attempts + verdict.refunded
    if verdict.outcome == RunOutcome.FAILED:
        moved = _move(Activity, "fail", _fence(claim), error=verdict.message, at=now)
    elif verdict.outcome == RunOutcome.PAUSED:
        # Parked for the person who raises the budget: due at once, and rung by the wake, not before.
        moved = _move(Activity, "retry", _fence(claim), error=verdict.message, next_attempt_at=now,
                      dispatched_at=now, max_attempts=given_back)
    else:
        assert verdict.retry_after_seconds is not None
        moved = _move(Activity, "retry", _fence(claim), error=verdict.message, dispatched_at=None,
                      next_attempt_at=now + timedelta(seconds=verdict.retry_after_seconds), max_attempts=given_back)
    if not moved:
        return False
    _move(ActivityAttempt, "fail", _attempt_row(claim), error=verdict.message, at=now, throttled=verdict.throttled,
          refunded=verdict.refunded, retry_after_seconds=verdict.retry_after_seconds)
    slots.freed(claim.tenant, claim.kind, now=now)
    return True


def throttled_streak(activity_id: int, *, before: int) -> int:
    """How many attempts of the activity right before attempt ``before`` were throttled (429/529)."""
    earlier = ActivityAttempt.objects.filter(activity_id=activity_id, number__lt=before).order_by(
        "-number").values_list("throttled", flat=True)[:STREAK_WINDOW]
    return next((i for i, throttled in enumerate(earlier) if not throttled), len(earlier))


def throttle_backoff_seconds(claim: Claim) -> float:
    """The wait after a throttled attempt whose provider named none: exponential in the number of
    throttled attempts in a row (this one included), from AGENTOPS_THROTTLE_BACKOFF_SECONDS up to
    AGENTOPS_THROTTLE_BACKOFF_MAX_SECONDS, with "equal jitter" (half fixed, half random) so the
    workflows an overload stopped together do not all come back in the same second."""
    streak = throttled_streak(claim.activity_id, before=claim.attempt)
    ceiling = min(settings.AGENTOPS_THROTTLE_BACKOFF_SECONDS * 2 ** streak,
                  settings.AGENTOPS_THROTTLE_BACKOFF_MAX_SECONDS)
    return float(ceiling / 2 + random.uniform(0, ceiling / 2))


# --- lost leases, voided work, reopened compensations ---------------------------------------------

def activity_lease_expire(activity: Activity, *, kind: str, now: datetime) -> str | None:
    """Mark the running attempt of ``activity`` (as read under the row lock of its workflow, of
    ``kind``) lost, and retry the activity (attempts left) or fail it. Returns the activity's new
    status, or None when another writer moved it first.

    Idempotent: conditional UPDATE on (status=running, attempt, lease_token, lease expired).
    """
    error = f"attempt {activity.attempt} lost: lease expired at {activity.lease_expires_at:%H:%M:%S}"
    fenced = Activity.objects.filter(pk=activity.pk, attempt=activity.attempt, lease_token=activity.lease_token,
                                     lease_expires_at__lt=now)
    if activity.attempt < activity.max_attempts:
        status = Activity.Status.SCHEDULED
        moved = _move_all(fenced, "retry", error=error, next_attempt_at=now, dispatched_at=now,
                          max_attempts=activity.max_attempts)
    else:
        status = Activity.Status.FAILED
        moved = _move_all(fenced, "fail", error=error, at=now)
    if not moved:
        return None
    _move(ActivityAttempt, "lose", {"activity": activity.pk, "number": activity.attempt}, error=error, at=now)
    slots.freed(activity.tenant, kind, now=now)
    return status


def activities_void(activity_ids: list[int], *, kind: str, reason: str, now: datetime) -> None:
    """Void the live activities among ``activity_ids`` (of one workflow, of ``kind``) and cancel
    their running attempts.

    Idempotent: a voided activity is no longer in a source state of ``void``.
    """
    # A running attempt's slot, or one just handed to a waiting activity, comes free.
    holding = models.Q(status=Activity.Status.RUNNING) | models.Q(status=Activity.Status.SCHEDULED,
                                                                  slot_granted_at__isnull=False)
    running = (list(Activity.objects.filter(holding, pk__in=activity_ids).values_list("tenant", flat=True))
               if settings.AGENTOPS_ACTIVITY_CONCURRENCY else [])
    _move_all(Activity.objects.filter(pk__in=activity_ids), "void", reason=reason, at=now)
    _move_all(ActivityAttempt.objects.filter(activity_id__in=activity_ids), "cancel", reason=reason, at=now)
    slots.freed_all(((tenant, kind) for tenant in running), now=now)


def activity_reopen(activity: Activity, *, max_attempts: int, now: datetime) -> bool:
    """Schedule a failed activity (a compensation) again, allowing ``max_attempts`` in all.

    Idempotent: conditional UPDATE on status=failed.
    """
    return bool(_move_all(Activity.objects.filter(pk=activity.pk), "reopen", max_attempts=max_attempts, at=now))
