"""Schedules declared in code (``agentops.kind.Schedule``): a sync makes them, with their beat
entries; changes and removals in code follow; schedules made by hand are never touched; a sync in
step changes nothing; syncs at once make one row; a bad declaration is refused with nothing written.
And per-object schedules: ``schedule_ensure`` twice with one name adds one."""
from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from io import StringIO

import pytest
from django.core.management import call_command
from django.db import connection
from django_celery_beat.models import PeriodicTask

from agentops.kind import Schedule, declare_schedules, schedule_ensure, schedule_remove
from workflows import engine, registry
from workflows.errors import InvalidInput, NotFound
from workflows.features.schedules import declared, sync
from workflows.features.schedules import services as schedules
from workflows.models import Schedule as ScheduleRow
from workflows.testing import registered

pytestmark = pytest.mark.django_db
KIND = "test-declared-schedules"


class Digest(engine.WorkflowDefinition):
    kind = KIND
    start_node = "DONE"
    revalidate_node = "DONE"
    schedules = (
        Schedule("nightly-digest", goal="Send the nightly digest", cron="0 3 * * *", overlap="buffer_one",
                 catch_up="1h", labels={"team": "support"}),
        Schedule("hourly-check", goal="Check the inbox", every="1h", jitter="5m"),
    )

    @engine.node("DONE")
    def done(self, ctx: engine.NodeContext) -> engine.Decision:
        return engine.Complete()


@pytest.fixture(autouse=True)
def kind_registered(monkeypatch) -> Iterator[None]:
    monkeypatch.setattr(declared, "_by_apps", {})
    with registered(Digest):
        yield


def rows() -> dict[str, tuple]:
    return {s.name: (s.kind, s.goal, s.when, s.overlap, s.catch_up_seconds, s.jitter_seconds, s.labels, s.declared,
                     s.paused) for s in ScheduleRow.objects.order_by("name")}


def beat(name: str) -> PeriodicTask:
    row = ScheduleRow.objects.get(name=name)
    task = PeriodicTask.objects.get(pk=row.periodic_task_id)
    assert (task.name, task.task, json.loads(task.kwargs)) == (
        f"agentops schedule {name}", schedules.FIRE_TASK, {"schedule_id": row.pk})
    return task


def test_a_sync_makes_the_declared_schedules_with_their_beat_entries():
    changes = sync.schedules_sync()
    assert [str(c) for c in changes] == ["added hourly-check", "added nightly-digest"]
    assert rows() == {
        "hourly-check": (KIND, "Check the inbox", "every 1h", "skip", 0, 300, {}, True, False),
        "nightly-digest": (KIND, "Send the nightly digest", "cron 0 3 * * *", "buffer_one", 3600, 0,
                           {"team": "support"}, True, False),
    }
    nightly = beat("nightly-digest")
    assert (nightly.crontab.minute, nightly.crontab.hour, nightly.interval, nightly.enabled) == ("0", "3", None, True)
    hourly = beat("hourly-check")
    assert (hourly.interval.every, hourly.crontab, hourly.enabled) == (3600, None, True)


def test_a_second_sync_changes_nothing():
    sync.schedules_sync()
    before = {(s.name, s.pk, s.periodic_task_id, s.next_due_at) for s in ScheduleRow.objects.all()}
    tasks = set(PeriodicTask.objects.values_list("pk", "last_run_at", "date_changed"))
    assert sync.schedules_sync() == []
    assert {(s.name, s.pk, s.periodic_task_id, s.next_due_at) for s in ScheduleRow.objects.all()} == before
    assert set(PeriodicTask.objects.values_list("pk", "last_run_at", "date_changed")) == tasks


def test_a_schedule_changed_in_code_changes_its_row_and_beat_entry_and_one_removed_is_removed(monkeypatch):
    sync.schedules_sync()
    nightly = ScheduleRow.objects.get(name="nightly-digest")
    hourly_task = ScheduleRow.objects.get(name="hourly-check").periodic_task_id
    monkeypatch.setattr(Digest, "schedules", (
        Schedule("nightly-digest", goal="Send the morning digest", every="6h", overlap="skip"),))
    assert [str(c) for c in sync.schedules_sync(dry_run=True)] == [
        "removed hourly-check", "changed nightly-digest (goal, labels, cron, every, overlap, catch-up)"]
    assert len(rows()) == 2 and rows()["nightly-digest"][1] == "Send the nightly digest"  # dry: nothing written
    assert [str(c) for c in sync.schedules_sync()] == [
        "removed hourly-check", "changed nightly-digest (goal, labels, cron, every, overlap, catch-up)"]
    assert rows() == {"nightly-digest": (KIND, "Send the morning digest", "every 6h", "skip", 0, 0, {}, True, False)}
    changed = ScheduleRow.objects.get(name="nightly-digest")
    assert (changed.pk, changed.periodic_task_id) == (nightly.pk, nightly.periodic_task_id)
    task = beat("nightly-digest")
    assert (task.interval.every, task.crontab, task.start_time) == (21600, None, changed.anchor_at)
    assert not PeriodicTask.objects.filter(pk=hourly_task).exists()


def test_schedules_made_by_hand_are_never_touched(monkeypatch):
    by_hand = schedules.schedule_add(name="by-hand", kind=KIND, goal="Made at the command line", every="2h")
    sync.schedules_sync()
    monkeypatch.setattr(Digest, "schedules", ())
    assert [str(c) for c in sync.schedules_sync()] == ["removed hourly-check", "removed nightly-digest"]
    assert rows() == {"by-hand": (KIND, "Made at the command line", "every 2h", "skip", 0, 0, {}, False, False)}
    assert beat("by-hand").pk == by_hand.periodic_task_id

    monkeypatch.setattr(Digest, "schedules", (Schedule("by-hand", goal="Taken over", every="1h"),))
    with pytest.raises(InvalidInput, match="a schedule made by hand has that name"):
        sync.schedules_sync()
    assert rows()["by-hand"][1] == "Made at the command line"


def test_a_declared_schedule_paused_by_hand_stays_paused_through_syncs_and_changes(monkeypatch):
    sync.schedules_sync()
    schedules.schedule_pause(name="hourly-check")
    monkeypatch.setattr(Digest, "schedules", (Schedule("hourly-check", goal="Check the inbox", every="30m",
                                                                  jitter="5m"),))
    assert [str(c) for c in sync.schedules_sync()] == ["changed hourly-check (every)",
                                                              "removed nightly-digest"]
    assert rows()["hourly-check"][2:] == ("every 30m", "skip", 0, 300, {}, True, True)
    assert beat("hourly-check").enabled is False


def test_a_process_without_the_kind_leaves_its_declared_schedules_alone():
    sync.schedules_sync()
    with registered():  # a process started with other AGENTOPS_AGENT_MODULES: no Digest
        del registry._definitions[KIND]
        assert sync.schedules_sync() == []
    assert set(rows()) == {"hourly-check", "nightly-digest"}


def test_the_admin_tells_declared_schedules_from_hand_made_ones(admin_client):
    sync.schedules_sync()
    schedules.schedule_add(name="by-hand", kind=KIND, goal="Made at the command line", every="2h")
    declared_page = admin_client.get("/admin/workflows/schedule/?declared__exact=1").content.decode()
    by_hand_page = admin_client.get("/admin/workflows/schedule/?declared__exact=0").content.decode()
    assert "nightly-digest" in declared_page and "by-hand" not in declared_page
    assert "column-declared" in declared_page and "field-declared" in declared_page
    assert "by-hand" in by_hand_page and "nightly-digest" not in by_hand_page


def test_a_beat_entry_deleted_by_hand_is_made_again():
    sync.schedules_sync()
    PeriodicTask.objects.filter(name="agentops schedule hourly-check").delete()
    assert [str(c) for c in sync.schedules_sync()] == ["changed hourly-check (beat entry)"]
    assert beat("hourly-check").interval.every == 3600


@pytest.mark.django_db(transaction=True)
def test_syncs_at_once_make_one_row_each():
    """Two processes starting together (two connections): one adds, the other finds it added."""
    start, results, errors = threading.Barrier(2), [], []

    def one() -> None:
        try:
            start.wait()
            results.append([str(c) for c in sync.schedules_sync()])
        except Exception as exc:  # noqa: BLE001  (the test reports it)
            errors.append(exc)
        finally:
            connection.close()

    threads = [threading.Thread(target=one) for _ in range(2)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=60)
    assert errors == []
    assert sorted(results) == [[], ["added hourly-check", "added nightly-digest"]]
    assert ScheduleRow.objects.count() == 2
    assert PeriodicTask.objects.filter(task=schedules.FIRE_TASK).count() == 2


@pytest.mark.parametrize(("declare", "said"), [
    (lambda: Schedule("bad name!", goal="x", every="1h"), "The schedule name must be 1–80 letters"),
    (lambda: Schedule("neither", goal="x"), "either --cron"),
    (lambda: Schedule("both", goal="x", cron="0 3 * * *", every="1h"), "either --cron"),
    (lambda: Schedule("cron", goal="x", cron="0 3 * *"), "must have five fields"),
    (lambda: Schedule("overlap", goal="x", every="1h", overlap="queue"), "Overlap 'queue' is not one of"),
    (lambda: Schedule("jitter", goal="x", every="1m", jitter="2m"), "must be shorter than --every"),
    (lambda: Schedule("labels", goal="x", every="1h", labels={"Team": "a"}), "label"),
])
def test_a_declaration_wrong_in_itself_is_refused_where_it_is_declared(declare, said):
    with pytest.raises(InvalidInput, match=said) as refused:
        declare()
    assert str(refused.value).startswith("Schedule ") and "declared in code: " in str(refused.value)


@pytest.mark.parametrize(("listed", "said"), [
    ((Schedule("params", goal="x", every="1h", params={"x": 1}),), "takes no parameters"),
    ((Schedule("empty-goal", goal="", every="1h"),), "The goal"),
    ((Schedule("other-kind", goal="x", every="1h", kind="release"),), "a definition's schedules launch its own kind"),
    ((Schedule("twice", goal="x", every="1h"), Schedule("twice", goal="y", every="2h")), "declared twice"),
    ("not a tuple", "must be a tuple of agentops.kind.Schedule values"),
])
def test_a_declaration_the_sync_refuses_changes_nothing(monkeypatch, listed, said):
    sync.schedules_sync()
    before = rows()
    monkeypatch.setattr(Digest, "schedules", (*Digest.schedules[:1], *listed) if isinstance(listed, tuple) else listed)
    with pytest.raises(InvalidInput, match=said):
        sync.schedules_sync()
    assert rows() == before and PeriodicTask.objects.filter(task=schedules.FIRE_TASK).count() == 2


def test_an_app_declares_schedules_that_name_their_kind():
    declare_schedules(Schedule("weekly-report", kind=KIND, goal="Write the weekly report", cron="0 8 * * 1"))
    declare_schedules(Schedule("weekly-report", kind=KIND, goal="Write the weekly report", cron="0 8 * * 1"))
    assert "added weekly-report" in [str(c) for c in sync.schedules_sync()]
    assert rows()["weekly-report"][:3] == (KIND, "Write the weekly report", "cron 0 8 * * 1")
    with pytest.raises(InvalidInput, match="must name its kind"):
        declare_schedules(Schedule("no-kind", goal="x", every="1h"))
    with pytest.raises(InvalidInput, match="declared twice with different values"):
        declare_schedules(Schedule("weekly-report", kind=KIND, goal="Another", cron="0 8 * * 1"))
    with pytest.raises(InvalidInput, match="declared twice: in apps' declare_schedules and in"):
        declare_schedules(Schedule("hourly-check", kind=KIND, goal="x", every="1h"))
        sync.schedules_sync()


def test_the_sync_command_and_its_dry_run(monkeypatch):
    def agent(*args: str) -> str:
        out = StringIO()
        call_command("agent", "schedule", *args, stdout=out)
        return out.getvalue()

    said = agent("sync", "--dry-run")
    assert "2 would change" in said and "would be added nightly-digest" in said and not ScheduleRow.objects.exists()
    assert "2 changed" in agent("sync") and len(rows()) == 2
    assert "none changed (in step)" in agent("sync")
    assert json.loads(agent("sync", "--json")) == {"dry_run": False, "changes": []}
    with pytest.raises(Exception, match="takes no name"):
        agent("sync", "nightly-digest")


@pytest.mark.django_db(transaction=True)  # the start closes its connection
def test_a_worker_or_beat_start_syncs_and_a_refused_declaration_does_not_stop_it(monkeypatch, caplog):
    from agentops.celery import sync_declared_schedules

    sync_declared_schedules()
    assert set(rows()) == {"hourly-check", "nightly-digest"}
    monkeypatch.setattr(Digest, "schedules", (Schedule("params", goal="x", every="1h", params={"x": 1}),))
    sync_declared_schedules()
    assert set(rows()) == {"hourly-check", "nightly-digest"}
    assert [r.reason for r in caplog.records if r.msg == "schedules.sync.refused"] == [
        "Schedule 'params' declared in code: Workflow kind 'test-declared-schedules' takes no parameters; got "
        "['x']. Nothing was changed."]


# --- per-object schedules: schedule_ensure and schedule_remove by a name made from the object -----

def test_schedule_ensure_twice_with_one_name_adds_one_and_other_values_are_refused():
    invoice = 1042
    name = f"invoice-{invoice}-reminder"
    reminder = Schedule(name, kind=KIND, goal=f"Remind about invoice {invoice}", every="1d")
    first = schedule_ensure(reminder)
    again = schedule_ensure(reminder)
    assert again.pk == first.pk and ScheduleRow.objects.filter(name=name).count() == 1
    assert PeriodicTask.objects.filter(name=f"agentops schedule {name}").count() == 1
    with pytest.raises(InvalidInput, match=f"A schedule named '{name}' exists with another goal, every; remove"):
        schedule_ensure(Schedule(name, kind=KIND, goal="Another goal", every="2d"))
    schedule_remove(name)
    assert not ScheduleRow.objects.filter(name=name).exists()


def test_schedule_ensure_refuses_a_schedule_without_its_kind_or_no_schedule_and_writes_nothing():
    with pytest.raises(InvalidInput, match="made by schedule_ensure must name its kind"):
        schedule_ensure(Schedule("invoice-7-reminder", goal="Remind about invoice 7", every="1d"))
    with pytest.raises(InvalidInput, match="takes an agentops.kind.Schedule value"):
        schedule_ensure({"name": "invoice-7-reminder"})  # type: ignore[arg-type]
    with pytest.raises(NotFound):
        schedule_remove("invoice-7-reminder")
    assert not ScheduleRow.objects.exists() and not PeriodicTask.objects.filter(name__startswith="agentops").exists()
