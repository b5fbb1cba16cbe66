"""Steer messages: what a person tells a running agent, read at its next model call."""
from __future__ import annotations

from django.conf import settings
from django.db import models
from django.db.models import Q

from workflows.models.activities import Activity
from workflows.models.workflow import Workflow

MAX_STEER_CHARS = 10_000
# A held message whose activity ended so is taken by the workflow's next model call: that
# activity's conversation is gone (workflows/services/steering.py).
ENDED_WITHOUT_RESULT = (Activity.Status.FAILED, Activity.Status.CANCELLED)


class SteerMessage(models.Model):
    """A durable message to a running agent, ordered per workflow (``seq``). The next model call
    of an activity that reads steering takes it as a user turn: the call's activity and its call
    number are recorded here (``activity``, ``call``), so a retried attempt of that activity sends it
    again at the same point of its conversation and no other activity takes it. It is delivered
    once its activity succeeded; when that activity ended without a result (failed, or voided)
    its conversation is gone, and the message goes to the workflow's next model call instead."""

    workflow = models.ForeignKey(Workflow, on_delete=models.CASCADE, related_name="steer_messages")
    seq = models.PositiveIntegerField(help_text="1, 2, 3, … per workflow: the order messages reach the agent in.")
    text = models.TextField(help_text="What the person told the agent, sent to the model as a user turn.")
    sent_by = models.ForeignKey(
        settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.SET_NULL, related_name="+",
        help_text="The user who sent it, when known.",
    )
    sender = models.CharField(
        max_length=200, help_text="Who sent it, as recorded in the history: a username, or shell:LOGIN.")
    dedupe_key = models.CharField(
        max_length=200, blank=True, default="",
        help_text="A repeated key is one message (the second send changes nothing); empty: every send is new.",
    )
    sent_at = models.DateTimeField(help_text="When it was received.")
    activity = models.ForeignKey(
        Activity, null=True, blank=True, on_delete=models.SET_NULL, related_name="+",
        help_text="The activity whose model call took it; empty while no call has.",
    )
    call = models.PositiveIntegerField(
        null=True, blank=True, help_text="The model call of that activity (0, 1, …) whose request carries it.")
    taken_at = models.DateTimeField(null=True, blank=True, help_text="When a model call last took it.")

    class Meta:
        constraints = [
            models.UniqueConstraint(fields=["workflow", "seq"], name="uniq_steer_seq"),
            models.UniqueConstraint(fields=["workflow", "dedupe_key"], condition=~Q(dedupe_key=""),
                                    name="uniq_steer_dedupe"),
        ]
        ordering = ["workflow", "seq"]

    def __str__(self) -> str:
        return f"steer #{self.seq} of workflow {self.workflow_id}"
