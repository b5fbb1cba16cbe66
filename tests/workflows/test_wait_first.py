"""ctx.wait_first: whichever of a signal, a child's end and a timer comes first wins, once, under
the parent's row lock; the losers are closed (the child cancelled and its deployment undone, the
timer ignored, a losing signal left queued), and nothing that comes later wakes the parent again."""
from __future__ import annotations

from collections.abc import Iterator
from datetime import timedelta
from typing import Any

import pytest

import tests.child_kinds  # noqa: F401 - registers test-deployer
from tests.conftest import drive, write_while_held
from workflows import clock, replay, services
from workflows.engine import Complete, Decision, Goto, NodeContext, WorkflowDefinition, node
from workflows.models import Activity, Commitment, Event, Signal, Timer, Wait, Workflow
from workflows.services import Outcome
from workflows.services.children import children_collect_if_finished
from workflows.testing import registered

pytestmark = [pytest.mark.django_db, pytest.mark.usefixtures("rung", "deploy_target")]

CHASER = "test-chaser"
WEEK = 7 * 86400


class Chaser(WorkflowDefinition):
    """An unpaid invoice escalated to a child that holds a deployment (standing in for reminders
    sent, each undone when cancelled), until the invoice is paid, the child ends or a week passes."""

    kind = CHASER
    start_node = "ESCALATE"
    revalidate_node = "ESCALATE"

    @node("ESCALATE")
    def escalate(self, ctx: NodeContext[Any]) -> Decision:
        reminders = ctx.child("test-deployer", "Remind the customer", {"n": 1})
        first = ctx.wait_first(signal="paid", children=[reminders], timeout_seconds=WEEK)
        if first.signalled:
            (undone,) = ctx.wait_children(reminders)  # its reminders are withdrawn before the parent ends
            return Complete({"won": "signal", "paid": first.payload, "child": undone.status})
        if first.timed_out:
            return Complete({"won": "timer"})
        assert first.child is not None
        return Goto("THANK", {"child": first.child.status})

    @node("THANK")
    def thank(self, ctx: NodeContext[Any]) -> Decision:
        paid = ctx.wait_for_event("paid")  # the signal the child's end beat is still queued for this wait
        return Complete({"won": "child", "child": ctx.state["child"], "paid": paid.payload})


@pytest.fixture(autouse=True)
def chaser() -> Iterator[None]:
    with registered(Chaser):
        yield


def child_of(parent: int) -> Workflow:
    return Workflow.objects.filter(parent_id=parent).order_by("-pk").first()  # type: ignore[return-value]


def drive_tree(parent: int, *, rounds: int = 6) -> Workflow:
    """Drive the parent and its children in process, delivering each child's end as its doorbell would."""
    for _ in range(rounds):
        drive(parent)
        for child in Workflow.objects.filter(parent_id=parent):
            drive(child.pk)
        children_collect_if_finished(workflow_id=parent)
    return drive(parent)


def kinds(workflow_id: int, kind: str) -> list[dict[str, Any]]:
    return list(Event.objects.filter(workflow_id=workflow_id, kind=kind).order_by("seq")
                .values_list("data", flat=True))


def race(parent: int) -> Wait:
    return Wait.objects.filter(workflow_id=parent, kind=Wait.Kind.FIRST).order_by("-pk").first()  # type: ignore[return-value]


def paid(parent: int, **kwargs: Any) -> services.Result:
    return services.workflow_signal(workflow_id=parent, name="paid", payload={"amount": "120.00"}, **kwargs)


@pytest.fixture
def chasing() -> Workflow:
    """A chaser waiting first-of, its child holding a deployment (an active commitment)."""
    parent = services.workflow_launch(kind=CHASER, goal="Collect INV-7")
    drive_tree(parent.pk, rounds=2)
    parent.refresh_from_db()
    assert (parent.status, race(parent.pk).status) == ("waiting", "open")
    assert child_of(parent.pk).current_node == "HOLD"
    assert Commitment.objects.filter(workflow=child_of(parent.pk), status="active").count() == 1
    return parent


def assert_undone(deploy_target: Any) -> None:
    assert Commitment.objects.filter(status="active").count() == 0
    assert all(e == {"created": 1, "deleted": 1} for e in deploy_target.store.stats()["effects"].values())


def test_the_signal_wins_cancels_the_child_and_undoes_its_deployment(chasing: Workflow, deploy_target: Any) -> None:
    result = paid(chasing.pk)
    assert (result.outcome, result.message) == (Outcome.APPLIED,
                                                f"Signal 'paid' delivered to wait {race(chasing.pk).pk}.")
    kid = child_of(chasing.pk)
    assert kid.status == "cancelling" and kid.reason == (
        f"parent workflow {chasing.pk} lost first-of wait {race(chasing.pk).pk} to the signal")
    assert Timer.objects.get(wait=race(chasing.pk)).status == "ignored"
    assert [e["won"] for e in kinds(chasing.pk, "wait.first_won")] == ["signal"]

    done = drive_tree(chasing.pk)

    assert (done.status, done.result) == ("completed", {"won": "signal", "paid": {"amount": "120.00"},
                                                        "child": "cancelled"})
    assert Activity.objects.filter(workflow=kid, name="undeploy", status="succeeded").count() == 1
    assert_undone(deploy_target)
    assert replay.check(replay.history_of(done)) is None


def test_the_childs_end_wins_and_the_signal_stays_queued_for_a_later_wait(chasing: Workflow) -> None:
    kid = child_of(chasing.pk)
    services.workflow_signal(workflow_id=kid.pk, name="finish")
    assert drive(kid.pk).status == "completed"
    # Its end has not reached the parent when the payment comes: the child's end, committed first, wins.
    result = paid(chasing.pk)
    assert result.outcome == Outcome.QUEUED and "which won; the signal is queued" in result.message
    assert race(chasing.pk).payload["won"] == "child"
    assert Signal.objects.get(workflow=chasing, name="paid").consumed_by is None
    assert Timer.objects.get(wait=race(chasing.pk)).status == "ignored"

    done = drive_tree(chasing.pk)

    assert (done.status, done.result) == ("completed", {"won": "child", "child": "completed",
                                                        "paid": {"amount": "120.00"}})
    # The deployment the child handed over is the root's outcome: released, not undone.
    assert Commitment.objects.get().status == "released"
    assert children_collect_if_finished(workflow_id=chasing.pk) == 0
    assert replay.check(replay.history_of(done)) is None


def test_the_childs_end_collected_wins_and_a_later_signal_reaches_the_next_wait(chasing: Workflow) -> None:
    kid = child_of(chasing.pk)
    services.workflow_signal(workflow_id=kid.pk, name="finish")
    drive(kid.pk)
    assert children_collect_if_finished(workflow_id=chasing.pk) == 1
    assert children_collect_if_finished(workflow_id=chasing.pk) == 0  # a duplicate doorbell
    assert len(kinds(chasing.pk, "wait.first_won")) == 1
    parent = drive(chasing.pk)
    assert (parent.status, parent.current_node) == ("waiting", "THANK")
    assert paid(chasing.pk).outcome == Outcome.APPLIED
    assert drive(chasing.pk).result["won"] == "child"


def test_the_timer_wins_cancels_the_child_and_undoes_its_deployment(chasing: Workflow, deploy_target: Any) -> None:
    timer = Timer.objects.get(wait=race(chasing.pk))
    Timer.objects.filter(pk=timer.pk).update(fire_at=clock.now() - timedelta(seconds=1))
    assert services.timers_fire_due() == 1
    assert services.timers_fire_due() == 0
    assert child_of(chasing.pk).status == "cancelling"

    done = drive_tree(chasing.pk)

    assert (done.status, done.result) == ("completed", {"won": "timer"})
    assert_undone(deploy_target)
    # The payment after the race is no answer to it: queued, never delivered to it.
    with pytest.raises(Exception, match="is completed; it takes no more signals"):
        paid(chasing.pk)
    assert [e["won"] for e in kinds(chasing.pk, "wait.first_won")] == ["timer"]


def test_duplicate_doorbells_settle_the_race_once_and_wake_the_parent_once(chasing: Workflow) -> None:
    woken = len(kinds(chasing.pk, "workflow.woken"))
    assert paid(chasing.pk, dedupe_key="bank-1").outcome == Outcome.APPLIED
    assert paid(chasing.pk, dedupe_key="bank-1").outcome == Outcome.ALREADY_APPLIED
    services.workflow_advance_if_runnable(workflow_id=chasing.pk)
    services.workflow_advance_if_runnable(workflow_id=chasing.pk)  # a duplicate advance doorbell
    assert Workflow.objects.get(pk=chasing.pk).status == "waiting"  # for its child's cancel to finish
    kid = child_of(chasing.pk)
    drive(kid.pk)
    assert children_collect_if_finished(workflow_id=chasing.pk) == 1
    assert children_collect_if_finished(workflow_id=chasing.pk) == 0
    Timer.objects.filter(wait=race(chasing.pk)).update(fire_at=clock.now() - timedelta(seconds=1))
    assert services.timers_fire_due() == 0  # ignored when the signal won: nothing left to fire
    assert len(kinds(chasing.pk, "wait.first_won")) == 1
    # Once by the signal, once by the end of the child it waits for (ctx.wait_children).
    assert len(kinds(chasing.pk, "workflow.woken")) == woken + 2
    assert drive(chasing.pk).result["won"] == "signal"


def test_a_loser_ending_while_the_parent_waits_for_something_else_wakes_nothing() -> None:
    """After the signal won, the handler waits for another signal: the cancelled child's end is
    recorded and the parent stays waiting."""

    class PaidThenFiled(Chaser):
        kind = "test-chaser-filed"

        @node("ESCALATE")
        def escalate(self, ctx: NodeContext[Any]) -> Decision:
            reminders = ctx.child("test-deployer", "Remind the customer", {"n": 1})
            ctx.wait_first(signal="paid", children=[reminders], timeout_seconds=WEEK)
            return Complete({"filed": ctx.wait_for_event("filed").payload})

    with registered(PaidThenFiled):
        parent = services.workflow_launch(kind="test-chaser-filed", goal="Collect and file")
        drive_tree(parent.pk, rounds=2)
        paid(parent.pk)
        drive(parent.pk)
        woken = len(kinds(parent.pk, "workflow.woken"))
        drive(child_of(parent.pk).pk)
        assert children_collect_if_finished(workflow_id=parent.pk) == 1
        parent.refresh_from_db()
        assert parent.status == "waiting" and len(kinds(parent.pk, "workflow.woken")) == woken
        services.workflow_signal(workflow_id=parent.pk, name="filed", payload="ok")
        assert drive(parent.pk).result == {"filed": "ok"}


@pytest.mark.django_db(transaction=True)
def test_a_childs_end_committing_while_the_signal_comes_wins_and_the_signal_stays_queued(
    chasing: Workflow,
) -> None:
    """The child's completion holds its row; the payment locks the parent, then waits for the
    child's row (parent first, child second) and, once the child has completed, lets it win."""
    kid = child_of(chasing.pk)
    services.workflow_signal(workflow_id=kid.pk, name="finish")

    _, answer = write_while_held(lambda: services.workflow_advance_if_runnable(workflow_id=kid.pk),
                                 lambda: paid(chasing.pk))

    assert isinstance(answer, services.Result) and answer.outcome == Outcome.QUEUED
    assert Workflow.objects.get(pk=kid.pk).status == "completed"
    assert race(chasing.pk).payload["won"] == "child"
    assert drive_tree(chasing.pk).result == {"won": "child", "child": "completed", "paid": {"amount": "120.00"}}


@pytest.mark.django_db(transaction=True)
def test_a_signal_holding_the_child_lets_its_end_find_it_cancelled(chasing: Workflow, deploy_target: Any) -> None:
    """The payment holds the parent's row and the child's; the child's advance waits, then finds
    the child cancelling and undoes its deployment instead of completing."""
    kid = child_of(chasing.pk)
    services.workflow_signal(workflow_id=kid.pk, name="finish")  # its advance would complete it

    write_while_held(lambda: paid(chasing.pk), lambda: services.workflow_advance_if_runnable(workflow_id=kid.pk))

    assert Workflow.objects.get(pk=kid.pk).status in ("cancelling", "cancelled")
    assert race(chasing.pk).payload["won"] == "signal"
    done = drive_tree(chasing.pk)
    assert done.result["won"] == "signal"
    assert_undone(deploy_target)


def test_cancelling_the_parent_while_it_waits_closes_the_race_and_undoes_the_childs_deployment(
    chasing: Workflow, deploy_target: Any,
) -> None:
    services.workflow_cancel(workflow_id=chasing.pk, reason="written off", by="ops")
    assert race(chasing.pk).status == "cancelled"
    assert Timer.objects.get(wait=race(chasing.pk)).status == "ignored"
    assert drive_tree(chasing.pk).status == "cancelled"
    assert_undone(deploy_target)
    assert not kinds(chasing.pk, "wait.first_won")
    assert children_collect_if_finished(workflow_id=chasing.pk) == 0


def test_a_new_goal_while_it_waits_starts_a_new_race_the_signal_then_wins(
    chasing: Workflow, deploy_target: Any,
) -> None:
    old = race(chasing.pk)
    services.workflow_supersede(workflow_id=chasing.pk, goal="Collect INV-7 and INV-8")
    assert Wait.objects.get(pk=old.pk).status == "invalidated"
    first_child = child_of(chasing.pk)
    assert first_child.status == "cancelling"
    drive_tree(chasing.pk, rounds=2)
    new = race(chasing.pk)
    assert new.pk != old.pk and new.intent_version == 2 and new.status == "open"
    # The old race's timer fires into nothing.
    Timer.objects.filter(wait=old).update(fire_at=clock.now() - timedelta(seconds=1))
    assert services.timers_fire_due() == 1
    assert Timer.objects.get(wait=old).status == "ignored"
    assert Workflow.objects.get(pk=chasing.pk).status == "waiting"

    assert paid(chasing.pk).outcome == Outcome.APPLIED
    done = drive_tree(chasing.pk)
    assert done.result == {"won": "signal", "paid": {"amount": "120.00"}, "child": "cancelled"}
    assert Workflow.objects.get(pk=first_child.pk).status == "cancelled"
    assert_undone(deploy_target)


def test_a_release_change_after_the_childs_deployment_keeps_the_signals_win(chasing: Workflow, settings: Any) -> None:
    settings.AGENTOPS_PROMPT_VERSION = "chaser-prompt-2"
    assert paid(chasing.pk).outcome == Outcome.APPLIED
    assert [e["node"] for e in kinds(chasing.pk, "release.kept_course")] == ["ESCALATE"]
    assert drive_tree(chasing.pk).result["won"] == "signal"


def test_a_release_change_before_any_effect_revalidates_and_the_new_race_takes_the_signal(settings: Any) -> None:
    parent = drive(services.workflow_launch(kind=CHASER, goal="Collect INV-7").pk)  # the child has not deployed
    assert parent.status == "waiting" and not Commitment.objects.exists()
    settings.AGENTOPS_PROMPT_VERSION = "chaser-prompt-2"

    assert paid(parent.pk).outcome == Outcome.APPLIED

    assert [e["name"] for e in kinds(parent.pk, "signal.requeued")] == ["paid"]
    done = drive_tree(parent.pk)
    assert done.result == {"won": "signal", "paid": {"amount": "120.00"}, "child": "cancelled"}
    assert [e["won"] for e in kinds(parent.pk, "wait.first_won")] == ["signal", "signal"]
    assert Workflow.objects.filter(parent=parent, status="cancelled").count() == 2
