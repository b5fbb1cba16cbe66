"""The test kit's lifecycle in memory: what the services do to a workflow's rows when it is
cancelled, gets a new goal, ends, starts and loses children, or when time passes, done on the
dictionaries of a ``WorkflowRun`` (``workflows.testing.memory``) in the order the services do it,
with the events they would append (``run.events``) and the commitments they would keep
(``run.commitments``). Each method names the service it mirrors."""
from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from decimal import Decimal
from typing import Any

from workflows import commands, engine
from workflows.errors import BudgetExhausted, TransitionRefused
from workflows.rules import child_budget_share, compensation_operation_id

Step = commands.Step

# Where the virtual clock (``run.clock``) starts: a fixed instant, so a run's times repeat.
CLOCK_START = datetime(2026, 1, 1, tzinfo=UTC)
# The kinds of event a run records, as the services name them (the rest, such as a wake or an
# attempt's start, are the database's own bookkeeping).
EVENT_KINDS = frozenset({
    "workflow.launched", "node.entered", "activity.scheduled", "activity.succeeded", "activity.failed",
    "activity.voided", "wait.opened", "wait.approved", "wait.rejected", "wait.satisfied", "wait.invalidated",
    "wait.first_won", "timer.fired", "timer.ignored", "signal.received", "child.started", "child.cancelled",
    "child.finished", "intent.superseded", "workflow.paused", "workflow.cancelling", "workflow.cancelled",
    "commitment.uncertain", "commitment.compensated", "commitment.released", "compensation.failed",
    "compensation.retried", "workflow.completed", "workflow.failed",
})


@dataclass(frozen=True)
class Event:
    """One event of ``run.events``: its kind, as the services name it (``activity.succeeded``),
    and the part of their data a test asserts, with operation ids for database ids (``wait`` is
    the wait's)."""

    kind: str
    data: dict[str, Any]


@dataclass
class Commitment:
    """An effect made in the outside world: an activity declared with ``commitment=`` succeeded
    (``data`` is its result), or failed after an attempt that may have acted (``data`` is
    ``{"uncertain": True}``). ``status`` is ``active`` until undone (``compensated``) or kept as
    the outcome of a completed workflow (``released``)."""

    operation_id: str
    kind: str
    compensation: str  # the name of the activity that undoes it
    data: dict[str, Any]
    input: Any
    result: Any
    intent_version: int
    status: str = "active"


@dataclass
class Child:
    """A child workflow a handler started (``ctx.child``) and that has not ended: ``budget_usd``
    is the share of the parent's total budget reserved for it (what it asked, or what remained;
    None when the parent has no budget), ``cancelling`` why it is being cancelled ("" while it runs)."""

    operation_id: str
    kind: str
    goal: str
    params: dict[str, Any]
    budget_usd: Decimal | None
    workflow_id: int
    intent_version: int
    cancelling: str = ""


@dataclass
class _Timer:
    fire_at: datetime
    wait: str  # the wait's operation id
    purpose: str  # "wake" (a sleep) or "expire" (a wait's timeout)
    intent_version: int


@dataclass
class _Compensation:
    commitment: Commitment
    status: str = "scheduled"  # scheduled, succeeded, failed
    error: str = ""


class Lifecycle:
    """The lifecycle part of ``WorkflowRun``: cancel, supersede, the clock, children and effects."""

    workflow_id: int
    definition: engine.WorkflowDefinition
    node: str
    node_visit: int
    intent_version: int
    goal: str
    status: str
    reason: str
    result: Any
    clock: datetime
    deadline: datetime | None
    budget_total_usd: Decimal | None
    history: list[Step]
    events: list[Event]
    pending: dict[str, engine.ScheduleActivity]
    open_waits: dict[str, engine.OpenWait]
    children: dict[str, Child]
    _commitments: list[Commitment]
    _compensations: dict[str, _Compensation]
    _timers: list[_Timer]
    _wait_status: dict[str, str]
    state: dict[str, Any]
    path: list[str]
    _pause_cause: str  # why a paused run is paused: "definition" or "budget"
    _cancelled_by: str

    def advance(self) -> None:
        raise NotImplementedError

    def _history_add(self, step: Step) -> None:
        raise NotImplementedError

    def _settle_first(self, race: engine.OpenWait, *, signal: dict[str, Any] | None = None,
                      timer_fired: bool = False) -> str:
        raise NotImplementedError

    # What a test does -----------------------------------------------------------------------

    @property
    def commitments(self) -> list[Commitment]:
        """The effects made and not undone (active, or released as a completed workflow's outcome), oldest first."""
        return [c for c in self._commitments if c.status != "compensated"]

    def cancel(self, reason: str = "", *, by: str = "tester") -> str:
        """Cancel as ``agent cancel`` does (``services.workflow_cancel``): waits closed, work in
        flight voided, children cancelled, then each active commitment compensated, newest first,
        one at a time (answer each compensation in ``pending`` like any activity); the workflow is
        ``cancelling`` until the last is undone, then ``cancelled``. Returns ``applied`` when it
        ended cancelled, ``suspended`` while compensations run, ``already_applied`` when it was
        already cancelling or cancelled. Raises TransitionRefused for a completed or failed one."""
        if self.status in ("cancelling", "cancelled"):
            return "already_applied"
        if self.status in ("completed", "failed"):
            raise TransitionRefused(f"Workflow {self.workflow_id} is already {self.status}; there is nothing to "
                                    "cancel.")
        self._cancel_locked(reason.strip() or f"cancelled by {by}", by=by)
        self._collect()
        return "applied" if self.status == "cancelled" else "suspended"

    def supersede(self, goal: str, *, by: str = "tester") -> None:
        """Give the workflow a new goal as ``agent supersede`` does (``services.workflow_supersede``):
        the next intent version; the open waits invalidated (their timers ignored when they fire),
        work in flight voided, children cancelled, every active commitment compensated (all at
        once, after the children have ended), and the workflow sent to its definition's
        ``revalidate_node``. Raises TransitionRefused for a workflow that ended or is cancelling."""
        if self.status in ("completed", "failed", "cancelled", "cancelling"):
            raise TransitionRefused(f"Workflow {self.workflow_id} is {self.status}; its goal can no longer change.")
        old = self.intent_version
        self.intent_version, self.goal = old + 1, goal
        for op in list(self.open_waits):
            self._wait_close(op, "invalidated")
            self._event("wait.invalidated", wait=op, reason="intent superseded")
        self._live_work_void(reason=f"intent v{old} superseded")
        self._children_cancel(why=f"superseded its goal (intent v{old} → v{old + 1})", by=by or "supersede")
        self._compensate_after_children([c for c in self._commitments if c.status == "active"])
        self._event("intent.superseded", old=old, new=old + 1, by=by)
        if self.status == "waiting":
            self.status = "running"
        self._enter_node(self.definition.revalidate_node, {})
        self.advance()
        self._collect()

    def advance_clock(self, step: timedelta | None = None, *, days: float = 0, hours: float = 0,
                      minutes: float = 0, seconds: float = 0) -> datetime:
        """Move ``run.clock`` forward by ``step`` (or the given time): each timer and deadline that
        falls due meanwhile fires at its own time, in the order they fall due (a sleep ends, a
        wait's timeout expires it, a race's timeout wins it, the time limit cancels the workflow),
        as beat would fire them. Returns the new ``run.clock``. Raises ValueError for a step back."""
        step = (step or timedelta(0)) + timedelta(days=days, hours=hours, minutes=minutes, seconds=seconds)
        if step < timedelta(0):
            raise ValueError(f"The clock only moves forward; {step} is a step back.")
        self._clock_to(self.clock + step)
        return self.clock

    def set_budget(self, total_usd: Decimal | str | int | None) -> None:
        """Set the total budget (USD; None: no limit) as ``agent budget --total`` does; a workflow
        paused because a child's budget did not fit goes on, and starts the child if it fits now."""
        self.budget_total_usd = None if total_usd is None else Decimal(str(total_usd))
        if self.status == "paused" and self._pause_cause == "budget":
            self.status, self.reason, self._pause_cause = "running", "", ""
            self.advance()
            self._collect()

    # Time ------------------------------------------------------------------------------------

    def _clock_to(self, target: datetime) -> None:
        for _ in range(10_000):
            due = self._next_due(target)
            if due is None:
                break
            when, timer = due
            self.clock = max(self.clock, when)
            if timer is None:
                self._deadline_enforce()
            else:
                self._timers.remove(timer)
                self._timer_fire(timer)
            self._collect()
        self.clock = max(self.clock, target)

    def _next_due(self, target: datetime) -> tuple[datetime, _Timer | None] | None:
        timers = sorted(self._timers, key=lambda t: t.fire_at)
        deadline = self.deadline if self.deadline is not None and self.status not in (
            "completed", "failed", "cancelled", "cancelling") else None
        if timers and timers[0].fire_at <= target and (deadline is None or timers[0].fire_at <= deadline):
            return timers[0].fire_at, timers[0]
        if deadline is not None and deadline <= target:
            return deadline, None
        return None

    def _timer_fire(self, timer: _Timer) -> None:
        """``services.timer_fire_if_due``: a timer whose intent, workflow or wait moved on is ignored."""
        stale = ""
        if timer.intent_version != self.intent_version:
            stale = f"bound to intent v{timer.intent_version}, superseded by v{self.intent_version}"
        elif self.status in ("completed", "failed", "cancelled", "cancelling"):
            stale = f"workflow is {self.status}"
        elif self._wait_status.get(timer.wait) != "open":
            stale = f"wait {timer.wait} is already {self._wait_status.get(timer.wait, 'closed')}"
        if stale:
            self._event("timer.ignored", wait=timer.wait, reason=stale)
            return
        wait = self.open_waits[timer.wait]
        self._event("timer.fired", wait=timer.wait, purpose=timer.purpose)
        if wait.kind == "first":
            self._settle_first(wait, timer_fired=True)
            return
        status = "satisfied" if timer.purpose == "wake" else "expired"
        self._wait_close(timer.wait, status)
        self._history_add(Step(timer.wait, self.node, wait.kind, wait.event_name, status))
        if self.status == "waiting":
            self.status = "running"
        self.advance()

    def _deadline_enforce(self) -> None:
        """``services.workflow_deadline_enforce_if_due``: past its time limit the workflow is cancelled."""
        assert self.deadline is not None
        self._cancel_locked(f"time limit reached at {self.deadline:%Y-%m-%d %H:%M:%S} UTC", by="time limit")

    def _timer_set(self, wait: engine.OpenWait) -> None:
        if wait.expires_in_seconds is not None:
            self._timers.append(_Timer(self.clock + timedelta(seconds=wait.expires_in_seconds), wait.operation_id,
                                       "wake" if wait.kind == "timer" else "expire", self.intent_version))

    def _wait_close(self, op: str, status: str) -> None:
        self.open_waits.pop(op, None)
        self._wait_status[op] = status

    # Cancellation ----------------------------------------------------------------------------

    def _cancel_locked(self, reason: str, *, by: str) -> None:
        """``services.cancellation._cancel_locked``."""
        self.status, self.reason = "cancelling", reason
        for op in list(self.open_waits):
            self._wait_close(op, "cancelled")
        self._timers.clear()
        self._live_work_void(reason="workflow cancelled")
        self._event("workflow.cancelling", reason=reason, by=by)
        self._cancelled_by = by
        self._children_cancel(why=f"was cancelled ({reason[:300]})", by=by)
        self._advance_cancellation()

    def _advance_cancellation(self) -> None:
        """``services.cancellation.advance_cancellation``: once the children have ended, one
        compensation at a time, newest first; cancelled when no commitment is active."""
        if self._children_live():
            return
        for commitment in reversed([c for c in self._commitments if c.status == "active"]):
            compensation = self._compensation_ensure(commitment)
            if compensation.status == "failed":
                self._note_failed_compensation(commitment)
            if compensation.status != "succeeded":
                return
            self._commitment_compensated(commitment)
        self.status = "cancelled"
        self._event("workflow.cancelled", by=self._cancelled_by)

    def _note_failed_compensation(self, commitment: Commitment) -> None:
        op = compensation_operation_id(commitment.operation_id)
        reason = (f"Compensation {op} ({commitment.compensation}) failed after its attempts: "
                  f"{self._compensations[op].error}. Fix the cause, then run `manage.py agent resume "
                  f"{self.workflow_id}` to try it again.")
        if self.reason != reason:
            self.reason = reason
            self._event("compensation.failed", operation_id=op)

    def _compensations_retry(self) -> int:
        """``services.cancellation.compensations_retry``: failed compensations are asked for again."""
        retried = 0
        for op, compensation in self._compensations.items():
            if compensation.status == "failed":
                compensation.status = "scheduled"
                self.pending[op] = self._compensation_command(compensation.commitment)
                self._event("compensation.retried", operation_id=op)
                retried += 1
        return retried

    # Effects ---------------------------------------------------------------------------------

    def _commitment_made(self, command: engine.ScheduleActivity, activity: Any, result: Any) -> None:
        if activity.commitment:
            data = result if isinstance(result, dict) else {"result": result}
            self._commitments.append(Commitment(command.operation_id, activity.commitment, activity.compensation,
                                                data, command.input, result, self.intent_version))

    def _failure_may_have_acted(self, op: str, activity: Any, input: Any) -> None:
        """``services.activities._failure_may_have_acted``: an activity that failed after an attempt
        may have acted; its effect is an uncertain commitment from then on, undone like a recorded
        one, and by a completion too (the path went on without it). The kit's voided work started
        no attempt: nothing else of it is uncertain."""
        self._commitments.append(Commitment(op, activity.commitment, activity.compensation, {"uncertain": True},
                                            input, None, _intent_of(op)))
        self._event("commitment.uncertain", operation_id=op, commitment_kind=activity.commitment)

    def _compensation_command(self, commitment: Commitment) -> engine.ScheduleActivity:
        return engine.ScheduleActivity(
            operation_id=compensation_operation_id(commitment.operation_id), name=commitment.compensation,
            input={"operation_id": commitment.operation_id, "data": commitment.data,
                   "idempotency_key": commitment.operation_id, "input": commitment.input,
                   "result": commitment.result})

    def _compensation_ensure(self, commitment: Commitment) -> _Compensation:
        """``services.steps.compensation_ensure``: the compensation, scheduled if absent."""
        command = self._compensation_command(commitment)
        found = self._compensations.get(command.operation_id)
        if found is None:
            found = self._compensations[command.operation_id] = _Compensation(commitment)
            self.pending[command.operation_id] = command
            self._event("activity.scheduled", operation_id=command.operation_id, name=command.name)
        return found

    def _compensated(self, op: str, *, error: str | None) -> None:
        """A compensation's answer: its success closes its commitment; the workflow goes on."""
        compensation = self._compensations[op]
        self.pending.pop(op, None)
        if error is None:
            compensation.status = "succeeded"
            self._event("activity.succeeded", operation_id=op)
            self._commitment_compensated(compensation.commitment)
        else:
            compensation.status, compensation.error = "failed", error
            self._event("activity.failed", operation_id=op, error=error[:500])
            if self.status != "cancelling":
                self._event("compensation.failed", operation_id=op)
        if self.status == "cancelling":
            self._advance_cancellation()
        else:
            self.advance()
        self._collect()

    def _commitment_compensated(self, commitment: Commitment) -> None:
        if commitment.status == "active":
            commitment.status = "compensated"
            self._event("commitment.compensated", operation_id=commitment.operation_id)

    def _compensate_after_children(self, commitments: list[Commitment]) -> None:
        """``services.steps.commitments_compensate_after_children``: all at once. The services wait
        for children still being cancelled (``compensation.deferred``); the kit's have ended."""
        assert not self._children_live()
        for commitment in commitments:
            self._compensation_ensure(commitment)

    def _live_work_void(self, *, reason: str) -> None:
        """``services.steps.live_work_void``: activities asked for and not answered are voided
        (compensations excepted). The kit's have started no attempt: nothing of theirs is uncertain."""
        for op in [op for op in self.pending if op not in self._compensations]:
            del self.pending[op]
            self._event("activity.voided", operation_id=op, was="scheduled", reason=reason)

    # Ends --------------------------------------------------------------------------------------

    def _enter_node(self, node: str, updates: dict[str, Any]) -> None:
        """``services.visits.enter_node``: the left visit's work is voided and its children cancelled."""
        previous = self.node
        self._live_work_void(reason=f"node {previous} (visit {self.node_visit}) was left")
        self._children_cancel(why=f"left node {previous} (visit {self.node_visit}) that started it", by="node left")
        for op in list(self.open_waits):
            self._wait_close(op, "left")
        self.state = _stored({**self.state, **updates})
        self.node, self.node_visit = node, self.node_visit + 1
        self.path.append(node)
        self._event("node.entered", node=node, previous=previous, visit=self.node_visit)

    def _complete(self, result: Any) -> None:
        """``services.visits.complete_locked``: children still running are cancelled; what a failed
        activity may have done is compensated; the other active commitments are the outcome (released)."""
        self._live_work_void(reason="workflow completed")
        self._children_cancel(why="completed without waiting for it", by="workflow completed")
        for commitment in self._commitments:
            if commitment.status == "active" and commitment.data == {"uncertain": True}:
                self._compensation_ensure(commitment)
            elif commitment.status == "active":
                commitment.status = "released"
                self._event("commitment.released", operation_id=commitment.operation_id,
                            commitment_kind=commitment.kind)
        self.status, self.result = "completed", _stored(result)
        self._event("workflow.completed")

    def _fail(self, reason: str) -> None:
        """``services.visits.fail_locked``: every active commitment is compensated, after the children."""
        self._live_work_void(reason="workflow failed")
        self.status, self.reason = "failed", reason
        self._event("workflow.failed", reason=reason)
        self._children_cancel(why=f"failed: {reason[:300]}", by="workflow failed")
        self._compensate_after_children([c for c in self._commitments if c.status == "active"])

    # Children --------------------------------------------------------------------------------

    def _child_start(self, command: engine.StartChild) -> bool:
        """``services.workflows.child_start``: False when its budget does not fit (paused for budget)."""
        try:
            budget = self._child_budget(command)
        except BudgetExhausted as exc:
            self.status, self.reason, self._pause_cause = "paused", str(exc), "budget"
            self._event("workflow.paused", reason=str(exc), cause="budget")
            return False
        child = Child(command.operation_id, command.child_kind, command.goal, _stored(command.params), budget,
                      1000 + len(self.events), self.intent_version)
        self.children[command.operation_id] = child
        self._event("child.started", operation_id=command.operation_id, child=child.workflow_id,
                    child_kind=child.kind, budget_usd=None if budget is None else str(budget))
        return True

    def _child_budget(self, command: engine.StartChild) -> Decimal | None:
        # The kit meters no model calls: what counts is what its live children hold.
        held = sum((c.budget_usd or Decimal(0) for c in self.children.values()), Decimal(0))
        return child_budget_share(command, total_usd=self.budget_total_usd, workflow_id=self.workflow_id,
                                  left_usd=lambda total: total - held)

    def _children_cancel(self, *, why: str, by: str, only: list[str] | None = None) -> None:
        """``services.cancellation.children_cancel_live``: each child still running is cancelled."""
        for op, child in self.children.items():
            if child.cancelling or (only is not None and op not in only):
                continue
            child.cancelling = f"parent workflow {self.workflow_id} {why}"
            self._event("child.cancelled", child=child.workflow_id, reason=child.cancelling, by=by)

    def _children_live(self) -> list[int]:
        """``selectors.children_live``: the children that have not ended. A child the kit cancels has
        no effects of its own to undo, so it ends at once (its wait records that end when the run
        collects it, after this step)."""
        return [c.workflow_id for c in self.children.values() if not c.cancelling]

    def _child_end(self, op: str, payload: dict[str, Any]) -> None:
        """``services.steps.child_wait_close``: the child's end recorded on its wait."""
        child = self.children.pop(op)
        self._history_add(Step(op, self._node_of_visit(op), "child", child.kind, "satisfied", result=payload))
        self._event("child.finished", operation_id=op, child=child.workflow_id, status=payload["status"])

    def _node_of_visit(self, op: str) -> str:
        return op.split("/")[1].rsplit(".", 1)[0]

    def _collect(self) -> None:
        """``services.children.children_collect_if_finished``, rung by each cancelled child's end
        once the step that cancelled it is done: its end is recorded on its wait (``child.finished``)
        and the workflow goes on (a handler waiting for it sees it cancelled)."""
        for _ in range(100):
            ending = [op for op, c in self.children.items() if c.cancelling]
            if not ending:
                return
            for op in ending:
                child = self.children[op]
                self._child_end(op, {"workflow_id": child.workflow_id, "status": "cancelled", "result": None,
                                     "reason": child.cancelling[:2000]})
            self.advance()

    def _event(self, kind: str, **data: Any) -> None:
        self.events.append(Event(kind, _stored(data)))


def _intent_of(operation_id: str) -> int:
    parts = operation_id.split("/")
    return int(parts[2][1:]) if len(parts) > 2 and parts[2][1:].isdigit() else 1


def _stored(value: Any) -> Any:
    """``value`` as the database would give it back: through JSON."""
    import json

    return json.loads(json.dumps(value))
