"""Progress samples (model-assessed, validated as data) and the stagnation check."""
from __future__ import annotations

import logging
from datetime import datetime, timedelta
from typing import Any

from django.conf import settings
from django.db import transaction

from workflows import clock, doorbells, registry
from workflows.models import Activity, Event, ProgressSample, Workflow
from workflows.progress import progress_validate
from workflows.services.common import event_record, workflow_lock, workflow_save
from workflows.services.failures import row_isolated
from workflows.services.steps import STAGNATION_PAUSE_PREFIX
from workflows.services.visits import enter_node
from workflows.sql import row_insert_unless_exists

logger = logging.getLogger("agentops.progress")

STAGNATION_POINTS = 5


def progress_record_once(*, workflow: Workflow, operation_id: str, result: Any, now: datetime) -> ProgressSample:
    """Store the sample of one verification. Idempotent: unique ``operation_id``."""
    progress = progress_validate(result)
    hours = progress.get("estimated_hours_left")
    sample = ProgressSample(
        workflow=workflow, operation_id=operation_id, percent=progress["percent"],
        confidence=float(progress["confidence"]), achievements=progress.get("achievements", []),
        remaining=progress.get("remaining", []),
        estimated_completion=now + timedelta(hours=hours) if hours is not None else None, created_at=now,
    )
    # One statement where get_or_create takes four (a read, a savepoint around the insert): every
    # verification of every autonomous agent stores one.
    if not row_insert_unless_exists(sample, unique="operation_id"):
        sample = ProgressSample.objects.get(operation_id=operation_id)
    return sample


def stagnation_check() -> int:
    """Flag running workflows that stopped moving; each at most once per its window.

    Each workflow is checked in its own savepoint: one that raises is recorded and skipped.
    """
    now = clock.now()
    silence = timedelta(hours=settings.AGENTOPS_SILENCE_HOURS)
    # The status too: django-fsm notes every loaded row's (a deferred one is read, a query a row).
    running = Workflow.objects.filter(status=Workflow.Status.RUNNING).only(
        "pk", "status", "stagnation_window_hours", "stagnation_flagged_at", "created_at"
    )
    # Nothing to read or write, so no savepoint either, for a workflow flagged within its window,
    # or one launched within both its window and the silence: each of its samples and events was
    # recorded after its launch, so none is old enough yet to find it stalled or silent. A fleet's
    # young workflows then cost this pass nothing (1,000 running: about 6,000 statements a pass).
    due = {w.pk: w for w in running
           if w.created_at <= now - min(_window(w), silence)
           and not (w.stagnation_flagged_at and w.stagnation_flagged_at > now - _window(w))}
    return sum(
        row_isolated("check_stagnation", pk, lambda pk: _stagnation_check_one(due[pk], now=now, silence=silence),
                     workflow_id=lambda pk: pk)
        for pk in due
    )


def _window(workflow: Workflow) -> timedelta:
    return timedelta(hours=workflow.stagnation_window_hours)


def _stagnation_check_one(workflow: Workflow, *, now: datetime, silence: timedelta) -> int:
    reason = (_stalled_progress(workflow, now=now, window=_window(workflow))
              or _silent(workflow, now=now, silence=silence))
    return stagnation_flag_if_due(workflow_id=workflow.pk, reason=reason) if reason else 0


def _stalled_progress(workflow: Workflow, *, now: datetime, window: timedelta) -> str:
    samples = ProgressSample.objects.filter(workflow=workflow)
    baseline = samples.filter(created_at__lte=now - window).order_by("-created_at").first()
    latest = samples.order_by("-created_at").first()
    if baseline is None or latest is None or latest.percent - baseline.percent >= STAGNATION_POINTS:
        return ""
    return (f"progress moved {latest.percent - baseline.percent} points ({baseline.percent}% → {latest.percent}%) "
            f"in {workflow.stagnation_window_hours:g} h, under {STAGNATION_POINTS}")


def _silent(workflow: Workflow, *, now: datetime, silence: timedelta) -> str:
    """No event for too long while nothing legitimate is pending (a heartbeating activity or
    a retry window in the future are legitimate)."""
    last = Event.objects.filter(workflow=workflow).order_by("-seq").values_list("created_at", flat=True).first()
    if last is None or last > now - silence:
        return ""
    activities = Activity.objects.filter(workflow=workflow)
    if activities.filter(status=Activity.Status.RUNNING, heartbeat_at__gt=now - silence).exists():
        return ""
    if activities.filter(status=Activity.Status.SCHEDULED, next_attempt_at__gt=now).exists():
        return ""
    return f"no event for {(now - last).total_seconds() / 3600:.1f} h and nothing is pending"


@transaction.atomic
def stagnation_flag_if_due(*, workflow_id: int, reason: str) -> int:
    """Apply the workflow's stagnation policy once per window: re-plan, pause, or only record.

    Idempotent within a window: ``stagnation_flagged_at`` checked under the row lock.
    """
    workflow = workflow_lock(workflow_id)
    now = clock.now()
    window = timedelta(hours=workflow.stagnation_window_hours)
    if workflow.status != Workflow.Status.RUNNING or (
        workflow.stagnation_flagged_at and workflow.stagnation_flagged_at > now - window
    ):
        return 0
    workflow.stagnation_flagged_at = now
    workflow_save(workflow, "stagnation_flagged_at", at=now)
    policy = workflow.stagnation_policy
    event_record(workflow=workflow, kind="workflow.stagnating", at=now, reason=reason, policy=policy)
    logger.warning("workflow.stagnating", extra={"workflow_id": workflow.pk, "policy": policy})
    if policy == Workflow.StagnationPolicy.PAUSE:
        workflow.pause(at=now, reason=f"{STAGNATION_PAUSE_PREFIX} {reason}. Look at it, then "
                                      f"`manage.py agent resume {workflow.pk}`.",
                       cause=Workflow.PauseCause.STAGNATION)
        workflow_save(workflow, "status", "reason", at=now)
    elif policy == Workflow.StagnationPolicy.REPLAN:
        adapt = registry.definition(workflow.kind).adapt_node
        if adapt:
            enter_node(workflow, adapt, {"stagnation": reason}, now=now)
            doorbells.workflow_advance(workflow_id=workflow.pk)
    return 1
