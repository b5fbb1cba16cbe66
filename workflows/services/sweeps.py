"""Beat sweeps: each finds due rows through a partial index and handles each row idempotently.

Every sweep is safe to run at any moment, any number of times, from any number of beat
processes: each row is claimed by a conditional UPDATE, so a second runner claims nothing.
Each row runs in its own savepoint (``row_isolated``): a row that raises is logged, recorded
on its workflow as ``sweep.row_failed`` and skipped, and the batch goes on.
"""
from __future__ import annotations

import logging
from collections.abc import Callable
from datetime import datetime, timedelta

from django.conf import settings
from django.db.models import DateTimeField, DurationField, Exists, ExpressionWrapper, F, OuterRef, Q, Value
from django.db.models.functions import Greatest, Least

from workflows import clock, doorbells
from workflows.models import Activity, Timer, Wait, Workflow
from workflows.services.activities import activity_lease_expire_if_due
from workflows.services.budgets import usage_reservations_settle_orphaned
from workflows.services.cancellation import workflow_deadline_enforce_if_due
from workflows.services.children import children_collect_if_finished
from workflows.services.failures import row_isolated
from workflows.services.waits import timer_fire_if_due

logger = logging.getLogger("agentops.sweeps")

# Re-rung doorbells back off to at most this many times AGENTOPS_REDISPATCH_AFTER_SECONDS apart.
REDISPATCH_BACKOFF_CAP = 8


def _batch() -> int:
    return settings.AGENTOPS_SWEEP_BATCH_SIZE


def timers_fire_due() -> int:
    """Fire timers whose ``fire_at`` has passed (index ``timer_pending_fire_idx``)."""
    ids = Timer.objects.filter(status=Timer.Status.PENDING, fire_at__lte=clock.now()).order_by("fire_at")
    return sum(
        row_isolated("fire_timers", pk, lambda pk: timer_fire_if_due(timer_id=pk), workflow_id=_workflow_of(Timer))
        for pk in ids.values_list("pk", flat=True)[: _batch()]
    )


def activities_redrive_due() -> int:
    """Ring activities that are due but whose doorbell is missing: retry windows that opened,
    and messages lost to a crash after commit or a broker outage (index ``act_scheduled_due_idx``).

    A doorbell still unanswered is rung again after AGENTOPS_REDISPATCH_AFTER_SECONDS, and after
    that only once the activity has waited as long again (30 s, 60 s, 120 s ... up to
    REDISPATCH_BACKOFF_CAP times the delay): behind a backlog the first doorbell is only slow,
    and ringing it again on every sweep would fill the queue with duplicates.
    """
    now = clock.now()
    delay = timedelta(seconds=settings.AGENTOPS_REDISPATCH_AFTER_SECONDS)
    waited = ExpressionWrapper(F("dispatched_at") - F("next_attempt_at"), output_field=DurationField())
    again_after = Greatest(Value(delay), Least(waited, Value(delay * REDISPATCH_BACKOFF_CAP)),
                           output_field=DurationField())
    due = Activity.objects.filter(status=Activity.Status.SCHEDULED, next_attempt_at__lte=now).alias(
        ring_again_at=ExpressionWrapper(F("dispatched_at") + again_after, output_field=DateTimeField())
    ).filter(Q(dispatched_at__isnull=True) | Q(ring_again_at__lte=now)).exclude(
        workflow__status=Workflow.Status.PAUSED
    )
    rows = {pk: (dispatched_at, name) for pk, dispatched_at, name in
            due.values_list("pk", "dispatched_at", "name")[: _batch()]}
    return sum(
        row_isolated("redrive_activities", pk, lambda pk: _activity_ring_if_undispatched(pk, *rows[pk], now=now),
                     workflow_id=_workflow_of(Activity))
        for pk in rows
    )


def _activity_ring_if_undispatched(pk: int, dispatched_at: datetime | None, name: str, *, now: datetime) -> bool:
    claim = Activity.objects.filter(pk=pk, status=Activity.Status.SCHEDULED)
    claim = claim.filter(dispatched_at__isnull=True) if dispatched_at is None else claim.filter(
        dispatched_at=dispatched_at)
    if not claim.update(dispatched_at=now):
        return False
    doorbells.activity_run(activity_id=pk, name=name)
    return True


def leases_reap_expired() -> int:
    """Mark attempts whose lease ran out as lost and re-drive them (every running one is read through
    a partial index on running rows, ``act_running_key_idx`` or ``act_live_workflow_idx``, and its
    expiry checked: an index on the expiry would make every heartbeat write an index entry);
    then mark the model requests those attempts (or any attempt that stopped) left in flight as
    uncertain in the usage ledger (index ``usage_reserved_idx``)."""
    ids = Activity.objects.filter(status=Activity.Status.RUNNING, lease_expires_at__lt=clock.now())
    reaped = sum(
        row_isolated("reap_leases", pk, lambda pk: activity_lease_expire_if_due(activity_id=pk),
                     workflow_id=_workflow_of(Activity))
        for pk in ids.values_list("pk", flat=True)[: _batch()]
    )
    usage_reservations_settle_orphaned()
    return reaped


def workflows_redrive_idle() -> int:
    """Ring running or cancelling workflows that have no live activity and were idle too long:
    their advance doorbell was lost (index ``wf_running_updated_idx``).

    A workflow whose advance failed is rung once its ``advance_retry_at`` passed, not before:
    the backoff between failed advances is this sweep's schedule.
    """
    now = clock.now()
    cutoff = now - timedelta(seconds=settings.AGENTOPS_REDISPATCH_AFTER_SECONDS)
    live = Activity.objects.filter(status__in=[Activity.Status.SCHEDULED, Activity.Status.RUNNING])
    # Idle past the cutoff, or not rung since the retry time passed (the row changed last when
    # the advance failed, before its retry time).
    quiet = Q(updated_at__lt=cutoff) | Q(updated_at__lt=F("advance_retry_at"))
    idle = Workflow.objects.filter(
        quiet, Q(advance_retry_at__isnull=True) | Q(advance_retry_at__lte=now),
        status__in=[Workflow.Status.RUNNING, Workflow.Status.CANCELLING],
    ).exclude(pk__in=live.values("workflow_id"))
    rows = dict(idle.values_list("pk", "updated_at")[: _batch()])
    return sum(
        row_isolated("redrive_workflows", pk, lambda pk: _workflow_ring_if_idle(pk, rows[pk], now=now),
                     workflow_id=lambda pk: pk)
        for pk in rows
    )


def _workflow_ring_if_idle(pk: int, updated_at: datetime, *, now: datetime) -> bool:
    if not Workflow.objects.filter(pk=pk, updated_at=updated_at).update(updated_at=now):
        return False
    doorbells.workflow_advance(workflow_id=pk)
    return True


def children_collect_due() -> int:
    """Deliver the ends of child workflows to parents whose doorbell was lost: open child waits
    whose child has ended (index ``wait_child_open_idx``); ``children_collect_if_finished``."""
    ended = Workflow.objects.filter(parent_wait=OuterRef("pk"), status__in=Workflow.TERMINAL)
    parents = (Wait.objects.filter(kind=Wait.Kind.CHILD, status=Wait.Status.OPEN).filter(Exists(ended))
               .order_by("workflow_id").values_list("workflow_id", flat=True).distinct())
    return sum(
        row_isolated("collect_children", pk, lambda pk: children_collect_if_finished(workflow_id=pk) > 0,
                     workflow_id=lambda pk: pk)
        for pk in list(parents[: _batch()])
    )


def deadlines_enforce() -> int:
    """Cancel unfinished workflows past their time limit (index ``wf_open_deadline_idx``)."""
    due = Workflow.objects.filter(deadline__lte=clock.now(), status__in=Workflow.CANCELLABLE)
    return sum(
        row_isolated("enforce_deadlines", pk, lambda pk: workflow_deadline_enforce_if_due(workflow_id=pk),
                     workflow_id=lambda pk: pk)
        for pk in due.values_list("pk", flat=True)[: _batch()]
    )


def _workflow_of(model: type[Activity] | type[Timer]) -> Callable[[int], int | None]:
    """The workflow id of a row of ``model``, for recording a failed row on its workflow."""
    def find(pk: int) -> int | None:
        return model.objects.filter(pk=pk).values_list("workflow_id", flat=True).first()
    return find
