"""Deciding what happens next from durable state: node handlers, commands and replay.

A node handler is a deterministic function of the workflow's durable state, marked with
``@node("NAME")`` on a ``WorkflowDefinition``. It asks for steps through its ``NodeContext``
(``ctx.activity(ref, input)``, ``ctx.approval``, ``ctx.sleep``, ``ctx.wait_for_event``,
``ctx.child``, ``ctx.wait_children`` and ``ctx.wait_first``).
A recorded step returns its recorded outcome; a step not yet recorded becomes a command
for the services to persist, and the handler is suspended until the step's outcome is
recorded. Nothing here touches the database, Celery or the
clock: the services load the recorded steps, call ``step`` and persist what it returns. The
values handlers and services exchange (decisions, commands, recorded steps, outcomes) are
``workflows.commands``; this module names them too, as kinds and services know them.
"""
from __future__ import annotations

import hashlib
import inspect
import json
import typing
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from decimal import Decimal
from functools import cached_property
from typing import Any, ClassVar, Generic, TypeVar

from workflows import codec
from workflows.commands import (
    ActivityRef,
    ChildHandle,
    ChildOutcome,
    Command,
    Complete,
    Decision,
    Fail,
    FirstOutcome,
    Goto,
    OpenWait,
    RecordedActivity,
    RecordedWait,
    ScheduleActivity,
    StartChild,
    Suspended,
    WaitOutcome,
    child_outcome_of,
    first_outcome_of,
)
from workflows.errors import InvalidDecision, InvalidInput, NonDeterminismError, Permanent
from workflows.params import LaunchParams, params_validated
from workflows.presentation import EMPTY_QUERY, AdminPanel, CandidateView, candidate_as_json

S = TypeVar("S", bound=Mapping[str, Any])
O = TypeVar("O")  # noqa: E741  (an activity's result type)


class ActivityFailed(Exception):
    """Raised inside a handler when a step it asked for failed permanently."""

    def __init__(self, name: str, error: str) -> None:
        super().__init__(f"activity {name} failed: {error}")
        self.name = name
        self.error = error


class _Suspend(BaseException):
    """Internal: unwinds a handler that is waiting for a step (BaseException: handlers must not catch it)."""


class _SuspendOnChildren(_Suspend):
    """Internal: the handler waits for children it started (``ctx.wait_children``)."""


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


class NodeContext(Generic[S]):
    """What a handler sees: durable facts and recorded steps of the current node visit.

    ``NodeContext[MyState]`` types ``ctx.state`` with the definition's TypedDict of state.
    """

    def __init__(
        self,
        snapshot: WorkflowSnapshot,
        activities: dict[str, RecordedActivity],
        load_waits: Callable[[], dict[str, RecordedWait]],
    ) -> None:
        self.snapshot = snapshot
        self.params = snapshot.params
        self.state: S = snapshot.state  # type: ignore[assignment]
        self.intent_version = snapshot.intent_version
        self.release_fingerprint = snapshot.release_fingerprint
        self.definition_version = snapshot.definition_version
        self._activities = activities
        self._load_waits = load_waits
        self._seq = 0
        self.commands: list[Command] = []
        self.asked: list[str] = []  # the operation ids the handler asked for, in order (replay checks read it)

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
        self.asked.append(op)
        return op

    def activity(self, activity: ActivityRef[O], input: Any) -> O:
        """The recorded result of ``activity`` run on ``input`` (its declared input type); scheduled,
        and the handler suspended, when not yet recorded."""
        if not callable(getattr(activity, "encode_input", None)):
            raise TypeError(f"ctx.activity takes an activity registered with @activity, not {activity!r}; "
                            "import the function and pass it.")
        name = activity.name
        op = self._next_operation_id()
        recorded = self._activities.get(op)
        if recorded is None:
            self.commands.append(ScheduleActivity(operation_id=op, name=name, input=activity.encode_input(input)))
            raise _Suspend
        if recorded.name != name:
            raise NonDeterminismError(
                f"Operation {op} was recorded as activity {recorded.name!r} but the handler now asks for {name!r}; "
                "branch on the definition version instead of changing a running workflow's steps.",
                operation_id=op,
            )
        if recorded.status == "succeeded":
            result: O = activity.decode_output(recorded.result)
            return result
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
        role: str,
        expires_in_seconds: float,
        candidate_hash: str = "",
        state_versions: dict[str, Any] | None = None,
        on_timeout: str = "fail",
    ) -> WaitOutcome:
        """Wait for a person with ``role`` to approve or reject this exact candidate.

        ``candidate_hash`` defaults to ``candidate_hash(candidate)`` (SHA-256 of its canonical
        JSON): a decision names it, so nobody approves a candidate they were not shown.
        ``state_versions`` records what the candidate was built on (shown to approvers and in
        the history); by default the intent version. ``on_timeout`` is ``"fail"`` (an expiry is
        final: a release change never re-routes the workflow past it) or ``"continue"`` (the
        handler goes on from ``.expired``, and a release change may rebuild the candidate).
        """
        if on_timeout not in TIMEOUT_POLICIES:
            raise InvalidDecision(f"ctx.approval(on_timeout={on_timeout!r}) must be one of "
                                  f"{', '.join(TIMEOUT_POLICIES)}.")
        candidate_json = codec.to_json(candidate)
        return self._wait(OpenWait(
            operation_id=self._next_operation_id(), kind="approval", expires_in_seconds=expires_in_seconds,
            candidate=candidate_json, candidate_hash=candidate_hash or hash_of_candidate(candidate_json),
            required_role=role, timeout_policy=on_timeout,
            state_versions=codec.to_json(state_versions) if state_versions is not None
            else {"intent_version": self.intent_version},
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

    def child(self, kind: str, goal: str, params: Mapping[str, Any] | None = None, *,
              budget: Decimal | str | int | None = None) -> ChildHandle:
        """Start a child workflow of ``kind`` with ``goal`` and ``params`` (validated as a launch's),
        once: the step's operation id is the child's identity, so a replay or a redelivered
        doorbell finds the child it started. Does not wait: ``ctx.wait_children(handle, ...)``
        does. ``budget`` (USD) is reserved from this workflow's total budget for the child's whole
        run (the child cannot spend more); None gives it what remains of this workflow's total
        budget (no limit when this workflow has none). A child belongs to the node visit that
        started it: leaving the visit, a new goal, a cancel or a failure cancels it."""
        op = self._next_operation_id()
        recorded = self._waits.get(op)
        if recorded is None:
            usd = None if budget is None else str(Decimal(str(budget)))
            self.commands.append(StartChild(operation_id=op, child_kind=kind, goal=goal,
                                            params=codec.to_json(dict(params or {})), budget_usd=usd))
            return ChildHandle(operation_id=op, kind=kind)
        if recorded.kind != "child" or recorded.name != kind:
            what = f"a child of kind {recorded.name!r}" if recorded.kind == "child" else f"a {recorded.kind} wait"
            raise NonDeterminismError(
                f"Operation {op} was recorded as {what}, the handler now starts a child of kind {kind!r}; "
                "branch on the definition version instead of changing a running workflow's steps.",
                operation_id=op,
            )
        return ChildHandle(operation_id=op, kind=kind)

    def wait_children(self, *handles: ChildHandle) -> tuple[ChildOutcome, ...]:
        """Wait until every child of ``handles`` has ended (durably: the workflow waits, as at a
        wait); their outcomes in the order given. Children run in parallel whatever the order."""
        started = {c.operation_id for c in self.commands if isinstance(c, StartChild)}
        outcomes = []
        for handle in handles:
            self._check_own_visit(handle)
            recorded = None if handle.operation_id in started else self._waits.get(handle.operation_id)
            if recorded is None or recorded.status == "open":
                raise _SuspendOnChildren
            outcomes.append(child_outcome_of(recorded.payload, handle.kind, recorded.status))
        return tuple(outcomes)

    def wait_first(self, *, signal: str = "", children: Sequence[ChildHandle] = (),
                   timeout_seconds: float | None = None) -> FirstOutcome:
        """Wait for whichever comes first: a signal called ``signal``, the end of one of
        ``children`` (started by this node visit), or ``timeout_seconds`` passing; which one it
        was is decided once, under the workflow's row lock, and recorded on the wait, so a replay
        returns the same. The losers are closed: the children that did not win are cancelled
        (their effects undone), the timer is ignored, and a signal that did not win stays queued
        for the next wait of its name."""
        if not signal and not children and timeout_seconds is None:
            raise InvalidDecision(f"Handler {self.snapshot.node} calls ctx.wait_first() with nothing to wait for; "
                                  "pass signal=, children= or timeout_seconds=.")
        if timeout_seconds is not None and timeout_seconds <= 0:
            raise InvalidDecision(f"ctx.wait_first(timeout_seconds={timeout_seconds!r}) must be positive.")
        for handle in children:
            self._check_own_visit(handle)
        return self._first(OpenWait(
            operation_id=self._next_operation_id(), kind="first", expires_in_seconds=timeout_seconds,
            event_name=signal, children=tuple(h.operation_id for h in children),
        ))

    def _first(self, command: OpenWait) -> FirstOutcome:
        recorded = self._waits.get(command.operation_id)
        if recorded is None:
            self.commands.append(command)
            raise _Suspend
        if recorded.kind != command.kind or recorded.name != command.event_name:
            what = f"a first-of wait for {recorded.name!r}" if recorded.kind == "first" else f"a {recorded.kind} wait"
            raise NonDeterminismError(
                f"Operation {command.operation_id} was recorded as {what}, the handler now asks for a first-of wait "
                f"for {command.event_name!r}; branch on the definition version instead of changing a running "
                "workflow's steps.",
                operation_id=command.operation_id,
            )
        if recorded.status != "satisfied":
            raise _Suspend
        return first_outcome_of(recorded.payload)

    def _check_own_visit(self, handle: ChildHandle) -> None:
        s = self.snapshot
        if not handle.operation_id.startswith(f"wf-{s.workflow_id}/{s.node}.{s.node_visit}/"):
            raise InvalidDecision(
                f"Handler {s.node} waits for child {handle.operation_id}, which another node visit started; a "
                "child belongs to the visit that started it (leaving the visit cancelled it). Start and wait for "
                "children in the same handler.")


TIMEOUT_POLICIES = ("fail", "continue")


def hash_of_candidate(candidate: Any) -> str:
    """SHA-256 over the canonical JSON of a candidate (keys sorted, no spaces): what
    ``ctx.approval`` binds a wait to when no ``candidate_hash`` is given, and what an approver
    passes (``agent approve --candidate-hash``; ``agent show`` prints it)."""
    text = json.dumps(codec.to_json(candidate), sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(text.encode()).hexdigest()


Handler = Callable[[NodeContext[Any]], Decision]
F = TypeVar("F", bound=Callable[..., Decision])
_NODE_ATTR = "__agentops_node__"


def node(name: str) -> Callable[[F], F]:
    """Mark a method of a ``WorkflowDefinition`` as the handler of node ``name``."""

    def mark(fn: F) -> F:
        setattr(fn, _NODE_ATTR, name)
        return fn

    return mark


class WorkflowDefinition:
    """Base of workflow definitions: a kind, and one ``@node("NAME")`` handler per node.

    The nodes are the marked methods, in the order the class declares them.
    """

    kind: ClassVar[str]
    version: ClassVar[int] = 1
    nodes: ClassVar[tuple[str, ...]] = ()
    start_node: ClassVar[str]
    revalidate_node: ClassVar[str]
    # Where a stagnation policy of "replan" sends the workflow; empty: the definition cannot re-plan.
    adapt_node: ClassVar[str] = ""
    # Time limit applied when the launch gives none; None: no limit.
    default_max_hours: ClassVar[float | None] = None
    # Release policy applied when the launch gives none: "revalidate", "pin" or "fail"
    # (docs/authoring.md, "Release changes").
    default_release_policy: ClassVar[str] = "revalidate"
    # The launch parameters, declared once (workflows.params): the types, ranges, defaults and
    # descriptions that validate a launch, print `agent launch --help` and give the JSON schema.
    # None: the kind takes no parameters.
    launch_params: ClassVar[type[LaunchParams] | None] = None
    # Whether the kind's model calls read steer messages (`agent steer`): its activities call
    # ``ctx.steering(call=…)`` (or ``agentops.steering.steered``) before each model call; a steer to
    # a kind that does not is refused (docs/authoring.md, "Steering").
    reads_steering: ClassVar[bool] = False
    # Why a workflow of this kind cannot be forked (`agent fork`), for people; empty: it can. A kind
    # whose state names something outside the database that a fork would share with the original
    # (a workspace on disk) says so here.
    fork_refusal: ClassVar[str] = ""
    # The schedules that launch this kind, declared in code (``agentops.kind.Schedule`` values, kept
    # in step with the database by the schedules feature; docs/authoring.md, "Schedules").
    schedules: ClassVar[tuple[Any, ...]] = ()

    _handlers: ClassVar[dict[str, str]] = {}

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        handlers: dict[str, str] = {}
        for klass in reversed(cls.__mro__):
            for attr, value in vars(klass).items():
                name = getattr(value, _NODE_ATTR, None)
                if name is None:
                    continue
                if name in handlers and handlers[name] != attr:
                    raise TypeError(f"{cls.__qualname__}: node {name!r} has two handlers, {handlers[name]} and {attr}.")
                handlers[name] = attr
        cls._handlers = handlers
        cls.nodes = tuple(handlers)

    def validate_params(self, params: dict[str, Any]) -> dict[str, Any]:
        """Check launch parameters against ``launch_params`` (types, ranges, defaults) and return
        them with the defaults filled in; raise InvalidInput with a field-level message. A kind
        adds what a type cannot say (a path that must be a git repository) by overriding this and
        calling it first. Everything a later node stores from them must be checked here, so bad
        input fails at launch."""
        if self.launch_params is None:
            if params:
                raise InvalidInput(f"Workflow kind {self.kind!r} takes no parameters; got {sorted(params)}.")
            return params
        return params_validated(self.kind, self.launch_params, params)

    # Presentation hooks: read-only, never called while advancing (see workflows.presentation).

    def describe_candidate(self, candidate: Any) -> CandidateView:
        """How the approval queue shows a candidate this kind asks people to approve."""
        return candidate_as_json(candidate)

    def admin_panels(self, workflow: Any, query: Mapping[str, str] = EMPTY_QUERY) -> list[AdminPanel]:
        """Extra sections for the admin's page of one of this kind's workflows; ``query`` is the
        page's query string (a panel of a long list reads its page number there)."""
        return []

    def show_extras(self, workflow: Any) -> dict[str, Any]:
        """Extra keys for ``agent show --json`` (they never replace the kernel's keys)."""
        return {}

    @classmethod
    def state_type(cls, node: str) -> Any:
        """The state type node ``node``'s handler declares (``ctx: NodeContext[State]``), or None."""
        key = (cls, node)
        if key not in _declared_states:
            _declared_states[key] = _declared_state(cls, cls._handlers.get(node, ""))
        return _declared_states[key]

    def handler(self, node: str) -> Handler:
        if node not in self._handlers:
            raise NonDeterminismError(
                f"Node {node!r} is not a node of {self.kind!r} (version {self.version}; nodes: "
                f"{', '.join(self.nodes)}): the definition changed under a workflow that is there. Deploy a "
                "definition that still has the node (branch on ctx.definition_version), then resume it.")
        handler: Handler = getattr(self, self._handlers[node])
        return handler


_declared_states: dict[tuple[type[WorkflowDefinition], str], Any] = {}


def _declared_state(cls: type[WorkflowDefinition], attr: str) -> Any:
    fn = getattr(cls, attr, None)
    if fn is None:
        return None
    try:
        params = list(inspect.signature(fn).parameters)
        hint = typing.get_type_hints(fn).get(params[1]) if len(params) > 1 else None
    except (NameError, TypeError):  # an annotation only a type checker can resolve: state stays as stored
        return None
    args = typing.get_args(hint) if typing.get_origin(hint) is NodeContext else ()
    return args[0] if args and typing.is_typeddict(args[0]) else None


def typed_state(definition: WorkflowDefinition, node: str, state: dict[str, Any]) -> dict[str, Any]:
    """The stored state as the node's handler declares it: the keys its TypedDict declares as
    dataclasses (or lists and dicts of them) rebuilt, the rest as stored (``codec.from_json``)."""
    tp = definition.state_type(node)
    if tp is None:
        return state
    typed: dict[str, Any] = codec.from_json(tp, state, what="The workflow's state")
    return typed


def decide(definition: WorkflowDefinition, ctx: NodeContext[Any]) -> Decision | Suspended:
    """Run the current node's handler once (``step``), as advancing does: a failed activity or a
    ``Permanent`` error fails the workflow; a ``NonDeterminismError`` (the definition no longer
    replays this visit) and an ``InvalidDecision`` (a Goto to no node, a return that is no
    decision) propagate, for the caller's failure boundary to stop the workflow for a person
    instead of failing it."""
    try:
        return step(definition, ctx)
    except ActivityFailed as exc:
        return Fail(str(exc))
    except NonDeterminismError:
        raise
    except Permanent as exc:
        return Fail(str(exc))


def step(definition: WorkflowDefinition, ctx: NodeContext[Any]) -> Decision | Suspended:
    """Run the current node's handler once against recorded steps."""
    handler = definition.handler(ctx.snapshot.node)
    ctx.state = typed_state(definition, ctx.snapshot.node, ctx.state)
    try:
        decision = handler(ctx)
    except _SuspendOnChildren:
        return Suspended(commands=tuple(ctx.commands), on_children=True)
    except _Suspend:
        return Suspended(commands=tuple(ctx.commands))
    if any(isinstance(c, StartChild) for c in ctx.commands):
        # Children it started are recorded before its decision is taken: the next run finds them
        # started and decides again (leaving the visit then cancels them, as it voids activities).
        return Suspended(commands=tuple(ctx.commands))
    if isinstance(decision, Goto) and decision.node not in definition.nodes:
        raise InvalidDecision(f"Handler {ctx.snapshot.node} sent the workflow to unknown node {decision.node!r}; "
                              f"the definition's nodes are {', '.join(sorted(definition.nodes))}. Fix the "
                              "definition, deploy it, and resume the workflow.")
    if isinstance(decision, Goto):
        return Goto(decision.node, codec.to_json(decision.updates), decision.pause)
    if isinstance(decision, Complete):
        return Complete(codec.to_json(decision.result))
    if not isinstance(decision, Fail):
        raise InvalidDecision(f"Handler {ctx.snapshot.node} returned {decision!r}, not Goto, Complete or Fail.")
    return decision
