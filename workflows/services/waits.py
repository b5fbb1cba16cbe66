"""Waits: open one (an advance's ``OpenWait``), decide it (approve, reject), fire its durable timers."""
from __future__ import annotations

import enum
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from django.db import transaction

from workflows import clock, engine, hooks
from workflows.authority import wait_authority_refusal
from workflows.errors import InvalidInput, NotFound, WaitRefused
from workflows.models import Signal, Timer, Wait, Workflow
from workflows.services import lifecycle
from workflows.services.common import event_record, text_checked, workflow_lock, workflow_save
from workflows.services.races import first_wait_settle
from workflows.services.steps import signal_consume
from workflows.services.visits import wake_locked
from workflows.statestore import json_checked

MAX_COMMENT_CHARS = 5_000


class Decision(enum.StrEnum):
    APPLIED = "applied"
    ALREADY_APPLIED = "already_applied"


@dataclass(frozen=True)
class DecisionResult:
    outcome: Decision
    message: str
    wait_id: int
    workflow_id: int


def wait_approve(*, wait_id: int, user: Any, candidate_hash: str, comment: str = "") -> DecisionResult:
    """Approve an open approval wait for one exact candidate.

    Idempotent: repeating the same approval returns ALREADY_APPLIED (status checked under the
    workflow's row lock) and changes nothing. Raises WaitRefused when the wait is expired,
    decided otherwise, invalidated, bound to another candidate or intent version, or the
    user lacks the role, launched the workflow or set the goal the wait was opened under.
    """
    return _decide(wait_id=wait_id, user=user, decision=Wait.Decision.APPROVED, candidate_hash=candidate_hash,
                   comment=comment)


def wait_reject(*, wait_id: int, user: Any, comment: str = "") -> DecisionResult:
    """Reject an open approval wait; the workflow fails with the reason. Idempotent like approval."""
    return _decide(wait_id=wait_id, user=user, decision=Wait.Decision.REJECTED, candidate_hash="", comment=comment)


def _decide(*, wait_id: int, user: Any, decision: str, candidate_hash: str, comment: str) -> DecisionResult:
    comment = text_checked(comment, what="The comment", max_length=MAX_COMMENT_CHARS) if comment.strip() else ""
    workflow_id = Wait.objects.filter(pk=wait_id).values_list("workflow_id", flat=True).first()
    if workflow_id is None:
        raise NotFound(f"Wait {wait_id} does not exist; `manage.py agent show ID` (GET /api/workflows/ID) lists "
                       "a workflow's waits.",
                       wait_id=wait_id)
    with transaction.atomic():
        workflow = workflow_lock(workflow_id)
        wait = Wait.objects.select_for_update(of=("self",)).select_related("decided_by").get(pk=wait_id)
        if wait.is_decided(decision, candidate_hash):
            return DecisionResult(
                Decision.ALREADY_APPLIED,
                f"Wait {wait.pk} was already {decision} by {wait.decided_by} at "
                f"{wait.decided_at:%Y-%m-%d %H:%M:%S} UTC; nothing changed.",
                wait.pk, workflow.pk,
            )
        now = clock.now()
        _check_decidable(wait=wait, workflow=workflow, user=user, decision=decision, candidate_hash=candidate_hash,
                         now=now)
        wait.decide(decision=decision, by=user, at=now, comment=comment)
        wait.save(update_fields=["status", "decision", "decided_by", "decided_at", "comment"])
        event_record(workflow=workflow, kind=f"wait.{decision}", at=now, wait_id=wait.pk, by=user.username,
                     candidate_hash=wait.candidate_hash, comment=comment)
        wake_locked(workflow, now=now, cause=f"wait {wait.pk} {decision} by {user.username}")
    return DecisionResult(Decision.APPLIED, f"Wait {wait.pk} {decision} by {user.username}.", wait.pk, workflow.pk)


def _check_decidable(
    *, wait: Wait, workflow: Workflow, user: Any, decision: str, candidate_hash: str, now: datetime
) -> None:
    refuse = _refusal(wait=wait, workflow=workflow, user=user, decision=decision, candidate_hash=candidate_hash,
                      now=now)
    if refuse:
        raise WaitRefused(refuse, wait_id=wait.pk, workflow_id=workflow.pk)


def _refusal(
    *, wait: Wait, workflow: Workflow, user: Any, decision: str, candidate_hash: str, now: datetime
) -> str:
    if wait.kind != Wait.Kind.APPROVAL:
        return f"Wait {wait.pk} is a {wait.kind} wait, not an approval; use `agent signal` for events."
    if wait.status == Wait.Status.SATISFIED:
        return (f"Wait {wait.pk} was already {wait.decision} by {wait.decided_by} at "
                f"{wait.decided_at:%Y-%m-%d %H:%M:%S} UTC; a decision cannot be changed.")
    if wait.status == Wait.Status.INVALIDATED:
        return (f"Wait {wait.pk} was invalidated at {wait.decided_at:%Y-%m-%d %H:%M:%S} UTC because the goal changed "
                f"(intent v{wait.intent_version} → v{workflow.intent_version}); decide on the new candidate instead.")
    if wait.status != Wait.Status.OPEN:
        return f"Wait {wait.pk} is {wait.status}; it can no longer be decided."
    if wait.expires_at is not None and wait.expires_at <= now:
        return f"Wait {wait.pk} expired at {wait.expires_at:%Y-%m-%d %H:%M:%S} UTC; it can no longer be decided."
    if wait.intent_version != workflow.intent_version:
        return (f"Wait {wait.pk} is bound to intent v{wait.intent_version}, but workflow {workflow.pk} is at "
                f"v{workflow.intent_version}; decide on the new candidate instead.")
    if decision == Wait.Decision.APPROVED and candidate_hash != wait.candidate_hash:
        return (f"Wait {wait.pk} is bound to candidate {wait.candidate_hash[:12]}…, "
                f"not {candidate_hash[:12] or '(none)'}…; "
                "reopen the approval queue or `agent show` to decide on the current candidate.")
    return wait_authority_refusal(wait=wait, user=user)


def timer_fire_if_due(*, timer_id: int) -> bool:
    """Fire one due timer: satisfy or expire its wait and wake the workflow.

    Idempotent: conditional UPDATE pending → fired; a second beat (or a second call) finds
    nothing to claim. A timer whose wait, intent or workflow moved on is recorded as ignored.
    """
    workflow_id = Timer.objects.filter(pk=timer_id).values_list("workflow_id", flat=True).first()
    if workflow_id is None:
        return False
    with transaction.atomic():
        workflow = workflow_lock(workflow_id)
        now = clock.now()
        if not lifecycle.rows_move(Timer.objects.filter(pk=timer_id, fire_at__lte=now), "fire", at=now):
            return False
        timer = Timer.objects.select_related("wait").get(pk=timer_id)
        stale = _timer_staleness(timer, workflow)
        if stale:
            lifecycle.rows_move(Timer.objects.filter(pk=timer_id), "ignore", note=stale)
            event_record(workflow=workflow, kind="timer.ignored", at=now, timer_id=timer_id, reason=stale)
            return True
        wait = timer.wait
        if wait.kind == Wait.Kind.FIRST:
            event_record(workflow=workflow, kind="timer.fired", at=now, timer_id=timer_id, wait_id=wait.pk,
                         purpose=timer.purpose, late_seconds=round((now - timer.fire_at).total_seconds(), 3))
            # It wakes the workflow; a child of the race that ended before the timer still wins.
            first_wait_settle(workflow, wait, now=now, timer_fired=True)
            return True
        if timer.purpose == Timer.Purpose.WAKE:
            wait.satisfy(at=now, payload=None)
        else:
            wait.expire(at=now)
        wait.save(update_fields=["status", "decided_at", "payload"])
        event_record(workflow=workflow, kind="timer.fired", at=now, timer_id=timer_id, wait_id=wait.pk,
                     purpose=timer.purpose, late_seconds=round((now - timer.fire_at).total_seconds(), 3))
        if workflow.status == Workflow.Status.WAITING:
            wake_locked(workflow, now=now, cause=f"timer {timer_id} ({timer.purpose})")
    return True


def _timer_staleness(timer: Timer, workflow: Workflow) -> str:
    if timer.intent_version != workflow.intent_version:
        return f"bound to intent v{timer.intent_version}, superseded by v{workflow.intent_version}"
    if workflow.is_terminal or workflow.status == Workflow.Status.CANCELLING:
        return f"workflow is {workflow.status}"
    if timer.wait.status != Wait.Status.OPEN:
        return f"wait {timer.wait_id} is already {timer.wait.status}"
    return ""


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
            "first_of": list(command.children), "created_at": now,
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
    if wait.kind == Wait.Kind.APPROVAL:
        # A feature may join the wait's transaction: the notifications feature schedules the
        # approvers' notice, so a crash cannot open the wait without it.
        hooks.approval_opened.send(sender=Wait, workflow=workflow, wait=wait, now=now)
    if wait.kind == Wait.Kind.EVENT:
        # Signals queued before the wait opened: the oldest of its name is its answer.
        signal = Signal.objects.filter(workflow=workflow, name=wait.event_name,
                                       consumed_by__isnull=True).order_by("pk").first()
        if signal is not None:
            signal_consume(workflow, wait, signal, now=now)
            return True
    if wait.kind == Wait.Kind.FIRST:
        # A child of the race that has ended, or a signal queued before the wait opened, wins at once.
        if first_wait_settle(workflow, wait, now=now):
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
