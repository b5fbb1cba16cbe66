"""Durable workflow state: tables, constraints, indexes and FSM transitions (no I/O, no clock)."""
from workflows.models.activities import Activity, ActivityAttempt, Commitment
from workflows.models.hooks import WebhookAttempt, WebhookDelivery, WebhookSubscription
from workflows.models.identity import ClientRequest, Installation
from workflows.models.ledger import ProgressSample, UsageEntry
from workflows.models.schedules import Schedule, ScheduleOccurrence
from workflows.models.steering import SteerMessage
from workflows.models.tokens import ApiToken
from workflows.models.waits import Signal, Timer, Wait
from workflows.models.workflow import BehavioralRelease, Checkpoint, Event, Intent, StateBlob, Workflow, WorkflowLabel

__all__ = [
    "Activity",
    "ActivityAttempt",
    "ApiToken",
    "BehavioralRelease",
    "Checkpoint",
    "ClientRequest",
    "Commitment",
    "Event",
    "Installation",
    "Intent",
    "ProgressSample",
    "Schedule",
    "ScheduleOccurrence",
    "Signal",
    "StateBlob",
    "SteerMessage",
    "Timer",
    "UsageEntry",
    "Wait",
    "WebhookAttempt",
    "WebhookDelivery",
    "WebhookSubscription",
    "Workflow",
    "WorkflowLabel",
]
