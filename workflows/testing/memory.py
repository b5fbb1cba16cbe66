"""``WorkflowRun``: a workflow of a definition advanced in memory, through the same engine code as
on a worker (``workflows.engine``), with the durable plane's rows kept in dictionaries; the
lifecycle beyond one step (cancel, a new goal, children, time, effects) is
``workflows.testing.lifecycle``."""
from __future__ import annotations

import json
from datetime import timedelta
from decimal import Decimal
from typing import TYPE_CHECKING, Any

from workflows import codec, commands, engine
from workflows.errors import TransitionRefused, WaitRefused
from workflows.testing.lifecycle import (
    CLOCK_START,
    Child,
    Commitment,
    Event,
    Lifecycle,
    _Compensation,
    _stored,
    _Timer,
)

if TYPE_CHECKING:
    from workflows.registry import ActivityType
    from workflows.testing import ActivityEnvironment

Step = commands.Step

__all__ = ["Child", "Commitment", "Event", "WorkflowRun"]


class WorkflowRun(Lifecycle):
    """A workflow of ``definition`` advanced in memory, step by step.

    After each answer the run advances until the definition needs something not yet
    answered: ``pending`` lists the activities it waits for, ``open_waits`` its waits;
    ``status`` is running, waiting, paused (``resume``), cancelling, cancelled, completed or
    failed, with ``result`` or ``reason``. ``events`` and ``commitments`` are what the services
    would have recorded; ``clock`` is the run's virtual time (``advance_clock``).
    """

    def __init__(
        self, definition: type[engine.WorkflowDefinition], *, goal: str = "", params: dict[str, Any] | None = None,
        workflow_id: int = 1, release_fingerprint: str = "test-release", definition_version: int | None = None,
        recorded: list[Step] | None = None, max_hours: float | None = None,
        budget_total_usd: Decimal | str | int | None = None,
    ) -> None:
        self.definition = definition()
        self.goal = goal
        self.params = json.loads(json.dumps(self.definition.validate_params(dict(params or {}))))
        self.workflow_id = workflow_id
        self.release_fingerprint = release_fingerprint
        self.definition_version = definition_version or definition.version
        self.node, self.node_visit, self.intent_version = definition.start_node, 1, 1
        self.state: dict[str, Any] = {}
        self.status, self.result, self.reason = "running", None, ""
        self.path: list[str] = [self.node]
        self.history: list[Step] = []
        self.events: list[Event] = []
        self.pending: dict[str, engine.ScheduleActivity] = {}
        self.open_waits: dict[str, engine.OpenWait] = {}
        self.children: dict[str, Child] = {}  # started and not ended, by operation id
        self.clock = CLOCK_START
        hours = definition.default_max_hours if max_hours is None else max_hours
        self.deadline = None if hours is None else self.clock + timedelta(hours=hours)
        self.budget_total_usd = None if budget_total_usd is None else Decimal(str(budget_total_usd))
        self._commitments: list[Commitment] = []
        self._compensations: dict[str, _Compensation] = {}
        self._timers: list[_Timer] = []
        self._wait_status: dict[str, str] = {}
        self._pause_cause, self._cancelled_by = "", ""
        self._signals: list[dict[str, Any]] = []  # every signal received, in order; "consumed_by" once taken
        self._recorded = {step.operation_id: step for step in recorded or []}
        self._event("workflow.launched", goal=goal, params=self.params)
        self.advance()
        self._collect()

    @property
    def signals_queued(self) -> list[tuple[str, Any]]:
        """The signals no wait has taken yet, oldest first: (name, payload)."""
        return [(s["name"], s["payload"]) for s in self._signals if s["consumed_by"] is None]

    # Answers -------------------------------------------------------------------------------

    def complete(self, activity: ActivityType[Any, Any], result: Any) -> None:
        """Record ``result`` for the pending call of ``activity`` and advance."""
        command = self._pending(activity)
        self._succeeded(command, activity, codec.to_json(result))

    def fail(self, activity: ActivityType[Any, Any], error: str = "failed in a test") -> None:
        """Record that the pending call of ``activity`` failed after all its attempts, and advance."""
        command = self._pending(activity)
        if command.operation_id in self._compensations:
            self._compensated(command.operation_id, error=error)
            return
        self.pending.pop(command.operation_id)
        self._event("activity.failed", operation_id=command.operation_id, error=error[:500])
        if activity.commitment:  # its attempts may have acted: undone however the workflow ends
            self._failure_may_have_acted(command.operation_id, activity, command.input)
        self._record(Step(command.operation_id, self.node, "activity", activity.name, "failed", error=error))

    def run(self, activity: ActivityType[Any, Any], env: ActivityEnvironment | None = None) -> Any:
        """Run the pending call of ``activity`` for real (in an ActivityEnvironment), record its
        result and advance; returns the result."""
        from workflows.testing import ActivityEnvironment

        command = self._pending(activity)
        env = env or ActivityEnvironment(workflow_id=self.workflow_id)
        env.operation_id = command.operation_id
        result = env.run(activity, activity.decode_input(command.input))
        self._succeeded(command, activity, codec.to_json(result))
        return result

    def _succeeded(self, command: engine.ScheduleActivity, activity: ActivityType[Any, Any], result: Any) -> None:
        if command.operation_id in self._compensations:
            self._compensated(command.operation_id, error=None)
            return
        self.pending.pop(command.operation_id)
        stored = _stored(result)
        self._commitment_made(command, activity, stored)
        self._event("activity.succeeded", operation_id=command.operation_id)
        self._record(Step(command.operation_id, self.node, "activity", activity.name, "succeeded", result=stored))

    def signal(self, name: str, payload: Any = None, *, dedupe_key: str = "") -> str:
        """Send signal ``name`` as ``agent signal`` does (``services.workflow_signal``): the open
        event wait for ``name`` takes it, or the open ``ctx.wait_first`` that races one (the signal
        wins it unless a child's end came first); else it is queued, and the next wait for
        ``name`` takes the oldest queued when it opens. Returns ``applied``, ``queued`` or, for a
        ``dedupe_key`` sent before, ``already_applied``. Raises TransitionRefused once the
        workflow has ended."""
        if dedupe_key and any(s["dedupe_key"] == dedupe_key for s in self._signals):
            return "already_applied"
        if self.status in ("completed", "failed", "cancelled"):
            raise TransitionRefused(f"Workflow {self.workflow_id} is {self.status}; it takes no more signals.")
        signal = {"name": name, "payload": _stored(payload), "dedupe_key": dedupe_key, "consumed_by": None}
        self._signals.append(signal)
        wait = next((w for w in self.open_waits.values() if w.kind in ("event", "first") and w.event_name == name),
                    None)
        self._event("signal.received", name=name, queued=wait is None)
        if wait is None:
            return "queued"
        oldest = next(s for s in self._signals if s["name"] == name and s["consumed_by"] is None)
        if wait.kind == "first":
            won = self._settle_first(wait, signal=oldest)
            self._collect()
            return "applied" if won == "signal" else "queued"
        self._signal_consume(wait, oldest)
        self._record_wake()
        return "applied"

    def approve(self, *, by: str = "approver", comment: str = "", candidate_hash: str | None = None) -> None:
        """Approve the open approval as ``by``; ``candidate_hash`` (default: the wait's own) is the
        candidate the approver saw: another one is refused with ``WaitRefused``, as the services do."""
        op = self._open_wait("approval")
        bound = self.open_waits[op].candidate_hash
        if candidate_hash is not None and candidate_hash != bound:
            raise WaitRefused(f"Wait {op} is bound to candidate {bound[:12]}…, not {candidate_hash[:12] or '(none)'}…; "
                              "reopen the approval queue or `agent show` to decide on the current candidate.")
        self._wait_close(op, "satisfied")
        self._event("wait.approved", wait=op, by=by, comment=comment)
        self._record(Step(op, self.node, "approval", "", "satisfied", decision="approved", decided_by=by,
                          comment=comment))

    def reject(self, *, by: str = "approver", comment: str = "") -> None:
        op = self._open_wait("approval")
        self._wait_close(op, "satisfied")
        self._event("wait.rejected", wait=op, by=by, comment=comment)
        self._record(Step(op, self.node, "approval", "", "satisfied", decision="rejected", decided_by=by,
                          comment=comment))

    def expire(self) -> None:
        """Let the open approval or event wait run out: the clock moves to its expiry (firing
        what falls due before it)."""
        op = next((op for op, w in self.open_waits.items() if w.kind in ("approval", "event")), None)
        if op is None:
            raise AssertionError(f"Workflow is at {self.node} with no approval or event wait open.")
        timer = next((t for t in self._timers if t.wait == op), None)
        if timer is not None:
            self._clock_to(timer.fire_at)
            return
        wait = self.open_waits[op]  # no timeout: it runs out now
        self._wait_close(op, "expired")
        self._record(Step(op, self.node, wait.kind, wait.event_name, "expired"))

    def fire_timer(self) -> None:
        """Let the open ``ctx.sleep`` end, or the timeout of the open ``ctx.wait_first`` pass (the
        timer wins it: its children are cancelled): the clock moves to its wake time (firing what
        falls due before it)."""
        race = self._open_first(lambda w: w.expires_in_seconds is not None)
        op = race.operation_id if race is not None else self._open_wait("timer")
        timer = next(t for t in self._timers if t.wait == op)
        self._clock_to(timer.fire_at)

    def finish_child(self, kind: str, *, status: str = "completed", result: Any = None, reason: str = "",
                     workflow_id: int = 0) -> None:
        """End the oldest running child of ``kind`` (``ctx.child``) with ``status`` (completed,
        failed or cancelled) and ``result`` or ``reason``, as its workflow would, and advance."""
        op = next((op for op, c in self.children.items() if c.kind == kind and not c.cancelling), None)
        if op is None:
            running = ", ".join(c.kind for c in self.children.values() if not c.cancelling) or "none"
            raise AssertionError(f"Workflow is at {self.node} ({self.status}) with no running child of kind "
                                 f"{kind!r}; running children: {running}.")
        payload = {"workflow_id": workflow_id or self.children[op].workflow_id, "status": status,
                   "result": _stored(codec.to_json(result)) if status == "completed" else None, "reason": reason}
        self._child_end(op, payload)
        race = self._open_first(lambda w: op in w.children)
        if race is not None:  # its end wins the race: the others are cancelled, a signal stays queued
            self._settle_first(race)
            self._collect()
            return
        self._record_wake()

    def resume(self) -> None:
        """Resume as ``agent resume`` does: a workflow its definition paused goes on; failed
        compensations (of a workflow in any state) are asked for again."""
        retried = self._compensations_retry()
        if self.status == "paused" and self._pause_cause == "budget":
            raise TransitionRefused(f"Workflow {self.workflow_id} is paused because its budget ran out; raise the "
                                    "budget (run.set_budget), which resumes it.")
        if self.status != "paused":
            if retried:
                return
            raise AssertionError(f"Workflow is {self.status} at {self.node}, not paused.")
        self.status, self.reason = "running", ""
        self.advance()
        self._collect()

    # The engine loop -----------------------------------------------------------------------

    def advance(self) -> None:
        """Run handlers until the definition needs an answer, completes or fails, as the services do;
        except that a NonDeterminismError propagates (the services fail the workflow with it), so a
        test sees it at once."""
        for _ in range(100):
            if self.status == "cancelling":
                self._advance_cancellation()
                return
            if self.status not in ("running", "waiting"):
                return
            ctx: engine.NodeContext[Any] = engine.NodeContext(
                self._snapshot(), self._visit_activities(), self._visit_waits)
            decision = engine.decide(self.definition, ctx)
            if isinstance(decision, engine.Suspended):
                applied = self._apply(decision.commands)
                if applied is None:
                    return  # paused: a child's budget did not fit
                if applied:
                    continue
                own = [op for op in self.pending if op not in self._compensations]
                self.status = "waiting" if (self.open_waits or self.children) and not own else "running"
                return
            if isinstance(decision, engine.Goto):
                self._enter_node(decision.node, decision.updates)
                if decision.pause:
                    self.status, self.reason, self._pause_cause = "paused", decision.pause, "definition"
                    self._event("workflow.paused", reason=decision.pause, cause="definition", node=self.node)
                    return
                continue
            if isinstance(decision, engine.Complete):
                self._complete(decision.result)
            else:
                self._fail(decision.reason)
            return
        raise AssertionError(f"More than 100 node changes without waiting; the definition loops ({self.path[-5:]}).")

    def _apply(self, commands: tuple[engine.Command, ...]) -> bool | None:
        """Take new steps; True when a recorded answer (replay) or a queued signal lets the handler
        run again at once; None when the workflow paused instead (a child's budget did not fit)."""
        for command in commands:
            step = self._recorded.pop(command.operation_id, None)
            if step is not None:
                self.history.append(step)
                return True
            op = command.operation_id
            if isinstance(command, engine.StartChild):
                if op not in self.children and not self._child_start(command):
                    return None
            elif isinstance(command, engine.ScheduleActivity):
                if op not in self.pending:
                    self.pending[op] = command
                    self._event("activity.scheduled", operation_id=op, name=command.name)
            elif op not in self.open_waits and self._wait_open(command):
                return True
        # Starting children does not stop the handler: it runs again and finds them started.
        return bool(commands) and isinstance(commands[-1], engine.StartChild)

    def _wait_open(self, wait: engine.OpenWait) -> bool:
        """``services.waits.wait_open``: True when a queued signal (or a race's ended child) answered it."""
        self.open_waits[wait.operation_id] = wait
        self._wait_status[wait.operation_id] = "open"
        self._timer_set(wait)
        expires = next((t.fire_at.isoformat() for t in self._timers if t.wait == wait.operation_id), None)
        self._event("wait.opened", wait=wait.operation_id, wait_kind=wait.kind, expires_at=expires)
        if wait.kind == "event":
            oldest = next((s for s in self._signals if s["name"] == wait.event_name and s["consumed_by"] is None),
                          None)
            if oldest is not None:
                self._signal_consume(wait, oldest)
                return True
        if wait.kind == "first" and self._settle_first(wait, advance=False):
            return True
        return False

    def _signal_consume(self, wait: engine.OpenWait, signal: dict[str, Any]) -> None:
        signal["consumed_by"] = wait.operation_id
        self._wait_close(wait.operation_id, "satisfied")
        self._event("wait.satisfied", wait=wait.operation_id, signal=signal["name"])
        self._history_add(Step(wait.operation_id, self.node, "event", wait.event_name, "satisfied",
                               result=signal["payload"]))

    def _settle_first(self, race: engine.OpenWait, *, signal: dict[str, Any] | None = None,
                      timer_fired: bool = False, advance: bool = True) -> str:
        """``services.races.first_wait_settle``: a child of the race that ended wins (the first in
        the order given), then the signal (the oldest queued), then the timer; the losers are
        closed (the race's timer ignored, its other children cancelled, a signal left queued)."""
        ended = {s.operation_id: s for s in self.history if s.kind == "child"}
        winner = next((op for op in race.children if op in ended), None)
        payload: dict[str, Any]
        if winner is not None:
            child = ended[winner]
            payload = {"won": "child", "operation_id": winner, "kind": child.name, "child": child.result}
        else:
            if signal is None and race.event_name:
                signal = next((s for s in self._signals if s["name"] == race.event_name and s["consumed_by"] is None),
                              None)
            if signal is not None:
                payload = {"won": "signal", "signal": signal["name"], "payload": signal["payload"]}
            elif timer_fired:
                payload = {"won": "timer"}
            else:
                return ""
        won = str(payload["won"])
        self._wait_close(race.operation_id, "satisfied")
        if won == "signal" and signal is not None:
            signal["consumed_by"] = race.operation_id
        self._timers = [t for t in self._timers if t.wait != race.operation_id]
        losers = [op for op in race.children if op != winner]
        self._children_cancel(why=f"lost first-of wait {race.operation_id} to the {won}", by=f"first-of wait "
                              f"{race.operation_id}", only=losers)
        self._event("wait.first_won", wait=race.operation_id, won=won,
                    **({"operation_id": winner} if winner is not None else {}),
                    **({"signal": payload["signal"]} if won == "signal" else {}))
        self._history_add(Step(race.operation_id, self.node, "first", race.event_name, "satisfied", result=payload))
        if advance:
            self._record_wake()
        return won

    def _record(self, step: Step) -> None:
        self._history_add(step)
        self._record_wake()

    def _record_wake(self) -> None:
        if self.status == "waiting":
            self.status = "running"
        self.advance()
        self._collect()

    def _history_add(self, step: Step) -> None:
        """Keep the steps in the order a replay asks for them: visit by visit, each visit's in the
        order its handler asks (a cancelled child's end comes after later steps of its visit, or
        after the visit was left)."""
        at = len(self.history)
        while at > 0 and _replay_order(self.history[at - 1]) > _replay_order(step):
            at -= 1
        self.history.insert(at, step)

    def _open_first(self, matches: Any) -> engine.OpenWait | None:
        return next((w for w in self.open_waits.values() if w.kind == "first" and matches(w)), None)

    def _snapshot(self) -> engine.WorkflowSnapshot:
        return engine.WorkflowSnapshot(
            workflow_id=self.workflow_id, kind=self.definition.kind, node=self.node, node_visit=self.node_visit,
            intent_version=self.intent_version, load_goal=lambda: self.goal, params=dict(self.params),
            state=dict(self.state), release_fingerprint=self.release_fingerprint,
            definition_version=self.definition_version,
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
                                           payload=None, name=c.kind) for op, c in self.children.items()}
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


def _replay_order(step: Step) -> tuple[int, int]:
    """(node visit, position in the handler) of a step, from its operation id (``wf-1/NODE.2/i1/0``)."""
    return int(step.operation_id.split("/")[1].rsplit(".", 1)[1]), step.seq
