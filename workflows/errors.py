"""The exception hierarchy of agentops: refused, retryable and permanent errors."""
from __future__ import annotations

from typing import Any


class AgentOpsError(Exception):
    """Base of every agentops error. Carries its message and keyword attributes; pickles cleanly."""

    def __init__(self, message: str, **attrs: Any) -> None:
        super().__init__(message)
        self.message = message
        self.attrs = attrs
        for key, value in attrs.items():
            setattr(self, key, value)

    def __reduce__(self) -> tuple[Any, ...]:
        return (_rebuild, (type(self), self.message, self.attrs))

    def __str__(self) -> str:
        return self.message


def _rebuild(cls: type[AgentOpsError], message: str, attrs: dict[str, Any]) -> AgentOpsError:
    return cls(message, **attrs)


class Refused(AgentOpsError):
    """Bad input or a stale decision: explained to the caller, nothing changed."""


class NotFound(Refused):
    """The named object does not exist."""


class InvalidInput(Refused):
    """Input failed validation (command arguments, form fields, activity or model output)."""


class WaitRefused(Refused):
    """A decision on a wait was refused: expired, stale candidate, superseded intent, wrong role."""


class TransitionRefused(Refused):
    """The workflow is not in a state that allows the requested operation."""


class ScheduleRefused(Refused):
    """A schedule's trigger the overlap policy refuses: a run it launched is live (overlap skip), or
    the occurrence would wait behind it on a paused schedule. Nothing is written."""


class Retryable(AgentOpsError):
    """A transient failure (timeout, connection error, 429, 5xx): the activity may try again."""


class Permanent(AgentOpsError):
    """A failure that retrying will not fix: recorded, and the workflow moves on."""


class InvalidDecision(AgentOpsError):
    """A definition's code is wrong (a Goto to a node it does not have, a handler that returns
    something else than a decision): like any exception of a handler, it goes through the failure
    boundary (recorded, retried with backoff, then paused for a person, recorded work kept); it
    never fails the workflow nor undoes its effects."""


class NonDeterminismError(Permanent):
    """A node handler asked for a different step than the one recorded at the same position."""


class Throttled(Retryable):
    """The provider is rate limiting or overloaded (429, 529): the work waits for ``retry_after_seconds``
    (or a jittered backoff) without using up an attempt; throttling is not a failure of the work."""


class BudgetDeferred(Retryable):
    """Over the hourly budget: the work waits for ``retry_after_seconds`` without using up an attempt."""


class BudgetExhausted(AgentOpsError):
    """Over the total budget: the workflow pauses until a person raises the budget."""


class IdempotencyKeyReused(Refused):
    """A client's idempotency key came back with another request than the one it first named:
    refused (409), nothing changed. The same request with the key returns the first result."""
