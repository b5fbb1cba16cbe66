"""What an activity sees while it runs: its identity, input, heartbeat and fault points."""
from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any

from workflows import faults
from workflows.errors import Permanent


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


@dataclass
class ActivityContext:
    """Passed to every activity function; ``operation_id`` is the idempotency key to send out."""

    claim: Claim
    reconciled: bool = field(default=False)
    _checkpointed_at: float = field(default_factory=time.monotonic)

    @property
    def operation_id(self) -> str:
        return self.claim.operation_id

    @property
    def attempt(self) -> int:
        return self.claim.attempt

    @property
    def input(self) -> dict[str, Any]:
        return self.claim.input

    @property
    def workflow_id(self) -> int:
        return self.claim.workflow_id

    def heartbeat(self, detail: str = "") -> None:
        """Extend the lease; raises LeaseLost when this attempt was superseded or cancelled."""
        from workflows.services import activity_heartbeat_if_current

        if not activity_heartbeat_if_current(claim=self.claim, detail=detail):
            raise self._lease_lost("lost its lease or its workflow is cancelling; stopping without recording a result")

    @property
    def resume(self) -> dict[str, Any] | None:
        """The working state an earlier attempt saved with ``checkpoint``, to carry on from; None
        on a first attempt or when no attempt saved one."""
        return self.claim.checkpoint

    def checkpoint(self, state: dict[str, Any], detail: str = "", *, force: bool = False) -> bool:
        """Save ``state`` (JSON, under 1 MB) for a later attempt to resume from, when
        AGENTOPS_CHECKPOINT_SECONDS have passed since this attempt started or last saved (or
        ``force``). Saving also heartbeats. True when saved; raises LeaseLost, as a heartbeat
        does, when this attempt was superseded or its workflow is cancelling."""
        from django.conf import settings

        from workflows.services import activity_checkpoint_if_current

        due = time.monotonic() - self._checkpointed_at >= settings.AGENTOPS_CHECKPOINT_SECONDS
        if not (due or force):
            return False
        if not activity_checkpoint_if_current(claim=self.claim, state=state, detail=detail):
            raise self._lease_lost("lost its lease or its workflow is cancelling; stopping without recording a result")
        self._checkpointed_at = time.monotonic()
        return True

    def note(self, kind: str, **data: Any) -> None:
        """Record an event in the workflow's history for this attempt (raises LeaseLost when fenced off)."""
        from workflows.services import activity_note_if_current

        if not activity_note_if_current(claim=self.claim, kind=kind, data=data):
            raise self._lease_lost("lost its lease; stopping")

    def _lease_lost(self, why: str) -> LeaseLost:
        return LeaseLost(f"Attempt {self.attempt} of {self.operation_id} {why}.", operation_id=self.operation_id)

    def faultpoint(self, point: str, **context: Any) -> None:
        faults.faultpoint(point, activity=self.claim.name, attempt=self.attempt, operation_id=self.operation_id,
                          **context)
