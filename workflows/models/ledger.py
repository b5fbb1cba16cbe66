"""The usage ledger of model calls and the progress samples."""
from __future__ import annotations

from typing import Any

from django.db import models

from workflows.models.workflow import Workflow


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
