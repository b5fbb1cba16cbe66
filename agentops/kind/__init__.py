"""What a kind is written against: its definition, its activities, its launch parameters, its errors.

A kind (a package of ``definition.py`` and ``activities.py``, docs/authoring.md) imports the
runtime from here, and from ``agentops.kind.presentation`` (its admin panels) and
``agentops.kind.testing`` (its tests), and from nowhere else of the kernel: these names are kept
from release to release (tests/test_kind_surface.py locks them), while the modules behind them may
move. Model calls go through ``metered_complete`` (fenced, reserved and charged) to the provider of
the workflow's release (``provider_for``); the offline answers, the structured-answer helpers, the
sandbox and the engine's git are features a kind may use besides (``agentops.providers``,
``agentops.sandbox``, ``agentops.git``). A kind's recurring launches are ``Schedule`` values on its
definition (or ``declare_schedules`` from an app's ``ready()``); one per object (a reminder per
invoice) is made and removed where the object is, by ``schedule_ensure`` and ``schedule_remove``.
"""
from __future__ import annotations

from workflows.activity_context import ActivityContext
from workflows.clock import now
from workflows.engine import (
    ActivityFailed,
    ChildHandle,
    ChildOutcome,
    Complete,
    Decision,
    Fail,
    FirstOutcome,
    Goto,
    NodeContext,
    WaitOutcome,
    WorkflowDefinition,
    hash_of_candidate,
    node,
)
from workflows.errors import (
    BudgetExhausted,
    InvalidInput,
    Permanent,
    Retryable,
    Throttled,
    TransitionRefused,
    WaitRefused,
)
from workflows.features.schedules.declared import Schedule, declare_schedules, schedule_ensure, schedule_remove
from workflows.heartbeats import keep_alive
from workflows.metering import MODEL_CALL_LEASE, metered_complete
from workflows.params import ROLE_MAX_LENGTH, LaunchParams
from workflows.presentation import EMPTY_QUERY, AdminPanel, CandidateView, candidate_as_json
from workflows.prices import cost_usd
from workflows.progress import progress_validate
from workflows.provider import ModelResponse, Usage
from workflows.registry import CompensationInput, DefinitionError, RetryPolicy, activity, register_definition
from workflows.releases import provider_for
from workflows.statestore import resolve, state_at, state_of
from workflows.telemetry import annotate, tool_span

__all__ = [
    "ActivityContext", "ActivityFailed", "AdminPanel", "BudgetExhausted", "CandidateView", "ChildHandle",
    "ChildOutcome", "CompensationInput", "Complete", "Decision", "DefinitionError", "EMPTY_QUERY", "Fail",
    "FirstOutcome", "Goto", "InvalidInput", "LaunchParams", "MODEL_CALL_LEASE", "ModelResponse", "NodeContext",
    "Permanent",
    "ROLE_MAX_LENGTH", "RetryPolicy", "Retryable", "Schedule", "Throttled", "TransitionRefused", "Usage",
    "WaitOutcome", "WaitRefused",
    "WorkflowDefinition", "activity", "annotate", "candidate_as_json", "cost_usd", "declare_schedules",
    "hash_of_candidate", "keep_alive", "metered_complete", "node", "now", "progress_validate", "provider_for",
    "register_definition", "resolve", "schedule_ensure", "schedule_remove", "state_at", "state_of", "tool_span",
]
