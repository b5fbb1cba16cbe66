"""Schedules: occurrences of a cron or an interval, each launched once however
often beat fires it; overlap policies, catch-up, jitter, pause and resume, trigger; the beat
entry kept in step; bad input refused with nothing written."""
from __future__ import annotations

import json
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from io import StringIO

import pytest
from django.core.management import call_command
from django_celery_beat.models import PeriodicTask

from workflows import clock, engine, services
from workflows.errors import InvalidInput, ScheduleRefused
from workflows.features.schedules import services as schedules
from workflows.models import Event, Schedule, Workflow
from workflows.testing import registered

pytestmark = pytest.mark.django_db
KIND = "test-scheduled-wait"
T0 = datetime(2026, 12, 2, 3, 0, 0, tzinfo=UTC)


class WaitsForDone(engine.WorkflowDefinition):
    """Stays live until signalled "done": the previous run of the overlap policies."""

    kind = KIND
    start_node = "WAIT"
    revalidate_node = "WAIT"

    @engine.node("WAIT")
    def wait(self, ctx: engine.NodeContext) -> engine.Decision:
        ctx.wait_for_event("done")
        return engine.Complete()


@pytest.fixture(autouse=True)
def kind_registered() -> Iterator[None]:
    with registered(WaitsForDone):
        yield


@pytest.fixture
def at(time_machine):
    """Move the clock: ``at(seconds)`` is T0 plus that many seconds."""
    def move(seconds: float) -> datetime:
        time_machine.move_to(T0 + timedelta(seconds=seconds), tick=False)
        return clock.now()
    move(0)
    return move


def add(name: str = "nightly", **kw) -> Schedule:
    kw.setdefault("every", "1h")
    return schedules.schedule_add(name=name, kind=KIND, goal="Check the nightly build", **kw)


def outcomes(schedule: Schedule) -> list[tuple[str, str]]:
    return [(o.at.strftime("%H:%M:%S"), o.outcome) for o in schedule.occurrences.order_by("at")]


def fire(schedule: Schedule) -> int:
    return schedules.schedule_fire(schedule_id=schedule.pk)


def finish(workflow_id: int) -> None:
    services.workflow_advance_if_runnable(workflow_id=workflow_id)
    services.workflow_signal(workflow_id=workflow_id, name="done", payload=None)
    services.workflow_advance_if_runnable(workflow_id=workflow_id)
    assert Workflow.objects.get(pk=workflow_id).status == Workflow.Status.COMPLETED


def test_an_interval_occurrence_launches_once_however_often_it_is_fired(at):
    schedule = add(overlap="allow_all")
    task = PeriodicTask.objects.get(pk=schedule.periodic_task_id)
    assert (task.task, json.loads(task.kwargs), task.interval.every, task.enabled) == (
        schedules.FIRE_TASK, {"schedule_id": schedule.pk}, 3600, True)
    at(3599)
    assert fire(schedule) == 0 and outcomes(schedule) == []
    at(3600)
    assert [fire(schedule), fire(schedule), schedules.schedules_fire_due()] == [1, 0, 0]  # two beats and the sweep
    at(7205)
    assert schedules.schedules_fire_due() == 1
    assert outcomes(schedule) == [("04:00:00", "launched"), ("05:00:00", "launched")]
    assert Workflow.objects.filter(kind=KIND).count() == 2


def test_a_cron_schedule_occurs_at_its_utc_times(at):
    schedule = add(every="", cron="30 3 * * *")
    assert schedule.next_due_at == T0 + timedelta(minutes=30)
    crontab = PeriodicTask.objects.get(pk=schedule.periodic_task_id).crontab
    assert (crontab.minute, crontab.hour, str(crontab.timezone)) == ("30", "3", "UTC")
    at(1800)
    assert fire(schedule) == 1
    schedule.refresh_from_db()
    assert schedule.next_due_at == T0 + timedelta(days=1, minutes=30)


def test_skip_launches_nothing_while_the_previous_run_is_live(at):
    schedule = add(overlap="skip")
    at(3600)
    fire(schedule)
    at(7200)
    fire(schedule)
    first = schedule.occurrences.get(outcome="launched").workflow_id
    assert outcomes(schedule) == [("04:00:00", "launched"), ("05:00:00", "skipped")]
    assert f"workflow {first} was" in schedule.occurrences.get(outcome="skipped").reason
    finish(first)
    at(10800)
    fire(schedule)
    assert outcomes(schedule)[-1] == ("06:00:00", "launched")


def test_buffer_one_keeps_the_newest_occurrence_and_launches_it_when_the_run_ends(at):
    schedule = add(overlap="buffer_one")
    at(3600)
    fire(schedule)
    at(7200)
    fire(schedule)
    at(10800)
    fire(schedule)
    assert outcomes(schedule) == [("04:00:00", "launched"), ("05:00:00", "replaced"), ("06:00:00", "buffered")]
    assert schedules.schedules_fire_due() == 0  # the previous run is still live
    finish(schedule.occurrences.get(outcome="launched").workflow_id)
    at(10830)
    assert schedules.schedules_fire_due() == 1
    assert outcomes(schedule) == [("04:00:00", "launched"), ("05:00:00", "replaced"), ("06:00:00", "launched")]
    schedule.refresh_from_db()
    assert schedule.buffered_at is None


def test_cancel_previous_cancels_the_live_run_then_launches(at):
    schedule = add(overlap="cancel_previous")
    at(3600)
    fire(schedule)
    first = schedule.occurrences.get().workflow_id
    at(7200)
    fire(schedule)
    assert Workflow.objects.get(pk=first).status == Workflow.Status.CANCELLED
    assert Event.objects.get(workflow_id=first, kind="workflow.cancelled").data["by"] == "schedule nightly"
    assert outcomes(schedule) == [("04:00:00", "launched"), ("05:00:00", "launched")]


def test_occurrences_missed_past_the_catch_up_window_are_counted_not_launched(at):
    late = add(name="late", overlap="allow_all")
    caught = add(name="caught", overlap="allow_all", catch_up="2h")
    at(5 * 3600 + 30)  # beat was down from 03:00 to 08:00:30
    assert fire(late) == 1  # 08:00 (within the grace)
    assert outcomes(late) == [("07:00:00", "missed"), ("08:00:00", "launched")]
    assert "4 occurrences up to this one" in late.occurrences.get(outcome="missed").reason
    assert fire(caught) == 3  # 06:00, 07:00, 08:00: within two hours and the grace
    assert outcomes(caught) == [("05:00:00", "missed"), ("06:00:00", "launched"), ("07:00:00", "launched"),
                                ("08:00:00", "launched")]


def test_jitter_delays_each_occurrence_by_the_same_amount_everywhere(at):
    schedule = add(overlap="allow_all", jitter="10m")
    first = T0 + timedelta(hours=1)
    delay = schedules.jitter(schedule, first)
    assert timedelta(0) <= delay < timedelta(minutes=10) and delay == schedules.jitter(schedule, first)
    assert schedule.next_due_at == T0 + timedelta(hours=1) + delay
    at(3600 + delay.total_seconds() - 1)
    assert fire(schedule) == 0
    at(3600 + delay.total_seconds())
    assert fire(schedule) == 1


def test_a_paused_schedule_launches_nothing_and_resumes_from_its_next_occurrence(at):
    schedule = add(overlap="allow_all")
    schedules.schedule_pause(name="nightly")
    assert PeriodicTask.objects.get(pk=schedule.periodic_task_id).enabled is False
    at(3 * 3600 + 10)
    assert fire(schedule) == 0 and schedules.schedules_fire_due() == 0
    schedules.schedule_resume(name="nightly")
    assert PeriodicTask.objects.get(pk=schedule.periodic_task_id).enabled is True
    assert fire(schedule) == 0 and outcomes(schedule) == []  # 04:00–06:00 passed while paused
    at(4 * 3600)
    assert fire(schedule) == 1


def test_trigger_launches_now_and_remove_leaves_the_runs_alone(at, requester):
    schedule = add(overlap="skip")
    occurrence = schedules.schedule_trigger(name="nightly", user=requester)
    assert occurrence.outcome == "launched" and occurrence.triggered_by == requester
    assert Workflow.objects.get(pk=occurrence.workflow_id).launched_by == requester
    at(60)
    with pytest.raises(ScheduleRefused, match="under overlap skip"):  # the first is live
        schedules.schedule_trigger(name="nightly")
    schedules.schedule_remove(name="nightly")
    assert not PeriodicTask.objects.filter(pk=schedule.periodic_task_id).exists()
    assert Workflow.objects.get(pk=occurrence.workflow_id).status == Workflow.Status.WAITING


def test_a_launch_the_kind_refuses_is_recorded_as_failed(at):
    schedule = add(overlap="allow_all")
    Schedule.objects.filter(pk=schedule.pk).update(kind="no-such-kind")
    at(3600)
    assert fire(schedule) == 0
    failed = schedule.occurrences.get()
    assert failed.outcome == "failed" and "Unknown workflow kind 'no-such-kind'" in failed.reason


@pytest.mark.parametrize("values, said", [
    ({"every": "", "cron": ""}, "either --cron"),
    ({"every": "1h", "cron": "0 3 * * *"}, "either --cron"),
    ({"every": "5s"}, "from 10 s"),
    ({"every": "soon"}, "must be a duration"),
    ({"every": "", "cron": "61 3 * * *"}, "five fields"),
    ({"overlap": "queue"}, "is not one of skip, buffer_one"),
    ({"jitter": "2h"}, "shorter than --every"),
    ({"catch_up": "-1h"}, "must be a duration"),
    ({"name": "night ly"}, "letters, digits"),
])
def test_bad_values_are_refused_with_nothing_written(at, values, said):
    name = values.pop("name", "nightly")
    with pytest.raises(InvalidInput, match=said):
        add(name=name, **values)
    assert not Schedule.objects.exists() and not PeriodicTask.objects.filter(task=schedules.FIRE_TASK).exists()


def test_the_command_adds_lists_triggers_and_refuses_what_is_wrong(at, requester):
    def agent(*args: str) -> str:
        out = StringIO()
        call_command("agent", "schedule", *args, stdout=out)
        return out.getvalue()

    assert "next at 2026-12-02 09:00:00 UTC" in agent("add", "six", "--kind", KIND, "--goal", "Check",
                                                      "--every", "6h", "--user", requester.username)
    listed = json.loads(agent("list", "--json"))
    assert [(s["name"], s["when"], s["overlap"], s["created_by"]) for s in listed] == [
        ("six", "every 6h", "skip", requester.username)]
    assert "launched workflow" in agent("trigger", "six")
    assert json.loads(agent("list", "--json"))[0]["launched"] == 1
    for args, said in ((("add", "six", "--kind", KIND, "--goal", "x", "--every", "1h"), "exists"),
                       (("pause",), "needs the schedule's NAME"), (("pause", "nope"), "No schedule is named")):
        with pytest.raises(Exception, match=said):
            agent(*args)
