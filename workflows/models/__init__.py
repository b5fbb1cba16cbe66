"""Durable workflow state: tables, constraints, indexes and FSM transitions (no I/O, no clock).

Indexes are paid for on every write of the rows they cover, and the tables a model call writes
(events, activities, attempts, the usage ledger, checkpoints) are written several times a call. So
a foreign key that an index or unique constraint already leads with has no index of its own
(``db_index=False``), a link that most rows leave empty is indexed only where it is set, and the
activity columns a lease extension writes are in no index, which lets PostgreSQL update the row in
place (a HOT update: no index entry). ``tests/workflows/test_indexes.py`` keeps it so.
"""
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
