"""A workflow's launch and advance, and the start of a child from its parent's advance: a child's
launch advances it, and that advance may start children of its own, so the three are one module."""
from __future__ import annotations

import contextlib
import functools
import logging
from datetime import datetime, timedelta
from decimal import Decimal
from typing import Any

from django.conf import settings
from django.db import transaction

from workflows import clock, engine, registry, selectors, telemetry
from workflows.errors import BudgetExhausted, NotFound
from workflows.models import ClientRequest, Intent, Wait, Workflow, WorkflowLabel
from workflows.rules import child_budget_share
from workflows.services.budgets import pause_for_budget_locked
from workflows.services.cancellation import advance_cancellation
from workflows.services.client_requests import client_request_claim_once, idempotency_key_checked
from workflows.services.common import (
    event_record,
    events_batched,
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
from workflows.services.launch_options import LaunchOptions
from workflows.services.lifecycle import LIVE
from workflows.services.steps import (
    MAX_GOAL_CHARS,
    MAX_STEPS_PER_ADVANCE,
    ChainSlot,
    Outcome,
    activity_schedule,
    child_wait_close,
    username_of,
)
from workflows.services.visits import complete_locked, enter_node, fail_locked
from workflows.services.waits import wait_open
from workflows.sql import row_insert_with
from workflows.statestore import json_checked

logger = logging.getLogger("agentops.workflows")


def workflow_launch(*, kind: str, goal: str, params: dict[str, Any] | None = None, user: Any = None,
                    options: LaunchOptions | None = None) -> Workflow:
    """Create a workflow with intent v1 and advance it in the same transaction (its first
    activity is scheduled, or its first wait opened, when this returns).

    ``options`` (``LaunchOptions``; by default as the kind declares): its time limit (past it, beat
    cancels the workflow), priority, budgets, release and stagnation policies, the model its calls
    move to on sustained overload (``workflows.releases.provider_for``) and the labels stored with
    it, to filter and count by.

    Not idempotent: every call launches a new workflow (``workflow_launch_once`` takes a key).
    Raises InvalidInput for an unknown kind, bad parameters, options or goal, and then writes nothing.
    """
    workflow, _ = workflow_launch_once(idempotency_key="", kind=kind, goal=goal, params=params, user=user,
                                       options=options)
    return workflow


def workflow_launch_once(
    *,
    idempotency_key: str,
    kind: str,
    goal: str,
    params: dict[str, Any] | None = None,
    user: Any = None,
    options: LaunchOptions | None = None,
    parent_wait: Wait | None = None,
) -> tuple[Workflow, bool]:
    """Launch as ``workflow_launch`` does, once per ``idempotency_key``: (workflow, True) when
    this call launched it; (workflow, False) when the same request with this key launched it
    before (the same kind, goal, parameters, options and user), and nothing was changed.

    Idempotent per key: unique constraint ``uniq_client_request_key``, claimed in the launch's
    transaction, so two concurrent launches with one key make one workflow
    (``client_request_claim_once``). An empty key launches every time. Raises
    IdempotencyKeyReused when the key named another request, InvalidInput as ``workflow_launch``
    does; both write nothing.

    ``parent_wait`` launches a child workflow (``child_start``, in
    the parent's locked advance): the child of that wait, ending no later than its parent's deadline.
    """
    idempotency_key = idempotency_key_checked(idempotency_key)
    definition = registry.definition(kind)
    goal = text_checked(goal, what="The goal", max_length=MAX_GOAL_CHARS)
    params = json_checked(definition.validate_params(dict(params or {})), what="The parameters")
    options = (options or LaunchOptions()).checked(definition)
    now = clock.now()
    request = {"kind": kind, "goal": goal, "params": params, **options.request(), "user": username_of(user)}
    launch = functools.partial(_launch, idempotency_key=idempotency_key, definition=definition, goal=goal,
                               params=params, options=options, request=request, user=user, parent_wait=parent_wait,
                               now=now)
    try:
        workflow, launched = launch(savepoint=False)
    except AdvanceRaised:  # the definition raised: again, with the savepoint that records it
        workflow, launched = launch(savepoint=True)
    if launched:
        logger.info("workflow.launched", extra={"workflow_id": workflow.pk, "kind": kind})
    return workflow, launched


@transaction.atomic
def _launch(*, idempotency_key: str, definition: engine.WorkflowDefinition, goal: str, params: dict[str, Any],
            options: LaunchOptions, request: dict[str, Any], user: Any, parent_wait: Wait | None, now: datetime,
            savepoint: bool) -> tuple[Workflow, bool]:
    """``workflow_launch_once``'s transaction: the rows, then the first advance (``savepoint``:
    ``advance_locked``'s)."""
    kind, labels = definition.kind, dict(options.labels)
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
        release=release, release_provisional=release.announced_at is None,
        release_policy=options.release_policy, launched_by=user,
        deadline=now + timedelta(hours=options.max_hours) if options.max_hours is not None else None,
        priority=options.priority, budget_total_usd=options.budget_total_usd,
        budget_hourly_usd=options.budget_hourly_usd, stagnation_policy=options.stagnation_policy,
        stagnation_window_hours=settings.AGENTOPS_STAGNATION_WINDOW_HOURS,
        fallback_model=options.fallback_model, created_at=now, updated_at=now,
    )
    if parent_wait is not None:
        parent = parent_wait.workflow
        workflow.parent, workflow.parent_wait = parent, parent_wait
        if parent.deadline is not None and (workflow.deadline is None or parent.deadline < workflow.deadline):
            workflow.deadline = parent.deadline
    workflow.start(at=now)
    row_insert_with(workflow, Intent, {"version": 1, "goal": goal, "created_by": getattr(user, "pk", None),
                                       "created_at": now}, key="workflow")
    workflow.status_saved()
    WorkflowLabel.objects.bulk_create(WorkflowLabel(workflow=workflow, key=k, value=v) for k, v in labels.items())
    with events_batched(workflow):
        event_record(
            workflow=workflow, kind="workflow.launched", at=now, goal=goal, params=params,
            release=workflow.release.fingerprint, by=username_of(user), **({"labels": labels} if labels else {}),
            **({"parent": workflow.parent_id, "operation_id": parent_wait.operation_id} if parent_wait else {}),
        )
        # Nobody else sees the new row before the commit: advance it here, no doorbell needed.
        advance_locked(workflow, savepoint=savepoint, recorded=[])  # a new row: no activity recorded yet
    if claimed is not None:
        claimed.workflow = workflow
        claimed.save(update_fields=["workflow"])
    return workflow, True


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


def child_start(workflow: Workflow, command: engine.StartChild, *, now: datetime) -> bool:
    """Start the child workflow ``command`` asks for, once; the caller holds the parent's row
    lock (its advance). The child wait (kind ``child``, its operation id the step's) records the
    child's end; the child is launched in the same transaction, with its budget reserved from the
    parent's, the parent's launcher, priority and hourly limit, and no later deadline.

    Idempotent: the wait is looked up by operation id (unique ``Wait.operation_id``) under the
    parent's lock, and a child is launched only with its wait (constraint ``uniq_child_per_wait``).
    Returns False, having paused the parent for a person (pause cause budget), when the child's
    budget does not fit in what remains of the parent's total; raising the budget resumes it and
    the handler starts the child then. Raises InvalidInput for an unknown kind, bad parameters or
    goal: a bug of the definition, which the failure boundary records (nothing is kept).
    """
    if Wait.objects.filter(operation_id=command.operation_id).exists():
        return True
    registry.definition(command.child_kind)  # an unknown kind is refused before anything is written
    try:
        budget = _child_budget(workflow, command)
    except BudgetExhausted as exc:
        pause_for_budget_locked(workflow, exc, now=now)
        return False
    wait = Wait.objects.create(
        workflow=workflow, operation_id=command.operation_id, kind=Wait.Kind.CHILD, node=workflow.current_node,
        node_visit=workflow.node_visit, intent_version=workflow.intent_version, event_name=command.child_kind,
        created_at=now,
    )
    workflow.child_waits_open = True
    child, _ = workflow_launch_once(
        idempotency_key="", kind=command.child_kind, goal=command.goal, params=command.params,
        user=workflow.launched_by, parent_wait=wait,
        options=LaunchOptions(priority=workflow.priority, budget_total_usd=budget,
                              budget_hourly_usd=workflow.budget_hourly_usd),
    )
    event_record(workflow=workflow, kind="child.started", at=now, wait_id=wait.pk, operation_id=wait.operation_id,
                 child=child.pk, child_kind=child.kind, budget_usd=None if budget is None else str(budget))
    if child.is_terminal:  # it ended in its own launch (a kind that completes at once)
        child_wait_close(workflow, wait, child, now=now)
    return True


def _child_budget(workflow: Workflow, command: engine.StartChild) -> Decimal | None:
    """The child's total budget: as asked, or what remains of the parent's; BudgetExhausted when
    it does not fit in what remains (the parent's spend and its live children's budgets)."""
    return child_budget_share(command, total_usd=workflow.budget_total_usd, workflow_id=workflow.pk,
                              left_usd=lambda total: total - selectors.spent_usd(workflow))


