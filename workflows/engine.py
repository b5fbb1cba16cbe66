"""Deciding what happens next from durable state: node handlers, commands and replay.

A node handler is a deterministic function of the workflow's durable state. It asks for
steps through its ``NodeContext`` (``ctx.activity``, ``ctx.approval``, ``ctx.sleep``,
``ctx.wait_for_event``). A recorded step returns its recorded outcome; a step not yet
recorded becomes a command for the services to persist, and the handler is suspended
until the step's outcome is recorded. Nothing here touches the database, Celery or the
clock: the services load the recorded steps, call ``step`` and persist what it returns.
"""
from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from functools import cached_property
from typing import Any, ClassVar

from workflows.errors import InvalidInput, NonDeterminismError, Permanent


@dataclass(frozen=True)
class Goto:
    """Enter ``node`` next, merging ``updates`` into the workflow's durable state."""

    node: str
    updates: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class Complete:
    result: Any = None


@dataclass(frozen=True)
class Fail:
    reason: str


Decision = Goto | Complete | Fail


@dataclass(frozen=True)
class ScheduleActivity:
    operation_id: str
    name: str
    input: dict[str, Any]


@dataclass(frozen=True)
class OpenWait:
    operation_id: str
    kind: str
    expires_in_seconds: float | None
    candidate: Any = None
    candidate_hash: str = ""
    required_role: str = ""
    state_versions: dict[str, Any] = field(default_factory=dict)
    event_name: str = ""
    timeout_policy: str = "fail"


Command = ScheduleActivity | OpenWait


@dataclass(frozen=True)
class Suspended:
    """The handler needs steps that are not recorded yet; ``commands`` are the new ones."""

    commands: tuple[Command, ...]


@dataclass(frozen=True)
class RecordedActivity:
    name: str
    status: str
    result: Any
    error: str


@dataclass(frozen=True)
class RecordedWait:
    kind: str
    status: str
    decision: str
    decided_by: str
    comment: str
    payload: Any


@dataclass(frozen=True)
class WaitOutcome:
    """How a wait ended: ``status`` is satisfied or expired; approvals carry the decision."""

    status: str
    decision: str = ""
    decided_by: str = ""
    comment: str = ""
    payload: Any = None

    @property
    def approved(self) -> bool:
        return self.status == "satisfied" and self.decision == "approved"

    @property
    def expired(self) -> bool:
        return self.status == "expired"


class ActivityFailed(Exception):
    """Raised inside a handler when a step it asked for failed permanently."""

    def __init__(self, name: str, error: str) -> None:
        super().__init__(f"activity {name} failed: {error}")
        self.name = name
        self.error = error


class _Suspend(BaseException):
    """Internal: unwinds a handler that is waiting for a step (BaseException: handlers must not catch it)."""


@dataclass
class WorkflowSnapshot:
    """The durable facts a handler may read."""

    workflow_id: int
    kind: str
    node: str
    node_visit: int
    intent_version: int
    load_goal: Callable[[], str]
    params: dict[str, Any]
    state: dict[str, Any]
    release_fingerprint: str
    definition_version: int

    @cached_property
    def goal(self) -> str:
        """The current intent's goal, read when a handler first asks: most steps never do."""
        return self.load_goal()


class NodeContext:
    """What a handler sees: durable facts and recorded steps of the current node visit."""

    def __init__(
        self,
        snapshot: WorkflowSnapshot,
        activities: dict[str, RecordedActivity],
        load_waits: Callable[[], dict[str, RecordedWait]],
    ) -> None:
        self.snapshot = snapshot
        self.params = snapshot.params
        self.state = snapshot.state
        self.intent_version = snapshot.intent_version
        self.release_fingerprint = snapshot.release_fingerprint
        self._activities = activities
        self._load_waits = load_waits
        self._seq = 0
        self.commands: list[Command] = []

    @property
    def goal(self) -> str:
        return self.snapshot.goal

    @cached_property
    def _waits(self) -> dict[str, RecordedWait]:
        """The recorded waits of this node visit, read when a handler first asks for a wait."""
        return self._load_waits()

    def _next_operation_id(self) -> str:
        s = self.snapshot
        op = f"wf-{s.workflow_id}/{s.node}.{s.node_visit}/i{s.intent_version}/{self._seq}"
        self._seq += 1
        return op

    def activity(self, name: str, **input: Any) -> Any:
        """The recorded result of activity ``name``; scheduled (and suspended) when not yet recorded."""
        op = self._next_operation_id()
        recorded = self._activities.get(op)
        if recorded is None:
            self.commands.append(ScheduleActivity(operation_id=op, name=name, input=input))
            raise _Suspend
        if recorded.name != name:
            raise NonDeterminismError(
                f"Operation {op} was recorded as activity {recorded.name!r} but the handler now asks for {name!r}; "
                "branch on the definition version instead of changing a running workflow's steps.",
                operation_id=op,
            )
        if recorded.status == "succeeded":
            return recorded.result
        if recorded.status in ("failed", "cancelled"):
            raise ActivityFailed(name, recorded.error or recorded.status)
        raise _Suspend

    def _wait(self, command: OpenWait) -> WaitOutcome:
        recorded = self._waits.get(command.operation_id)
        if recorded is None:
            self.commands.append(command)
            raise _Suspend
        if recorded.kind != command.kind:
            raise NonDeterminismError(
                f"Operation {command.operation_id} was recorded as a {recorded.kind} wait, "
                f"the handler now asks for a {command.kind} wait.",
                operation_id=command.operation_id,
            )
        if recorded.status == "open":
            raise _Suspend
        return WaitOutcome(
            status=recorded.status, decision=recorded.decision, decided_by=recorded.decided_by,
            comment=recorded.comment, payload=recorded.payload,
        )

    def approval(
        self,
        *,
        candidate: Any,
        candidate_hash: str,
        role: str,
        expires_in_seconds: float,
        state_versions: dict[str, Any],
        on_timeout: str = "fail",
    ) -> WaitOutcome:
        """Wait for a person with ``role`` to approve or reject this exact candidate."""
        return self._wait(OpenWait(
            operation_id=self._next_operation_id(), kind="approval", expires_in_seconds=expires_in_seconds,
            candidate=candidate, candidate_hash=candidate_hash, required_role=role,
            state_versions=state_versions, timeout_policy=on_timeout,
        ))

    def wait_for_event(self, name: str, *, timeout_seconds: float | None = None) -> WaitOutcome:
        """Wait for a signal called ``name``; its payload is in the outcome."""
        return self._wait(OpenWait(
            operation_id=self._next_operation_id(), kind="event", expires_in_seconds=timeout_seconds,
            event_name=name,
        ))

    def sleep(self, seconds: float) -> None:
        """Sleep durably: a timer row with its wake time stored, fired by beat."""
        self._wait(OpenWait(operation_id=self._next_operation_id(), kind="timer", expires_in_seconds=seconds))


Handler = Callable[[NodeContext], Decision]


class WorkflowDefinition:
    """Base of workflow definitions: a kind, nodes and one handler per node (``node.lower()``)."""

    kind: ClassVar[str]
    version: ClassVar[int] = 1
    nodes: ClassVar[tuple[str, ...]]
    start_node: ClassVar[str]
    revalidate_node: ClassVar[str]
    # Where a stagnation policy of "replan" sends the workflow; empty: the definition cannot re-plan.
    adapt_node: ClassVar[str] = ""
    # Time limit applied when the launch gives none; None: no limit.
    default_max_hours: ClassVar[float | None] = None

    def validate_params(self, params: dict[str, Any]) -> dict[str, Any]:
        """Check launch parameters; raise InvalidInput with a field-level message."""
        if params:
            raise InvalidInput(f"Workflow kind {self.kind!r} takes no parameters; got {sorted(params)}.")
        return params

    def handler(self, node: str) -> Handler:
        if node not in self.nodes:
            raise Permanent(f"Node {node!r} is not a node of {self.kind!r}; nodes: {', '.join(self.nodes)}.")
        handler: Handler = getattr(self, node.lower())
        return handler


def step(definition: WorkflowDefinition, ctx: NodeContext) -> Decision | Suspended:
    """Run the current node's handler once against recorded steps."""
    try:
        decision = definition.handler(ctx.snapshot.node)(ctx)
    except _Suspend:
        return Suspended(commands=tuple(ctx.commands))
    if isinstance(decision, Goto) and decision.node not in definition.nodes:
        raise Permanent(f"Handler {ctx.snapshot.node} sent the workflow to unknown node {decision.node!r}.")
    if not isinstance(decision, (Goto, Complete, Fail)):
        raise Permanent(f"Handler {ctx.snapshot.node} returned {decision!r}, not Goto, Complete or Fail.")
    return decision
