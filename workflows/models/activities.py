"""Activities with their attempts, and the commitments they create in the outside world."""
from __future__ import annotations

from datetime import datetime

from django.db import models
from django.db.models import Q
from django_fsm import ConcurrentTransitionMixin, FSMField, transition

from workflows.models.workflow import Workflow


class Activity(models.Model):
    """One unit of work with a stable operation identity; attempts are disposable.

    Status changes are conditional UPDATEs on (status, attempt, lease_token) rather than
    FSM transitions on a loaded instance: a claim must hold where row locks are absent
    (SQLite) and against a zombie attempt that still holds an old copy of the row.
    """

    class Status(models.TextChoices):
        SCHEDULED = "scheduled"
        RUNNING = "running"
        SUCCEEDED = "succeeded"
        FAILED = "failed"
        CANCELLED = "cancelled"

    workflow = models.ForeignKey(Workflow, on_delete=models.CASCADE, related_name="activities")
    operation_id = models.CharField(
        max_length=200, unique=True,
        help_text="Stable identity across attempts and workers, within this installation.",
    )
    idempotency_key = models.CharField(
        max_length=240, blank=True,
        help_text="The key sent to external systems: the installation id, then the operation id, fixed when the "
                  "activity is scheduled. Empty for activities scheduled before installations had ids: they send "
                  "their operation id, as they always did.",
    )
    name = models.CharField(max_length=80, help_text="Registered activity type.")
    node = models.CharField(max_length=60, help_text="Node that scheduled it.")
    node_visit = models.PositiveIntegerField(help_text="Node visit that scheduled it.")
    intent_version = models.PositiveIntegerField(help_text="Intent version it was scheduled under.")
    input = models.JSONField(default=dict, blank=True, help_text="JSON input, fixed at scheduling.")
    status = models.CharField(max_length=12, choices=Status.choices, default=Status.SCHEDULED)
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

    class Meta:
        verbose_name_plural = "activities"
        indexes = [
            models.Index(fields=["next_attempt_at"], name="act_scheduled_due_idx", condition=Q(status="scheduled")),
            models.Index(fields=["lease_expires_at"], name="act_running_lease_idx", condition=Q(status="running")),
            models.Index(fields=["workflow", "node_visit"], name="act_workflow_visit_idx"),
            # The idle-workflow sweep asks "which workflows have live work?"; without this index it
            # scanned every activity row (5.3x slower beat tick with 100,000 parked workflows).
            models.Index(
                fields=["workflow"], name="act_live_workflow_idx", condition=Q(status__in=["scheduled", "running"])
            ),
        ]

    def __str__(self) -> str:
        return f"{self.name} {self.operation_id} ({self.status})"

    @property
    def sent_key(self) -> str:
        """The idempotency key this activity sends out (``ActivityContext.idempotency_key``)."""
        return self.idempotency_key or self.operation_id


class ActivityAttempt(models.Model):
    """One try at an activity, on one worker."""

    class Status(models.TextChoices):
        RUNNING = "running"
        SUCCEEDED = "succeeded"
        FAILED = "failed"
        LOST = "lost", "Lost: the lease expired before a result was recorded"
        STALE = "stale", "Stale: finished after its lease was taken over; result discarded"
        CANCELLED = "cancelled", "Cancelled: its work was no longer wanted (cancel, new goal, node left, failure)"

    activity = models.ForeignKey(Activity, on_delete=models.CASCADE, related_name="attempts")
    number = models.PositiveIntegerField(help_text="1 for the first attempt.")
    lease_token = models.CharField(max_length=32)
    worker = models.CharField(max_length=200, blank=True, help_text="Celery worker hostname and pid.")
    task_id = models.CharField(max_length=64, blank=True, help_text="Celery task id of the doorbell that ran it.")
    status = models.CharField(max_length=12, choices=Status.choices, default=Status.RUNNING)
    error = models.TextField(blank=True)
    started_at = models.DateTimeField()
    finished_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        constraints = [models.UniqueConstraint(fields=["activity", "number"], name="uniq_attempt_number")]
        ordering = ["activity", "number"]

    def __str__(self) -> str:
        return f"attempt {self.number} of {self.activity_id} ({self.status})"


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

    # Declared for type checkers: the FSM mixins hide the implicit manager from django-stubs.
    objects: models.Manager[Commitment] = models.Manager()

    def __str__(self) -> str:
        return f"{self.kind} commitment {self.pk} ({self.status})"

    @transition(field=status, source=Status.ACTIVE, target=Status.RELEASED)
    def release(self, *, at: datetime) -> None:
        self.closed_at = at

    @transition(field=status, source=Status.ACTIVE, target=Status.COMPENSATED)
    def compensated(self, *, at: datetime) -> None:
        self.closed_at = at
