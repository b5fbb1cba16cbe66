"""Child workflows: start one from a parent's handler, deliver its end to the parent, and undo the
parent's effects only once the children a cancel, a failure or a new goal stopped have ended."""
from __future__ import annotations

from datetime import datetime
from decimal import ROUND_DOWN, Decimal
from typing import Any

from django.db import transaction

from workflows import clock, doorbells, engine, registry, selectors
from workflows.errors import BudgetExhausted, InvalidInput, NotFound
from workflows.models import Commitment, Wait, Workflow
from workflows.services.budgets import pause_for_budget_locked
from workflows.services.common import amount_checked, event_record, workflow_lock
from workflows.services.steps import BUDGET_PAUSE_PREFIX, child_commitments_adopt, commitments_compensate, wake_locked

BUDGET_STEP = Decimal("0.0001")  # Workflow.budget_total_usd's precision


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
    from workflows.services.workflows import workflow_launch_once  # it imports this module

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
        user=workflow.launched_by, priority=workflow.priority, budget_total_usd=budget,
        budget_hourly_usd=workflow.budget_hourly_usd, parent_wait=wait,
    )
    event_record(workflow=workflow, kind="child.started", at=now, wait_id=wait.pk, operation_id=wait.operation_id,
                 child=child.pk, child_kind=child.kind, budget_usd=None if budget is None else str(budget))
    if child.is_terminal:  # it ended in its own launch (a kind that completes at once)
        child_wait_close(workflow, wait, child, now=now)
    return True


def _child_budget(workflow: Workflow, command: engine.StartChild) -> Decimal | None:
    """The child's total budget: as asked, or what remains of the parent's; BudgetExhausted when
    it does not fit in what remains (the parent's spend and its live children's budgets)."""
    asked = None
    if command.budget_usd is not None:
        try:
            asked = Decimal(command.budget_usd)
        except ArithmeticError:
            raise InvalidInput(f"ctx.child(budget={command.budget_usd!r}) is not an amount of USD.") from None
        asked = amount_checked(asked, what=f"The budget of child {command.operation_id}")
    if workflow.budget_total_usd is None:
        return asked
    left = workflow.budget_total_usd - selectors.spent_usd(workflow)
    budget = left.quantize(BUDGET_STEP, rounding=ROUND_DOWN) if asked is None else asked
    if budget <= 0 or budget > left:
        raise BudgetExhausted(
            f"{BUDGET_PAUSE_PREFIX}: workflow {workflow.pk} has {max(left, Decimal(0)):.4f} of its "
            f"{workflow.budget_total_usd:.4f} USD left (its spend and its children's budgets), and its child "
            f"{command.operation_id} ({command.child_kind}) needs {budget:.4f}; raise the budget (`manage.py agent "
            f"budget {workflow.pk} --total USD`, or POST /api/workflows/{workflow.pk}/budget) to start it.",
            workflow_id=workflow.pk,
        )
    return budget


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


@transaction.atomic
def children_collect_if_finished(*, workflow_id: int) -> int:
    """Deliver the end of each child of workflow ``workflow_id`` that has ended to its child wait;
    wake the parent when it waited for a child of its current node visit (or ring its advance
    when it runs or cancels), and compensate what a failure or a new goal of the parent held back
    for its children (``compensations_after_children``). Rung by every child's end, and by beat
    for an end whose doorbell was lost (``sweeps.children_collect_due``).

    Idempotent: only open child waits whose child has ended are closed, under the parent's row
    lock; a second call closes none. Returns how many it closed.
    """
    try:
        workflow = workflow_lock(workflow_id)
    except NotFound:
        return 0
    now = clock.now()
    waits = {w.pk: w for w in workflow.waits.filter(kind=Wait.Kind.CHILD, status=Wait.Status.OPEN)}
    ended = Workflow.objects.filter(parent_wait__in=list(waits), status__in=Workflow.TERMINAL).order_by("pk")
    closed, current = 0, False
    for child in ended:
        assert child.parent_wait_id is not None
        wait = waits[child.parent_wait_id]
        child_wait_close(workflow, wait, child, now=now)
        closed += 1
        current |= (wait.node_visit, wait.intent_version) == (workflow.node_visit, workflow.intent_version)
    # Before the parent goes on: what a completed child made is the parent's from now on.
    child_commitments_adopt(workflow, now=now)
    settled = 0
    if closed and current:
        from workflows.services.races import first_waits_settle  # it imports this module

        # A first-of wait that the end of one of its children wins wakes the parent itself.
        settled = first_waits_settle(workflow, now=now)
    if settled:
        pass
    elif closed and current and workflow.status == Workflow.Status.WAITING:
        # A handler that stops at a wait still open (a race's loser ending after the race was
        # decided, while the handler waits for something else) has nothing to go on with.
        if not workflow.waits.filter(node_visit=workflow.node_visit, status=Wait.Status.OPEN).exclude(
                kind=Wait.Kind.CHILD).exists():
            wake_locked(workflow, now=now, cause=f"{closed} child workflow{'s' if closed > 1 else ''} ended")
    elif closed and workflow.status in (Workflow.Status.RUNNING, Workflow.Status.CANCELLING):
        doorbells.workflow_advance(workflow_id=workflow.pk)
    compensations_after_children(workflow, now=now)
    return closed


def compensations_after_children(workflow: Workflow, *, now: datetime) -> int:
    """Compensate the parent's active commitments that its failure (all of them) or a new goal
    (those of older intents) left for after its children: a child's effects are undone before its
    parent's. A cancel orders its own (``advance_cancellation`` waits for the children). Returns
    how many compensations it scheduled.

    Idempotent: compensations are ensured by operation id (``compensation_ensure``).
    """
    active = workflow.commitments.filter(status=Commitment.Status.ACTIVE)
    if workflow.status == Workflow.Status.FAILED:
        before = None
    elif workflow.status in (Workflow.Status.CANCELLING, Workflow.Status.CANCELLED):
        return 0
    else:
        before = workflow.intent_version
        active = active.filter(intent_version__lt=before)
    due = list(active)
    if not due or selectors.children_live(workflow, before_intent=before):
        return 0
    commitments_compensate(workflow, due, now=now)
    return len(due)

