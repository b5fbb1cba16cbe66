"""Who is asking: this installation's identity among others, and the idempotency keys of client requests."""
from __future__ import annotations

from django.conf import settings
from django.db import models
from django.db.models import Q


class Installation(models.Model):
    """This database's identity: one row, created once (by migration 0011, or by the first process
    that needs it), never changed. Part of every idempotency key sent outside, so two
    installations calling one external system never share a key."""

    SINGLETON = 1

    id = models.PositiveSmallIntegerField(
        primary_key=True, default=SINGLETON, editable=False, help_text="Always 1: there is one row.",
    )
    installation_id = models.CharField(
        max_length=32, unique=True, editable=False,
        help_text="Random hex (a UUID4), made once: the prefix of the idempotency keys this installation sends.",
    )
    created_at = models.DateTimeField(help_text="When this installation was first migrated or used.")

    class Meta:
        constraints = [models.CheckConstraint(condition=Q(id=1), name="installation_singleton")]

    def __str__(self) -> str:
        return f"installation {self.installation_id}"


class ClientRequest(models.Model):
    """A launch or supersede sent with an idempotency key: the key names one request, whose body
    (its fingerprint) and result are kept, so the same request sent again returns that result."""

    class Operation(models.TextChoices):
        LAUNCH = "launch"
        SUPERSEDE = "supersede"

    operation = models.CharField(max_length=12, choices=Operation.choices, help_text="What the request asked.")
    key = models.CharField(max_length=200, help_text="The client's idempotency key (Idempotency-Key header, "
                                                     "--idempotency-key).")
    fingerprint = models.CharField(
        max_length=64, help_text="SHA-256 of the request's body as the service received it; the same key with "
                                 "another body is refused.",
    )
    workflow = models.ForeignKey(
        "workflows.Workflow", null=True, blank=True, on_delete=models.CASCADE, related_name="client_requests",
        help_text="The workflow launched, or whose goal was superseded.",
    )
    intent_version = models.PositiveIntegerField(
        null=True, blank=True, help_text="The intent version a supersede made (empty for a launch).",
    )
    requested_by = models.ForeignKey(
        settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.SET_NULL, related_name="+",
        help_text="Who sent it.",
    )
    created_at = models.DateTimeField(help_text="When the request was first applied.")

    class Meta:
        constraints = [models.UniqueConstraint(fields=["operation", "key"], name="uniq_client_request_key")]

    def __str__(self) -> str:
        return f"{self.operation} {self.key!r}"
