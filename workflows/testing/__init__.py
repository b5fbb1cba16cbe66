"""The test kit: test a kind without a database or a worker.

- ``registered(*definitions_and_activities)``: register them for one test, restore the registry after.
- ``WorkflowRun``: drive a definition through its nodes in memory, answering each step it asks
  for (an activity's result or failure, a signal, an approval, a timer) as the durable plane
  would, and keep the history of recorded steps.
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

from workflows import codec, commands, engine, registry
from workflows.activity_context import ActivityContext
from workflows.errors import NonDeterminismError
from workflows.leases import Claim, LeaseLost
from workflows.registry import ActivityType
from workflows.testing.model import FakeLedger, FakeModel, Reply, Throttle, cut_off

if TYPE_CHECKING:
    from workflows.sql import RowWrite

Step = commands.Step  # one recorded step of a run's history, as ``WorkflowRun.history`` lists them

__all__ = [
    "ActivityEnvironment", "Divergence", "FakeLease", "FakeLedger", "FakeModel", "LeaseLost", "Reply", "Throttle",
    "WorkflowRun", "cut_off", "deployed", "registered", "replay",
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


class WorkflowRun:
    """A workflow of ``definition`` advanced in memory, step by step.

    After each answer the run advances until the definition needs something not yet
    answered: ``pending`` lists the activities it waits for, ``open_waits`` its waits;
    ``status`` is running, waiting, paused (``resume``), completed or failed, with ``result`` or ``reason``.
    """

    def __init__(
        self, definition: type[engine.WorkflowDefinition], *, goal: str = "", params: dict[str, Any] | None = None,
        workflow_id: int = 1, release_fingerprint: str = "test-release", definition_version: int | None = None,
        recorded: list[Step] | None = None,
    ) -> None:
        self.definition = definition()
        self.goal = goal
        self.params = json.loads(json.dumps(self.definition.validate_params(dict(params or {}))))
        self.workflow_id = workflow_id
        self.release_fingerprint = release_fingerprint
        self.definition_version = definition_version or definition.version
        self.node, self.node_visit = definition.start_node, 1
        self.state: dict[str, Any] = {}
        self.status, self.result, self.reason = "running", None, ""
        self.path: list[str] = [self.node]
        self.history: list[Step] = []
        self.pending: dict[str, engine.ScheduleActivity] = {}
        self.open_waits: dict[str, engine.OpenWait] = {}
        self.children: dict[str, engine.StartChild] = {}  # started and not ended, by operation id
        self._recorded = {step.operation_id: step for step in recorded or []}
        self.advance()

    # Answers -------------------------------------------------------------------------------

    def complete(self, activity: ActivityType[Any, Any], result: Any) -> None:
        """Record ``result`` for the pending call of ``activity`` and advance."""
        command = self._pending(activity)
        self._record(Step(command.operation_id, self.node, "activity", activity.name, "succeeded",
                          result=_stored(codec.to_json(result))))

    def fail(self, activity: ActivityType[Any, Any], error: str = "failed in a test") -> None:
        """Record that the pending call of ``activity`` failed after all its attempts, and advance."""
        command = self._pending(activity)
        self._record(Step(command.operation_id, self.node, "activity", activity.name, "failed", error=error))

    def run(self, activity: ActivityType[Any, Any], env: ActivityEnvironment | None = None) -> Any:
        """Run the pending call of ``activity`` for real (in an ActivityEnvironment), record its
        result and advance; returns the result."""
        command = self._pending(activity)
        env = env or ActivityEnvironment(workflow_id=self.workflow_id)
        env.operation_id = command.operation_id
        result = env.run(activity, activity.decode_input(command.input))
        self._record(Step(command.operation_id, self.node, "activity", activity.name, "succeeded",
                          result=_stored(codec.to_json(result))))
        return result

    def signal(self, name: str, payload: Any = None) -> None:
        """Deliver a signal to the open event wait for ``name``, or to the open ``ctx.wait_first``
        that races one (the signal wins it: its children are cancelled)."""
        race = self._open_first(lambda w: w.event_name == name)
        if race is not None:
            self._first_won(race, {"won": "signal", "signal": name, "payload": _stored(payload)})
            return
        op = self._open_wait("event", name)
        self._record(Step(op, self.node, "event", name, "satisfied", result=_stored(payload)))

    def approve(self, *, by: str = "approver", comment: str = "") -> None:
        op = self._open_wait("approval")
        self._record(Step(op, self.node, "approval", "", "satisfied", decision="approved", decided_by=by,
                          comment=comment))

    def reject(self, *, by: str = "approver", comment: str = "") -> None:
        op = self._open_wait("approval")
        self._record(Step(op, self.node, "approval", "", "satisfied", decision="rejected", decided_by=by,
                          comment=comment))

    def expire(self) -> None:
        """Let the open approval or event wait run out."""
        op = next((op for op, w in self.open_waits.items() if w.kind in ("approval", "event")), None)
        if op is None:
            raise AssertionError(f"Workflow is at {self.node} with no approval or event wait open.")
        self._record(Step(op, self.node, self.open_waits[op].kind, self.open_waits[op].event_name, "expired"))

    def fire_timer(self) -> None:
        """Let the open ``ctx.sleep`` end, or the timeout of the open ``ctx.wait_first`` pass (the
        timer wins it: its children are cancelled)."""
        race = self._open_first(lambda w: w.expires_in_seconds is not None)
        if race is not None:
            self._first_won(race, {"won": "timer"})
            return
        op = self._open_wait("timer")
        self._record(Step(op, self.node, "timer", "", "satisfied"))

    def finish_child(self, kind: str, *, status: str = "completed", result: Any = None, reason: str = "",
                     workflow_id: int = 0) -> None:
        """End the oldest running child of ``kind`` (``ctx.child``) with ``status`` (completed,
        failed or cancelled) and ``result`` or ``reason``, as its workflow would, and advance."""
        op = next((op for op, c in self.children.items() if c.child_kind == kind), None)
        if op is None:
            running = ", ".join(c.child_kind for c in self.children.values()) or "none"
            raise AssertionError(f"Workflow is at {self.node} ({self.status}) with no running child of kind "
                                 f"{kind!r}; running children: {running}.")
        payload = {"workflow_id": workflow_id or 1000 + len(self.history), "status": status,
                   "result": _stored(codec.to_json(result)) if status == "completed" else None, "reason": reason}
        race = self._open_first(lambda w: op in w.children)
        if race is not None:  # its end wins the race: the others are cancelled, a signal stays queued
            self._first_won(race, {"won": "child", "operation_id": op, "kind": kind, "child": payload},
                            ended=[Step(op, self.node, "child", kind, "satisfied", result=payload)])
            return
        self._record(Step(op, self.node, "child", kind, "satisfied", result=payload))

    def resume(self) -> None:
        """Resume a workflow its definition paused for a person (``manage.py agent resume``)."""
        if self.status != "paused":
            raise AssertionError(f"Workflow is {self.status} at {self.node}, not paused.")
        self.status, self.reason = "running", ""
        self.advance()

    # The engine loop -----------------------------------------------------------------------

    def advance(self) -> None:
        """Run handlers until the definition needs an answer, completes or fails, as the services do;
        except that a NonDeterminismError propagates (the services fail the workflow with it), so a
        test sees it at once."""
        for _ in range(100):
            if self.status not in ("running", "waiting"):
                return
            ctx: engine.NodeContext[Any] = engine.NodeContext(
                self._snapshot(), self._visit_activities(), self._visit_waits)
            decision = engine.decide(self.definition, ctx)
            if isinstance(decision, engine.Suspended):
                if self._apply(decision.commands):
                    continue
                self.status = "waiting" if (self.open_waits or self.children) and not self.pending else "running"
                return
            if isinstance(decision, engine.Goto):
                self.state = _stored({**self.state, **decision.updates})
                self.node, self.node_visit = decision.node, self.node_visit + 1
                self.path.append(self.node)
                self.pending.clear()
                self.open_waits.clear()
                self.children.clear()  # leaving the visit cancels the children it started
                if decision.pause:
                    self.status, self.reason = "paused", decision.pause
                    return
                continue
            if isinstance(decision, engine.Complete):
                self.status, self.result = "completed", _stored(decision.result)
            else:
                self.status, self.reason = "failed", decision.reason
            return
        raise AssertionError(f"More than 100 node changes without waiting; the definition loops ({self.path[-5:]}).")

    def _apply(self, commands: tuple[engine.Command, ...]) -> bool:
        """Take new steps; True when a recorded answer (replay) lets the handler run again at once."""
        for command in commands:
            step = self._recorded.pop(command.operation_id, None)
            if step is not None:
                self.history.append(step)
                return True
            if isinstance(command, engine.StartChild):
                self.children[command.operation_id] = command
            elif isinstance(command, engine.ScheduleActivity):
                self.pending[command.operation_id] = command
            else:
                self.open_waits[command.operation_id] = command
        # Starting children does not stop the handler: it runs again and finds them started.
        return bool(commands) and isinstance(commands[-1], engine.StartChild)

    def _record(self, step: Step) -> None:
        self._ended(step)
        self.status = "running"
        self.advance()

    def _ended(self, step: Step) -> None:
        self.pending.pop(step.operation_id, None)
        self.open_waits.pop(step.operation_id, None)
        self.children.pop(step.operation_id, None)
        self.history.append(step)

    def _open_first(self, matches: Any) -> engine.OpenWait | None:
        return next((w for w in self.open_waits.values() if w.kind == "first" and matches(w)), None)

    def _first_won(self, race: engine.OpenWait, payload: dict[str, Any], ended: list[Step] | None = None) -> None:
        """Record ``race`` won as ``payload`` says (after the ``ended`` steps), with its losing
        children ended cancelled, as their workflows would end once cancelled, and advance. The
        steps go in the order the handler asked for them, as a replay records them."""
        won, steps = payload["won"], list(ended or [])
        for op in race.children:
            child = self.children.get(op)
            if child is not None and op != payload.get("operation_id"):
                why = f"parent workflow {self.workflow_id} lost first-of wait {race.operation_id} to the {won}"
                steps.append(Step(op, self.node, "child", child.child_kind, "satisfied", result={
                    "workflow_id": 1000 + len(self.history) + len(steps), "status": "cancelled", "result": None,
                    "reason": why}))
        for step in sorted(steps, key=lambda s: s.seq):
            self._ended(step)
        self._record(Step(race.operation_id, self.node, "first", race.event_name, "satisfied", result=payload))

    def _snapshot(self) -> engine.WorkflowSnapshot:
        return engine.WorkflowSnapshot(
            workflow_id=self.workflow_id, kind=self.definition.kind, node=self.node, node_visit=self.node_visit,
            intent_version=1, load_goal=lambda: self.goal, params=dict(self.params), state=dict(self.state),
            release_fingerprint=self.release_fingerprint, definition_version=self.definition_version,
        )

    def _visit_prefix(self) -> str:
        return f"wf-{self.workflow_id}/{self.node}.{self.node_visit}/"

    def _visit_activities(self) -> dict[str, engine.RecordedActivity]:
        return {
            s.operation_id: engine.RecordedActivity(name=s.name, status=s.status, result=s.result, error=s.error)
            for s in self.history if s.kind == "activity" and s.operation_id.startswith(self._visit_prefix())
        }

    def _visit_waits(self) -> dict[str, engine.RecordedWait]:
        running = {op: engine.RecordedWait(kind="child", status="open", decision="", decided_by="", comment="",
                                           payload=None, name=c.child_kind) for op, c in self.children.items()}
        return running | {
            s.operation_id: engine.RecordedWait(kind=s.kind, status=s.status, decision=s.decision,
                                                decided_by=s.decided_by, comment=s.comment, payload=s.result,
                                                name=s.name)
            for s in self.history if s.kind != "activity" and s.operation_id.startswith(self._visit_prefix())
        }

    def _pending(self, activity: ActivityType[Any, Any]) -> engine.ScheduleActivity:
        for command in self.pending.values():
            if command.name == activity.name:
                return command
        asked = ", ".join(c.name for c in self.pending.values()) or "nothing"
        raise AssertionError(f"Workflow is at {self.node} ({self.status}) and waits for {asked}, "
                             f"not for activity {activity.name!r}.")

    def _open_wait(self, kind: str, event_name: str = "") -> str:
        for op, wait in self.open_waits.items():
            if wait.kind == kind and (not event_name or wait.event_name == event_name):
                return op
        opened = ", ".join(f"{w.kind} {w.event_name}".strip() for w in self.open_waits.values()) or "none"
        raise AssertionError(f"Workflow is at {self.node} ({self.status}) with no open {kind} wait "
                             f"{event_name}; open waits: {opened}.")


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


def _stored(value: Any) -> Any:
    """``value`` as the database would give it back: through JSON."""
    return json.loads(json.dumps(value))
