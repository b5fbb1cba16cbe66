"""Registries of workflow definitions (by kind) and activity types (by name)."""
from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from workflows.errors import InvalidInput

if TYPE_CHECKING:
    from workflows.activity_context import ActivityContext
    from workflows.engine import WorkflowDefinition


@dataclass(frozen=True)
class RetryPolicy:
    """How an activity is retried: attempts, exponential backoff, errors never retried."""

    max_attempts: int = 5
    initial_interval_seconds: float = 1.0
    backoff: float = 2.0
    max_interval_seconds: float = 300.0
    non_retryable: tuple[type[BaseException], ...] = ()

    def delay_after(self, attempt: int) -> float:
        """Seconds to wait before attempt number ``attempt + 1``."""
        return min(self.initial_interval_seconds * self.backoff ** max(attempt - 1, 0), self.max_interval_seconds)


ActivityFn = Callable[["ActivityContext"], Any]


@dataclass(frozen=True)
class ActivityType:
    """A registered activity: its function and how the engine treats it."""

    name: str
    fn: ActivityFn
    retry: RetryPolicy = field(default_factory=RetryPolicy)
    lease_seconds: int | None = None
    reconcile: ActivityFn | None = None
    commitment: str = ""
    compensation: str = ""
    records_progress: bool = False


_definitions: dict[str, type[WorkflowDefinition]] = {}
_activities: dict[str, ActivityType] = {}


def register_definition(cls: type[WorkflowDefinition]) -> type[WorkflowDefinition]:
    if cls.kind in _definitions and _definitions[cls.kind] is not cls:
        raise ValueError(f"workflow kind {cls.kind!r} is registered twice")
    _definitions[cls.kind] = cls
    return cls


def definition(kind: str) -> WorkflowDefinition:
    try:
        return _definitions[kind]()
    except KeyError:
        known = ", ".join(sorted(_definitions)) or "none"
        raise InvalidInput(f"Unknown workflow kind {kind!r}; known kinds: {known}.", kind=kind) from None


def definition_kinds() -> list[str]:
    return sorted(_definitions)


def activity(
    name: str,
    *,
    retry: RetryPolicy | None = None,
    lease_seconds: int | None = None,
    reconcile: ActivityFn | None = None,
    commitment: str = "",
    compensation: str = "",
    records_progress: bool = False,
) -> Callable[[ActivityFn], ActivityFn]:
    """Register an activity type. ``reconcile`` asks the outside world whether a lost attempt took effect;
    ``records_progress`` stores the result's ``progress`` object as a progress sample."""

    def register(fn: ActivityFn) -> ActivityFn:
        if name in _activities:
            raise ValueError(f"activity type {name!r} is registered twice")
        _activities[name] = ActivityType(
            name=name, fn=fn, retry=retry or RetryPolicy(), lease_seconds=lease_seconds,
            reconcile=reconcile, commitment=commitment, compensation=compensation,
            records_progress=records_progress,
        )
        return fn

    return register


def activity_type(name: str) -> ActivityType:
    try:
        return _activities[name]
    except KeyError:
        raise InvalidInput(f"Unknown activity type {name!r}.", name=name) from None
