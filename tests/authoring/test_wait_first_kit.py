"""``ctx.wait_first`` in the test kit: each winner, the losers closed, and the recorded run replays."""
from __future__ import annotations

from typing import Any

import pytest

from workflows.engine import Complete, Decision, Fail, NodeContext, WorkflowDefinition, node
from workflows.errors import InvalidDecision, NonDeterminismError
from workflows.testing import WorkflowRun, replay

WEEK = 7 * 86400


class Chaser(WorkflowDefinition):
    """Escalates an unpaid invoice to a reminder child, ended by whichever comes first."""

    kind = "test-kit-chaser"
    start_node = "ESCALATE"
    revalidate_node = "ESCALATE"

    @node("ESCALATE")
    def escalate(self, ctx: NodeContext[Any]) -> Decision:
        reminders = ctx.child("test-deployer", "Remind the customer", {"n": 1})
        first = ctx.wait_first(signal="paid", children=[reminders], timeout_seconds=WEEK)
        if first.signalled:
            return Complete({"paid": first.payload})
        if first.timed_out:
            return Fail("Still unpaid after a week of reminders.")
        assert first.child is not None
        return Complete({"reminders": first.child.status, "child": first.operation_id})


def test_the_signal_wins_and_cancels_the_child() -> None:
    run = WorkflowRun(Chaser)
    assert run.status == "waiting" and list(run.children) == ["wf-1/ESCALATE.1/i1/0"]
    assert [w.kind for w in run.open_waits.values()] == ["first"]
    run.signal("paid", {"amount": "120.00"})
    assert (run.status, run.result) == ("completed", {"paid": {"amount": "120.00"}})
    assert not run.children
    child_end = next(s for s in run.history if s.kind == "child")
    assert child_end.result["status"] == "cancelled" and "lost first-of wait" in child_end.result["reason"]
    assert replay(Chaser, run.history) is None


def test_the_childs_end_wins() -> None:
    run = WorkflowRun(Chaser)
    run.finish_child("test-deployer", result={"sent": 3})
    assert (run.status, run.result) == ("completed", {"reminders": "completed", "child": "wf-1/ESCALATE.1/i1/0"})
    assert replay(Chaser, run.history) is None


def test_the_timer_wins_and_cancels_the_child() -> None:
    run = WorkflowRun(Chaser)
    run.fire_timer()
    assert (run.status, run.reason) == ("failed", "Still unpaid after a week of reminders.")
    assert not run.children and replay(Chaser, run.history) is None


def test_a_race_of_another_signal_no_longer_replays() -> None:
    run = WorkflowRun(Chaser)
    run.signal("paid", {"amount": "1"})

    class Renamed(Chaser):
        @node("ESCALATE")
        def escalate(self, ctx: NodeContext[Any]) -> Decision:
            reminders = ctx.child("test-deployer", "Remind the customer", {"n": 1})
            ctx.wait_first(signal="settled", children=[reminders], timeout_seconds=WEEK)
            return Complete()

    divergence = replay(Renamed, run.history)
    assert divergence is not None and "first-of wait for 'paid'" in divergence.reason
    with pytest.raises(NonDeterminismError, match="now asks for a first-of wait for 'settled'"):
        WorkflowRun(Renamed, recorded=run.history)


def test_a_race_with_nothing_to_wait_for_is_a_bug_of_the_definition() -> None:
    class Empty(WorkflowDefinition):
        kind = "test-kit-empty-race"
        start_node = "WAIT"
        revalidate_node = "WAIT"

        @node("WAIT")
        def wait(self, ctx: NodeContext[Any]) -> Decision:
            ctx.wait_first()
            return Complete()

    with pytest.raises(InvalidDecision, match="with nothing to wait for"):
        WorkflowRun(Empty)
