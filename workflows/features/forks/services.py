"""Fork: a new workflow that reuses the first N node visits of another and runs on from there.

A handler reads nothing of earlier visits but the durable state (``selectors.recorded_activities``
reads the current visit only), and the checkpoint of visit N + 1 holds the state the original
entered that visit with: everything visits 1 to N recorded, as the handlers kept it. So a fork is
that state, started at visit N + 1's node with the current definition: the visits it reuses are
never replayed, nothing of them runs again, and every step after them is the fork's own (its
operation ids start with its own workflow id). The original's commitments stay the original's:
the fork owns no activity of the visits it reused, so nothing it does (complete, fail, cancel)
releases or compensates them.
"""
from __future__ import annotations

import logging
from decimal import Decimal
from typing import Any

from django.db import transaction

from workflows import clock, registry, selectors, statestore
from workflows.errors import TransitionRefused
from workflows.models import Checkpoint, Intent, Workflow, WorkflowLabel
from workflows.services.common import event_record, events_batched, release_current, workflow_lock
from workflows.services.steps import username_of

logger = logging.getLogger("agentops.workflows")


def workflow_fork(*, workflow_id: int, from_visit: int, user: Any = None, by: str = "") -> Workflow:
    """Start a fork of workflow ``workflow_id`` that reuses its visits 1 to ``from_visit`` (see the
    module's docstring) and advance it in the same transaction, as a launch does.

    The fork has the original's kind, parameters, labels and options (release policy, priority, hourly
    budget, stagnation policy, fallback model; as its total budget what the original has left of its
    own; a time limit as long as the original's, from now), the goal
    of the intent version that visit was entered under (as its intent v1), the current release and
    definition version, ``forked_from`` and ``forked_from_visit``; ``user`` (or ``by``) launched it.
    Recorded as ``workflow.forked`` on the original and ``workflow.launched`` (with the relation)
    on the fork.

    Not idempotent: every call makes a new fork. Raises TransitionRefused for a visit out of range
    (1 to the original's current visit minus one), a kind that declares it cannot be forked, an
    original whose checkpoints retention archived, or a visit whose node the current definition no
    longer has; each writes nothing.
    """
    with transaction.atomic():
        original = workflow_lock(workflow_id)
        definition = registry.definition(original.kind)
        if definition.fork_refusal:
            raise TransitionRefused(f"Workflow {workflow_id} cannot be forked: {definition.fork_refusal}",
                                    workflow_id=workflow_id)
        last = original.node_visit - 1
        # Refusals, not bad input: which visits exist is the workflow's state (the HTTP API answers 409).
        if last < 1:
            raise TransitionRefused(
                f"Workflow {workflow_id} has not finished a node visit yet (it is at visit 1, "
                f"{original.current_node}); there is nothing to reuse. Launch a new one instead.",
                workflow_id=workflow_id)
        if not 1 <= from_visit <= last:
            raise TransitionRefused(
                f"The visit to fork from must be between 1 and {last}, the node visits workflow {workflow_id} "
                f"finished (it is at visit {original.node_visit}, {original.current_node}); got {from_visit}. "
                f"`agent show {workflow_id}` lists its node.entered events.", workflow_id=workflow_id)
        if original.history_archived:
            raise TransitionRefused(f"Workflow {workflow_id}'s checkpoints were archived to "
                                    f"{original.history_archive_path}; a fork needs them in the database.",
                                    workflow_id=workflow_id)
        entered = Checkpoint.objects.filter(workflow=original, node_visit=from_visit + 1).first()
        if entered is None:
            raise TransitionRefused(f"Workflow {workflow_id} has no checkpoint of visit {from_visit + 1}; it cannot "
                                    "be forked there.", workflow_id=workflow_id)
        if entered.node not in definition.nodes:
            raise TransitionRefused(
                f"Visit {from_visit + 1} of workflow {workflow_id} entered node {entered.node}, which the current "
                f"{original.kind} definition (version {definition.version}) no longer has; fork from an earlier "
                "visit.", workflow_id=workflow_id)
        state = statestore.state_at(original, from_visit + 1)
        goal = Intent.objects.values_list("goal", flat=True).get(workflow=original, version=entered.intent_version)
        fork = _fork_create(original, entered, definition_version=definition.version, from_visit=from_visit,
                            user=user, goal=goal, state=state)
        who = username_of(user) or by.strip()[:150] or "unknown"
        event_record(workflow=original, kind="workflow.forked", at=fork.created_at, fork_id=fork.pk,
                     from_visit=from_visit, by=who)
        from workflows.services.workflows import advance_locked

        with events_batched(fork):
            event_record(workflow=fork, kind="workflow.launched", at=fork.created_at, goal=goal, params=fork.params,
                         release=fork.release.fingerprint, by=who, forked_from=original.pk, from_visit=from_visit,
                         node=fork.current_node, visit=fork.node_visit)
            advance_locked(fork)
    logger.info("workflow.forked", extra={"workflow_id": fork.pk, "forked_from": original.pk,
                                          "from_visit": from_visit})
    return fork


def _fork_create(original: Workflow, entered: Checkpoint, *, definition_version: int, from_visit: int, user: Any,
                 goal: str, state: dict[str, Any]) -> Workflow:
    """The fork's row, its intent and its first checkpoint (the whole state, stored as its own)."""
    now = clock.now()
    limit = original.deadline - original.created_at if original.deadline is not None else None
    release = release_current(at=now)
    fork = Workflow(
        kind=original.kind, definition_version=definition_version, current_node=entered.node,
        node_visit=entered.node_visit, params=original.params, release=release,
        release_provisional=release.announced_at is None, release_policy=original.release_policy, launched_by=user,
        deadline=now + limit if limit is not None else None, priority=original.priority,
        budget_total_usd=_left(original), budget_hourly_usd=original.budget_hourly_usd,
        stagnation_policy=original.stagnation_policy, stagnation_window_hours=original.stagnation_window_hours,
        fallback_model=original.fallback_model, forked_from=original, forked_from_visit=from_visit,
        created_at=now, updated_at=now,
    )
    fork.start(at=now)
    fork.save()
    WorkflowLabel.objects.bulk_create(WorkflowLabel(workflow=fork, key=key, value=value) for key, value in
                                      original.labels.values_list("key", "value"))
    Intent.objects.create(workflow=fork, version=1, goal=goal, created_by=user, created_at=now)
    # Long values become the fork's own blobs: retention prunes each workflow's blobs with it.
    written = statestore.state_write(fork, state, previous=None, what=f"The state of workflow {original.pk} at "
                                     f"visit {entered.node_visit}", now=now)
    fork.checkpoint = Checkpoint.objects.create(
        workflow=fork, node=fork.current_node, node_visit=fork.node_visit, intent_version=1, state=fork.state,
        delta=None, state_hash=written.state_hash, chain_bytes=0, created_at=now)
    fork.save(update_fields=["state", "checkpoint"])
    return fork


def _left(original: Workflow) -> Decimal | None:
    """A fork's total: what the original has left of its own (never below nothing), so that the two
    together never spend more than the one budget they came from; None when it has none."""
    if original.budget_total_usd is None:
        return None
    return max(original.budget_total_usd - selectors.spent_usd(original), Decimal(0))
