"""A person's trigger of a schedule whose previous run is still live, under each overlap policy:
skip refuses it, buffer_one buffers it and launches that same occurrence row once when the run
ends, cancel_previous cancels the run then launches, allow_all launches. A newer buffered
occurrence (a trigger's or beat's) replaces the older. Two sweeps at once, a sweep delivered
twice and a sweep killed mid-launch still launch a buffered occurrence once."""
from __future__ import annotations

import threading
from collections.abc import Iterator
from datetime import timedelta
from io import StringIO

import pytest
from django.core.management import CommandError, call_command
from django.db import IntegrityError, connection, transaction
from django.db.migrations.executor import MigrationExecutor

from tests.workflows.test_schedules import KIND, T0, WaitsForDone, add, finish, fire, outcomes
from workflows.errors import Refused
from workflows.features.schedules import services as schedules
from workflows.models import Schedule, ScheduleOccurrence, Workflow
from workflows.testing import registered

pytestmark = pytest.mark.django_db


@pytest.fixture(autouse=True)
def kind_registered() -> Iterator[None]:
    with registered(WaitsForDone):
        yield


@pytest.fixture
def at(time_machine):
    def move(seconds: float):
        time_machine.move_to(T0 + timedelta(seconds=seconds), tick=False)
    move(0)
    return move


def live_run(schedule: Schedule, at) -> int:
    """The schedule's first occurrence, launched by beat at 04:00 and still live."""
    at(3600)
    assert fire(schedule) == 1
    return schedule.occurrences.get(outcome="launched").workflow_id


def buffered_at(schedule: Schedule):
    return Schedule.objects.get(pk=schedule.pk).buffered_at


def test_buffer_one_a_trigger_behind_a_live_run_launches_that_occurrence_once_when_the_run_ends(at, requester):
    schedule = add(overlap="buffer_one")
    first = live_run(schedule, at)
    at(3700)
    occurrence = schedules.schedule_trigger(name="nightly", user=requester)
    assert (occurrence.outcome, occurrence.workflow_id, occurrence.triggered_by) == ("buffered", None, requester)
    assert f"workflow {first}" in occurrence.reason
    assert buffered_at(schedule) == occurrence.at  # saved, not only set on the instance
    assert schedules.schedules_fire_due() == 0  # the run is still live
    finish(first)
    at(3730)
    assert schedules.schedules_fire_due() == 1
    assert [schedules.schedules_fire_due(), fire(schedule)] == [0, 0]  # a second sweep, a redelivered fire
    launched = ScheduleOccurrence.objects.get(pk=occurrence.pk)  # the same row, not a second one
    assert launched.outcome == "launched" and launched.triggered_by == requester
    assert Workflow.objects.get(pk=launched.workflow_id).launched_by == requester  # who asked
    assert schedule.occurrences.filter(at=occurrence.at).count() == 1
    assert outcomes(schedule) == [("04:00:00", "launched"), ("04:01:40", "launched")]
    assert buffered_at(schedule) is None
    assert Workflow.objects.filter(kind=KIND).count() == 2


def test_buffer_one_a_second_trigger_replaces_the_first(at, requester):
    schedule = add(overlap="buffer_one")
    first = live_run(schedule, at)
    at(3700)
    older = schedules.schedule_trigger(name="nightly", user=requester)
    at(3800)
    newer = schedules.schedule_trigger(name="nightly")
    assert ScheduleOccurrence.objects.get(pk=older.pk).outcome == "replaced"
    assert newer.outcome == "buffered" and buffered_at(schedule) == newer.at  # the older no longer pointed at
    finish(first)
    at(3830)
    assert [schedules.schedules_fire_due(), schedules.schedules_fire_due()] == [1, 0]
    assert outcomes(schedule) == [("04:00:00", "launched"), ("04:01:40", "replaced"), ("04:03:20", "launched")]
    assert ScheduleOccurrence.objects.get(pk=older.pk).workflow_id is None
    assert ScheduleOccurrence.objects.filter(schedule=schedule, outcome="buffered").count() == 0


def test_the_database_keeps_one_buffered_occurrence_per_schedule(at):
    schedule = add(overlap="buffer_one")
    live_run(schedule, at)
    at(3700)
    buffered = schedules.schedule_trigger(name="nightly")
    with pytest.raises(IntegrityError, match="schedule_one_buffered_occurrence"), transaction.atomic():
        ScheduleOccurrence.objects.create(schedule=schedule, at=buffered.at + timedelta(seconds=1),
                                          outcome="buffered", recorded_at=buffered.at)


def test_buffer_one_a_trigger_replaces_beats_buffered_occurrence_and_beat_replaces_a_trigger(at, requester):
    schedule = add(overlap="buffer_one")
    first = live_run(schedule, at)
    at(7200)
    assert fire(schedule) == 0  # 05:00 buffered by beat
    at(7300)
    trigger = schedules.schedule_trigger(name="nightly", user=requester)
    assert outcomes(schedule) == [("04:00:00", "launched"), ("05:00:00", "replaced"), ("05:01:40", "buffered")]
    assert buffered_at(schedule) == trigger.at
    at(10800)
    assert fire(schedule) == 0  # 06:00 buffered by beat, the trigger replaced
    assert outcomes(schedule)[-2:] == [("05:01:40", "replaced"), ("06:00:00", "buffered")]
    assert buffered_at(schedule) == T0 + timedelta(hours=3)
    finish(first)
    at(10830)
    assert schedules.schedules_fire_due() == 1
    assert outcomes(schedule) == [("04:00:00", "launched"), ("05:00:00", "replaced"), ("05:01:40", "replaced"),
                                  ("06:00:00", "launched")]
    assert ScheduleOccurrence.objects.filter(schedule=schedule, outcome="buffered").count() == 0


def test_buffer_one_a_buffered_occurrence_launched_then_the_next_one_buffers_behind_it(at):
    schedule = add(overlap="buffer_one")
    first = live_run(schedule, at)
    at(3700)
    trigger = schedules.schedule_trigger(name="nightly")
    finish(first)
    at(7200)  # one fire: the buffered trigger launches first, then 05:00 finds it live
    assert fire(schedule) == 1
    assert outcomes(schedule) == [("04:00:00", "launched"), ("04:01:40", "launched"), ("05:00:00", "buffered")]
    second = ScheduleOccurrence.objects.get(pk=trigger.pk).workflow_id
    assert f"workflow {second}" in schedule.occurrences.get(outcome="buffered").reason


def test_skip_refuses_a_trigger_behind_a_live_run_and_writes_nothing(at, requester):
    schedule = add(overlap="skip")
    first = live_run(schedule, at)
    at(3700)
    with pytest.raises(schedules.ScheduleRefused, match=f"workflow {first} .*overlap skip") as refused:
        schedules.schedule_trigger(name="nightly", user=requester)
    assert isinstance(refused.value, Refused)
    assert outcomes(schedule) == [("04:00:00", "launched")] and buffered_at(schedule) is None
    finish(first)
    assert schedules.schedule_trigger(name="nightly", user=requester).outcome == "launched"


def test_cancel_previous_a_trigger_cancels_the_live_run_then_launches(at, requester):
    schedule = add(overlap="cancel_previous")
    first = live_run(schedule, at)
    at(3700)
    occurrence = schedules.schedule_trigger(name="nightly", user=requester)
    assert occurrence.outcome == "launched" and occurrence.workflow_id not in (None, first)
    assert Workflow.objects.get(pk=first).status == Workflow.Status.CANCELLED
    assert Workflow.objects.get(pk=occurrence.workflow_id).launched_by == requester
    assert buffered_at(schedule) is None


def test_allow_all_a_trigger_launches_beside_the_live_run(at):
    schedule = add(overlap="allow_all")
    first = live_run(schedule, at)
    at(3700)
    occurrence = schedules.schedule_trigger(name="nightly")
    assert occurrence.outcome == "launched" and occurrence.workflow_id != first
    assert Workflow.objects.get(pk=first).status == Workflow.Status.WAITING


def test_a_trigger_that_would_buffer_on_a_paused_schedule_is_refused(at):
    schedule = add(overlap="buffer_one")
    first = live_run(schedule, at)
    schedules.schedule_pause(name="nightly")
    at(3700)
    with pytest.raises(schedules.ScheduleRefused, match=f"paused.*workflow {first}"):
        schedules.schedule_trigger(name="nightly")
    assert outcomes(schedule) == [("04:00:00", "launched")] and buffered_at(schedule) is None
    finish(first)
    assert schedules.schedule_trigger(name="nightly").outcome == "launched"  # a paused schedule: nothing live


def test_a_sweep_killed_mid_launch_leaves_the_occurrence_buffered_for_the_next(at, monkeypatch):
    schedule = add(overlap="buffer_one")
    first = live_run(schedule, at)
    at(3700)
    occurrence = schedules.schedule_trigger(name="nightly")
    finish(first)
    at(3730)

    def killed(**kw: object) -> Workflow:
        raise SystemExit("the worker died")  # not caught: the sweep's transaction rolls back

    monkeypatch.setattr(schedules, "workflow_launch", killed)
    with pytest.raises(SystemExit):
        fire(schedule)
    assert ScheduleOccurrence.objects.get(pk=occurrence.pk).outcome == "buffered"
    assert buffered_at(schedule) == occurrence.at
    monkeypatch.undo()
    assert [fire(schedule), fire(schedule)] == [1, 0]
    assert ScheduleOccurrence.objects.get(pk=occurrence.pk).outcome == "launched"


@pytest.mark.django_db(transaction=True)
def test_two_sweeps_at_once_launch_a_buffered_occurrence_once(at, monkeypatch):
    schedule = add(overlap="buffer_one")
    first = live_run(schedule, at)
    at(3700)
    occurrence = schedules.schedule_trigger(name="nightly")
    finish(first)
    at(3730)
    launch, start = schedules.workflow_launch, threading.Barrier(2)

    def slow_launch(**kw: object) -> Workflow:
        threading.Event().wait(0.3)  # the other sweep reaches the schedule's row lock meanwhile
        return launch(**kw)

    monkeypatch.setattr(schedules, "workflow_launch", slow_launch)
    counts: list[int] = []

    def sweep() -> None:
        try:
            start.wait(5)
            counts.append(schedules.schedules_fire_due())
        finally:
            connection.close()

    threads = [threading.Thread(target=sweep) for _ in range(2)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(30)
    assert sorted(counts) == [0, 1]
    assert ScheduleOccurrence.objects.get(pk=occurrence.pk).outcome == "launched"
    assert Workflow.objects.filter(kind=KIND).count() == 2


@pytest.mark.django_db(transaction=True)
def test_the_migration_leaves_each_schedule_one_buffered_occurrence_pointed_at(at):
    before = [("workflows", "0022_tree_owns_commitments")]
    after = [("workflows", "0023_schedule_one_buffered_occurrence")]
    executor = MigrationExecutor(connection)
    executor.migrate(before)
    try:
        apps = executor.loader.project_state(before).apps
        Old, OldOccurrence = apps.get_model("workflows", "Schedule"), apps.get_model("workflows", "ScheduleOccurrence")
        made = {"kind": KIND, "goal": "g", "every_seconds": 3600, "anchor_at": T0, "created_at": T0,
                "handled_until": T0, "next_due_at": T0}
        lost = Old.objects.create(name="lost", buffered_at=T0 + timedelta(hours=1), **made)  # the replaced one
        for minutes, outcome in ((60, "replaced"), (70, "buffered"), (80, "buffered")):
            OldOccurrence.objects.create(schedule=lost, at=T0 + timedelta(minutes=minutes), outcome=outcome,
                                         recorded_at=T0 + timedelta(minutes=minutes))
        stale = Old.objects.create(name="stale", buffered_at=T0, **made)
        OldOccurrence.objects.create(schedule=stale, at=T0, outcome="replaced", recorded_at=T0)
        executor = MigrationExecutor(connection)
        executor.loader.build_graph()
        executor.migrate(after)
    finally:
        executor = MigrationExecutor(connection)
        executor.migrate(executor.loader.graph.leaf_nodes())
    repaired = Schedule.objects.get(name="lost")
    assert repaired.buffered_at == T0 + timedelta(minutes=80)
    assert outcomes(repaired) == [("04:00:00", "replaced"), ("04:10:00", "replaced"), ("04:20:00", "buffered")]
    assert Schedule.objects.get(name="stale").buffered_at is None


def test_a_schedule_paused_while_an_occurrence_is_buffered_launches_it_after_resume(at, requester):
    schedule = add(overlap="buffer_one")
    first = live_run(schedule, at)
    at(3700)
    buffered = schedules.schedule_trigger(name="nightly", user=requester)
    schedules.schedule_pause(name="nightly")
    finish(first)
    at(3730)
    assert schedules.schedules_fire_due() == 0 and fire(schedule) == 0  # paused: nothing launches
    schedules.schedule_resume(name="nightly")
    assert schedules.schedules_fire_due() == 1
    assert ScheduleOccurrence.objects.get(pk=buffered.pk).outcome == "launched"


def test_the_command_says_why_a_trigger_is_refused_and_exits_3(at):
    schedule = add(overlap="skip")
    first = live_run(schedule, at)
    with pytest.raises(CommandError, match=f"workflow {first} .*under overlap skip") as refused:
        call_command("agent", "schedule", "trigger", "nightly", stdout=StringIO())
    assert refused.value.returncode == 3


@pytest.mark.parametrize("overlap", ["skip", "buffer_one", "cancel_previous"])
def test_the_live_run_is_the_one_launched_last_not_the_one_with_the_latest_time(at, overlap):
    schedule = add(overlap=overlap, jitter="10m")
    delay = schedules.jitter(schedule, T0 + timedelta(hours=1)).total_seconds()
    assert delay > 60  # 04:00 launches after a trigger made later than 04:00
    at(3630)
    trigger = schedules.schedule_trigger(name="nightly")  # 04:00:30, launched: nothing was live
    finish(trigger.workflow_id)
    at(3600 + delay)
    assert fire(schedule) == 1  # 04:00, jittered: launched after the trigger, so now the live run
    beat = schedule.occurrences.get(at=T0 + timedelta(hours=1)).workflow_id
    at(3600 + delay + 10)
    if overlap == "skip":
        with pytest.raises(schedules.ScheduleRefused, match=f"workflow {beat} "):
            schedules.schedule_trigger(name="nightly")
    else:
        answer = schedules.schedule_trigger(name="nightly")
        assert answer.outcome == {"buffer_one": "buffered", "cancel_previous": "launched"}[overlap]
        assert Workflow.objects.get(pk=beat).is_terminal == (overlap == "cancel_previous")
