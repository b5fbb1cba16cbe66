"""Durable workflow state: tables, constraints, indexes and FSM transitions (no I/O, no clock)."""
from __future__ import annotations

from datetime import datetime
from typing import Any

from django.conf import settings
from django.db import models
from django.db.models import Q
from django_fsm import ConcurrentTransitionMixin, FSMField, transition


class BehavioralRelease(models.Model):
    """The model, prompt and tool versions a workflow was started with."""

    fingerprint = models.CharField(
        max_length=64, unique=True, help_text="SHA-256 over provider, model, prompt version and tool versions."
    )
    provider = models.CharField(max_length=40, help_text="Model provider name, e.g. 'scripted' or 'anthropic'.")
    model = models.CharField(max_length=120, help_text="Model identifier sent to the provider.")
    prompt_version = models.CharField(max_length=80, help_text="Version label of the prompts in use.")
    tool_versions = models.JSONField(default=dict, blank=True, help_text="Tool name to tool version.")
    created_at = models.DateTimeField(help_text="When this release was first seen.")

    def __str__(self) -> str:
        return f"{self.provider}:{self.model} prompt={self.prompt_version} ({self.fingerprint[:10]})"


class Workflow(ConcurrentTransitionMixin, models.Model):
    """One agent run: a definition kind, a status, a current semantic node and durable state."""

    class Status(models.TextChoices):
        CREATED = "created"
        RUNNING = "running"
        WAITING = "waiting"
        PAUSED = "paused"
        CANCELLING = "cancelling"
        COMPLETED = "completed"
        FAILED = "failed"
        CANCELLED = "cancelled"

    class ReleasePolicy(models.TextChoices):
        PIN = "pin", "Pin: keep running on the release it started with"
        REVALIDATE = "revalidate", "Revalidate: adopt the new release and revalidate the candidate"
        FAIL = "fail", "Fail: stop the workflow when its release changed"

    class StagnationPolicy(models.TextChoices):
        REPLAN = "replan", "Re-plan: go to the definition's adaptation node"
        PAUSE = "pause", "Pause for a person"
        RECORD = "record", "Only record it"

    TERMINAL = (Status.COMPLETED, Status.FAILED, Status.CANCELLED)
    CANCELLABLE = (Status.CREATED, Status.RUNNING, Status.WAITING, Status.PAUSED)

    kind = models.CharField(max_length=60, db_index=True, help_text="Workflow definition kind, e.g. 'release'.")
    definition_version = models.PositiveIntegerField(
        default=1, help_text="Version of the definition recorded at launch; handlers branch on it."
    )
    status = FSMField(
        default=Status.CREATED, choices=Status.choices, protected=True, db_index=True,
        help_text="Lifecycle status; changes only through the workflow services.",
    )
    current_node = models.CharField(max_length=60, help_text="Semantic node the workflow is at.")
    node_visit = models.PositiveIntegerField(
        default=1, help_text="How many node entries so far; part of every operation identity."
    )
    version = models.PositiveIntegerField(default=1, help_text="Optimistic-concurrency version, bumped on every write.")
    intent_version = models.PositiveIntegerField(default=1, help_text="Version of the current intent (goal).")
    params = models.JSONField(default=dict, blank=True, help_text="Launch parameters (validated by the definition).")
    state = models.JSONField(default=dict, blank=True, help_text="Durable variables written by node handlers.")
    release = models.ForeignKey(
        BehavioralRelease, on_delete=models.PROTECT, related_name="workflows",
        help_text="Behavioral release the workflow runs on.",
    )
    release_policy = models.CharField(
        max_length=12, choices=ReleasePolicy.choices, default=ReleasePolicy.REVALIDATE,
        help_text="What to do on resume when the current release differs from this workflow's.",
    )
    launched_by = models.ForeignKey(
        settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.SET_NULL, related_name="+",
        help_text="User who launched the workflow; may not approve its own candidates.",
    )
    result = models.JSONField(null=True, blank=True, help_text="Final result when completed.")
    reason = models.TextField(blank=True, help_text="Why the workflow failed, paused or was cancelled.")
    event_seq = models.PositiveIntegerField(default=0, help_text="Sequence number of the last event recorded.")
    checkpoint = models.ForeignKey(
        "Checkpoint", null=True, blank=True, on_delete=models.SET_NULL, related_name="+",
        help_text="The latest checkpoint.",
    )
    priority = models.PositiveSmallIntegerField(
        default=5, help_text="0–10; work at 9 or above may pass the hourly budget, never the total."
    )
    budget_total_usd = models.DecimalField(
        max_digits=12, decimal_places=4, null=True, blank=True,
        help_text="Total model spend allowed (USD); over it the workflow pauses for a person. Empty: no limit.",
    )
    budget_hourly_usd = models.DecimalField(
        max_digits=12, decimal_places=4, null=True, blank=True,
        help_text="Model spend allowed in any hour (USD); over it work is deferred. Empty: no limit.",
    )
    stagnation_window_hours = models.FloatField(
        default=6.0, help_text="Progress must move 5 points within this window, or the workflow is stagnating."
    )
    stagnation_policy = models.CharField(
        max_length=10, choices=StagnationPolicy.choices, default=StagnationPolicy.RECORD,
        help_text="What beat does when the workflow stagnates.",
    )
    stagnation_flagged_at = models.DateTimeField(
        null=True, blank=True, help_text="When stagnation was last flagged (once per window)."
    )
    deadline = models.DateTimeField(
        null=True, blank=True, help_text="Time limit of the whole run, if any; past it, beat cancels the workflow."
    )
    created_at = models.DateTimeField(help_text="When the workflow was launched.")
    updated_at = models.DateTimeField(help_text="When the workflow row last changed.")

    # Declared for type checkers: the FSM mixins hide the implicit manager from django-stubs.
    objects: models.Manager[Workflow] = models.Manager()

    class Meta:
        indexes = [
            models.Index(
                fields=["updated_at"], name="wf_running_updated_idx", condition=Q(status__in=["running", "cancelling"])
            ),
            models.Index(
                fields=["deadline"], name="wf_open_deadline_idx",
                condition=Q(status__in=["created", "running", "waiting", "paused"]),  # CANCELLABLE
            ),
        ]

    def __str__(self) -> str:
        return f"workflow {self.pk} ({self.kind}, {self.status} at {self.current_node})"

    @property
    def is_terminal(self) -> bool:
        return self.status in self.TERMINAL

    @transition(field=status, source=Status.CREATED, target=Status.RUNNING)
    def start(self, *, at: datetime) -> None:
        self.updated_at = at

    @transition(field=status, source=Status.RUNNING, target=Status.WAITING)
    def park(self, *, at: datetime) -> None:
        self.updated_at = at

    @transition(field=status, source=[Status.WAITING, Status.PAUSED], target=Status.RUNNING)
    def wake(self, *, at: datetime) -> None:
        self.updated_at = at

    @transition(field=status, source=[Status.RUNNING, Status.WAITING], target=Status.PAUSED)
    def pause(self, *, at: datetime, reason: str) -> None:
        self.updated_at = at
        self.reason = reason

    @transition(field=status, source=Status.RUNNING, target=Status.COMPLETED)
    def complete(self, *, at: datetime, result: Any) -> None:
        self.updated_at = at
        self.result = result

    @transition(field=status, source=[Status.RUNNING, Status.WAITING, Status.PAUSED], target=Status.FAILED)
    def fail(self, *, at: datetime, reason: str) -> None:
        self.updated_at = at
        self.reason = reason

    @transition(
        field=status, source=[Status.CREATED, Status.RUNNING, Status.WAITING, Status.PAUSED], target=Status.CANCELLING
    )
    def request_cancel(self, *, at: datetime, reason: str) -> None:
        self.updated_at = at
        self.reason = reason

    @transition(field=status, source=Status.CANCELLING, target=Status.CANCELLED)
    def finish_cancel(self, *, at: datetime) -> None:
        self.updated_at = at

    def enter_node(self, node: str, *, at: datetime) -> None:
        self.current_node = node
        self.node_visit += 1
        self.updated_at = at


class Intent(models.Model):
    """A version of the workflow's goal; a newer version supersedes the older ones."""

    workflow = models.ForeignKey(Workflow, on_delete=models.CASCADE, related_name="intents")
    version = models.PositiveIntegerField(help_text="1 for the launch goal, then 2, 3, … per supersession.")
    goal = models.TextField(help_text="What the agent should achieve, in the requester's words.")
    created_by = models.ForeignKey(
        settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.SET_NULL, related_name="+",
        help_text="Who set this goal.",
    )
    created_at = models.DateTimeField(help_text="When this version was recorded.")
    superseded_at = models.DateTimeField(null=True, blank=True, help_text="When a newer version replaced it.")

    class Meta:
        constraints = [models.UniqueConstraint(fields=["workflow", "version"], name="uniq_intent_version")]
        ordering = ["workflow", "version"]

    def __str__(self) -> str:
        return f"intent v{self.version} of workflow {self.workflow_id}"


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
        help_text="Stable identity across attempts and workers; the idempotency key sent to external systems.",
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
        ]

    def __str__(self) -> str:
        return f"{self.name} {self.operation_id} ({self.status})"


class ActivityAttempt(models.Model):
    """One try at an activity, on one worker."""

    class Status(models.TextChoices):
        RUNNING = "running"
        SUCCEEDED = "succeeded"
        FAILED = "failed"
        LOST = "lost", "Lost: the lease expired before a result was recorded"
        STALE = "stale", "Stale: finished after its lease was taken over; result discarded"

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


class Wait(ConcurrentTransitionMixin, models.Model):
    """The workflow waits for something explicit: an approval, a named event, or a timer."""

    class Kind(models.TextChoices):
        APPROVAL = "approval"
        EVENT = "event"
        TIMER = "timer"

    class Status(models.TextChoices):
        OPEN = "open"
        SATISFIED = "satisfied"
        EXPIRED = "expired"
        INVALIDATED = "invalidated"
        CANCELLED = "cancelled"

    class Decision(models.TextChoices):
        APPROVED = "approved"
        REJECTED = "rejected"

    workflow = models.ForeignKey(Workflow, on_delete=models.CASCADE, related_name="waits")
    operation_id = models.CharField(max_length=200, unique=True, help_text="Stable identity of this wait.")
    kind = models.CharField(max_length=10, choices=Kind.choices)
    status = FSMField(default=Status.OPEN, choices=Status.choices, protected=True, db_index=True)
    node = models.CharField(max_length=60, help_text="Node that opened the wait.")
    node_visit = models.PositiveIntegerField(help_text="Node visit that opened it.")
    intent_version = models.PositiveIntegerField(help_text="Intent version the wait is bound to.")
    candidate = models.JSONField(null=True, blank=True, help_text="The candidate to approve, shown to approvers.")
    candidate_hash = models.CharField(max_length=64, blank=True, help_text="SHA-256 of the candidate under approval.")
    required_role = models.CharField(max_length=150, blank=True, help_text="Django group whose members may decide.")
    state_versions = models.JSONField(
        default=dict, blank=True, help_text="State versions the candidate was built on (intent, repository HEAD, …)."
    )
    event_name = models.CharField(max_length=100, blank=True, help_text="Signal name an event wait is waiting for.")
    expires_at = models.DateTimeField(null=True, blank=True, help_text="When the wait expires (or a timer fires).")
    timeout_policy = models.CharField(
        max_length=20, default="fail", help_text="What the workflow does when the wait expires: fail or continue."
    )
    decision = models.CharField(max_length=10, choices=Decision.choices, blank=True)
    decided_by = models.ForeignKey(
        settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.SET_NULL, related_name="+"
    )
    decided_at = models.DateTimeField(null=True, blank=True)
    comment = models.TextField(blank=True, help_text="Comment given with the decision.")
    payload = models.JSONField(null=True, blank=True, help_text="Payload of the event that satisfied the wait.")
    version = models.PositiveIntegerField(default=1)
    created_at = models.DateTimeField()

    # Declared for type checkers: the FSM mixins hide the implicit manager from django-stubs.
    objects: models.Manager[Wait] = models.Manager()

    class Meta:
        indexes = [models.Index(fields=["workflow", "status"], name="wait_workflow_status_idx")]

    def __str__(self) -> str:
        return f"{self.kind} wait {self.pk} of workflow {self.workflow_id} ({self.status})"

    def is_decided(self, decision: str, candidate_hash: str) -> bool:
        return (
            self.status == self.Status.SATISFIED
            and self.decision == decision
            and (decision == self.Decision.REJECTED or self.candidate_hash == candidate_hash)
        )

    @transition(field=status, source=Status.OPEN, target=Status.SATISFIED)
    def decide(self, *, decision: str, by: Any, at: datetime, comment: str) -> None:
        self.decision = decision
        self.decided_by = by
        self.decided_at = at
        self.comment = comment

    @transition(field=status, source=Status.OPEN, target=Status.SATISFIED)
    def satisfy(self, *, at: datetime, payload: Any) -> None:
        self.decided_at = at
        self.payload = payload

    @transition(field=status, source=Status.OPEN, target=Status.EXPIRED)
    def expire(self, *, at: datetime) -> None:
        self.decided_at = at

    @transition(field=status, source=Status.OPEN, target=Status.INVALIDATED)
    def invalidate(self, *, at: datetime) -> None:
        self.decided_at = at

    @transition(field=status, source=Status.OPEN, target=Status.CANCELLED)
    def cancel(self, *, at: datetime) -> None:
        self.decided_at = at


class Timer(models.Model):
    """A durable wake-up: a row with fire_at, fired by beat, bound to an intent version."""

    class Purpose(models.TextChoices):
        WAKE = "wake", "Wake: satisfies a timer wait"
        EXPIRE = "expire", "Expire: expires an approval or event wait"

    class Status(models.TextChoices):
        PENDING = "pending"
        FIRED = "fired"
        IGNORED = "ignored", "Ignored: its wait, intent or workflow had moved on"

    workflow = models.ForeignKey(Workflow, on_delete=models.CASCADE, related_name="timers")
    wait = models.ForeignKey(Wait, on_delete=models.CASCADE, related_name="timers")
    purpose = models.CharField(max_length=10, choices=Purpose.choices)
    fire_at = models.DateTimeField(help_text="Wake time, computed once when the timer was created.")
    intent_version = models.PositiveIntegerField(help_text="Intent version the timer is bound to.")
    status = models.CharField(max_length=10, choices=Status.choices, default=Status.PENDING)
    fired_at = models.DateTimeField(null=True, blank=True)
    note = models.CharField(max_length=200, blank=True, help_text="Why an ignored timer was ignored.")

    class Meta:
        constraints = [models.UniqueConstraint(fields=["wait", "purpose"], name="uniq_timer_per_wait_purpose")]
        indexes = [models.Index(fields=["fire_at"], name="timer_pending_fire_idx", condition=Q(status="pending"))]

    def __str__(self) -> str:
        return f"{self.purpose} timer {self.pk} at {self.fire_at:%Y-%m-%d %H:%M:%S} ({self.status})"


class Signal(models.Model):
    """A named external event delivered to a workflow; deduplicated by its key."""

    workflow = models.ForeignKey(Workflow, on_delete=models.CASCADE, related_name="signals")
    name = models.CharField(max_length=100)
    payload = models.JSONField(null=True, blank=True)
    dedupe_key = models.CharField(max_length=200, help_text="Sender's key; a repeated key is a no-op.")
    consumed_by = models.ForeignKey(Wait, null=True, blank=True, on_delete=models.SET_NULL, related_name="+")
    received_at = models.DateTimeField()

    class Meta:
        constraints = [models.UniqueConstraint(fields=["workflow", "dedupe_key"], name="uniq_signal_dedupe")]

    def __str__(self) -> str:
        return f"signal {self.name} to workflow {self.workflow_id}"


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


class Checkpoint(models.Model):
    """A snapshot of the durable state at a semantic boundary."""

    workflow = models.ForeignKey(Workflow, on_delete=models.CASCADE, related_name="checkpoints")
    node = models.CharField(max_length=60, help_text="Node being entered.")
    node_visit = models.PositiveIntegerField()
    intent_version = models.PositiveIntegerField()
    state = models.JSONField(default=dict, blank=True)
    created_at = models.DateTimeField()

    class Meta:
        ordering = ["workflow", "node_visit"]

    def __str__(self) -> str:
        return f"checkpoint {self.node}#{self.node_visit} of workflow {self.workflow_id}"


class Event(models.Model):
    """Append-only history, with a contiguous sequence per workflow."""

    workflow = models.ForeignKey(Workflow, on_delete=models.CASCADE, related_name="events")
    seq = models.PositiveIntegerField(help_text="1, 2, 3, … per workflow, without gaps.")
    kind = models.CharField(max_length=60, help_text="Dotted event name, e.g. 'activity.succeeded'.")
    data = models.JSONField(default=dict, blank=True)
    created_at = models.DateTimeField()

    class Meta:
        constraints = [models.UniqueConstraint(fields=["workflow", "seq"], name="uniq_event_seq")]
        ordering = ["workflow", "seq"]

    def __str__(self) -> str:
        return f"#{self.seq} {self.kind}"


class UsageEntry(models.Model):
    """One model call in the usage ledger: reserved before the call, charged after it.

    ``key`` is the activity's operation id plus the call's position in it, so a retried
    attempt finds its row and is charged once.
    """

    class Status(models.TextChoices):
        RESERVED = "reserved", "Reserved: the estimate is held while the call runs"
        CHARGED = "charged", "Charged: the call's real cost"

    workflow = models.ForeignKey(Workflow, on_delete=models.CASCADE, related_name="usage")
    key = models.CharField(max_length=240, unique=True, help_text="Operation id and call number; unique.")
    operation_id = models.CharField(max_length=200, help_text="Activity that made the call.")
    provider = models.CharField(max_length=40)
    model = models.CharField(max_length=120)
    status = models.CharField(max_length=10, choices=Status.choices, default=Status.RESERVED)
    reserved_usd = models.DecimalField(max_digits=12, decimal_places=6, help_text="Estimate held before the call.")
    cost_usd = models.DecimalField(
        max_digits=12, decimal_places=6, null=True, blank=True, help_text="Real cost from the reported usage."
    )
    input_tokens = models.PositiveIntegerField(default=0)
    output_tokens = models.PositiveIntegerField(default=0)
    cache_read_tokens = models.PositiveIntegerField(default=0)
    cache_write_tokens = models.PositiveIntegerField(default=0)
    created_at = models.DateTimeField()
    charged_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        verbose_name_plural = "usage entries"
        indexes = [models.Index(fields=["workflow", "created_at"], name="usage_workflow_time_idx")]

    def __str__(self) -> str:
        return f"{self.key}: {self.cost_usd if self.cost_usd is not None else self.reserved_usd} USD ({self.status})"

    @property
    def amount_usd(self) -> Any:
        """What the entry counts against the budget: the cost once charged, the estimate before."""
        return self.cost_usd if self.status == self.Status.CHARGED else self.reserved_usd


class ProgressSample(models.Model):
    """A model-assessed progress reading, taken after a verification."""

    workflow = models.ForeignKey(Workflow, on_delete=models.CASCADE, related_name="progress")
    operation_id = models.CharField(max_length=200, unique=True, help_text="Activity that assessed it.")
    percent = models.PositiveSmallIntegerField(help_text="0–100.")
    achievements = models.JSONField(default=list, blank=True)
    remaining = models.JSONField(default=list, blank=True, help_text="Work the model says is left.")
    estimated_completion = models.DateTimeField(null=True, blank=True)
    confidence = models.FloatField(help_text="0–1, the model's confidence in this reading.")
    created_at = models.DateTimeField()

    class Meta:
        indexes = [models.Index(fields=["workflow", "created_at"], name="progress_workflow_time_idx")]

    def __str__(self) -> str:
        return f"{self.percent}% for workflow {self.workflow_id}"
