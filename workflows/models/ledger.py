"""The usage ledger of model calls and the progress samples."""
from __future__ import annotations

from datetime import datetime
from decimal import Decimal
from typing import Any

from django.db import models
from django_fsm import FSMField, transition

from workflows.models.workflow import Workflow


class UsageEntry(models.Model):
    """One request to a model provider in the usage ledger: reserved before it leaves the
    process, then charged (usage reported), released (answered with an error, which the API
    does not bill) or uncertain (no answer seen: a timeout, a dropped connection, a dead worker).

    ``key`` is ``<operation_id>#<call>@<attempt>.<n>``: the activity, the logical call's
    position in it, the attempt that made it and the request's number within that call (the
    SDK's in-process retries), so every request that left the process has its own row and a
    retried *recording* of the same request finds that row and changes nothing.
    """

    class Status(models.TextChoices):
        RESERVED = "reserved", "Reserved: the estimate is held while the request runs"
        CHARGED = "charged", "Charged: the request's real cost, from the usage the provider reported"
        UNCERTAIN = "uncertain", "Uncertain: no answer was seen; the estimate counts until the usage is known"
        RELEASED = "released", "Released: answered with an error (not billed), or never sent; counts nothing"

    workflow = models.ForeignKey(Workflow, on_delete=models.CASCADE, related_name="usage",
                                 db_index=False)  # usage_workflow_time_idx leads with it
    key = models.CharField(
        max_length=240, unique=True,
        help_text="<operation_id>#<call>@<attempt>.<n>: one request; unique (constraint on the column).",
    )
    operation_id = models.CharField(max_length=200, help_text="Activity that made the call.")
    attempt = models.PositiveIntegerField(default=0, help_text="The activity attempt that sent the request.")
    provider = models.CharField(max_length=40, help_text="Provider the request went to.")
    model = models.CharField(max_length=120, help_text="Model the request asked for.")
    status = FSMField(max_length=10, choices=Status.choices, default=Status.RESERVED, protected=True,
                      help_text="reserved → charged, released or uncertain; uncertain → charged or released.")
    reserved_usd = models.DecimalField(max_digits=12, decimal_places=6, help_text="Estimate held before the call.")
    cost_usd = models.DecimalField(
        max_digits=12, decimal_places=6, null=True, blank=True, help_text="Real cost from the reported usage."
    )
    request_id = models.CharField(max_length=120, blank=True, default="",
                                  help_text="The provider's request id, when an answer came back.")
    http_status = models.IntegerField(null=True, blank=True,
                                      help_text="HTTP status of the answer; empty when none was seen.")
    outcome = models.CharField(max_length=300, blank=True, default="",
                               help_text="Why the entry was released or is uncertain.")
    input_tokens = models.PositiveIntegerField(default=0)
    output_tokens = models.PositiveIntegerField(default=0)
    cache_read_tokens = models.PositiveIntegerField(default=0)
    cache_write_tokens = models.PositiveIntegerField(default=0)
    cache_write_1h_tokens = models.PositiveIntegerField(
        default=0, help_text="The part of the cache write made with the 1-hour TTL (priced higher)."
    )
    created_at = models.DateTimeField(help_text="When the request was reserved (before it was sent).")
    charged_at = models.DateTimeField(null=True, blank=True, help_text="When the entry was charged or released.")

    class Meta:
        verbose_name_plural = "usage entries"
        indexes = [
            models.Index(fields=["workflow", "created_at"], name="usage_workflow_time_idx"),
            # The lease sweep looks for reservations whose attempt is no longer running.
            models.Index(fields=["created_at"], name="usage_reserved_idx", condition=models.Q(status="reserved")),
        ]

    def __str__(self) -> str:
        return f"{self.key}: {self.cost_usd if self.cost_usd is not None else self.reserved_usd} USD ({self.status})"

    # The whole lifecycle (docs/state-machines.md); the budget services issue each as one
    # conditional UPDATE on its sources and the request's key (``lifecycle.rows_move``).
    @transition(field=status, source=[Status.RESERVED, Status.UNCERTAIN], target=Status.CHARGED)
    def charge(self, *, cost_usd: Decimal, usage: dict[str, int], request_id: str, http_status: int | None,
               at: datetime) -> None:
        """The provider reported the request's usage: its real cost replaces the estimate (a late
        answer or the provider's usage report settles an uncertain one)."""
        self.cost_usd, self.charged_at, self.outcome = cost_usd, at, ""
        self.request_id, self.http_status = request_id[:120], http_status
        for name, tokens in usage.items():
            setattr(self, name, tokens)

    @transition(field=status, source=[Status.RESERVED, Status.UNCERTAIN], target=Status.RELEASED)
    def release(self, *, reason: str, http_status: int | None, request_id: str, at: datetime) -> None:
        """The request cost nothing: answered with an error (not billed) or never sent."""
        self.charged_at, self.outcome = at, reason[:300]
        self.request_id, self.http_status = request_id[:120], http_status

    @transition(field=status, source=Status.RESERVED, target=Status.UNCERTAIN)
    def doubt(self, *, reason: str) -> None:
        """No answer was seen (a timeout, a dropped connection, the attempt that sent it stopped):
        the provider may have billed it, so the estimate keeps counting."""
        self.outcome = reason[:300]

    @property
    def amount_usd(self) -> Any:
        """What the entry counts against the budget: the cost once charged, nothing once released,
        the estimate while reserved or uncertain."""
        if self.status == self.Status.CHARGED:
            return self.cost_usd
        if self.status == self.Status.RELEASED:
            return Decimal(0)
        return self.reserved_usd


class ProgressSample(models.Model):
    """A model-assessed progress reading, taken after a verification."""

    workflow = models.ForeignKey(Workflow, on_delete=models.CASCADE, related_name="progress",
                                 db_index=False)  # progress_workflow_time_idx leads with it
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
