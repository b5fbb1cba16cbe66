"""Replay checks: would the current definitions still replay the recorded histories?

The engine replays one node visit at a time: advancing a workflow runs its current node's
handler against the steps recorded for that visit, from the state the visit was entered with.
A definition deployed under a workflow in flight is safe for it when that handler still asks
for the recorded steps, in order, under the same names, and, for a visit that was left, still
decides to go where the workflow went. This module checks exactly that, without writing:

- ``history_of(workflow)`` reads a workflow's visits from the database; ``History.to_json`` and
  ``History.from_json`` carry one as a fixture file (``manage.py agent export-history``).
- ``check(history)`` replays visits against the registered definitions and returns the first
  ``Divergence`` (the node, the visit and the step, and why), or None.

``manage.py agent replay-check`` runs it over the workflows in flight (their current visit: the
only one the engine will replay) and over fixture files (every visit: a change anywhere in a
kind's path fails it).
"""
from __future__ import annotations

import functools
import itertools
from collections.abc import Callable, Iterable, Iterator
from dataclasses import asdict, dataclass, field, replace
from typing import Any, Generic, TypeVar

from workflows import commands, engine, registry, statestore
from workflows.errors import AgentOpsError, NonDeterminismError
from workflows.models import Activity, Intent, Wait, Workflow
from workflows.services.steps import COMPENSATION_NODE

FORMAT = "agentops.history/1"
# Steps closed from outside when the visit was left (a new goal, a cancel, a replan) were still
# unanswered while the handler ran: it must ask for them, and it was waiting for them.
UNANSWERED = {"activity": {"cancelled": "scheduled"}, "wait": {"invalidated": "open", "cancelled": "open"}}


@dataclass(frozen=True)
class Visit:
    """A node visit: where it was, what it started from and what it recorded."""

    node: str
    visit: int
    intent_version: int
    goal: str
    state: dict[str, Any]
    steps: list[commands.Step] = field(default_factory=list)


@dataclass(frozen=True)
class History:
    workflow_id: int
    kind: str
    definition_version: int
    params: dict[str, Any]
    release_fingerprint: str
    status: str
    visits: list[Visit]

    def to_json(self) -> dict[str, Any]:
        return {"format": FORMAT, **asdict(self)}

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> History:
        if not isinstance(data, dict) or data.get("format") != FORMAT:
            raise ValueError(f"not a recorded history (its \"format\" is not {FORMAT!r})")
        visits = [Visit(**{**v, "steps": [commands.Step(**{"node": v["node"], **s}) for s in v["steps"]]})
                  for v in data["visits"]]
        fields = {k: data[k] for k in ("workflow_id", "kind", "definition_version", "params", "release_fingerprint",
                                       "status")}
        return cls(**fields, visits=visits)


@dataclass(frozen=True)
class Divergence:
    """Where the current definition no longer replays a history."""

    workflow_id: int
    kind: str
    node: str
    visit: int
    operation_id: str
    reason: str

    def __str__(self) -> str:
        step = f", step {self.operation_id}" if self.operation_id else ""
        where = f"at node {self.node} (visit {self.visit}{step})"
        return f"workflow {self.workflow_id} ({self.kind}) {where}: {self.reason}"


def history_of(workflow: Workflow, *, current_visit_only: bool = False) -> History:
    """The recorded visits of ``workflow`` (or its current one), read from the database."""
    first = workflow.node_visit if current_visit_only else 1
    return History(**header_of(workflow), visits=list(visits_of(workflow, first=first)))


def header_of(workflow: Workflow) -> dict[str, Any]:
    """The fields of ``History`` but its visits: what a replay needs besides them."""
    return {"workflow_id": workflow.pk, "kind": workflow.kind, "definition_version": workflow.definition_version,
            "params": dict(workflow.params), "release_fingerprint": workflow.release.fingerprint,
            "status": workflow.status}


# Rows fetched per round trip when streaming a history: a checkpoint carries a state (or its
# delta), a step its input and result; memory holds one fetch of each, however long the run.
CHECKPOINTS_PER_FETCH = 8
STEPS_PER_FETCH = 100


def visits_of(workflow: Workflow, *, first: int = 1) -> Iterator[Visit]:
    """The recorded visits of ``workflow`` from visit ``first`` on, in order, streamed: the
    checkpoints, activities and waits are read by three cursors ordered by visit
    (``.iterator(chunk_size=…)``) and merged, so memory holds one visit at a time and the
    reads are linear in visits. Inside a transaction (``export-history`` opens one) the
    PostgreSQL cursors live in it; outside one, Django declares them WITH HOLD.

    Checkpoints hold deltas and long values are blobs (``workflows.statestore``): each visit's
    state is rebuilt from the last whole checkpoint on; the current visit's is the workflow
    row's, which a data migration of parked state rewrites."""
    # A fork's first visit is the one after those it reused from its original (workflows.features.forks.services).
    first = max(first, (workflow.forked_from_visit or 0) + 1)
    goals = dict(Intent.objects.filter(workflow=workflow).values_list("version", "goal"))
    checkpoints = _ByVisit(statestore.states_streamed(workflow, first_visit=first, chunk_size=CHECKPOINTS_PER_FETCH),
                           key=lambda pair: pair[0].node_visit)
    activities = _ByVisit(
        Activity.objects.filter(workflow=workflow, node_visit__gte=first).exclude(node=COMPENSATION_NODE)
        .order_by("node_visit", "pk").iterator(chunk_size=STEPS_PER_FETCH))
    waits = _ByVisit(
        Wait.objects.filter(workflow=workflow, node_visit__gte=first).select_related("decided_by")
        .order_by("node_visit", "pk").iterator(chunk_size=STEPS_PER_FETCH))
    start_node = _first_node(workflow) if first == 1 else ""
    for number in range(first, workflow.node_visit + 1):
        found = checkpoints.take(number)
        steps = [_activity_step(a) for a in activities.take(number)] + [_wait_step(w) for w in waits.take(number)]
        entry = found[-1] if found else None
        checkpoint, state = entry if entry is not None else (None, {})
        if checkpoint is None and number != 1:
            continue  # a visit with no checkpoint left no trace to replay
        node = checkpoint.node if checkpoint else start_node
        intent = checkpoint.intent_version if checkpoint else 1
        if number == workflow.node_visit and entry is not None:
            state = statestore.state_of(workflow)
        yield Visit(node=node, visit=number, intent_version=intent, goal=goals.get(intent, ""),
                    state=state if entry is not None else {}, steps=sorted(steps, key=lambda s: s.seq))


def _activity_step(a: Activity) -> commands.Step:
    return commands.Step(a.operation_id, a.node, "activity", a.name, a.status,
                       result=statestore.resolve(a.workflow_id, a.result), error=a.error, input=a.input)


def _wait_step(w: Wait) -> commands.Step:
    return commands.Step(w.operation_id, w.node, w.kind, w.event_name, w.status, result=w.payload,
                       decision=w.decision, decided_by=w.decided_by.username if w.decided_by else "",
                       comment=w.comment)


T = TypeVar("T")


class _ByVisit(Generic[T]):
    """Rows ordered by visit (``key``: a row's ``node_visit``), taken one visit at a time (a merge join of cursors)."""

    def __init__(self, rows: Iterator[T], key: Callable[[T], int] = lambda row: row.node_visit) -> None:  # type: ignore[attr-defined]
        self._groups: Iterator[tuple[int, Iterator[T]]] = itertools.groupby(rows, key=key)
        self._next: tuple[int, list[T]] | None = None
        self._advance()

    def _advance(self) -> None:
        group = next(self._groups, None)
        self._next = None if group is None else (group[0], list(group[1]))

    def take(self, visit: int) -> list[T]:
        """The rows of ``visit``; rows of earlier visits not asked for are skipped."""
        while self._next is not None and self._next[0] < visit:
            self._advance()
        if self._next is None or self._next[0] != visit:
            return []
        rows = self._next[1]
        self._advance()
        return rows


def _first_node(workflow: Workflow) -> str:
    kind = registry.definition(workflow.kind) if workflow.kind in registry.definition_kinds() else None
    return kind.start_node if kind is not None else workflow.current_node


def check(history: History, *, visits: Iterable[Visit] | None = None) -> Divergence | None:
    """Replay ``visits`` of ``history`` (all of them by default) against the registered
    definition of its kind; the first divergence, or None when each replays as recorded."""
    if visits is None:
        return check_stream(history, history.visits)
    definition = _definition_or_divergence(history)
    if isinstance(definition, Divergence):
        return definition
    following = {v.visit: n for v, n in zip(history.visits, history.visits[1:], strict=False)}
    for visit in visits:
        divergence = _check_visit(definition, history, visit, following.get(visit.visit))
        if divergence is not None:
            return divergence
    return None


def check_stream(history: History, visits: Iterable[Visit]) -> Divergence | None:
    """Replay each of ``visits`` (a history's, in order; ``history.visits`` is not read) and
    return the first divergence, or None. One pass holding two visits at a time: time is
    linear in visits and memory does not grow with them (``replay-check`` of JSON Lines files)."""
    definition = _definition_or_divergence(history)
    if isinstance(definition, Divergence):
        return definition
    stream = iter(visits)
    visit = next(stream, None)
    while visit is not None:
        following = next(stream, None)
        divergence = _check_visit(definition, history, visit, following)
        if divergence is not None:
            return divergence
        visit = following
    return None


def _definition_or_divergence(history: History) -> engine.WorkflowDefinition | Divergence:
    if history.kind not in registry.definition_kinds():
        return Divergence(history.workflow_id, history.kind, "", 0, "",
                          f"no definition of kind {history.kind!r} is registered (AGENTOPS_AGENT_MODULES)")
    return registry.definition(history.kind)


def _check_visit(definition: engine.WorkflowDefinition, history: History, visit: Visit,
                 next_visit: Visit | None) -> Divergence | None:
    def diverged(reason: str, operation_id: str = "") -> Divergence:
        return Divergence(history.workflow_id, history.kind, visit.node, visit.visit, operation_id, reason)

    if visit.node not in definition.nodes:
        return diverged(f"the definition (version {definition.version}) has no node {visit.node}")
    answered = [_as_the_handler_saw_it(s) for s in visit.steps]
    snapshot = engine.WorkflowSnapshot(
        workflow_id=history.workflow_id, kind=history.kind, node=visit.node, node_visit=visit.visit,
        intent_version=visit.intent_version, load_goal=functools.partial(str, visit.goal), params=dict(history.params),
        state=dict(visit.state), release_fingerprint=history.release_fingerprint,
        definition_version=history.definition_version,
    )
    ctx: engine.NodeContext[Any] = engine.NodeContext(
        snapshot,
        {s.operation_id: engine.RecordedActivity(name=s.name, status=s.status, result=s.result, error=s.error)
         for s in answered if s.kind == "activity"},
        lambda: {s.operation_id: engine.RecordedWait(kind=s.kind, status=s.status, decision=s.decision,
                                                     decided_by=s.decided_by, comment=s.comment, payload=s.result,
                                                     name=s.name)
                 for s in answered if s.kind != "activity"},
    )
    try:
        decision = engine.decide(definition, ctx)
    except NonDeterminismError as exc:
        return diverged(str(exc), str(getattr(exc, "operation_id", "")))
    except Exception as exc:  # noqa: BLE001 - a handler bug is a finding of the check, not a crash of it
        return diverged(f"the handler raises {type(exc).__name__}: {exc}")
    if isinstance(decision, engine.Suspended):
        recorded = {s.operation_id: s for s in answered}
        for command in decision.commands:
            clash = recorded.get(command.operation_id)
            if clash is not None:  # a new step where another kind of step was recorded
                asked_for = (f"activity {command.name!r}" if isinstance(command, engine.ScheduleActivity)
                             else f"a {command.kind} wait")
                return diverged(f"recorded {clash.label} ({clash.status}) here; the handler now asks for "
                                f"{asked_for}", clash.operation_id)
    asked = set(ctx.asked)
    for step in answered:
        if step.operation_id not in asked:
            return diverged(f"recorded {step.label} ({step.status}) is no longer asked for; the handler now "
                            f"{_describe(decision)}", step.operation_id)
    for step in visit.steps:
        unfit = _input_unfit(step)
        if unfit:
            return diverged(unfit, step.operation_id)
    if next_visit is not None and not isinstance(decision, engine.Suspended):
        # The visit was left by the handler itself (an external move, such as a new goal, leaves
        # it suspended): it must still go where the workflow went.
        if not isinstance(decision, engine.Goto):
            return diverged(f"the handler now {_describe(decision)}, where the workflow went on to "
                            f"{next_visit.node}")
        if decision.node != next_visit.node:
            return diverged(f"the handler now goes to {decision.node}, where the workflow went to {next_visit.node}")
    return None


def _input_unfit(step: commands.Step) -> str:
    """Why the input stored for a step still to run no longer decodes into its activity's input type,
    or "": a worker would refuse it when an attempt starts (a renamed field calls for a data
    migration, docs/authoring.md)."""
    if step.kind != "activity" or step.status not in ("scheduled", "running") or step.input is None:
        return ""
    try:
        registry.activity_type(step.name).decode_input(step.input)
    except AgentOpsError as exc:
        return f"the input stored for {step.label} ({step.status}) no longer fits its input type: {exc}"
    return ""


def _as_the_handler_saw_it(step: commands.Step) -> commands.Step:
    unanswered = UNANSWERED["activity" if step.kind == "activity" else "wait"].get(step.status)
    return step if unanswered is None else replace(step, status=unanswered, result=None, decision="")


def _describe(decision: engine.Decision | engine.Suspended) -> str:
    if isinstance(decision, engine.Suspended):
        asked = ", ".join(getattr(c, "name", "") or getattr(c, "kind", "") for c in decision.commands)
        return f"waits for {asked or 'nothing new'}"
    if isinstance(decision, engine.Goto):
        return f"goes to {decision.node}"
    if isinstance(decision, engine.Complete):
        return "completes the workflow"
    return f"fails the workflow ({decision.reason[:200]})"
