"""How a workflow runs, beside what it does: the launch options, declared once.

``agent launch``, ``POST /api/workflows``, the admin's launch form and a parent starting a child
give the same options; each takes its help from ``HELP`` and hands the service one
``LaunchOptions``, which ``checked`` checks in one place.
"""
from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, field, fields, replace
from decimal import Decimal
from typing import TYPE_CHECKING, Any

from workflows.errors import InvalidInput
from workflows.models import Workflow
from workflows.rules import amount_checked
from workflows.services.common import priority_checked
from workflows.services.labels import labels_checked
from workflows.services.steps import MAX_HOURS

if TYPE_CHECKING:
    from workflows.engine import WorkflowDefinition

MODEL_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._:-]{0,119}")

HELP = {
    "release_policy": "what to do when the model release changes; empty: the kind's default (revalidate unless "
                      "the kind declares another)",
    "max_hours": "time limit in hours; past it the workflow is cancelled",
    "priority": "0–10; 9 and above may pass the hourly budget",
    "budget_total_usd": "total model spend allowed (USD, at most 4 decimal places)",
    "budget_hourly_usd": "model spend allowed per hour (USD, at most 4 decimal places)",
    "stagnation_policy": "what beat does when progress stalls",
    "fallback_model": "model to move to on sustained overload (429/529), e.g. claude-haiku-4-5; empty: none",
    "labels": "labels to find it by, key=value",
}


@dataclass(frozen=True)
class LaunchOptions:
    """The options of a launch; every one has a default, so ``LaunchOptions()`` launches as the
    kind declares. ``checked(definition)`` returns them checked, with the kind's defaults filled in."""

    release_policy: str = ""
    max_hours: float | None = None
    priority: int = 5
    budget_total_usd: Decimal | None = None
    budget_hourly_usd: Decimal | None = None
    stagnation_policy: str = Workflow.StagnationPolicy.RECORD
    fallback_model: str = ""
    labels: Mapping[str, str] = field(default_factory=dict)

    @classmethod
    def of(cls, values: Mapping[str, Any]) -> LaunchOptions:
        """The options among ``values`` (a request's fields, a form's cleaned data, parsed flags);
        anything else in it is not an option and is left out."""
        return cls(**{f.name: values[f.name] for f in fields(cls) if f.name in values})

    def checked(self, definition: WorkflowDefinition) -> LaunchOptions:
        """These options as a launch of ``definition`` stores them, or InvalidInput naming the first
        bad one (nothing is written before this returns)."""
        release_policy = self.release_policy or definition.default_release_policy
        if release_policy not in Workflow.ReleasePolicy.values:
            choices = ", ".join(Workflow.ReleasePolicy.values)
            raise InvalidInput(f"Release policy {release_policy!r} is not one of {choices}.")
        max_hours = definition.default_max_hours if self.max_hours is None else self.max_hours
        if max_hours is not None and not 0 < max_hours <= MAX_HOURS:
            raise InvalidInput(f"The time limit must be between 0 and {MAX_HOURS} hours; got {max_hours}.")
        if self.stagnation_policy not in Workflow.StagnationPolicy.values:
            choices = ", ".join(Workflow.StagnationPolicy.values)
            raise InvalidInput(f"Stagnation policy {self.stagnation_policy!r} is not one of {choices}.")
        if self.fallback_model and not MODEL_NAME.fullmatch(self.fallback_model):
            raise InvalidInput(f"The fallback model must be a model name of at most 120 letters, digits and . _ - : "
                               f"characters, e.g. claude-haiku-4-5; got {self.fallback_model[:130]!r}.")
        return replace(
            self, release_policy=release_policy, max_hours=max_hours, priority=priority_checked(self.priority),
            budget_total_usd=amount_checked(self.budget_total_usd, what="The total budget"),
            budget_hourly_usd=amount_checked(self.budget_hourly_usd, what="The hourly budget"),
            labels=labels_checked(self.labels),
        )

    def request(self) -> dict[str, Any]:
        """What names a launch with these (checked) options, for its idempotency key: the values as
        checked, so 5, 5.0 and "5.00" are one request."""
        named: dict[str, Any] = {
            "release_policy": self.release_policy,
            "max_hours": None if self.max_hours is None else float(self.max_hours), "priority": self.priority,
            "budget_total_usd": _amount(self.budget_total_usd), "budget_hourly_usd": _amount(self.budget_hourly_usd),
            "stagnation_policy": self.stagnation_policy, "fallback_model": self.fallback_model,
        }
        if self.labels:  # only when given: a key reused from before labels existed still names the same request
            named["labels"] = dict(self.labels)
        return named


def _amount(value: Decimal | None) -> str | None:
    """An amount as the same text however it was written (5, 5.0 and 5.00 alike)."""
    return None if value is None else str(value.normalize())
