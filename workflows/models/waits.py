"""What a workflow waits for: approvals, events and timers, and the signals that arrive."""
from __future__ import annotations

from datetime import datetime
from typing import Any

from django.conf import settings
from django.db import models
from django.db.models import Q
from django_fsm import ConcurrentTransitionMixin, FSMField, FSMModelMixin, transition

from workflows.models.workflow import Workflow
from workflows.params import ROLE_MAX_LENGTH


class Wait(ConcurrentTransitionMixin, models.Model):
    """The workflow waits for something explicit: an approval, a named event, or a timer."""

    class Kind(models.TextChoices):
        APPROVAL = "approval"
        EVENT = "event"
        TIMER = "timer"
        CHILD = "child", "Child: a child workflow's end (ctx.child)"
        FIRST = "first", "First: whichever comes first of a signal, a child's end and a timer (ctx.wait_first)"

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
    required_role = models.CharField(max_length=ROLE_MAX_LENGTH, blank=True,
                                     help_text="Django group whose members may decide.")
    state_versions = models.JSONField(
        default=dict, blank=True, help_text="State versions the candidate was built on (intent, repository HEAD, …)."
    )
    event_name = models.CharField(
        max_length=100, blank=True,
        help_text="Signal name an event wait is waiting for; a child wait's child kind.")
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
    payload = models.JSONField(
        null=True, blank=True,
        help_text="Payload of the event that satisfied the wait; a child wait's outcome (workflow_id, status, "
                  "result, reason).")
    first_of = models.JSONField(
        default=list, blank=True,
        help_text="A first-of wait's child waits (operation ids), in the order the handler gave them; the payload "
                  "records which source won (signal, child or timer).")
    created_at = models.DateTimeField()

    # Declared for type checkers: the FSM mixins hide the implicit manager from django-stubs.
    objects: models.Manager[Wait] = models.Manager()

    class Meta:
        indexes = [
            models.Index(fields=["workflow", "status"], name="wait_workflow_status_idx"),
            # The children sweep looks for open child waits whose child ended (a lost doorbell).
            models.Index(fields=["created_at"], name="wait_child_open_idx", condition=Q(kind="child", status="open")),
        ]

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


class Timer(FSMModelMixin, models.Model):
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
    status = FSMField(max_length=10, choices=Status.choices, default=Status.PENDING, protected=True)
    fired_at = models.DateTimeField(null=True, blank=True)
    note = models.CharField(max_length=200, blank=True, help_text="Why an ignored timer was ignored.")

    class Meta:
        constraints = [models.UniqueConstraint(fields=["wait", "purpose"], name="uniq_timer_per_wait_purpose")]
        indexes = [models.Index(fields=["fire_at"], name="timer_pending_fire_idx", condition=Q(status="pending"))]

    def __str__(self) -> str:
        return f"{self.purpose} timer {self.pk} at {self.fire_at:%Y-%m-%d %H:%M:%S} ({self.status})"

    # The whole lifecycle (docs/state-machines.md); the services issue each as one conditional
    # UPDATE on its sources (``lifecycle.rows_move``), so two beats fire a timer once.
    @transition(field=status, source=Status.PENDING, target=Status.FIRED)
    def fire(self, *, at: datetime) -> None:
        """Its time came and a beat claimed it; it satisfies or expires its wait next."""
        self.fired_at = at

    @transition(field=status, source=[Status.PENDING, Status.FIRED], target=Status.IGNORED)
    def ignore(self, *, note: str) -> None:
        """Its wait, intent or workflow moved on: cancelled, superseded, or a first-of wait won by
        another branch (pending), or found stale once claimed (fired)."""
        self.note = note[:200]


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
