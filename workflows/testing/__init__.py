"""The test kit: test a kind without a database or a worker.

- ``registered(*definitions_and_activities)``: register them for one test, restore the registry after.
- ``WorkflowRun`` (``workflows.testing.memory``): drive a definition through its nodes in memory,
  answering each step it asks for (an activity's result or failure, a signal, an approval, a
  child's end) as the durable plane would, through its lifecycle (``workflows.testing.lifecycle``:
  a cancel and its compensations, a new goal, children, timers on a virtual clock), and keep the
  history of recorded steps, the events and the commitments.
- ``replay(definition, history)``: run a recorded history against a definition and name the
  first place where it no longer replays (a changed step, a step no longer asked for).
- ``ActivityEnvironment``: run an activity with a fake lease that records heartbeats,
  checkpoints and notes, and can be cancelled (the heartbeat then raises ``LeaseLost``); with
  ``model=FakeModel([...])`` its model calls (``metered_complete``) are answered by the fake and
  metered in a ``FakeLedger`` (``workflows.testing.model``): no database, no provider.

The same engine code runs here as on a worker (``workflows.engine.step``); only the storage
is a dictionary. Process-level behaviour (leases running out, retries, doorbells) needs the
real services and processes: ``workflows.testing.cluster`` runs real workers and beat.
"""
from __future__ import annotations

import json
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, TypeVar

from workflows import commands, engine, registry
from workflows.activity_context import ActivityContext
from workflows.errors import NonDeterminismError
from workflows.leases import Claim, LeaseLost
from workflows.registry import ActivityType
from workflows.testing.memory import Child, Commitment, Event, WorkflowRun
from workflows.testing.model import FakeLedger, FakeModel, Reply, Throttle, cut_off

if TYPE_CHECKING:
    from workflows.sql import RowWrite

Step = commands.Step  # one recorded step of a run's history, as ``WorkflowRun.history`` lists them

__all__ = [
    "ActivityEnvironment", "Child", "Commitment", "Divergence", "Event", "FakeLease", "FakeLedger", "FakeModel",
    "LeaseLost", "Reply", "Throttle", "WorkflowRun", "cut_off", "deployed", "registered", "replay",
]

I = TypeVar("I")  # noqa: E741
O = TypeVar("O")  # noqa: E741


@contextmanager
def registered(*items: type[engine.WorkflowDefinition] | ActivityType[Any, Any]) -> Iterator[None]:
    """Register definitions and activities for the block; afterwards the registry is as it was
    (also rid of anything imported meanwhile). Definitions are checked as at start-up."""
    saved = registry.snapshot()
    try:
        for item in items:
            if isinstance(item, ActivityType):
                registry.register_activity(item)
            else:
                registry.register_definition(item)
        yield
    finally:
        registry.restore(saved)


@contextmanager
def deployed(definition: type[engine.WorkflowDefinition]) -> Iterator[None]:
    """The registry as if ``definition`` had been deployed in place of the registered definition of
    its kind (a new version of it, say), for the block: test what workflows in flight do with it."""
    problems = registry.definition_problems(definition)
    if problems:
        raise registry.DefinitionError(f"{definition.__qualname__} cannot be deployed: " + "; ".join(problems))
    saved = registry.snapshot()
    registry.restore(({**saved[0], definition.kind: definition}, saved[1]))
    try:
        yield
    finally:
        registry.restore(saved)


@dataclass
class FakeLease:
    """A lease that always holds until ``cancel()``; it keeps what the activity reported."""

    heartbeats: list[str] = field(default_factory=list)
    checkpoints: list[dict[str, Any]] = field(default_factory=list)
    notes: list[tuple[str, dict[str, Any]]] = field(default_factory=list)
    releases: list[dict[str, Any]] = field(default_factory=list)
    cancelled: bool = False
    # Steer messages (texts) not taken yet: the next ``ctx.steering`` takes them all, oldest first;
    # ``steered`` keeps (call, messages) of each take that had some.
    steer: list[str] = field(default_factory=list)
    steered: list[tuple[int, list[dict[str, Any]]]] = field(default_factory=list)

    @property
    def fence_in_sql(self) -> bool:
        return False

    def cancel(self) -> None:
        """From now on every heartbeat, checkpoint and note reports the lease lost."""
        self.cancelled = True

    def heartbeat(self, claim: Claim, detail: str) -> bool:
        if self.cancelled:
            return False
        self.heartbeats.append(detail)
        return True

    def checkpoint(self, claim: Claim, state: dict[str, Any], detail: str,
                   notes: Sequence[tuple[str, dict[str, Any]]] = ()) -> bool:
        if self.cancelled:
            return False
        self.notes.extend((kind, json.loads(json.dumps(data))) for kind, data in notes)
        self.checkpoints.append(json.loads(json.dumps(state)))  # stored as JSON, as the database would
        return True

    def note(self, claim: Claim, kind: str, data: dict[str, Any], also: RowWrite | None = None) -> bool:
        if also is not None:  # the context gives one only to a lease that fences in SQL; made as asked
            also.run()
        if self.cancelled:
            return False
        self.notes.append((kind, json.loads(json.dumps(data))))
        return True

    def adopt_release(self, claim: Claim, release: dict[str, Any], why: str) -> bool:
        if self.cancelled:
            return False
        self.releases.append({**release, "why": why})
        return True

    def steering(self, claim: Claim, call: int) -> list[dict[str, Any]] | None:
        if self.cancelled:
            return None
        first = sum(len(taken) for _, taken in self.steered) + 1
        taken = [{"seq": first + n, "text": text, "sender": "tester", "sent_at": "2026-01-01T00:00:00+00:00"}
                 for n, text in enumerate(self.steer)]
        self.steer = []
        if taken:
            self.steered.append((call, taken))
        return taken


@dataclass
class ActivityEnvironment:
    """Run an activity as a worker would (input and result through JSON) with a ``FakeLease``.

    ``resume`` is the checkpoint an earlier attempt saved; ``previous_attempt_lost`` makes the
    activity's ``reconcile`` run first, as after a crash. ``idempotency_key`` is what
    ``ctx.idempotency_key`` gives (empty: the operation id). ``model`` answers the activity's
    model calls (``workflows.metering.metered_complete``), metered in ``ledger``; without a model,
    a model call reaches the configured provider and the database ledger, as on a worker.
    """

    workflow_id: int = 1
    operation_id: str = "wf-1/TEST.1/i1/0"
    idempotency_key: str = ""
    attempt: int = 1
    resume: dict[str, Any] | None = None
    previous_attempt_lost: bool = False
    definition_version: int = 1
    lease: FakeLease = field(default_factory=FakeLease)
    model: FakeModel | None = None
    ledger: FakeLedger = field(default_factory=FakeLedger)

    def run(self, activity: ActivityType[I, O], input: I) -> O:
        claim = Claim(
            activity_id=0, workflow_id=self.workflow_id, operation_id=self.operation_id, name=activity.name,
            attempt=self.attempt, lease_token="test-lease", input=activity.encode_input(input),
            previous_attempt_lost=self.previous_attempt_lost, checkpoint=self.resume,
            definition_version=self.definition_version, idempotency_key=self.idempotency_key,
        )
        ctx = ActivityContext(claim=claim, lease=self.lease)
        with self._model_calls():
            found = activity.reconcile_json(ctx, claim.input) if self.previous_attempt_lost else None
            result = found if found is not None else activity.execute(ctx, claim.input)
        output: O = activity.decode_output(json.loads(json.dumps(result)))
        return output


    @contextmanager
    def _model_calls(self) -> Iterator[None]:
        if self.model is None:
            yield
            return
        from workflows.metering import answered_by

        with answered_by(self.model, self.ledger):
            yield


@dataclass(frozen=True)
class Divergence:
    """Where a definition no longer replays a recorded history."""

    node: str
    operation_id: str
    reason: str

    def __str__(self) -> str:
        return f"at node {self.node}, step {self.operation_id}: {self.reason}"


def replay(
    definition: type[engine.WorkflowDefinition], history: list[Step], *, goal: str = "",
    params: dict[str, Any] | None = None, workflow_id: int = 1, definition_version: int | None = None,
) -> Divergence | None:
    """Replay ``history`` (e.g. ``run.history`` of an earlier run, or one loaded from fixtures)
    against ``definition``; None when every recorded step is asked for again, in order, with
    the same name, else the first divergence."""
    try:
        run = WorkflowRun(definition, goal=goal, params=params, workflow_id=workflow_id, recorded=history,
                          definition_version=definition_version)
    except NonDeterminismError as exc:
        op = str(getattr(exc, "operation_id", ""))
        return Divergence(node=_node_of(op), operation_id=op, reason=str(exc))
    if run.history != history[: len(run.history)]:
        first = next(i for i, (a, b) in enumerate(zip(run.history, history, strict=False)) if a != b)
        step = history[first]
        return Divergence(node=step.node, operation_id=step.operation_id,
                          reason=f"the definition now takes step {run.history[first].operation_id} here")
    if len(run.history) < len(history):
        step = history[len(run.history)]
        return Divergence(node=step.node, operation_id=step.operation_id,
                          reason=f"recorded {step.kind} {step.name!r} ({step.status}) is no longer asked for; "
                                 f"the definition is now at {run.node} ({run.status})")
    return None


def _node_of(operation_id: str) -> str:
    parts = operation_id.split("/")
    return parts[1].rsplit(".", 1)[0] if len(parts) > 1 else ""
