"""What a running attempt holds: its claim (the fencing token) and the lease interface it talks to.

A leaf module: the activity context, the services and the test kit all import it, and it
imports nothing of theirs.
"""
from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol

from workflows.errors import Permanent

if TYPE_CHECKING:
    from workflows.sql import RowWrite


class LeaseLost(Permanent):
    """The attempt no longer holds its lease (taken over, or the workflow is cancelling): stop now."""


@dataclass(frozen=True)
class Claim:
    """A successfully claimed attempt: the fencing token is (attempt, lease_token)."""

    activity_id: int
    workflow_id: int
    operation_id: str
    name: str
    attempt: int
    lease_token: str
    input: dict[str, Any]
    previous_attempt_lost: bool
    checkpoint: dict[str, Any] | None = None
    definition_version: int = 1
    # The workflow's behavioral release (provider, model, prompt_version, tool_versions) and its
    # release policy (pin, revalidate, fail): what the attempt's model calls run on
    # (workflows.releases.provider_for). None (the test kit): the current release.
    release: dict[str, Any] | None = None
    release_policy: str = "revalidate"
    # Workflow.release_provisional: the release was recorded from the settings of a process that
    # launched before any worker announced one (a shell), and no worker has moved it to its own since.
    release_provisional: bool = False
    # The workflow's fallback model ("" for none) and how many attempts before this one in a row
    # were throttled (429/529): provider_for moves the calls to the fallback on sustained overload.
    fallback_model: str = ""
    throttled_in_a_row: int = 0
    # The key the attempt sends to external systems (Activity.sent_key): the installation id, then
    # the operation id. "" (the test kit, an activity scheduled before installations had ids):
    # the operation id itself.
    idempotency_key: str = ""
    # Whose the work is and how urgent, for the shared rate limits (workflows.ratelimits): the
    # workflow's tenant (workflows.tenancy), kind and priority (0–10) when the attempt was claimed.
    tenant: str = ""
    kind: str = ""
    priority: int = 5
    # Whether the workflow had a budget limit (total or hourly) when the attempt was claimed: only
    # then does a model call ask the provider to count its input for the reservation
    # (workflows.metering.metered_complete). True (the test kit): it may have one.
    budget_limited: bool = True


@dataclass(frozen=True)
class Fence:
    """``ctx.fence(effect)`` handed to what records the effect: ``check()`` raises LeaseLost unless
    the attempt still holds its lease and its work is still wanted. ``claim`` and ``detail`` (what
    the lease's row is written with) let the database ledger check the same lease inside the
    statement that reserves a model request instead (``workflows.services.budgets``); ``claim``
    is None when the lease is not the database's (``Lease.fence_in_sql``): then only ``check``
    can tell."""

    claim: Claim | None
    detail: str
    check: Callable[[], None]


class Lease(Protocol):
    """How a running attempt reaches durable state. Each call is fenced by the claim: it returns
    False, changing nothing, once the attempt was taken over or its workflow is cancelling."""

    @property
    def fence_in_sql(self) -> bool:
        """True when a fenced call is the condition on the activity's row ``(status=running,
        attempt, lease_token)`` and nothing else (the services' database lease), so a statement
        may check it itself (``Fence``)."""
        ...

    def heartbeat(self, claim: Claim, detail: str) -> bool: ...

    def checkpoint(self, claim: Claim, state: dict[str, Any], detail: str,
                   notes: Sequence[tuple[str, dict[str, Any]]] = ()) -> bool: ...

    def note(self, claim: Claim, kind: str, data: dict[str, Any], also: RowWrite | None = None) -> bool:
        """Record the event; ``also`` (a model call's charge, given only when ``fence_in_sql``) is
        written whether or not the note is, in its statement."""
        ...

    def adopt_release(self, claim: Claim, release: dict[str, Any], why: str) -> bool: ...

    def steering(self, claim: Claim, call: int) -> list[dict[str, Any]] | None:
        """The steer messages model call ``call`` sends (seq, text, sender, sent_at), or None when fenced off."""
        ...
