"""Child workflows: deliver a child's end to its parent, and undo the parent's effects only once
the children a cancel, a failure or a new goal stopped have ended. A child is started by its
parent's advance (``workflows.child_start``), whose launch advances the child in turn."""
from __future__ import annotations

from datetime import datetime

from django.db import transaction

from workflows import clock, doorbells, selectors
from workflows.errors import NotFound
from workflows.models import Commitment, Wait, Workflow
from workflows.services.common import workflow_lock
from workflows.services.races import first_waits_settle
from workflows.services.steps import child_commitments_adopt, child_wait_close, commitments_compensate
from workflows.services.visits import wake_locked


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

