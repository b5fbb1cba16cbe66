"""The moves that leave what a node visit holds: enter the next node, complete or fail the
workflow, wake it (when its release changed, the wake may fail it or send it to revalidate). Each
reaches past the workflow's own rows to the children its visit started, cancelled when it is left,
so this module sits above ``cancellation``, which builds on ``steps`` alone; ``races`` and
``waits`` sit above this one."""
from __future__ import annotations

from datetime import datetime
from typing import Any

from django.db.models import Q

from workflows import doorbells, registry, statestore
from workflows.models import Activity, Checkpoint, Commitment, Signal, Wait, Workflow
from workflows.services.cancellation import children_cancel_live
from workflows.services.common import event_record, release_current, workflow_save
from workflows.services.steps import (
    child_commitments_adopt,
    commitments_compensate,
    commitments_compensate_after_children,
    compensation_ensure,
    live_work_void,
    parent_ring_on_commit,
    trace_finished_on_commit,
    uncertain_commitments_ensure,
)
from workflows.sql import row_insert, rows_select
from workflows.statestore import json_checked


def enter_node(workflow: Workflow, node: str, updates: dict[str, Any], *, now: datetime,
               left_live: bool = True) -> None:
    """Leave the current node visit for a new visit of ``node``. Work the left visit still has
    in flight (a replan leaves a running task behind) is voided, its possible effects compensated.
    ``left_live`` False: the caller read every activity of the visit under the row lock and none
    was live, so they are not looked for again."""
    previous = workflow.current_node
    if left_live:
        left = live_work_void(workflow, now=now, reason=f"node {previous} (visit {workflow.node_visit}) was left",
                              visit=workflow.node_visit)
        commitments_compensate(workflow, left, now=now)
    children_cancel_live(workflow, why=f"left node {previous} (visit {workflow.node_visit}) that started it",
                         by="node left", now=now, visit=workflow.node_visit)
    # Only what changed is written: long values once (blobs), the checkpoint as a delta
    # (workflows.statestore); the row keeps the stored form of the whole state.
    written = statestore.state_write(workflow, updates, previous=_last_checkpoint_chain(workflow),
                                     what=f"State written by node {previous}", now=now)
    workflow.enter_node(node, at=now)
    checkpoint = Checkpoint(
        workflow=workflow, node=node, node_visit=workflow.node_visit, intent_version=workflow.intent_version,
        state=workflow.state if written.delta is None else {}, delta=written.delta, state_hash=written.state_hash,
        chain_bytes=written.chain_bytes, created_at=now,
    )
    row_insert(checkpoint)
    workflow.checkpoint = checkpoint
    event_record(workflow=workflow, kind="node.entered", at=now, node=node, previous=previous,
                 visit=workflow.node_visit)
    workflow_save(workflow, "state", "current_node", "node_visit", "checkpoint", at=now, with_events=True)


def _last_checkpoint_chain(workflow: Workflow) -> tuple[str, int] | None:
    """The state hash and chain length of the workflow's last checkpoint: from the instance when
    this transaction wrote it (an advance that enters two nodes) or read it with the row lock
    (``workflow_lock(advance=True)``), else read."""
    if workflow.checkpoint_id is None:
        return None
    cached = Workflow._meta.get_field("checkpoint").get_cached_value(workflow, None)
    if cached is not None and cached.pk == workflow.checkpoint_id:
        return cached.state_hash, cached.chain_bytes
    read = workflow.checkpoint_read
    if read is not None and read[0] == workflow.checkpoint_id:
        return read[1], read[2]
    rows = rows_select(Checkpoint, ("state_hash", "chain_bytes"), {"id": workflow.checkpoint_id})
    return (rows[0][0], rows[0][1]) if rows else None


def complete_locked(workflow: Workflow, result: Any, *, now: datetime) -> None:
    """Complete: children still running are no longer wanted (cancelled), nor are the effects its
    work in flight or its failed activities may have made (compensated: a handler that went on
    after a failure took another path); the active commitments (those its completed children
    handed over included) are the outcome. A root releases them; a
    child keeps them active for its parent, which takes them over when it collects this end
    (``child_commitments_adopt``): the tree owns them until its root ends, so a cancel, a new goal
    or a failure of any ancestor still undoes them."""
    commitments_compensate(workflow, live_work_void(workflow, now=now, reason="workflow completed"), now=now)
    children_cancel_live(workflow, why="completed without waiting for it", by="workflow completed", now=now)
    child_commitments_adopt(workflow, now=now)
    for commitment in workflow.commitments.filter(status=Commitment.Status.ACTIVE).select_related("activity"):
        if commitment.of_a_failure:  # the handler went on without it: what it may have done is undone
            compensation_ensure(workflow, commitment, now=now)
            continue
        if workflow.parent_id is not None:
            event_record(workflow=workflow, kind="commitment.held_for_parent", at=now, commitment_id=commitment.pk,
                         commitment_kind=commitment.kind, parent=workflow.parent_id)
            continue
        commitment.release(at=now)
        commitment.save(update_fields=["status", "closed_at"])
        event_record(workflow=workflow, kind="commitment.released", at=now, commitment_id=commitment.pk,
                     commitment_kind=commitment.kind)
    workflow.complete(at=now, result=json_checked(result, what="The workflow result"))
    event_record(workflow=workflow, kind="workflow.completed", at=now)
    workflow_save(workflow, "status", "result", at=now)
    trace_finished_on_commit(workflow)
    parent_ring_on_commit(workflow)


def fail_locked(workflow: Workflow, reason: str, *, now: datetime) -> None:
    """Fail: void the work in flight, cancel the children still running, and compensate every
    active commitment, the uncertain effects of failed or voided attempts included; a failed
    workflow owns no effect. While a child is still being cancelled, the compensations wait for
    it (``children.compensations_after_children``): a child's effects are undone first."""
    live_work_void(workflow, now=now, reason="workflow failed")
    uncertain_commitments_ensure(workflow, now=now)
    workflow.fail(at=now, reason=reason)
    event_record(workflow=workflow, kind="workflow.failed", at=now, reason=reason)
    workflow_save(workflow, "status", "reason", at=now)
    trace_finished_on_commit(workflow)
    parent_ring_on_commit(workflow)
    children_cancel_live(workflow, why=f"failed: {reason[:300]}", by="workflow failed", now=now)
    child_commitments_adopt(workflow, now=now)
    commitments_compensate_after_children(workflow, workflow.commitments.filter(status=Commitment.Status.ACTIVE),
                                          now=now)


def wake_locked(workflow: Workflow, *, now: datetime, cause: str, resume: bool = False) -> None:
    """Resume a waiting or paused workflow and check its behavioral release (per its policy).

    A workflow an operator paused stays paused unless ``resume`` (``workflow_resume``): what would
    wake it (a decision, a signal) is recorded on its wait, and the advance after the resume reads it.
    """
    if workflow.status == Workflow.Status.PAUSED and workflow.pause_cause == Workflow.PauseCause.OPERATOR \
            and not resume:
        event_record(workflow=workflow, kind="workflow.wake_held", at=now, cause=cause,
                     why="paused by an operator; it goes on when resumed")
        return
    workflow.wake(at=now)
    event_record(workflow=workflow, kind="workflow.woken", at=now, cause=cause)
    workflow_save(workflow, "status", at=now)
    doorbells.workflow_advance(workflow_id=workflow.pk)
    # Work parked while the workflow was paused has no doorbell in flight.
    for pk, name in workflow.activities.filter(
        status=Activity.Status.SCHEDULED, next_attempt_at__lte=now
    ).values_list("pk", "name"):
        doorbells.activity_run(activity_id=pk, name=name)
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
        release_revalidate_if_no_effect(workflow, now=now)


def release_revalidate_if_no_effect(workflow: Workflow, *, now: datetime) -> bool:
    """Under ``revalidate``, send a woken workflow whose release changed to its definition's
    revalidate node, unless that would repeat or strand what it already did. Returns whether it went.

    - An **effect** of the current intent (a commitment, recorded or uncertain, not undone; its
      own or one of its children's) stands: the workflow goes on from where it waited, with the
      new release for what follows (``release.kept_course``); a revalidation would redo the
      effect under a new operation.
    - A rejection, or an expiry whose policy is fail, is final: the node's handler must see it
      instead of being sent back to rebuild a candidate and ask again.
    - Otherwise it revalidates, and every signal a wait of the visit it leaves had taken goes
      back to its queue (``signal.requeued``), so the next wait for its name receives it: no
      signal is consumed without a handler seeing it.
    """
    visit = workflow.waits.filter(node_visit=workflow.node_visit)
    if visit.filter(Q(decision=Wait.Decision.REJECTED) | Q(status=Wait.Status.EXPIRED, timeout_policy="fail")).exists():
        return False
    # The tree's: its own and those its completed children handed over, and those of the
    # children it started for this intent that are still running.
    effects = list(Commitment.objects.filter(
        Q(workflow=workflow, intent_version=workflow.intent_version)
        | Q(workflow__parent=workflow, workflow__parent_wait__intent_version=workflow.intent_version),
        status__in=(Commitment.Status.ACTIVE, Commitment.Status.RELEASED),
    ).values_list("activity__operation_id", flat=True))
    if effects:
        event_record(workflow=workflow, kind="release.kept_course", at=now, node=workflow.current_node,
                     effects=effects[:20], why="effects of this intent stand; revalidating would redo them")
        return False
    for signal in Signal.objects.filter(workflow=workflow, consumed_by__in=visit).order_by("pk"):
        signal.consumed_by = None
        signal.save(update_fields=["consumed_by"])
        event_record(workflow=workflow, kind="signal.requeued", at=now, name=signal.name,
                     dedupe_key=signal.dedupe_key, why="the release changed and the workflow revalidates")
    enter_node(workflow, registry.definition(workflow.kind).revalidate_node, {}, now=now)
    return True
