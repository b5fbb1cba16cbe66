"""Outbound webhooks: subscriptions, and one delivery row per event and subscription, retried from
the database until the receiver answers 2xx (docs/live.md, "Outbound webhooks")."""
from __future__ import annotations

from datetime import datetime
from typing import Any

from django.conf import settings
from django.db import models
from django.db.models import F, Q
from django_fsm import FSMField, FSMModelMixin, transition


class WebhookSubscription(models.Model):
    """An endpoint told of events: each matching history event becomes one signed delivery."""

    name = models.CharField(max_length=100, help_text="A label to tell subscriptions apart, e.g. 'ci'; unique.")
    url = models.URLField(max_length=1000, help_text="Where deliveries are POSTed (http or https).")
    secret = models.CharField(
        max_length=200,
        help_text="The shared secret deliveries are signed with (scheme v2, as inbound webhooks); 32+ characters. "
                  "Kept in the database: the server needs it to sign.",
    )
    event_kinds = models.JSONField(
        default=list, blank=True, help_text="Event kinds delivered, e.g. [\"workflow.completed\"]; empty: every kind.",
    )
    workflow_kinds = models.JSONField(default=list, blank=True,
                                      help_text="Only events of workflows of these kinds; empty: all kinds.")
    launchers = models.JSONField(default=list, blank=True,
                                 help_text="Only events of workflows these users launched (usernames); empty: all.")
    active = models.BooleanField(default=True, help_text="An inactive subscription makes no new deliveries.")
    created_by = models.ForeignKey(
        settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.SET_NULL, related_name="+",
        help_text="Who made the subscription.",
    )
    created_at = models.DateTimeField(help_text="When the subscription was made; events recorded before are not sent.")
    cursor = models.BigIntegerField(
        default=0, help_text="The last event (its global number) the scan has looked at for this subscription.",
    )
    cursor_hole_since = models.DateTimeField(
        null=True, blank=True,
        help_text="Since when the scan has waited for a missing event number after the cursor (a transaction "
                  "still committing, or one rolled back).",
    )
    cursor_hole_waits_on = models.JSONField(
        null=True, blank=True,
        help_text="The database's transactions the hole waits on to end (PostgreSQL transaction ids), looked "
                  "at once it had stood for AGENTOPS_STREAM_GAP_SECONDS; passed when none is left.",
    )

    class Meta:
        constraints = [models.UniqueConstraint(fields=["name"], name="uniq_webhook_subscription_name")]
        ordering = ["pk"]

    def __str__(self) -> str:
        return f"webhook {self.name} → {self.url}"


def _attempt_recorded(row: Any, attempt: int, status_code: int | None, error: str) -> None:
    """What every answered (or failed) attempt writes on its delivery."""
    row.attempts = attempt
    row.claimed_until = None
    row.last_status_code = status_code
    row.last_error = error[:500]


class WebhookDelivery(FSMModelMixin, models.Model):
    """One event for one subscription: sent until a 2xx answer, oldest first per workflow."""

    class Status(models.TextChoices):
        PENDING = "pending", "Pending: to be sent at next_attempt_at"
        DELIVERED = "delivered", "Delivered: the receiver answered 2xx"
        FAILED = "failed", "Failed: out of attempts (AGENTOPS_OUTBOUND_WEBHOOK_MAX_ATTEMPTS); redeliver to retry"

    subscription = models.ForeignKey(WebhookSubscription, on_delete=models.CASCADE, related_name="deliveries")
    delivery_id = models.CharField(max_length=40,
                                   help_text="The X-Agentops-Delivery header: the same on every attempt.")
    event_id = models.BigIntegerField(help_text="The event's global number (kept when retention archives the event).")
    workflow_id = models.BigIntegerField(help_text="The event's workflow.")
    seq = models.PositiveIntegerField(help_text="The event's number within its workflow: the order of deliveries.")
    kind = models.CharField(max_length=60, help_text="The event's kind.")
    body = models.TextField(help_text="The JSON body, made once: every attempt sends these bytes.")
    status = FSMField(max_length=10, choices=Status.choices, default=Status.PENDING, protected=True,
                      help_text="pending → delivered, or failed after the last attempt.")
    attempts = models.PositiveIntegerField(default=0, help_text="Attempts made so far.")
    redeliveries = models.PositiveIntegerField(
        default=0, help_text="How many times a person asked to send it again: the X-Agentops-Redelivery header "
                             "(a redelivery may come after the workflow's later events).",
    )
    next_attempt_at = models.DateTimeField(help_text="When the next attempt is due.")
    claimed_until = models.DateTimeField(
        null=True, blank=True, help_text="An attempt is in flight until then (a worker that died lets it lapse).",
    )
    last_status_code = models.IntegerField(null=True, blank=True, help_text="HTTP status of the last answer.")
    last_error = models.CharField(max_length=500, blank=True, default="", help_text="Why the last attempt failed.")
    created_at = models.DateTimeField(help_text="When the delivery was made from the event.")
    delivered_at = models.DateTimeField(null=True, blank=True, help_text="When the receiver answered 2xx.")

    class Meta:
        verbose_name_plural = "webhook deliveries"
        constraints = [
            models.UniqueConstraint(fields=["subscription", "event_id"], name="uniq_webhook_delivery_event"),
            models.UniqueConstraint(fields=["delivery_id"], name="uniq_webhook_delivery_id"),
        ]
        indexes = [
            models.Index(fields=["next_attempt_at"], name="webhook_delivery_due_idx", condition=Q(status="pending")),
            models.Index(fields=["subscription", "workflow_id", "seq"], name="webhook_delivery_order_idx",
                         condition=Q(status="pending")),
        ]
        ordering = ["-pk"]

    def __str__(self) -> str:
        return f"delivery {self.delivery_id} of {self.kind} #{self.seq} (workflow {self.workflow_id}): {self.status}"

    # The whole lifecycle (docs/state-machines.md); the services issue each as one conditional
    # UPDATE on its sources and the attempt it records (``lifecycle.rows_move``).
    @transition(field=status, source=Status.PENDING, target=Status.DELIVERED)
    def deliver(self, *, attempt: int, status_code: int | None, error: str, at: datetime) -> None:
        """The receiver answered 2xx."""
        _attempt_recorded(self, attempt, status_code, error)
        self.delivered_at = at

    @transition(field=status, source=Status.PENDING, target=Status.PENDING)
    def retry(self, *, attempt: int, status_code: int | None, error: str, next_attempt_at: datetime) -> None:
        """An attempt failed with attempts left: sent again at ``next_attempt_at``."""
        _attempt_recorded(self, attempt, status_code, error)
        self.next_attempt_at = next_attempt_at

    @transition(field=status, source=Status.PENDING, target=Status.FAILED)
    def fail(self, *, attempt: int, status_code: int | None, error: str) -> None:
        """The last attempt (AGENTOPS_OUTBOUND_WEBHOOK_MAX_ATTEMPTS) failed; a person may redeliver it."""
        _attempt_recorded(self, attempt, status_code, error)

    @transition(field=status, source=[Status.DELIVERED, Status.FAILED], target=Status.PENDING)
    def redeliver(self, *, at: datetime) -> None:
        """A person asked to send it again: at once, counted in ``X-Agentops-Redelivery``."""
        self.next_attempt_at = at
        self.claimed_until = None
        self.delivered_at = None
        self.redeliveries = F("redeliveries") + 1


class WebhookAttempt(models.Model):
    """One POST of a delivery and what came back."""

    delivery = models.ForeignKey(WebhookDelivery, on_delete=models.CASCADE, related_name="attempt_rows")
    number = models.PositiveIntegerField(help_text="1, 2, 3, … per delivery.")
    started_at = models.DateTimeField(help_text="When the request was sent.")
    duration_ms = models.PositiveIntegerField(default=0, help_text="How long the answer took.")
    status_code = models.IntegerField(null=True, blank=True, help_text="HTTP status; empty when none came back.")
    error = models.CharField(max_length=500, blank=True, default="", help_text="What went wrong, if anything.")

    class Meta:
        constraints = [models.UniqueConstraint(fields=["delivery", "number"], name="uniq_webhook_attempt_number")]
        ordering = ["delivery", "number"]

    def __str__(self) -> str:
        return f"attempt {self.number} of {self.delivery_id}: {self.status_code or self.error[:40]}"
