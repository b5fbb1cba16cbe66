"""Workflow lifecycle: launch, advance, signal, supersede, resume."""
from __future__ import annotations

import contextlib
import functools
import logging
import re
from datetime import datetime, timedelta
from decimal import Decimal
from typing import Any

from django.conf import settings
from django.db import transaction

from workflows import clock, doorbells, engine, registry, selectors, telemetry
from workflows.errors import InvalidInput, NotFound, TransitionRefused
from workflows.models import ClientRequest, Commitment, Intent, Signal, Wait, Workflow, WorkflowLabel
from workflows.services.cancellation import advance_cancellation, children_cancel_live, compensations_retry
from workflows.services.children import child_start
from workflows.services.client_requests import client_request_claim_once, idempotency_key_checked
from workflows.services.common import (
    amount_checked,
    event_record,
    events_batched,
    priority_checked,
    release_current,
    text_checked,
    workflow_lock,
    workflow_save,
    workflow_save_put_off,
)
from workflows.services.failures import (
    INFRASTRUCTURE_ERRORS,
    AdvanceMark,
    handler_failure_record,
    handler_failures_clear,
)
from workflows.services.labels import labels_checked
from workflows.services.lifecycle import LIVE
from workflows.services.pauses import operator_resume_locked
from workflows.services.races import first_wait_settle
from workflows.services.steps import (
    MAX_GOAL_CHARS,
    MAX_HOURS,
    MAX_STEPS_PER_ADVANCE,
    ChainSlot,
    Outcome,
    Result,
    activity_schedule,
    child_commitments_adopt,
    commitments_compensate_after_children,
    complete_locked,
    enter_node,
    fail_locked,
    live_work_void,
    signal_consume,
    username_of,
    wait_open,
    wake_locked,
)
from workflows.statestore import json_checked

logger = logging.getLogger("agentops.workflows")
MODEL_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._:-]{0,119}")


def workflow_launch(
    *,
    kind: str,
    goal: str,
    params: dict[str, Any] | None = None,
    user: Any = None,
    release_policy: str = "",
    max_hours: float | None = None,
    priority: int = 5,
    budget_total_usd: Decimal | None = None,
    budget_hourly_usd: Decimal | None = None,
    stagnation_policy: str = Workflow.StagnationPolicy.RECORD,
    fallback_model: str = "",
    labels: dict[str, str] | None = None,
) -> Workflow:
    """Create a workflow with intent v1 and advance it in the same transaction (its first
    activity is scheduled, or its first wait opened, when this returns).

    ``max_hours`` sets a durable deadline: past it, beat cancels the workflow. ``fallback_model``
    is the model its calls move to on sustained overload (``workflows.releases.provider_for``).
    ``labels`` (key to value, ``labels_checked``) are stored with it, to filter and count by.

    Not idempotent: every call launches a new workflow (``workflow_launch_once`` takes a key).
    Raises InvalidInput for an unknown kind, bad parameters or a bad goal, and then writes nothing.
    """
    workflow, _ = workflow_launch_once(
        idempotency_key="", kind=kind, goal=goal, params=params, user=user, release_policy=release_policy,
        max_hours=max_hours, priority=priority, budget_total_usd=budget_total_usd,
        budget_hourly_usd=budget_hourly_usd, stagnation_policy=stagnation_policy, fallback_model=fallback_model,
        labels=labels,
    )
    return workflow


def workflow_launch_once(
    *,
    idempotency_key: str,
    kind: str,
    goal: str,
    params: dict[str, Any] | None = None,
    user: Any = None,
    release_policy: str = "",
    max_hours: float | None = None,
    priority: int = 5,
    budget_total_usd: Decimal | None = None,
    budget_hourly_usd: Decimal | None = None,
    stagnation_policy: str = Workflow.StagnationPolicy.RECORD,
    fallback_model: str = "",
    parent_wait: Wait | None = None,
    labels: dict[str, str] | None = None,
) -> tuple[Workflow, bool]:
    """Launch as ``workflow_launch`` does, once per ``idempotency_key``: (workflow, True) when
    this call launched it; (workflow, False) when the same request with this key launched it
    before (the same kind, goal, parameters, options and user), and nothing was changed.

    Idempotent per key: unique constraint ``uniq_client_request_key``, claimed in the launch's
    transaction, so two concurrent launches with one key make one workflow
    (``client_request_claim_once``). An empty key launches every time. Raises
    IdempotencyKeyReused when the key named another request, InvalidInput as ``workflow_launch``
    does; both write nothing.

    ``parent_wait`` launches a child workflow (``workflows.services.children.child_start``, in
    the parent's locked advance): the child of that wait, ending no later than its parent's deadline.
    """
    idempotency_key = idempotency_key_checked(idempotency_key)
    definition = registry.definition(kind)
    goal = text_checked(goal, what="The goal", max_length=MAX_GOAL_CHARS)
    params = json_checked(definition.validate_params(dict(params or {})), what="The parameters")
    release_policy = release_policy or definition.default_release_policy
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
    if fallback_model and not MODEL_NAME.fullmatch(fallback_model):
        raise InvalidInput(f"The fallback model must be a model name of at most 120 letters, digits and . _ - : "
                           f"characters, e.g. claude-haiku-4-5; got {fallback_model[:130]!r}.")
    priority = priority_checked(priority)
    budget_total_usd = amount_checked(budget_total_usd, what="The total budget")
    budget_hourly_usd = amount_checked(budget_hourly_usd, what="The hourly budget")
    labels = labels_checked(labels)
    now = clock.now()
    # What names the request: its values as checked, so 5, 5.0 and "5.00" are one request.
    request = {"kind": kind, "goal": goal, "params": params, "release_policy": release_policy,
               "max_hours": None if max_hours is None else float(max_hours), "priority": priority,
               "budget_total_usd": _amount(budget_total_usd), "budget_hourly_usd": _amount(budget_hourly_usd),
               "stagnation_policy": stagnation_policy, "fallback_model": fallback_model, "user": username_of(user)}
    if labels:  # only when given: a key reused from before labels existed still names the same request
        request["labels"] = labels
    with transaction.atomic():
        claimed = None
        if idempotency_key:
            claimed, first = client_request_claim_once(operation=ClientRequest.Operation.LAUNCH, key=idempotency_key,
                                                       body=request, user=user, now=now)
            if not first:
                assert claimed.workflow is not None  # set in the launch's own transaction
                return claimed.workflow, False
        release = release_current(at=now)
        workflow = Workflow(
            kind=kind, definition_version=definition.version, current_node=definition.start_node, params=params,
            release=release, release_provisional=release.announced_at is None, release_policy=release_policy,
            launched_by=user,
            deadline=now + timedelta(hours=max_hours) if max_hours is not None else None, priority=priority,
            budget_total_usd=budget_total_usd, budget_hourly_usd=budget_hourly_usd,
            stagnation_policy=stagnation_policy, stagnation_window_hours=settings.AGENTOPS_STAGNATION_WINDOW_HOURS,
            fallback_model=fallback_model, created_at=now, updated_at=now,
        )
        if parent_wait is not None:
            parent = parent_wait.workflow
            workflow.parent, workflow.parent_wait = parent, parent_wait
            if parent.deadline is not None and (workflow.deadline is None or parent.deadline < workflow.deadline):
                workflow.deadline = parent.deadline
        workflow.start(at=now)
        workflow.save()
        Intent.objects.create(workflow=workflow, version=1, goal=goal, created_by=user, created_at=now)
        WorkflowLabel.objects.bulk_create(WorkflowLabel(workflow=workflow, key=k, value=v) for k, v in labels.items())
        with events_batched(workflow):
            event_record(
                workflow=workflow, kind="workflow.launched", at=now, goal=goal, params=params,
                release=workflow.release.fingerprint, by=username_of(user), **({"labels": labels} if labels else {}),
                **({"parent": workflow.parent_id, "operation_id": parent_wait.operation_id} if parent_wait else {}),
            )
            # Nobody else sees the new row before the commit: advance it here, no doorbell needed.
            advance_locked(workflow)
        if claimed is not None:
            claimed.workflow = workflow
            claimed.save(update_fields=["workflow"])
    logger.info("workflow.launched", extra={"workflow_id": workflow.pk, "kind": kind})
    return workflow, True


def _amount(value: Decimal | None) -> str | None:
    """An amount as the same text however it was written (5, 5.0 and 5.00 alike)."""
    return None if value is None else str(value.normalize())


@transaction.atomic
def workflow_advance_if_runnable(*, workflow_id: int) -> Outcome:
    """Run node handlers until the workflow needs something not yet recorded.

    Idempotent: a no-op unless the workflow is running (or cancelling) under its row lock;
    recorded steps are replayed, never re-run, so a duplicate doorbell changes nothing.
    A doorbell for a workflow that no longer exists is a no-op too, and so is one that comes
    before the retry time of a failed advance (``advance_retry_at``: beat rings it then).
    """
    try:
        workflow = workflow_lock(workflow_id, advance=True)
    except NotFound:
        logger.warning("workflow.doorbell.unknown", extra={"workflow_id": workflow_id})
        return Outcome.NOT_RUNNABLE
    if workflow.advance_retry_at is not None and workflow.advance_retry_at > clock.now():
        logger.info("workflow.doorbell.backing_off", extra={"workflow_id": workflow_id})
        return Outcome.NOT_RUNNABLE
    with events_batched(workflow):
        return advance_locked(workflow)


class AdvanceRaised(Exception):  # noqa: N818 - an outcome, raised to unwind the caller's transaction
    """An advance without its savepoint (``advance_locked(savepoint=False)``) met definition code
    that raised: the caller rolls its whole transaction back and does it again with the savepoint,
    which records the failure."""


def advance_locked(workflow: Workflow, *, chain: ChainSlot | None = None, savepoint: bool = True,
                   recorded: list[tuple[Any, ...]] | None = None) -> Outcome:
    """Advance a workflow whose row lock the caller holds; ``chain`` takes the first activity
    it schedules for the caller to run (see ``activity_schedule``).

    The failure boundary around definition code: the advance runs in a savepoint, so when a
    handler (or a value it stores) raises, only the advance is rolled back; what the caller
    recorded before it (an activity's result) stays. The failure is recorded and retried with
    backoff, then paused for a person (``handler_failure_record``); HANDLER_FAILED says so.
    ``Permanent`` and a failed activity are not failures of the code: they fail the workflow.
    Errors of the database connection itself propagate (INFRASTRUCTURE_ERRORS).

    ``savepoint=False`` runs the advance in the caller's transaction itself and raises
    AdvanceRaised where the savepoint would have been rolled back: for a caller that can do its
    whole transaction again (an activity's result, on every activity: the savepoint is two
    statements more in a transaction of five). ``recorded``: the node visit's activities as
    ``selectors.recorded_activities`` reads them, read by the caller in this transaction since
    it last wrote one (the result's own statement gives them).
    """
    if workflow.status not in (Workflow.Status.RUNNING, Workflow.Status.CANCELLING):
        return Outcome.NOT_RUNNABLE
    started_ns, seq, node = telemetry.now_ns(), workflow.event_seq, workflow.current_node
    outcome = _advance_guarded(workflow, chain=chain, savepoint=savepoint, recorded=recorded)
    if workflow.event_seq != seq and telemetry.enabled():
        # Only an advance that recorded something, once it has committed: replaying recorded steps,
        # or an advance rolled back and done again, makes no second span.
        transaction.on_commit(functools.partial(
            telemetry.span_recorded, f"advance {workflow.kind}", workflow_id=workflow.pk, started_ns=started_ns,
            attributes={"agentops.workflow.id": workflow.pk, "agentops.workflow.kind": workflow.kind,
                        "agentops.node.from": node, "agentops.node.to": workflow.current_node,
                        "agentops.advance.outcome": str(outcome), "agentops.events": workflow.event_seq - seq}))
    return outcome


def _advance_guarded(workflow: Workflow, *, chain: ChainSlot | None, savepoint: bool,
                     recorded: list[tuple[Any, ...]] | None) -> Outcome:
    mark = AdvanceMark.take(workflow, chain)
    if savepoint:
        workflow_save_put_off(workflow)  # a rollback of the savepoint undoes only what the advance saved
    try:
        with transaction.atomic() if savepoint else contextlib.nullcontext():
            outcome = _advance(workflow, chain=chain, recorded_rows=recorded)
    except INFRASTRUCTURE_ERRORS:
        raise
    except Exception as exc:
        if not savepoint:
            raise AdvanceRaised(f"Advancing workflow {workflow.pk} raised {type(exc).__name__}") from exc
        node = workflow.current_node  # where it raised: the restore below goes back to the recorded node
        mark.restore(workflow, chain)
        handler_failure_record(workflow, exc, node=node, now=clock.now())
        return Outcome.HANDLER_FAILED
    handler_failures_clear(workflow, mark, now=clock.now())
    return outcome


def _advance(workflow: Workflow, *, chain: ChainSlot | None,
             recorded_rows: list[tuple[Any, ...]] | None) -> Outcome:
    if workflow.status == Workflow.Status.CANCELLING:
        return advance_cancellation(workflow)
    definition = registry.definition(workflow.kind)
    goal = functools.cache(lambda: selectors.current_goal(workflow))
    entered = False  # a visit this advance entered has no activities until it schedules one, which ends it
    for _ in range(MAX_STEPS_PER_ADVANCE):
        now = clock.now()
        # Every activity of the visit, read under the workflow's row lock, which every change of
        # their status holds (a lease's expiry too).
        recorded = {} if entered else selectors.recorded_activities(workflow, recorded_rows)
        recorded_rows = None  # for the first pass only: the passes after it follow this advance's writes
        ctx: engine.NodeContext[Any] = engine.NodeContext(
            selectors.snapshot(workflow, goal), recorded, functools.partial(selectors.recorded_waits, workflow))
        # A NonDeterminismError (the definition changed under this workflow) propagates to the
        # failure boundary: recorded, retried with backoff, then paused for a person.
        decision = engine.decide(definition, ctx)
        if isinstance(decision, engine.Suspended):
            applied = _apply_all(workflow, decision.commands, now=now, chain=chain)
            if applied is None:
                return Outcome.APPLIED  # a child's budget did not fit: paused for a person
            if applied:
                continue
            if decision.on_children and workflow.status == Workflow.Status.RUNNING:
                workflow.park(at=now)
                workflow_save(workflow, "status", at=now)
            return Outcome.SUSPENDED
        if isinstance(decision, engine.Goto):
            enter_node(workflow, decision.node, decision.updates, now=now,
                       left_live=any(a.status in LIVE for a in recorded.values()))
            entered = True
            if decision.pause:
                _pause_for_definition(workflow, decision.pause, now=now)
                return Outcome.APPLIED
            continue
        if isinstance(decision, engine.Complete):
            complete_locked(workflow, decision.result, now=now)
        else:
            fail_locked(workflow, decision.reason, now=now)
        return Outcome.APPLIED
    fail_locked(workflow, f"More than {MAX_STEPS_PER_ADVANCE} node changes without waiting; the definition loops.",
                now=now)
    return Outcome.APPLIED


def _pause_for_definition(workflow: Workflow, reason: str, *, now: datetime) -> None:
    """The definition asked a person to decide at the node it entered; ``agent resume`` goes on."""
    workflow.pause(at=now, reason=reason, cause=Workflow.PauseCause.DEFINITION)
    event_record(workflow=workflow, kind="workflow.paused", at=now, reason=reason,
                 cause=Workflow.PauseCause.DEFINITION, node=workflow.current_node)
    workflow_save(workflow, "status", "reason", at=now)


def _apply_all(workflow: Workflow, commands: tuple[engine.Command, ...], *, now: datetime,
               chain: ChainSlot | None) -> bool | None:
    """Persist the new steps of one handler run: the children it started (they do not stop it),
    then the step it stopped at. True when the handler can run again at once; None when the
    workflow paused instead (a child's budget did not fit in its own)."""
    for command in commands:
        if isinstance(command, engine.StartChild):
            if not child_start(workflow, command, now=now):
                return None
    last = commands[-1] if commands else None
    if last is None or isinstance(last, engine.StartChild):
        return bool(commands)
    return _apply(workflow, last, now=now, chain=chain)


def _apply(workflow: Workflow, command: engine.ScheduleActivity | engine.OpenWait, *, now: datetime,
           chain: ChainSlot | None) -> bool:
    """Persist a new step; True when the handler can run again at once."""
    if isinstance(command, engine.ScheduleActivity):
        # The engine asks only for steps not among those replayed from this node visit.
        activity_schedule(workflow=workflow, command=command, now=now, chain=chain)
        return False
    return wait_open(workflow, command, now=now)


SIGNAL_AUTO_KEY_PREFIX = "auto-"
# The keys of signed webhook deliveries: "webhook:<source>:<delivery id>". No caller of
# workflow_signal (the HTTP API, `agent signal`) may send a key here, so none can make a genuine
# delivery look like a repeat.
SIGNAL_WEBHOOK_KEY_PREFIX = "webhook:"


@transaction.atomic
def workflow_signal(*, workflow_id: int, name: str, payload: Any = None, dedupe_key: str = "") -> Result:
    """Deliver a named event to the workflow's open event wait for that name, or queue it.

    Signals are queued per name in order of arrival, and each event wait for a name receives
    the oldest one queued (when it opens, or when the next signal arrives). Outcome APPLIED: the
    signal satisfied an open wait now (the message names it); QUEUED: no wait for the name is
    open, the signal waits for the next one (``agent show`` lists it under ``signals_queued``).
    A signal is never answered as delivered when no wait received it.

    Idempotent per ``dedupe_key``: unique constraint ``uniq_signal_dedupe``; a repeated key
    returns ALREADY_APPLIED and changes nothing. Without a key, every delivery is a new signal,
    stored under a key of its own that starts with SIGNAL_AUTO_KEY_PREFIX. Raises InvalidInput,
    and stores nothing, for a key longer than the column or one in a reserved namespace
    (SIGNAL_AUTO_KEY_PREFIX, or SIGNAL_WEBHOOK_KEY_PREFIX: see workflow_signal_from_webhook).
    """
    if dedupe_key.startswith(SIGNAL_AUTO_KEY_PREFIX):
        raise InvalidInput(f"The dedupe key {dedupe_key[:40]!r} starts with {SIGNAL_AUTO_KEY_PREFIX!r}, which is "
                           "reserved for the keys of signals sent without one; choose a key without that prefix.")
    if dedupe_key.startswith(SIGNAL_WEBHOOK_KEY_PREFIX):
        raise InvalidInput(f"The dedupe key {dedupe_key[:40]!r} starts with {SIGNAL_WEBHOOK_KEY_PREFIX!r}, which is "
                           "reserved for signed webhook deliveries; choose a key without that prefix.")
    return _signal_deliver(workflow_id=workflow_id, name=name, payload=payload, dedupe_key=dedupe_key)


@transaction.atomic
def workflow_signal_from_webhook(*, workflow_id: int, name: str, payload: Any, source: str,
                                 delivery_id: str) -> Result:
    """Deliver the signal of a signed webhook delivery (its signature already verified).

    Idempotent per delivery: the key ``webhook:<source>:<delivery_id>`` (unique constraint
    ``uniq_signal_dedupe``), in the namespace workflow_signal refuses, so only a delivery the
    source signed can take it; the same delivery again returns ALREADY_APPLIED. Raises
    InvalidInput, and stores nothing, for an empty source or delivery id.
    """
    if not source or not delivery_id:
        raise InvalidInput("A webhook delivery needs its source and its delivery id; nothing was delivered.")
    return _signal_deliver(workflow_id=workflow_id, name=name, payload=payload,
                          dedupe_key=f"{SIGNAL_WEBHOOK_KEY_PREFIX}{source}:{delivery_id}")


def _signal_deliver(*, workflow_id: int, name: str, payload: Any, dedupe_key: str) -> Result:
    """The delivery both entry points share, inside their transaction: the key's namespace is theirs to check."""
    name = text_checked(name, what="The signal name", max_length=100)
    payload = json_checked(payload, what="The signal payload")
    max_key = Signal._meta.get_field("dedupe_key").max_length
    if max_key is not None and len(dedupe_key) > max_key:
        raise InvalidInput(f"The dedupe key is {len(dedupe_key)} characters long; the limit is {max_key}. "
                           "Send a shorter key, e.g. a hash of this one.")
    if any(c < " " or c == "\x7f" for c in dedupe_key):
        raise InvalidInput("The dedupe key holds a control character (NUL, a line break…); send printable text.")
    workflow = workflow_lock(workflow_id)
    keys = Signal.objects.filter(workflow=workflow)
    if dedupe_key:
        # Before the status: a repeat (a webhook redelivered after the workflow finished) is answered
        # as the repeat it is, not refused.
        earlier = keys.filter(dedupe_key=dedupe_key).first()
        if earlier is not None:
            where = "still queued" if earlier.consumed_by_id is None else f"delivered to wait {earlier.consumed_by_id}"
            return Result.of(workflow, Outcome.ALREADY_APPLIED,
                             f"A signal with dedupe key {dedupe_key!r} was received before ({where}); nothing changed.")
    if workflow.is_terminal:
        raise TransitionRefused(f"Workflow {workflow_id} is {workflow.status}; it takes no more signals.")
    now = clock.now()
    key = dedupe_key
    if not key:
        # A keyless signal is never a repeat. The seq of the event that records it makes its key
        # unique among generated ones; the suffix steps around a key a sender chose in this
        # namespace before it was reserved (such rows stay as they are).
        seq, n = workflow.event_seq + 1, 0
        key = f"{SIGNAL_AUTO_KEY_PREFIX}{seq}"
        while keys.filter(dedupe_key=key).exists():
            n += 1
            key = f"{SIGNAL_AUTO_KEY_PREFIX}{seq}.{n}"
    signal = Signal.objects.create(workflow=workflow, name=name, payload=payload, dedupe_key=key, received_at=now)
    wait = workflow.waits.filter(kind__in=(Wait.Kind.EVENT, Wait.Kind.FIRST), status=Wait.Status.OPEN,
                                 event_name=name).order_by("pk").first()
    queued = keys.filter(name=name, consumed_by__isnull=True)
    event_record(workflow=workflow, kind="signal.received", at=now, name=name, dedupe_key=key,
                 queued=wait is None)
    if wait is None:
        ahead = queued.count() - 1
        return Result.of(workflow, Outcome.QUEUED,
                         f"No wait for signal {name!r} is open on workflow {workflow_id}; the signal is queued"
                         + (f" behind {ahead} earlier one{'s' if ahead > 1 else ''}" if ahead else "")
                         + f" and the next wait for {name!r} receives it (oldest first).")
    # The oldest queued signal of the name: normally this one, since an open wait leaves none queued.
    oldest = queued.order_by("pk").first() or signal
    if wait.kind == Wait.Kind.FIRST:
        won = first_wait_settle(workflow, wait, now=now, signal=oldest)
        if won != "signal":
            return Result.of(workflow, Outcome.QUEUED,
                             f"Signal {name!r} came after the end of a child that wait {wait.pk} (first of) was "
                             f"waiting for, which won; the signal is queued and the next wait for {name!r} "
                             "receives it (oldest first).")
        return Result.of(workflow, Outcome.APPLIED, f"Signal {name!r} delivered to wait {wait.pk}.")
    signal_consume(workflow, wait, oldest, now=now)
    wake_locked(workflow, now=now, cause=f"signal {name}")
    return Result.of(workflow, Outcome.APPLIED, f"Signal {name!r} delivered to wait {wait.pk}.")


@transaction.atomic
def workflow_supersede(*, workflow_id: int, goal: str, user: Any = None, idempotency_key: str = "") -> Result:
    """Record a new intent version; old waits are invalidated and the workflow revalidates.

    The old intent's activities in flight are voided (a running attempt stops at its next
    fenced call) and its active commitments are compensated. Timers of the old version stay
    in place and are recorded as ignored when they fire.

    Without ``idempotency_key`` not idempotent: each call adds an intent version. With one,
    once per key: the same supersede again (same workflow, goal and user) returns
    ALREADY_APPLIED naming the version it made, and changes nothing (unique constraint
    ``uniq_client_request_key``, claimed under the workflow's row lock); the key with another
    request raises IdempotencyKeyReused.
    """
    goal = text_checked(goal, what="The goal", max_length=MAX_GOAL_CHARS)
    idempotency_key = idempotency_key_checked(idempotency_key)
    workflow = workflow_lock(workflow_id)
    now = clock.now()
    claimed = None
    if idempotency_key:
        claimed, first = client_request_claim_once(
            operation=ClientRequest.Operation.SUPERSEDE, key=idempotency_key, user=user, now=now,
            body={"workflow_id": workflow_id, "goal": goal, "user": username_of(user)})
        if not first:
            return Result.of(workflow, Outcome.ALREADY_APPLIED,
                             f"This supersede (key {idempotency_key!r}) already made intent v{claimed.intent_version} "
                             f"of workflow {workflow_id}; nothing changed.")
    if workflow.is_terminal or workflow.status == Workflow.Status.CANCELLING:
        raise TransitionRefused(f"Workflow {workflow_id} is {workflow.status}; its goal can no longer change.")
    old = workflow.intent_version
    if claimed is not None:
        claimed.workflow, claimed.intent_version = workflow, old + 1
        claimed.save(update_fields=["workflow", "intent_version"])
    Intent.objects.filter(workflow=workflow, version=old).update(superseded_at=now)
    Intent.objects.create(workflow=workflow, version=old + 1, goal=goal, created_by=user, created_at=now)
    workflow.intent_version = old + 1
    workflow_save(workflow, "intent_version", at=now)
    # A child wait stays open until its child (cancelled below) has ended: it records that end.
    for wait in workflow.waits.filter(status=Wait.Status.OPEN).exclude(kind=Wait.Kind.CHILD):
        wait.invalidate(at=now)
        wait.save(update_fields=["status", "decided_at"])
        event_record(workflow=workflow, kind="wait.invalidated", at=now, wait_id=wait.pk, reason="intent superseded")
    # No effect outlives its intent: the old goal's work in flight is voided, its children
    # cancelled, and every effect made for it (recorded or uncertain) is compensated while the
    # workflow rebuilds: after the children's, once they have ended.
    live_work_void(workflow, now=now, reason=f"intent v{old} superseded")
    children_cancel_live(workflow, why=f"superseded its goal (intent v{old} → v{old + 1})", by=username_of(user)
                         or "supersede", now=now, before_intent=old + 1)
    child_commitments_adopt(workflow, now=now)
    commitments_compensate_after_children(workflow, workflow.commitments.filter(status=Commitment.Status.ACTIVE),
                                          now=now, before_intent=old + 1)
    event_record(workflow=workflow, kind="intent.superseded", at=now, old=old, new=old + 1, by=username_of(user))
    if workflow.advance_retry_at is not None:
        # Failed advances were failures of the old goal's path: the new one advances now.
        workflow.handler_failures, workflow.advance_retry_at, workflow.reason = 0, None, ""
        workflow_save(workflow, "handler_failures", "advance_retry_at", "reason", at=now)
    if workflow.status == Workflow.Status.WAITING:
        workflow.wake(at=now)
        workflow_save(workflow, "status", at=now)
    enter_node(workflow, registry.definition(workflow.kind).revalidate_node, {}, now=now)
    doorbells.workflow_advance(workflow_id=workflow.pk)
    return Result.of(workflow, Outcome.APPLIED,
                     f"Workflow {workflow_id} now pursues intent v{old + 1}; its open approvals were withdrawn, its "
                     f"work for the old goal stopped and its effects compensated, and it revalidates before going on.")


@transaction.atomic
def workflow_resume(*, workflow_id: int, user: Any = None, by: str = "") -> Result:
    """Resume a paused workflow, retry failed compensations (of a workflow in any state), or
    re-ring a running one whose doorbell may be lost.

    A workflow an operator paused goes on exactly where it stopped (``operator_resume_locked``).
    A workflow paused, or backing off, after failed advances is advanced at once, in this
    call, with a fresh count of failures: HANDLER_FAILED when it fails again (recorded).
    Idempotent: resuming a running workflow only rings its doorbell again; only failed
    compensations get new attempts (conditional UPDATE on status=failed).
    Raises TransitionRefused for waiting and terminal workflows, naming what they wait for.
    """
    workflow = workflow_lock(workflow_id)
    now = clock.now()
    by = username_of(user) or by.strip()[:150] or "an operator"
    if workflow.status == Workflow.Status.PAUSED and workflow.pause_cause == Workflow.PauseCause.BUDGET:
        raise TransitionRefused(f"Workflow {workflow_id} is paused because its budget ran out; resuming would pause "
                                f"it again at its next model call. Raise the budget (`manage.py agent budget "
                                f"{workflow_id} --total USD --user NAME`, or POST "
                                f"/api/workflows/{workflow_id}/budget), which resumes it.")
    # A compensation out of attempts leaves an effect nothing undoes, whatever the workflow's state.
    retried = compensations_retry(workflow, now=now)
    if workflow.status == Workflow.Status.PAUSED and workflow.pause_cause == Workflow.PauseCause.OPERATOR:
        return operator_resume_locked(workflow, now=now, by=by)
    if workflow.status == Workflow.Status.PAUSED:
        failed = workflow.pause_cause == Workflow.PauseCause.HANDLER_FAILED
        if workflow.pause_cause == Workflow.PauseCause.DEFINITION:
            workflow.reason = ""  # the question was for the person who just answered it
            workflow_save(workflow, "reason", at=now)
        wake_locked(workflow, now=now, cause=f"resumed by {by}")
        return _advance_now(workflow, now=now, by=by) if failed else _resumed(workflow)
    if workflow.status == Workflow.Status.RUNNING and workflow.handler_failures:
        return _advance_now(workflow, now=now, by=by)
    if retried:
        return Result.of(workflow, Outcome.APPLIED, f"Workflow {workflow_id}: {retried} failed compensation"
                                                    f"{'s get' if retried > 1 else ' gets'} new attempts.")
    if workflow.status in (Workflow.Status.RUNNING, Workflow.Status.CANCELLING):
        doorbells.workflow_advance(workflow_id=workflow.pk)
        return Result.of(workflow, Outcome.ALREADY_APPLIED,
                         f"Workflow {workflow_id} was already {workflow.status}; its doorbell was rung again.")
    if workflow.status == Workflow.Status.WAITING:
        waits = ", ".join(f"{w.kind} wait {w.pk}" for w in workflow.waits.filter(status=Wait.Status.OPEN))
        raise TransitionRefused(
            f"Workflow {workflow_id} is waiting on {waits or 'a wait'}; decide or signal it instead."
        )
    raise TransitionRefused(f"Workflow {workflow_id} is {workflow.status}; it cannot be resumed.")


def _resumed(workflow: Workflow) -> Result:
    return Result.of(workflow, Outcome.APPLIED, f"Workflow {workflow.pk} resumed; it is {workflow.status}.")


def _advance_now(workflow: Workflow, *, now: datetime, by: str) -> Result:
    """Advance a workflow after its handler failures, presumably fixed, with a fresh count
    (the failures' reason goes with them; a new failure writes its own)."""
    if workflow.status != Workflow.Status.RUNNING:
        return _resumed(workflow)  # waking it ended it (its release policy) or sent it elsewhere
    event_record(workflow=workflow, kind="workflow.advance_retried", at=now, by=by,
                 failures=workflow.handler_failures)
    workflow.handler_failures, workflow.advance_retry_at, workflow.reason = 0, None, ""
    workflow_save(workflow, "handler_failures", "advance_retry_at", "reason", at=now)
    with events_batched(workflow):
        outcome = advance_locked(workflow)
    if outcome == Outcome.HANDLER_FAILED:
        return Result.of(workflow, outcome, f"Workflow {workflow.pk} was resumed, but advancing failed again: "
                                            f"{workflow.reason}")
    return _resumed(workflow)
