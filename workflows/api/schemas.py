"""Typed request bodies (they generate the OpenAPI schema); responses are the selectors' JSON shapes."""
from __future__ import annotations

from decimal import Decimal
from typing import Any

from ninja import Field, Schema
from pydantic import ConfigDict

from workflows.models import Workflow


class Body(Schema):
    # A misspelt optional field is an error, not a silent default.
    model_config = ConfigDict(extra="forbid")


class LaunchIn(Body):
    kind: str = Field(description="workflow kind, e.g. release")
    goal: str = Field(description="what the agent should achieve")
    params: dict[str, str] = Field(default_factory=dict, description="launch parameters, as `--param KEY=VALUE`")
    max_hours: float | None = Field(default=None, description="time limit; past it the workflow is cancelled")
    budget_total_usd: Decimal | None = Field(default=None, description="total model spend allowed")
    budget_hourly_usd: Decimal | None = Field(default=None, description="model spend allowed per hour")
    priority: int = Field(default=5, description="0–10; 9 and above may pass the hourly budget")
    stagnation_policy: str = Field(default=Workflow.StagnationPolicy.RECORD,
                                   description=f"one of {', '.join(Workflow.StagnationPolicy.values)}")
    release_policy: str = Field(default="", description=f"one of {', '.join(Workflow.ReleasePolicy.values)}; "
                                "empty: the kind's default (revalidate unless the kind declares another)")
    fallback_model: str = Field(default="", description="model to move to on sustained overload; empty: none")


class ApproveIn(Body):
    candidate_hash: str = Field(description="hash of the candidate you reviewed (from the workflow's waits)")
    comment: str = ""


class RejectIn(Body):
    comment: str = ""


class SignalIn(Body):
    name: str = Field(description="the event's name")
    payload: Any = None
    dedupe_key: str = Field(default="", description=(
        "a repeated key is delivered once; at most 200 characters, not starting with 'auto-' or 'webhook:' "
        "(reserved for keyless signals and for signed webhook deliveries)"))


class SupersedeIn(Body):
    goal: str = Field(description="the new goal; it becomes the next intent version")


class CancelIn(Body):
    reason: str = ""


class BudgetIn(Body):
    total_usd: Decimal | None = None
    hourly_usd: Decimal | None = None


class ErrorOut(Schema):
    error: str = Field(description="what went wrong and what to do next; nothing was changed")
