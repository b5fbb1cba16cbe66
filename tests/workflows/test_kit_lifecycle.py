"""The in-memory test kit (``WorkflowRun``) through the lifecycle: a cancel and its compensations,
a new goal, children and their budget shares, signals queued before their wait, timers on the
run's virtual clock and the first-of wait, with the events and commitments the services would
record. Where it matters most, the same definition runs against the database services too and
the two are compared."""
from __future__ import annotations

import os
import subprocess
import sys
from datetime import timedelta
from decimal import Decimal
from pathlib import Path
from typing import Any

import pytest

from workflows import services
from workflows.engine import ActivityFailed, Complete, Decision, Fail, Goto, NodeContext, WorkflowDefinition, node
from workflows.errors import Permanent, TransitionRefused
from workflows.models import Event as EventRow
from workflows.models import Workflow
from workflows.registry import CompensationInput, activity
from workflows.testing import Commitment, WorkflowRun, registered, replay
from workflows.testing.database import doorbells_recorded, drive, launch
from workflows.testing.lifecycle import EVENT_KINDS

HOUR = 3600


@activity
def unbook(ctx: Any, input: CompensationInput) -> dict[str, Any]:
    return {"undone": input.operation_id, "key": input.sent_key}


@activity(commitment="booking", compensation=unbook)
def book(ctx: Any, input: dict[str, Any]) -> dict[str, Any]:
    return {"booked": input["what"]}


class Trip(WorkflowDefinition):
    """Books a room, then a flight (two effects), then waits for the traveller's go."""

    kind = "test-kit-trip"
    start_node = "ROOM"
    revalidate_node = "ROOM"

    @node("ROOM")
    def room(self, ctx: NodeContext[Any]) -> Decision:
        return Goto("FLIGHT", {"room": ctx.activity(book, {"what": f"room for {ctx.goal}"})})

    @node("FLIGHT")
    def flight(self, ctx: NodeContext[Any]) -> Decision:
        return Goto("CONFIRM", {"flight": ctx.activity(book, {"what": "flight"})})

    @node("CONFIRM")
    def confirm(self, ctx: NodeContext[Any]) -> Decision:
        go = ctx.wait_for_event("go", timeout_seconds=2 * HOUR)
        return Complete({"go": go.payload}) if not go.expired else Fail("No go within two hours.")


TRIP = (Trip, book, unbook)


def booked_trip(workflow_id: int = 1) -> WorkflowRun:
    run = WorkflowRun(Trip, goal="Ada", workflow_id=workflow_id)
    run.run(book)
    run.run(book)
    assert (run.status, run.node) == ("waiting", "CONFIRM")
    return run


def compared(events: Any) -> list[tuple[str, str]]:
    """Events as both tiers record them: the kind, and the operation of an activity or child event."""
    out = []
    for kind, data in events:
        if kind not in EVENT_KINDS or str(data.get("operation_id", "")).endswith("/notify"):
            continue
        out.append((kind, data.get("operation_id", "") if kind.startswith(("activity.", "child.")) else ""))
    return out


def real_events(workflow: Workflow) -> list[tuple[str, str]]:
    return compared(EventRow.objects.filter(workflow=workflow).order_by("seq").values_list("kind", "data"))


def kit_events(run: WorkflowRun) -> list[tuple[str, str]]:
    return compared((e.kind, e.data) for e in run.events)


# Cancel and compensation -----------------------------------------------------------------------

def test_a_cancel_compensates_the_effects_newest_first_then_ends_cancelled() -> None:
    run = booked_trip()
    room, flight = (c.operation_id for c in run.commitments)
    assert [c.kind for c in run.commitments] == ["booking", "booking"]

    assert run.cancel("trip called off", by="ada") == "suspended"
    assert (run.status, run.reason) == ("cancelling", "trip called off")
    (undo,) = run.pending.values()
    assert (undo.name, undo.input["operation_id"]) == ("unbook", flight)  # the newest first
    assert run.run(unbook) == {"undone": flight, "key": flight}
    (undo,) = run.pending.values()
    assert undo.input["operation_id"] == room and undo.input["data"] == {"booked": "room for Ada"}
    run.complete(unbook, {"undone": room})

    assert (run.status, run.commitments, run.pending) == ("cancelled", [], {})
    assert [e.kind for e in run.events][-8:] == [
        "workflow.cancelling", "activity.scheduled", "activity.succeeded", "commitment.compensated",
        "activity.scheduled", "activity.succeeded", "commitment.compensated", "workflow.cancelled"]
    assert run.events[-1].data == {"by": "ada"}
    assert run.cancel() == "already_applied"
    with pytest.raises(TransitionRefused, match="it takes no more signals"):
        run.signal("go")


@pytest.mark.django_db
def test_the_kit_cancels_and_compensates_as_the_services_do() -> None:
    with registered(*TRIP), doorbells_recorded():
        workflow = drive(launch("test-kit-trip", goal="Ada"))
        assert (workflow.status, workflow.current_node) == ("waiting", "CONFIRM")
        services.workflow_cancel(workflow_id=workflow.pk, reason="trip called off", by="ada")
        workflow = drive(workflow)
        run = booked_trip(workflow_id=workflow.pk)
        run.cancel("trip called off", by="ada")
        run.run(unbook)
        run.run(unbook)
    assert (run.status, run.reason) == (workflow.status, workflow.reason) == ("cancelled", "trip called off")
    assert kit_events(run) == real_events(workflow)
    assert not workflow.commitments.filter(status="active").exists() and run.commitments == []


def test_a_failed_compensation_keeps_the_workflow_cancelling_until_resumed() -> None:
    run = booked_trip()
    run.cancel()
    assert run.reason == "cancelled by tester"
    run.fail(unbook, "the airline is down")
    assert run.status == "cancelling" and "failed after its attempts: the airline is down" in run.reason
    assert run.events[-1].kind == "compensation.failed" and len(run.commitments) == 2
    run.resume()  # tries it again
    assert run.events[-1].kind == "compensation.retried"
    run.run(unbook)
    run.run(unbook)
    assert run.status == "cancelled"


def test_a_completed_workflow_keeps_its_effects_and_cannot_be_cancelled() -> None:
    run = booked_trip()
    run.signal("go", {"at": "9:00"})
    assert (run.status, run.result) == ("completed", {"go": {"at": "9:00"}})
    assert [c.status for c in run.commitments] == ["released", "released"]
    with pytest.raises(TransitionRefused, match="already completed; there is nothing to cancel"):
        run.cancel()


def test_a_failure_compensates_every_effect_at_once() -> None:
    run = booked_trip()
    run.advance_clock(hours=2)
    assert (run.status, run.reason) == ("failed", "No go within two hours.")
    assert sorted(c.input["operation_id"] for c in run.pending.values()) == sorted(
        c.operation_id for c in run.commitments)
    run.run(unbook)
    run.run(unbook)
    assert (run.status, run.commitments) == ("failed", [])


# A new goal --------------------------------------------------------------------------------------

def test_a_new_goal_undoes_the_old_goal_s_effects_and_revalidates() -> None:
    run = booked_trip()
    run.supersede("Bob", by="lead")
    assert (run.intent_version, run.goal, run.node) == (2, "Bob", "ROOM")
    kinds = [e.kind for e in run.events]
    assert kinds[kinds.index("wait.invalidated"):] == [
        "wait.invalidated", "activity.scheduled", "activity.scheduled", "intent.superseded", "node.entered",
        "activity.scheduled"]
    (new_room,) = [c for c in run.pending.values() if c.name == "book"]
    assert new_room.operation_id == "wf-1/ROOM.4/i2/0" and new_room.input == {"what": "room for Bob"}
    run.run(unbook)
    run.run(unbook)
    assert run.commitments == [] and run.status == "running"
    run.advance_clock(hours=3)  # the old goal's timeout fires late and is ignored
    assert run.events[-1].kind == "timer.ignored" and "superseded by v2" in run.events[-1].data["reason"]
    run.cancel()
    with pytest.raises(TransitionRefused, match="its goal can no longer change"):
        run.supersede("Carol")


@pytest.mark.django_db
def test_the_kit_supersedes_as_the_services_do() -> None:
    with registered(*TRIP), doorbells_recorded():
        workflow = drive(launch("test-kit-trip", goal="Ada"))
        services.workflow_supersede(workflow_id=workflow.pk, goal="Bob")
        workflow = drive(workflow)  # the compensations and the new room's booking run
        run = booked_trip(workflow_id=workflow.pk)
        run.supersede("Bob", by="")
        run.run(unbook)
        run.run(unbook)
        run.run(book)
        run.run(book)
    assert (run.status, run.node) == (workflow.status, workflow.current_node) == ("waiting", "CONFIRM")
    assert kit_events(run) == real_events(workflow)


# Children --------------------------------------------------------------------------------------

class Survey(WorkflowDefinition):
    """Asks two children, the first with a budget of its own, the second with what remains."""

    kind = "test-kit-survey"
    start_node = "ASK"
    revalidate_node = "ASK"

    @node("ASK")
    def ask(self, ctx: NodeContext[Any]) -> Decision:
        handles = [ctx.child("test-kit-trip", "Ada", budget="0.25"), ctx.child("test-kit-trip", "Bob")]
        return Complete([o.status for o in ctx.wait_children(*handles)])


def test_children_are_started_with_their_budget_shares() -> None:
    run = WorkflowRun(Survey, budget_total_usd="1.00")
    first, second = run.children.values()
    assert (first.kind, first.goal, first.budget_usd) == ("test-kit-trip", "Ada", Decimal("0.25"))
    assert second.budget_usd == Decimal("0.7500")  # what remained of the parent's total
    assert [e.data["budget_usd"] for e in run.events if e.kind == "child.started"] == ["0.25", "0.7500"]
    assert WorkflowRun(Survey).children["wf-1/ASK.1/i1/0"].budget_usd == Decimal("0.25")
    assert WorkflowRun(Survey).children["wf-1/ASK.1/i1/1"].budget_usd is None  # the parent has no limit


def test_a_child_that_does_not_fit_pauses_the_parent_until_the_budget_is_raised() -> None:
    run = WorkflowRun(Survey, budget_total_usd="0.20")
    assert (run.status, run.children) == ("paused", {})
    assert run.reason.startswith("Budget exhausted: workflow 1 has 0.2000 of its 0.2000 USD left")
    with pytest.raises(TransitionRefused, match="raise the budget"):
        run.resume()
    run.set_budget("2")
    assert run.status == "waiting" and [c.budget_usd for c in run.children.values()] == [
        Decimal("0.25"), Decimal("1.7500")]


@pytest.mark.django_db
def test_the_kit_s_budget_shares_and_cancelled_children_are_the_services() -> None:
    with registered(*TRIP, Survey), doorbells_recorded():
        workflow = drive(launch("test-kit-survey", goal="Ask", budget_total_usd="1"))
        shares = list(workflow.children.order_by("pk").values_list("budget_total_usd", flat=True))
        run = WorkflowRun(Survey, workflow_id=workflow.pk, budget_total_usd="1")
        assert [c.budget_usd for c in run.children.values()] == shares == [Decimal("0.25"), Decimal("0.75")]
        services.workflow_cancel(workflow_id=workflow.pk, by="ada")
        workflow = drive(workflow)
        run.cancel(by="ada")
    assert run.status == workflow.status == "cancelled"
    assert [(c.status, c.reason) for c in workflow.children.order_by("pk")] == 2 * [
        ("cancelled", f"parent workflow {workflow.pk} was cancelled (cancelled by ada)")]
    ends = [s.result for s in run.history if s.kind == "child"]
    assert [(e["status"], e["reason"]) for e in ends] == 2 * [
        ("cancelled", f"parent workflow {workflow.pk} was cancelled (cancelled by ada)")]
    assert not run.children


def test_a_child_left_running_is_cancelled_when_the_parent_completes() -> None:
    class Impatient(WorkflowDefinition):
        kind = "test-kit-impatient"
        start_node = "ASK"
        revalidate_node = "ASK"

        @node("ASK")
        def ask(self, ctx: NodeContext[Any]) -> Decision:
            ctx.child("test-kit-trip", "Ada")
            ctx.sleep(60)
            return Complete("done")

    run = WorkflowRun(Impatient)
    assert run.status == "waiting" and len(run.children) == 1
    run.fire_timer()
    assert (run.status, run.children) == ("completed", {})
    assert [e.kind for e in run.events][-3:] == ["child.cancelled", "workflow.completed", "child.finished"]
    assert replay(Impatient, run.history) is None


# Signals queued before their wait ----------------------------------------------------------------

def test_a_signal_sent_before_its_wait_is_queued_and_taken_when_the_wait_opens() -> None:
    run = WorkflowRun(Trip, goal="Ada")
    assert run.signal("go", {"n": 1}) == "queued"
    assert run.signal("go", {"n": 2}) == "queued"
    assert run.signals_queued == [("go", {"n": 1}), ("go", {"n": 2})]
    run.run(book)
    run.run(book)
    assert (run.status, run.result) == ("completed", {"go": {"n": 1}})  # the oldest
    assert run.signals_queued == [("go", {"n": 2})]
    assert [e.data for e in run.events if e.kind == "signal.received"] == 2 * [{"name": "go", "queued": True}]


@pytest.mark.django_db
def test_the_kit_queues_signals_as_the_services_do() -> None:
    with registered(*TRIP), doorbells_recorded():
        workflow = launch("test-kit-trip", goal="Ada")
        services.workflow_signal(workflow_id=workflow.pk, name="go", payload={"n": 1})
        workflow = drive(workflow)
        run = WorkflowRun(Trip, goal="Ada", workflow_id=workflow.pk)
        run.signal("go", {"n": 1})
        run.run(book)
        run.run(book)
    assert (run.status, run.result) == (workflow.status, workflow.result) == ("completed", {"go": {"n": 1}})
    assert kit_events(run) == real_events(workflow)


def test_a_dedupe_key_makes_a_repeated_signal_a_no_op() -> None:
    run = WorkflowRun(Trip, goal="Ada")
    assert run.signal("go", 1, dedupe_key="k") == "queued"
    assert run.signal("go", 2, dedupe_key="k") == "already_applied"
    assert run.signals_queued == [("go", 1)]


# The virtual clock -------------------------------------------------------------------------------

class Reminder(WorkflowDefinition):
    kind = "test-kit-reminder"
    start_node = "SLEEP"
    revalidate_node = "SLEEP"
    default_max_hours = 10

    @node("SLEEP")
    def sleep(self, ctx: NodeContext[Any]) -> Decision:
        ctx.sleep(HOUR)
        return Goto("ASK")

    @node("ASK")
    def ask(self, ctx: NodeContext[Any]) -> Decision:
        outcome = ctx.approval(candidate={"text": "Call Ada"}, role="leads", expires_in_seconds=4 * HOUR,
                               on_timeout="continue")
        if outcome.expired:
            ctx.sleep(24 * HOUR)  # past the time limit
        return Complete(outcome.approved)


def test_the_clock_fires_timers_and_expiries_in_the_order_they_fall_due() -> None:
    run = WorkflowRun(Reminder)
    start = run.clock
    assert run.advance_clock(minutes=59) == start + timedelta(minutes=59) and run.node == "SLEEP"
    run.advance_clock(timedelta(hours=6))  # the sleep ends at 1 h, the approval opened then expires at 5 h
    assert run.clock == start + timedelta(hours=6, minutes=59)
    assert [(e.kind, e.data.get("purpose")) for e in run.events if e.kind.startswith("timer.")] == [
        ("timer.fired", "wake"), ("timer.fired", "expire")]
    (approval,) = [e for e in run.events if e.kind == "wait.opened" and e.data["wait_kind"] == "approval"]
    assert approval.data["expires_at"] == (start + timedelta(hours=5)).isoformat()
    assert run.status == "waiting"
    run.advance_clock(days=1)  # the time limit (10 h) comes before the second sleep ends
    assert (run.status, run.reason) == ("cancelled", "time limit reached at 2026-01-01 10:00:00 UTC")
    assert run.events[-2].data == {"reason": run.reason, "by": "time limit"}
    with pytest.raises(ValueError, match="only moves forward"):
        run.advance_clock(seconds=-1)


def test_expire_and_fire_timer_move_the_clock_to_the_wait_s_time() -> None:
    run = WorkflowRun(Reminder, max_hours=100)
    run.fire_timer()
    assert run.clock.hour == 1 and run.node == "ASK"
    run.expire()
    assert run.clock.hour == 5 and run.status == "waiting"


# The first-of wait -------------------------------------------------------------------------------

class Chaser(WorkflowDefinition):
    kind = "test-kit-chaser2"
    start_node = "ESCALATE"
    revalidate_node = "ESCALATE"

    @node("ESCALATE")
    def escalate(self, ctx: NodeContext[Any]) -> Decision:
        reminders = ctx.child("test-kit-trip", "Remind")
        first = ctx.wait_first(signal="paid", children=[reminders], timeout_seconds=HOUR)
        if first.won == "child":
            ctx.wait_for_event("paid")  # a later "paid" stays queued for this wait
        return Complete(first.won)


def test_a_signal_queued_before_the_race_opens_wins_it_at_once() -> None:
    class Late(Chaser):
        kind = "test-kit-chaser-late"
        start_node = "FIRST"

        @node("FIRST")
        def first(self, ctx: NodeContext[Any]) -> Decision:
            ctx.sleep(60)
            return Goto("ESCALATE")

    run = WorkflowRun(Late)
    run.signal("paid", 1)
    run.fire_timer()
    assert (run.status, run.result, run.children) == ("completed", "signal", {})
    assert [e.data["won"] for e in run.events if e.kind == "wait.first_won"] == ["signal"]


def test_after_a_child_wins_the_race_a_signal_is_queued_for_the_next_wait() -> None:
    run = WorkflowRun(Chaser)
    run.finish_child("test-kit-trip", result={"sent": 2})
    assert run.status == "waiting"
    run.advance_clock(hours=2)  # the race's timer was closed with it: nothing fires
    assert not [e for e in run.events if e.kind.startswith("timer.")]
    assert run.signal("paid") == "applied" and run.result == "child"


def test_the_race_s_timer_wins_and_cancels_its_child() -> None:
    run = WorkflowRun(Chaser)
    run.advance_clock(hours=1)
    assert (run.status, run.result, run.children) == ("completed", "timer", {})
    kinds = [e.kind for e in run.events]
    assert kinds[-5:] == ["timer.fired", "child.cancelled", "wait.first_won", "workflow.completed", "child.finished"]
    assert replay(Chaser, run.history) is None


# Events and commitments ----------------------------------------------------------------------------

def test_the_events_and_commitments_of_a_run_read_as_the_services_record_them() -> None:
    run = booked_trip()
    assert [e.kind for e in run.events][:5] == [
        "workflow.launched", "activity.scheduled", "activity.succeeded", "node.entered", "activity.scheduled"]
    assert run.events[0].data == {"goal": "Ada", "params": {}}
    assert run.events[3].data == {"node": "FLIGHT", "previous": "ROOM", "visit": 2}
    assert run.commitments[0] == Commitment(
        operation_id="wf-1/ROOM.1/i1/0", kind="booking", compensation="unbook", data={"booked": "room for Ada"},
        input={"what": "room for Ada"}, result={"booked": "room for Ada"}, intent_version=1)
    (opened,) = [e for e in run.events if e.kind == "wait.opened"]
    assert opened.data == {"wait": "wf-1/CONFIRM.3/i1/0", "wait_kind": "event",
                           "expires_at": "2026-01-01T02:00:00+00:00"}


def test_a_failed_effect_is_compensated_as_uncertain() -> None:
    run = WorkflowRun(Trip, goal="Ada")
    run.fail(book, "timed out")
    assert run.status == "failed"
    (uncertain,) = run.commitments
    assert uncertain.data == {"uncertain": True} and uncertain.result is None
    (undo,) = run.pending.values()
    assert undo.input["data"] == {"uncertain": True} and undo.input["input"] == {"what": "room for Ada"}
    assert "commitment.uncertain" in [e.kind for e in run.events]


def test_a_race_won_while_its_loser_ends_after_the_visit_was_left_still_replays() -> None:
    class RaceThenNote(WorkflowDefinition):
        kind = "test-kit-race-then-note"
        start_node = "ESCALATE"
        revalidate_node = "ESCALATE"

        @node("ESCALATE")
        def escalate(self, ctx: NodeContext[Any]) -> Decision:
            reminders = ctx.child("test-kit-trip", "Remind")
            ctx.wait_first(signal="paid", children=[reminders])
            return Goto("NOTE")

        @node("NOTE")
        def note(self, ctx: NodeContext[Any]) -> Decision:
            return Complete(ctx.wait_for_event("note").payload)

    run = WorkflowRun(RaceThenNote)
    run.signal("note", "queued first")
    run.signal("paid")
    assert (run.status, run.result) == ("completed", "queued first")
    assert [s.operation_id for s in run.history] == [
        "wf-1/ESCALATE.1/i1/0", "wf-1/ESCALATE.1/i1/1", "wf-1/NOTE.2/i1/0"]  # the child's end in its visit
    assert replay(RaceThenNote, run.history) is None


def test_a_cancel_while_a_race_waits_closes_it_and_cancels_its_child() -> None:
    run = WorkflowRun(Chaser)
    assert run.cancel() == "applied"
    assert (run.status, run.children, run.open_waits) == ("cancelled", {}, {})
    run.advance_clock(hours=2)  # its timer went with it
    assert run.events[-1].kind == "child.finished"


class Idle(WorkflowDefinition):
    """A child with no effects: it waits for a signal that never comes."""

    kind = "test-kit-idle"
    start_node = "WAIT"
    revalidate_node = "WAIT"

    @node("WAIT")
    def wait(self, ctx: NodeContext[Any]) -> Decision:
        return Complete(ctx.wait_for_event("never").payload)


class Race(WorkflowDefinition):
    kind = "test-kit-race"
    start_node = "RACE"
    revalidate_node = "RACE"

    @node("RACE")
    def race(self, ctx: NodeContext[Any]) -> Decision:
        idle = ctx.child("test-kit-idle", "Idle")
        return Complete(ctx.wait_first(signal="paid", children=[idle], timeout_seconds=HOUR).won)


@pytest.mark.django_db
@pytest.mark.parametrize("winner", ["signal", "timer"])
def test_the_kit_settles_a_race_as_the_services_do(winner: str) -> None:
    from workflows.testing.database import Clock

    with registered(Race, Idle), doorbells_recorded(), Clock().running() as clock:
        workflow = drive(launch("test-kit-race"))
        run = WorkflowRun(Race, workflow_id=workflow.pk)
        if winner == "signal":
            services.workflow_signal(workflow_id=workflow.pk, name="paid")
            run.signal("paid")
        else:
            clock.advance(hours=1, seconds=1)
            run.advance_clock(hours=1)
        workflow = drive(workflow)
    assert (run.status, run.result) == (workflow.status, workflow.result) == ("completed", winner)
    assert kit_events(run) == real_events(workflow)


class Timed(WorkflowDefinition):
    kind = "test-kit-timed"
    start_node = "SLEEP"
    revalidate_node = "SLEEP"
    default_max_hours = 10

    @node("SLEEP")
    def sleep(self, ctx: NodeContext[Any]) -> Decision:
        ctx.sleep(HOUR)
        return Goto("ASK")

    @node("ASK")
    def ask(self, ctx: NodeContext[Any]) -> Decision:
        if ctx.wait_for_event("go", timeout_seconds=4 * HOUR).expired:
            ctx.sleep(24 * HOUR)
        return Complete()


@pytest.mark.django_db
def test_the_kit_s_clock_fires_as_beat_does() -> None:
    from workflows.testing.database import Clock

    with registered(Timed), doorbells_recorded(), Clock().running() as clock:
        workflow = drive(launch("test-kit-timed"))
        for hours in (1, 4, 5):  # the sleep ends, the wait expires, the time limit passes (drive enforces it)
            clock.advance(hours=hours, seconds=1)
            workflow = drive(workflow)
        run = WorkflowRun(Timed, workflow_id=workflow.pk)
        run.advance_clock(hours=10, seconds=3)
    assert (run.status, workflow.status) == ("cancelled", "cancelled")
    assert run.reason == "time limit reached at 2026-01-01 10:00:00 UTC" and workflow.reason.startswith(
        "time limit reached at ")
    assert kit_events(run) == real_events(workflow)


def test_the_authoring_page_lists_the_event_kinds_the_kit_records() -> None:
    import re
    from pathlib import Path

    page = (Path(__file__).resolve().parents[2] / "docs" / "authoring.md").read_text()
    listed = page.split("- **`run.events`**", 1)[1].split("- **`run.commitments`**", 1)[0]
    assert set(re.findall(r"`([a-z_]+\.[a-z_]+)`", listed)) == EVENT_KINDS


class BookOrWait(WorkflowDefinition):
    """Books a room; when the booking fails, waits for the traveller's go anyway, then completes."""

    kind = "test-kit-book-or-wait"
    start_node = "ROOM"
    revalidate_node = "ROOM"

    @node("ROOM")
    def room(self, ctx: NodeContext[Any]) -> Decision:
        try:
            return Goto("CONFIRM", {"room": ctx.activity(book_or_raise, {"what": "room"})})
        except ActivityFailed:
            return Goto("CONFIRM", {"room": None})

    @node("CONFIRM")
    def confirm(self, ctx: NodeContext[Any]) -> Decision:
        return Complete({"go": ctx.wait_for_event("go").payload})


@activity(commitment="booking", compensation=unbook)
def book_or_raise(ctx: Any, input: dict[str, Any]) -> dict[str, Any]:
    raise Permanent("the hotel's answer could not be read")  # it may have booked


@pytest.mark.django_db
def test_a_completion_undoes_what_a_caught_failure_may_have_done_as_the_services_do() -> None:
    with registered(BookOrWait, book_or_raise, unbook), doorbells_recorded():
        workflow = drive(launch("test-kit-book-or-wait", goal="Ada"))
        services.workflow_signal(workflow_id=workflow.pk, name="go", payload={"by": "ada"})
        workflow = drive(workflow)
        run = WorkflowRun(BookOrWait, goal="Ada", workflow_id=workflow.pk)
        run.fail(book_or_raise, "the hotel's answer could not be read")
        run.signal("go", {"by": "ada"})
        assert run.status == "completed" and [c.name for c in run.pending.values()] == ["unbook"]
        run.run(unbook)
    assert (run.status, run.result) == (workflow.status, workflow.result) == ("completed", {"go": {"by": "ada"}})
    assert kit_events(run) == real_events(workflow)
    assert list(workflow.commitments.values_list("status", flat=True)) == ["compensated"] and run.commitments == []


KIT_WITHOUT_DJANGO = """
import os

from workflows.engine import Complete, Goto, NodeContext, WorkflowDefinition, node
from workflows.registry import CompensationInput, activity
from workflows.testing import WorkflowRun


@activity
def unbook(ctx, input: CompensationInput):
    return {"undone": input.operation_id}


@activity(commitment="booking", compensation=unbook)
def book(ctx, input):
    return {"booked": input["what"]}


class Parent(WorkflowDefinition):
    kind = "kit-without-django"
    start_node = "BOOK"

    @node("BOOK")
    def book_it(self, ctx: NodeContext):
        return Goto("HELP", {"room": ctx.activity(book, {"what": "room"})})

    @node("HELP")
    def help(self, ctx: NodeContext):
        (outcome,) = ctx.wait_children(ctx.child("kit-without-django-helper", "help", budget="0.25"))
        return Complete({"helped": outcome.status})


run = WorkflowRun(Parent, goal="trip", budget_total_usd="1.00")
run.run(book)
shares = [str(c.budget_usd) for c in run.children.values()]
run.cancel()
undo = [p.input["operation_id"] for p in run.pending.values()]
run.run(unbook)
from django.apps import apps

assert not apps.ready and "DJANGO_SETTINGS_MODULE" not in os.environ
print(run.status, shares, undo)
"""


def test_the_in_memory_kit_runs_where_django_is_not_set_up(tmp_path: Path) -> None:
    """The in-memory kit needs no settings, no app registry and no database: a tool that imports
    ``workflows.testing`` before ``django.setup()`` (the soak does) and a test that never sets it
    up both work, with budgets shared and compensations named by the services' own rules."""
    env = {k: v for k, v in os.environ.items() if k not in ("DJANGO_SETTINGS_MODULE", "DATABASE_URL")}
    script = tmp_path / "kit.py"
    script.write_text(KIT_WITHOUT_DJANGO)
    done = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, env=env, timeout=60,
                          cwd=Path(__file__).resolve().parents[2])
    assert done.returncode == 0, done.stderr[-3000:]
    status, shares, undone = done.stdout.strip().split(" ", 2)
    assert (status, shares) == ("cancelled", "['0.25']"), done.stdout
    assert undone.startswith("['") and undone.endswith("']"), done.stdout
