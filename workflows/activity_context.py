"""What an activity sees while it runs: its identity, heartbeat, checkpoints, notes and fault points."""
from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from django.conf import settings

from workflows import faults
from workflows.leases import Claim, Fence, Lease, LeaseLost

if TYPE_CHECKING:
    from workflows.sql import RowWrite

__all__ = ["ActivityContext", "Claim", "LeaseLost"]

LEASE_LOST = "was taken over or its work is no longer wanted; stopping without recording a result"


def _before(effect: str) -> str:
    """What a fenced attempt shows it is doing (its heartbeat detail)."""
    return f"before {effect}"[:200]


@dataclass
class ActivityContext:
    """Passed to every activity function; ``idempotency_key`` is the key to send out.

    The ``lease`` is handed in by whoever runs the attempt: the services' database lease on a
    worker, ``workflows.testing.FakeLease`` in a test.
    """

    claim: Claim
    lease: Lease
    reconciled: bool = field(default=False)
    _checkpointed_at: float = field(default_factory=time.monotonic)

    @property
    def operation_id(self) -> str:
        """The operation's identity within this installation (``wf-1/SEND.4/i1/0``): stable across
        attempts and workers, the same string in every database. Name local things with it (a
        scratch directory, a commit trailer); send ``idempotency_key`` outside."""
        return self.claim.operation_id

    @property
    def idempotency_key(self) -> str:
        """The idempotency key to send to external systems: ``<installation id>/<operation id>~<nonce>``,
        stable across attempts and workers and unique across installations (two databases
        calling one system never share a key). Fixed when the activity was scheduled: an
        activity scheduled before installations had ids sends its operation id, as it did."""
        return self.claim.idempotency_key or self.claim.operation_id

    @property
    def attempt(self) -> int:
        return self.claim.attempt

    @property
    def workflow_id(self) -> int:
        return self.claim.workflow_id

    @property
    def release(self) -> dict[str, Any] | None:
        """The workflow's behavioral release (``provider``, ``model``, ``prompt_version``,
        ``tool_versions``), which ``workflows.releases.provider_for(ctx)`` runs; None in a test
        kit without one (the current release runs)."""
        return self.claim.release

    @property
    def release_provisional(self) -> bool:
        """True when the release was recorded from the settings of a process that launched before
        any worker announced one (a shell), and no worker has run its own since."""
        return self.claim.release_provisional

    @property
    def release_policy(self) -> str:
        """What to do when this worker cannot run the workflow's release: pin, revalidate or fail."""
        return self.claim.release_policy

    @property
    def fallback_model(self) -> str:
        """The model to move to on sustained overload; "" when the workflow has none."""
        return self.claim.fallback_model

    @property
    def throttled_in_a_row(self) -> int:
        """How many attempts right before this one were throttled (429/529)."""
        return self.claim.throttled_in_a_row

    def adopt_release(self, release: dict[str, Any], *, why: str) -> None:
        """Record that the workflow now runs on ``release`` (``why``: ``worker``, this worker cannot
        run the recorded one; ``fallback``, sustained overload); raises LeaseLost when the attempt
        no longer holds its lease."""
        if not self.lease.adopt_release(self.claim, release, why):
            raise self._lease_lost(LEASE_LOST)

    @property
    def definition_version(self) -> int:
        """The version of the workflow's definition recorded at launch."""
        return self.claim.definition_version

    def heartbeat(self, detail: str = "") -> None:
        """Extend the lease; raises LeaseLost when this attempt was taken over or its work is no
        longer wanted (the workflow cancelled or failed, its goal superseded, its node left)."""
        if not self.lease.heartbeat(self.claim, detail):
            raise self._lease_lost(LEASE_LOST)

    def fence(self, effect: str) -> None:
        """Call right before each external effect (a request that changes something, a model
        call, a tool that writes): raises LeaseLost, and the effect must not be made, unless this
        attempt still holds its lease and its work is still wanted. Extends the lease as a
        heartbeat does, and shows ``effect`` as what the attempt is doing.

        An effect sent after the fence can still land after a cancel (a worker paused in between):
        send ``idempotency_key`` to a target that remembers a compensated key
        (docs/deploy-protocol.md, "tombstones"), so the late effect is refused.
        """
        if not self.lease.heartbeat(self.claim, _before(effect)):
            raise self._lease_lost(f"{LEASE_LOST}; {effect} was not made")

    def fence_of(self, effect: str) -> Fence:
        """``fence(effect)`` as a value, for what records the effect to run (``Fence``)."""
        return Fence(claim=self.claim if self.lease.fence_in_sql else None, detail=_before(effect),
                     check=lambda: self.fence(effect))

    @property
    def resume(self) -> dict[str, Any] | None:
        """The working state an earlier attempt saved with ``checkpoint``, to carry on from; None
        on a first attempt or when no attempt saved one."""
        return self.claim.checkpoint

    def checkpoint(self, state: dict[str, Any], detail: str = "", *, force: bool = False,
                   notes: Sequence[tuple[str, dict[str, Any]]] = ()) -> bool:
        """Save ``state`` (JSON, under 1 MB) for a later attempt to resume from, when
        AGENTOPS_CHECKPOINT_SECONDS have passed since this attempt started or last saved (or
        ``force``). Saving also heartbeats. True when saved; raises LeaseLost, as a heartbeat
        does, when this attempt was taken over or its work is no longer wanted.

        ``notes`` are (kind, data) events of what the attempt did since its last checkpoint (the
        tool calls of a turn, say): saved with the state in one transaction, so the history and
        the resume point never disagree; when the checkpoint is not due they are noted alone.
        """
        due = time.monotonic() - self._checkpointed_at >= settings.AGENTOPS_CHECKPOINT_SECONDS
        if not (due or force):
            for kind, data in notes:
                self.note(kind, **data)
            return False
        if not self.lease.checkpoint(self.claim, state, detail, notes):
            raise self._lease_lost(LEASE_LOST)
        self._checkpointed_at = time.monotonic()
        return True

    def note(self, kind: str, **data: Any) -> None:
        """Record an event in the workflow's history for this attempt (raises LeaseLost when fenced off)."""
        self.note_with(None, kind, **data)

    def note_with(self, also: RowWrite | None, kind: str, **data: Any) -> None:
        """``note(kind, **data)``, and the write ``also`` made whether or not the note is (the
        engine's: a model call's charge, which its ``model.called`` note records): in the note's own
        statement when the lease fences in SQL, else first and alone."""
        if also is not None and not self.lease.fence_in_sql:
            also.run()
            also = None
        if not self.lease.note(self.claim, kind, data, also=also):
            raise self._lease_lost(LEASE_LOST)

    def steering(self, *, call: int) -> list[dict[str, Any]]:
        """The steer messages (``agent steer``) model call ``call`` of this activity sends as a user
        turn: each has ``seq``, ``text``, ``sender`` and ``sent_at``; oldest first, often none. Ask
        right before each model call with that call's number (the ``call`` given to
        ``metered_complete``), and add what it returns to the conversation the activity keeps (and
        checkpoints): a later attempt that resumes at this call or before gets the same messages
        again, and no other activity gets them (docs/authoring.md, "Steering"). Raises LeaseLost
        when this attempt no longer holds its lease."""
        taken = self.lease.steering(self.claim, call)
        if taken is None:
            raise self._lease_lost(LEASE_LOST)
        return taken

    def _lease_lost(self, why: str) -> LeaseLost:
        return LeaseLost(f"Attempt {self.attempt} of {self.operation_id} {why}.", operation_id=self.operation_id)

    def faultpoint(self, point: str, **context: Any) -> None:
        faults.faultpoint(point, activity=self.claim.name, attempt=self.attempt, operation_id=self.operation_id,
                          **context)
