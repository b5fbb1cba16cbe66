"""Activities with their attempts, and the commitments they create in the outside world."""
from __future__ import annotations

from datetime import datetime
from typing import Any

from django.db import models
from django.db.models import Q
from django_fsm import ConcurrentTransitionMixin, FSMField, FSMModelMixin, transition

from workflows.models.workflow import Workflow

# An attempt keeps this much of its error's text.
ERROR_CHARS = 2000
STALE_ERROR = "lease was taken over, or its work voided, before the result was recorded"


class Activity(FSMModelMixin, models.Model):
    """One unit of work with a stable operation identity; attempts are disposable.

    The transitions below are the whole lifecycle (docs/state-machines.md). The lifecycle
    service (``workflows.services.lifecycle``) issues each as a conditional UPDATE on the
    declared source states (and, for a running attempt's, on (attempt, lease_token)) rather than
    on a loaded instance: a claim must hold where row locks are absent (SQLite) and against a
    zombie attempt that still holds an old copy of the row. So a transition's method only sets
    fields, from its arguments: the service runs it to learn what the UPDATE writes.
    """

    class Status(models.TextChoices):
        SCHEDULED = "scheduled"
        RUNNING = "running"
        SUCCEEDED = "succeeded"
        FAILED = "failed"
        CANCELLED = "cancelled"

    workflow = models.ForeignKey(Workflow, on_delete=models.CASCADE, related_name="activities",
                                 db_index=False)  # act_workflow_visit_idx leads with it
    operation_id = models.CharField(
        max_length=200, unique=True,
        help_text="Stable identity across attempts and workers, within this installation.",
    )
    idempotency_key = models.CharField(
        max_length=240, blank=True,
        help_text="The key sent to external systems: the installation id, the operation id and a random nonce, "
                  "fixed when the activity is scheduled. Empty for activities scheduled before installations had "
                  "ids: they send their operation id, as they always did.",
    )
    name = models.CharField(max_length=80, help_text="Registered activity type.")
    node = models.CharField(max_length=60, help_text="Node that scheduled it.")
    node_visit = models.PositiveIntegerField(help_text="Node visit that scheduled it.")
    intent_version = models.PositiveIntegerField(help_text="Intent version it was scheduled under.")
    input = models.JSONField(default=dict, blank=True, help_text="JSON input, fixed at scheduling.")
    status = FSMField(max_length=12, choices=Status.choices, default=Status.SCHEDULED, protected=True)
    attempt = models.PositiveIntegerField(default=0, help_text="Number of the latest attempt (a fencing token).")
    max_attempts = models.PositiveIntegerField(default=5, help_text="Attempts allowed by the retry policy.")
    lease_token = models.CharField(max_length=32, blank=True, help_text="Token of the attempt holding the lease.")
    lease_expires_at = models.DateTimeField(null=True, blank=True, help_text="When the running attempt's lease ends.")
    heartbeat_at = models.DateTimeField(null=True, blank=True, help_text="Last heartbeat of the running attempt.")
    heartbeat_detail = models.CharField(
        max_length=200, blank=True, help_text="What the running attempt said it was doing at its last heartbeat."
    )
    checkpoint = models.JSONField(
        null=True, blank=True,
        help_text="Working state a running attempt saved (every AGENTOPS_CHECKPOINT_SECONDS); the next attempt "
                  "resumes from it. Cleared when the activity succeeds.",
    )
    checkpointed_at = models.DateTimeField(null=True, blank=True, help_text="When the checkpoint was saved.")
    next_attempt_at = models.DateTimeField(help_text="Earliest time the next attempt may start (the retry window).")
    dispatched_at = models.DateTimeField(null=True, blank=True, help_text="When a doorbell was last rung for it.")
    result = models.JSONField(null=True, blank=True, help_text="Recorded result; never recomputed.")
    error = models.TextField(blank=True, help_text="Last error message.")
    created_at = models.DateTimeField()
    completed_at = models.DateTimeField(null=True, blank=True)
    # Concurrency keys (AGENTOPS_ACTIVITY_CONCURRENCY, workflows/services/slots.py): its workflow's
    # kind and tenant on its own row, so that counting and queueing by key joins no other table.
    kind = models.CharField(max_length=60, blank=True, help_text="Its workflow's kind.")
    tenant = models.CharField(
        max_length=200, blank=True, help_text="The tenant its latest attempt ran or waits as (workflows.tenancy); "
                                              "concurrency keys count running attempts by it.",
    )
    slot_waiting_since = models.DateTimeField(
        null=True, blank=True, help_text="Waiting for a concurrency slot (AGENTOPS_ACTIVITY_CONCURRENCY) since then; "
                                         "empty when it is not waiting.",
    )
    slot_priority = models.PositiveSmallIntegerField(
        null=True, blank=True, help_text="Its workflow's priority while it waits for a concurrency slot (the order "
                                         "of the queue; a changed priority applies to it at once).",
    )
    slot_granted_at = models.DateTimeField(
        null=True, blank=True, help_text="When a freed concurrency slot was handed to it; the slot is kept for it "
                                         "a while, until its doorbell arrives.",
    )

    # Declared for type checkers: the FSM mixins hide the implicit manager from django-stubs.
    objects: models.Manager[Activity] = models.Manager()

    class Meta:
        verbose_name_plural = "activities"
        indexes = [
            models.Index(fields=["next_attempt_at"], name="act_scheduled_due_idx", condition=Q(status="scheduled")),
            # Running attempts, by concurrency key (workflows/services/slots.py counts them here) and for the
            # lease sweep, which reads each one's lease_expires_at. No index holds a column that a lease
            # extension writes (lease_expires_at, heartbeat_at, heartbeat_detail, checkpoint, checkpointed_at):
            # so a heartbeat, a fence or a checkpoint is a HOT update, which writes no index entry.
            models.Index(fields=["tenant", "kind"], name="act_running_key_idx", condition=Q(status="running")),
            models.Index(fields=["workflow", "node_visit"], name="act_workflow_visit_idx"),
            # The idle-workflow sweep asks "which workflows have live work?"; without this index it
            # scanned every activity row (5.3x slower beat tick with 100,000 parked workflows).
            models.Index(
                fields=["workflow"], name="act_live_workflow_idx", condition=Q(status__in=["scheduled", "running"])
            ),
            # Concurrency keys: slots just handed out, and the queue of those waiting for a slot, each
            # tenant's in its order.
            models.Index(fields=["slot_granted_at"], name="act_slot_granted_idx",
                         condition=Q(status="scheduled", slot_granted_at__isnull=False)),
            models.Index(fields=["tenant", "-slot_priority", "slot_waiting_since", "id"], name="act_slot_waiting_idx",
                         condition=Q(status="scheduled", slot_waiting_since__isnull=False)),
        ]

    def __str__(self) -> str:
        return f"{self.name} {self.operation_id} ({self.status})"

    @property
    def sent_key(self) -> str:
        """The idempotency key this activity sends out (``ActivityContext.idempotency_key``)."""
        return self.idempotency_key or self.operation_id

    @transition(field=status, source=Status.SCHEDULED, target=Status.RUNNING)
    def claim(self, *, attempt: int, lease_token: str, lease_expires_at: datetime, at: datetime, tenant: str) -> None:
        """A worker starts attempt ``attempt`` under a new lease (a doorbell, or the chain of the result
        before), as ``tenant``; a wait for a concurrency slot ends."""
        self.attempt, self.lease_token, self.tenant = attempt, lease_token, tenant
        self.lease_expires_at, self.heartbeat_at = lease_expires_at, at
        self.slot_waiting_since, self.slot_granted_at, self.slot_priority = None, None, None

    @transition(field=status, source=Status.RUNNING, target=Status.SUCCEEDED)
    def succeed(self, *, result: Any, at: datetime) -> None:
        """The running attempt's result is recorded, once; its working state is dropped."""
        self.result, self.error, self.completed_at = result, "", at
        self.lease_expires_at, self.checkpoint = None, None

    @transition(field=status, source=Status.RUNNING, target=Status.SCHEDULED)
    def retry(self, *, error: str, next_attempt_at: datetime, max_attempts: int,
              dispatched_at: datetime | None) -> None:
        """The running attempt failed, or its lease ran out, with attempts left (or given back: throttled,
        deferred or paused for budget): a retry window opens at ``next_attempt_at``."""
        self.error, self.next_attempt_at, self.max_attempts = error, next_attempt_at, max_attempts
        self.dispatched_at, self.lease_expires_at = dispatched_at, None

    @transition(field=status, source=Status.RUNNING, target=Status.FAILED)
    def fail(self, *, error: str, at: datetime) -> None:
        """The running attempt failed, or its lease ran out, with no attempt left or a permanent error."""
        self.error, self.completed_at, self.lease_expires_at = error, at, None

    @transition(field=status, source=[Status.SCHEDULED, Status.RUNNING], target=Status.CANCELLED)
    def void(self, *, reason: str, at: datetime) -> None:
        """Its work is no longer wanted: cancel, a new goal, its node visit left, the workflow ended.
        A running attempt finds out at its next fenced call and records nothing."""
        self.error, self.completed_at, self.lease_expires_at = reason, at, None

    @transition(field=status, source=Status.FAILED, target=Status.SCHEDULED)
    def reopen(self, *, max_attempts: int, at: datetime) -> None:
        """A failed compensation gets a fresh set of attempts (``agent resume``)."""
        self.max_attempts, self.next_attempt_at, self.dispatched_at, self.completed_at = max_attempts, at, at, None


class ActivityAttempt(FSMModelMixin, models.Model):
    """One try at an activity, on one worker. Created running (``lifecycle.attempt_start``); its
    transitions are issued like the activity's, by ``workflows.services.lifecycle``."""

    class Status(models.TextChoices):
        RUNNING = "running"
        SUCCEEDED = "succeeded"
        FAILED = "failed"
        LOST = "lost", "Lost: the lease expired before a result was recorded"
        STALE = "stale", "Stale: finished after its lease was taken over; result discarded"
        CANCELLED = "cancelled", "Cancelled: its work was no longer wanted (cancel, new goal, node left, failure)"

    activity = models.ForeignKey(Activity, on_delete=models.CASCADE, related_name="attempts",
                                 db_index=False)  # uniq_attempt_number leads with it
    number = models.PositiveIntegerField(help_text="1 for the first attempt.")
    lease_token = models.CharField(max_length=32)
    worker = models.CharField(max_length=200, blank=True, help_text="Celery worker hostname and pid.")
    task_id = models.CharField(max_length=64, blank=True, help_text="Celery task id of the doorbell that ran it.")
    status = FSMField(max_length=12, choices=Status.choices, default=Status.RUNNING, protected=True)
    error = models.TextField(blank=True)
    throttled = models.BooleanField(
        default=False, help_text="The provider refused the call for capacity (429/529, errors.Throttled). A run of "
                                 "these moves a workflow with a fallback model to it.",
    )
    refunded = models.BooleanField(
        default=False, help_text="Given back to the retry policy: a wait for the provider's capacity or for money "
                                 "(throttled, budget deferred or exhausted), not a failed try; the activity's "
                                 "max_attempts grew by one.",
    )
    retry_after_seconds = models.FloatField(
        null=True, blank=True, help_text="The retry window this failure opened: the wait the provider or the budget "
                                         "named, else the backoff. Empty when no retry followed.",
    )
    started_at = models.DateTimeField()
    finished_at = models.DateTimeField(null=True, blank=True)

    # Declared for type checkers: the FSM mixins hide the implicit manager from django-stubs.
    objects: models.Manager[ActivityAttempt] = models.Manager()

    class Meta:
        constraints = [models.UniqueConstraint(fields=["activity", "number"], name="uniq_attempt_number")]
        ordering = ["activity", "number"]

    def __str__(self) -> str:
        return f"attempt {self.number} of {self.activity_id} ({self.status})"

    @transition(field=status, source=Status.RUNNING, target=Status.SUCCEEDED)
    def succeed(self, *, at: datetime) -> None:
        """Its result was recorded."""
        self.error, self.finished_at = "", at

    @transition(field=status, source=Status.RUNNING, target=Status.FAILED)
    def fail(self, *, error: str, at: datetime, throttled: bool = False, refunded: bool = False,
             retry_after_seconds: float | None = None) -> None:
        """It raised: the activity retries (``retry_after_seconds``), pauses for budget or fails."""
        self.error, self.finished_at = error[:ERROR_CHARS], at
        self.throttled, self.refunded, self.retry_after_seconds = throttled, refunded, retry_after_seconds

    @transition(field=status, source=Status.RUNNING, target=Status.LOST)
    def lose(self, *, error: str, at: datetime) -> None:
        """Its lease ran out before a result was recorded (the lease sweep)."""
        self.error, self.finished_at = error[:ERROR_CHARS], at

    @transition(field=status, source=[Status.RUNNING, Status.LOST], target=Status.STALE)
    def discard(self, *, at: datetime) -> None:
        """It finished after its lease was taken over or its work voided: what it sent back is dropped."""
        self.error, self.finished_at = STALE_ERROR, at

    @transition(field=status, source=Status.RUNNING, target=Status.CANCELLED)
    def cancel(self, *, reason: str, at: datetime) -> None:
        """Its activity was voided while it ran."""
        self.error, self.finished_at = reason[:ERROR_CHARS], at


class Commitment(ConcurrentTransitionMixin, models.Model):
    """An obligation created in the outside world; active until released or compensated."""

    class Status(models.TextChoices):
        ACTIVE = "active"
        RELEASED = "released", "Released: handed over as the workflow's outcome"
        COMPENSATED = "compensated", "Compensated: undone after cancellation"

    workflow = models.ForeignKey(Workflow, on_delete=models.CASCADE, related_name="commitments")
    activity = models.OneToOneField(
        Activity, on_delete=models.CASCADE, related_name="commitment", help_text="Activity that created it."
    )
    kind = models.CharField(max_length=60, help_text="What kind of obligation, e.g. 'deployment'.")
    status = FSMField(default=Status.ACTIVE, choices=Status.choices, protected=True)
    compensation = models.CharField(max_length=80, help_text="Activity type that undoes it.")
    data = models.JSONField(default=dict, blank=True, help_text="What the external system said about it.")
    created_at = models.DateTimeField()
    closed_at = models.DateTimeField(null=True, blank=True)
    intent_version = models.PositiveIntegerField(
        default=1, help_text="The owner's intent it serves: its activity's, or for one a child handed over, the "
                             "intent its parent started that child under.")
    handed_over_by = models.ForeignKey(
        Workflow, null=True, blank=True, on_delete=models.SET_NULL, related_name="+",
        help_text="The completed child that handed it to this workflow (its tree owns it until the root ends).")

    # Declared for type checkers: the FSM mixins hide the implicit manager from django-stubs.
    objects: models.Manager[Commitment] = models.Manager()

    def __str__(self) -> str:
        return f"{self.kind} commitment {self.pk} ({self.status})"

    @property
    def of_a_failure(self) -> bool:
        """The effect an activity that failed may have made (uncertain: one of its attempts may
        have acted before it failed or was cut off), not one its workflow went on with."""
        return self.data.get("uncertain") is True and self.activity.status == Activity.Status.FAILED

    @transition(field=status, source=Status.ACTIVE, target=Status.RELEASED)
    def release(self, *, at: datetime) -> None:
        self.closed_at = at

    @transition(field=status, source=Status.ACTIVE, target=Status.COMPENSATED)
    def compensated(self, *, at: datetime) -> None:
        self.closed_at = at
