"""A new goal: ``workflow_supersede`` records the next intent version, stops and undoes what the
old goal started (its waits, work in flight, children and effects), and sends the workflow to
revalidate."""
from __future__ import annotations

from typing import Any

from django.db import transaction

from workflows import clock, doorbells, registry
from workflows.errors import TransitionRefused
from workflows.models import ClientRequest, Commitment, Intent, Wait, Workflow
from workflows.services.cancellation import children_cancel_live
from workflows.services.client_requests import client_request_claim_once, idempotency_key_checked
from workflows.services.common import event_record, text_checked, workflow_lock, workflow_save
from workflows.services.steps import (
    MAX_GOAL_CHARS,
    Outcome,
    Result,
    child_commitments_adopt,
    commitments_compensate_after_children,
    live_work_void,
    username_of,
)
from workflows.services.visits import enter_node


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
