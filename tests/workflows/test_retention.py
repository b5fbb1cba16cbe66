"""Retention: finished workflows' checkpoints and events move to an archive file after
AGENTOPS_RETENTION_DAYS, archive first; the workflow row stays and says where they went."""
from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time
from datetime import timedelta
from io import StringIO
from pathlib import Path
from typing import Any

import pytest
from django.core.management import CommandError, call_command
from django.db import connection

from tests.conftest import drive, release_params, run_at_once
from tests.workflows.test_replay_check import replay_check
from workflows import clock, services, statestore
from workflows.engine import Complete, Decision, Goto, NodeContext, WorkflowDefinition, node
from workflows.errors import TransitionRefused
from workflows.features import forks
from workflows.features.retention import services as retention
from workflows.models import Checkpoint, Event, StateBlob, Workflow
from workflows.testing import registered
from workflows.testing.cluster import subprocess_database_url

ROOT = Path(__file__).resolve().parents[2]
DAYS = 30


@pytest.fixture(autouse=True)
def retention_on(settings, tmp_path):
    settings.AGENTOPS_WORKSPACE_DIR = tmp_path / "workspaces"
    settings.AGENTOPS_RETENTION_DAYS = DAYS
    settings.AGENTOPS_ARCHIVE_DIR = tmp_path / "archive"
    return settings.AGENTOPS_ARCHIVE_DIR


def finished() -> Workflow:
    workflow = drive(services.workflow_launch(kind="autonomous", goal="Prepare onboarding notes").pk)
    assert workflow.status == Workflow.Status.COMPLETED, workflow.reason
    return workflow


def exported(workflow_id: int) -> str:
    out = StringIO()
    call_command("agent", "export-history", str(workflow_id), stdout=out)
    return out.getvalue()


def rows(workflow_id: int) -> tuple[int, int]:
    return Checkpoint.objects.filter(workflow_id=workflow_id).count(), Event.objects.filter(
        workflow_id=workflow_id).count()


@pytest.mark.django_db
def test_a_workflow_finished_longer_ago_than_the_age_is_archived_then_its_rows_deleted(time_machine):
    """The archive is the export, byte for byte; replay-check replays it; the row stays, marked,
    with one `history.archived` event; `agent show` and export-history say where it went."""
    workflow = finished()
    before = exported(workflow.pk)
    checkpoints, events = rows(workflow.pk)
    assert checkpoints > 5 and events > 20
    time_machine.move_to(workflow.updated_at + timedelta(days=DAYS, seconds=1))

    assert retention.histories_archive_due() == 1

    workflow.refresh_from_db()
    archive = Path(workflow.history_archive_path)
    assert workflow.history_archived_at is not None and archive.is_file()
    assert archive.read_text(encoding="utf-8") == before
    assert oct(archive.stat().st_mode & 0o777) == "0o600"
    [marker] = Event.objects.filter(workflow=workflow)
    assert (marker.kind, marker.seq) == ("history.archived", events + 1)
    assert marker.data == {"path": str(archive), "visits": checkpoints + 1, "checkpoints": checkpoints,
                           "events": events, "blobs": 0, "through_seq": events}
    assert (rows(workflow.pk), workflow.checkpoint_id, workflow.status) == ((0, 1), None, "completed")
    assert replay_check("--fixtures", str(archive)) == (0, "1 of 1 histories replay on the current definitions.\n")
    assert exported(workflow.pk) == before

    out = StringIO()
    call_command("agent", "show", str(workflow.pk), stdout=out)
    shown = " ".join(out.getvalue().split())  # rich wraps long lines at 120 columns
    assert (f"History: archived on {workflow.history_archived_at.isoformat()[:19]} to {archive} (its checkpoints "
            f"and the events before it); `manage.py agent export-history {workflow.pk}` prints it") in shown
    out = StringIO()
    call_command("agent", "show", str(workflow.pk), "--json", stdout=out)
    detail = json.loads(out.getvalue())
    assert detail["history_archive"] == {
        "archived_at": workflow.history_archived_at.isoformat(), "path": str(archive),
        "export": f"manage.py agent export-history {workflow.pk}"}
    assert [e["kind"] for e in detail["events"]] == ["history.archived"]


@pytest.mark.django_db
def test_a_workflow_finished_more_recently_than_the_age_is_kept(time_machine, retention_on):
    workflow = finished()
    before = rows(workflow.pk)
    time_machine.move_to(workflow.updated_at + timedelta(days=DAYS, seconds=-60))

    assert retention.histories_archive_due() == 0

    workflow.refresh_from_db()
    assert (rows(workflow.pk), workflow.history_archived_at, workflow.history_archive_claimed_at) == (before, None,
                                                                                                     None)
    assert not retention_on.exists()


@pytest.mark.django_db
def test_retention_days_0_keeps_every_history_forever(time_machine, settings):
    workflow = finished()
    before = rows(workflow.pk)
    settings.AGENTOPS_RETENTION_DAYS = 0
    time_machine.move_to(workflow.updated_at + timedelta(days=4000))

    assert retention.histories_archive_due() == 0
    assert rows(workflow.pk) == before


@pytest.mark.django_db
@pytest.mark.parametrize("status", ["created", "running", "waiting", "paused", "cancelling"])
def test_a_workflow_that_is_not_finished_is_never_archived_however_old(status, time_machine, retention_on):
    """Only completed, failed and cancelled workflows are claimed; a live one keeps every row."""
    live = finished()
    Workflow.objects.filter(pk=live.pk).update(status=status)
    before = rows(live.pk)
    time_machine.move_to(live.updated_at + timedelta(days=DAYS * 100))

    assert retention.histories_archive_due() == 0

    live.refresh_from_db()
    assert (rows(live.pk), live.history_archived_at, live.history_archive_claimed_at) == (before, None, None)
    assert not retention_on.exists()


@pytest.mark.django_db
def test_a_claimed_workflow_that_came_back_to_life_is_not_deleted(time_machine):
    """The claim is checked again under the row lock: a workflow whose status is not final there
    (a row changed by hand, say) keeps its rows."""
    workflow = finished()
    before = rows(workflow.pk)
    time_machine.move_to(workflow.updated_at + timedelta(days=DAYS + 1))
    now = clock.now()
    [claimed] = retention._claim_due(now=now, finished_before=now - timedelta(days=DAYS))
    Workflow.objects.filter(pk=claimed).update(status="running")

    assert retention.history_archive_if_claimed(workflow_id=claimed, claimed_at=now) is False
    assert rows(workflow.pk) == before


@pytest.mark.django_db
def test_each_run_archives_at_most_the_batch_oldest_first(time_machine, settings):
    workflows = [finished() for _ in range(3)]
    settings.AGENTOPS_RETENTION_BATCH_SIZE = 2
    time_machine.move_to(workflows[-1].updated_at + timedelta(days=DAYS + 1))

    assert retention.histories_archive_due() == 2
    archived = set(Workflow.objects.filter(history_archived_at__isnull=False).values_list("pk", flat=True))
    assert archived == {workflows[0].pk, workflows[1].pk}
    assert retention.histories_archive_due() == 1
    assert retention.histories_archive_due() == 0


@pytest.mark.django_db
def test_a_second_run_changes_nothing(time_machine):
    workflow = finished()
    time_machine.move_to(workflow.updated_at + timedelta(days=DAYS + 1))
    assert retention.histories_archive_due() == 1
    workflow.refresh_from_db()
    archive = Path(workflow.history_archive_path)
    first = (archive.read_bytes(), archive.stat().st_mtime_ns, rows(workflow.pk), workflow.history_archived_at,
             list(Event.objects.filter(workflow=workflow).values_list("seq", "kind")))
    time_machine.shift(timedelta(days=DAYS * 3))

    assert retention.histories_archive_due() == 0

    workflow.refresh_from_db()
    assert (archive.read_bytes(), archive.stat().st_mtime_ns, rows(workflow.pk), workflow.history_archived_at,
            list(Event.objects.filter(workflow=workflow).values_list("seq", "kind"))) == first
    assert sorted(p.name for p in archive.parent.iterdir()) == [archive.name], "no temporary file is left"


@pytest.mark.django_db(transaction=True)
def test_two_beats_at_once_archive_each_workflow_once(time_machine):
    workflows = [finished() for _ in range(4)]
    time_machine.move_to(workflows[-1].updated_at + timedelta(days=DAYS + 1))

    results = run_at_once(retention.histories_archive_due)

    assert all(isinstance(r, int) for r in results) and sum(results) == 4, results
    for workflow in workflows:
        assert list(Event.objects.filter(workflow=workflow).values_list("kind", flat=True)) == ["history.archived"]
    assert Checkpoint.objects.filter(workflow__in=workflows).count() == 0


@pytest.mark.django_db(transaction=True)
def test_killed_between_archive_and_delete_keeps_every_row_then_the_next_run_finishes(
        retention_on, settings, tmp_path, time_machine):
    """SIGKILL after the archive is written and fsynced, before the delete: the rows are all
    there and unmarked (admin and show see the whole history), the archive is whole; a run
    after the claim expired writes it again and deletes."""
    workflow = finished()
    Workflow.objects.filter(pk=workflow.pk).update(updated_at=clock.now() - timedelta(days=DAYS + 1))
    before, counts = exported(workflow.pk), rows(workflow.pk)
    fault_log = tmp_path / "faults.log"
    env = {k: v for k, v in os.environ.items() if not k.startswith(("AGENTOPS_", "DATABASE_URL"))}
    env.update(DJANGO_SETTINGS_MODULE="agentops.settings", DATABASE_URL=subprocess_database_url(),
               AGENTOPS_RETENTION_DAYS=str(DAYS), AGENTOPS_ARCHIVE_DIR=str(retention_on),
               AGENTOPS_FAULT_LOG=str(fault_log), AGENTOPS_VAR_DIR=str(tmp_path / "var"),
               AGENTOPS_TESTING_FAULTS=json.dumps([{"point": "retention.archive_written", "action": "sigkill_self"}]))
    code = ("import django; django.setup(); from workflows.features.retention import services; "
            "services.histories_archive_due()")
    done = subprocess.run([sys.executable, "-c", code], cwd=ROOT, env=env, capture_output=True, text=True, timeout=120)

    assert done.returncode == -9, done.stderr[-2000:]
    assert json.loads(fault_log.read_text())["workflow_id"] == workflow.pk
    workflow.refresh_from_db()
    assert (workflow.history_archived_at, workflow.history_archive_path) == (None, "")
    assert workflow.history_archive_claimed_at is not None
    assert rows(workflow.pk) == counts
    archive = retention.archive_path(workflow)
    assert archive.read_text(encoding="utf-8") == before == exported(workflow.pk)
    assert [p.name for p in archive.parent.iterdir()] == [archive.name]

    assert retention.histories_archive_due() == 0, "the dead run's claim holds until it expires"
    time_machine.move_to(workflow.history_archive_claimed_at + timedelta(
        seconds=settings.AGENTOPS_RETENTION_CLAIM_SECONDS + 1))
    assert retention.histories_archive_due() == 1

    workflow.refresh_from_db()
    assert workflow.history_archive_path == str(archive) and rows(workflow.pk) == (0, 1)
    assert replay_check("--fixtures", str(archive))[0] == 0


@pytest.mark.django_db
def test_an_archive_that_cannot_be_read_is_named_by_export_history(time_machine):
    workflow = finished()
    time_machine.move_to(workflow.updated_at + timedelta(days=DAYS + 1))
    assert retention.histories_archive_due() == 1
    workflow.refresh_from_db()
    Path(workflow.history_archive_path).unlink()

    with pytest.raises(CommandError, match=f"Workflow {workflow.pk}'s history was archived on .* to "
                                           f"{workflow.history_archive_path}, which cannot be read here") as exc:
        exported(workflow.pk)
    assert exc.value.returncode == 2


@pytest.mark.django_db
def test_the_admin_page_of_an_archived_workflow_says_where_its_history_went(time_machine, admin_client, git_repo,
                                                                            deploy_target, requester):
    workflow = finished()
    time_machine.move_to(workflow.updated_at + timedelta(days=DAYS + 1))
    assert retention.histories_archive_due() == 1
    workflow.refresh_from_db()
    time_machine.move_to(workflow.updated_at + timedelta(seconds=1))  # the admin's session is a day old, not 30

    page = admin_client.get(f"/admin/workflows/workflow/{workflow.pk}/change/")

    assert page.status_code == 200
    html = page.content.decode()
    assert 'id="history-archived"' in html and workflow.history_archive_path in html
    assert f"manage.py agent export-history {workflow.pk}" in html
    assert "history.archived" in html
    # a live release workflow beside it keeps its whole page
    live = drive(services.workflow_launch(kind="release", goal="Ship the release notes",
                                          params=release_params(git_repo), user=requester).pk)
    live_page = admin_client.get(f"/admin/workflows/workflow/{live.pk}/change/").content.decode()
    assert 'id="history-archived"' not in live_page and "No checkpoints yet" not in live_page


@pytest.mark.parametrize(("name", "value", "message"), [
    ("AGENTOPS_RETENTION_DAYS", "-1", "AGENTOPS_RETENTION_DAYS=-1 must be 0 (keep forever) or more."),
    ("AGENTOPS_RETENTION_DAYS", "a month", "AGENTOPS_RETENTION_DAYS='a month' is not a number"),
    ("AGENTOPS_RETENTION_BATCH_SIZE", "0", "AGENTOPS_RETENTION_BATCH_SIZE=0 must be at least 1."),
])
def test_a_bad_retention_setting_stops_start_up_with_what_to_set(tmp_path, name, value, message):
    env = {k: v for k, v in os.environ.items() if not k.startswith(("AGENTOPS_", "DATABASE_URL"))}
    env.update({name: value, "DATABASE_URL": f"sqlite:///{tmp_path / 'db.sqlite3'}",
                "AGENTOPS_VAR_DIR": str(tmp_path / "var")})
    done = subprocess.run([sys.executable, "manage.py", "check"], cwd=ROOT, env=env, capture_output=True, text=True,
                          timeout=120)

    assert done.returncode != 0 and message in done.stderr, done.stderr[-1500:]


class Redraft(WorkflowDefinition):
    """Writes a long draft, replaces it with another, keeps a long note throughout."""

    kind = "redraft"
    start_node = "DRAFT"
    revalidate_node = "DRAFT"

    @node("DRAFT")
    def draft(self, ctx: NodeContext[Any]) -> Decision:
        return Goto("REVISE", {"draft": "first draft " * 200, "notes": ["kept note " * 200, "short"]})

    @node("REVISE")
    def revise(self, ctx: NodeContext[Any]) -> Decision:
        return Goto("PUBLISH", {"draft": "second draft " * 200})

    @node("PUBLISH")
    def publish(self, ctx: NodeContext[Any]) -> Decision:
        return Complete({"chars": len(ctx.state["draft"])})


def blobs_of(workflow: Workflow) -> set[str]:
    return set(StateBlob.objects.filter(workflow=workflow).values_list("digest", flat=True))


@pytest.mark.django_db
def test_archiving_deletes_the_blobs_no_remaining_row_references_and_keeps_a_forks(settings, monkeypatch):
    """The first draft, which only a deleted checkpoint referenced, goes; the second draft and the
    note (the row's state) stay; the fork's rows for the same texts all stay, and it still reads them."""
    settings.AGENTOPS_STATE_BLOB_MIN_CHARS = 1024
    first, second, note = (statestore.digest_of(text) for text in ("first draft " * 200, "second draft " * 200,
                                                                    "kept note " * 200))
    with registered(Redraft):
        original = drive(services.workflow_launch(kind="redraft", goal="Publish the notes").pk)
        fork = drive(forks.workflow_fork(workflow_id=original.pk, from_visit=1).pk)
    assert (original.status, fork.status) == ("completed", "completed")
    assert blobs_of(original) == blobs_of(fork) == {first, second, note}
    fork_states = {visit: statestore.state_at(fork, visit) for visit in (2, 3)}
    checkpoints = Checkpoint.objects.filter(workflow=original).count()
    Workflow.objects.filter(pk=original.pk).update(updated_at=clock.now() - timedelta(days=DAYS + 1))

    assert retention.histories_archive_due() == 1

    assert blobs_of(original) == {second, note}
    assert blobs_of(fork) == {first, second, note}
    assert {visit: statestore.state_at(fork, visit) for visit in (2, 3)} == fork_states
    assert fork_states[2]["draft"] == "first draft " * 200
    archived = Workflow.objects.get(pk=original.pk)
    monkeypatch.setattr(statestore, "_cache", statestore._BlobCache(max_chars=1_000_000))  # read the rows
    assert statestore.state_of(archived) == {"draft": "second draft " * 200, "notes": ["kept note " * 200, "short"]}
    [marker] = Event.objects.filter(workflow=original)
    assert (marker.data["checkpoints"], marker.data["blobs"]) == (checkpoints, 1)
    assert retention.histories_archive_due() == 0 and blobs_of(fork) == {first, second, note}


def waiting_for_a_lock(*, seconds: float = 10) -> int:
    """How many other sessions of this database wait for a lock, once one does (or ``seconds`` pass)."""
    deadline = time.monotonic() + seconds
    while True:
        with connection.cursor() as cursor:
            # Sessions of other databases on the server (another suite's) are not counted; the
            # activity view is read once per transaction unless its snapshot is cleared.
            cursor.execute("SELECT pg_stat_clear_snapshot()")
            cursor.execute("SELECT count(DISTINCT l.pid) FROM pg_locks l JOIN pg_stat_activity a ON a.pid = l.pid "
                           "WHERE NOT l.granted AND l.pid <> pg_backend_pid() AND a.datname = current_database()")
            waiting = cursor.fetchone()[0]
        if waiting or time.monotonic() > deadline:
            return int(waiting)
        time.sleep(0.05)


@pytest.mark.skipif(connection.vendor != "postgresql", reason="a fork and retention at once: PostgreSQL")
@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize("when", ["after_the_archive_is_written", "while_retention_holds_the_lock"])
def test_a_fork_created_while_retention_archives_the_original_keeps_every_blob_it_references(
        when, settings, monkeypatch):
    """A fork of the original created from another connection after the archive is written (it
    commits first), or while retention deletes under the row lock (it waits, then is refused):
    the fork, if made, reads every state it has from its own rows; the original keeps what its row
    references."""
    settings.AGENTOPS_STATE_BLOB_MIN_CHARS = 1024
    first, second, note = (statestore.digest_of(text) for text in ("first draft " * 200, "second draft " * 200,
                                                                    "kept note " * 200))
    made: list[Any] = []

    def fork_it() -> None:
        try:
            made.append(forks.workflow_fork(workflow_id=original.pk, from_visit=1))
        except Exception as exc:  # noqa: BLE001 - asserted on below
            made.append(exc)
        finally:
            connection.close()

    def meanwhile() -> threading.Thread:
        thread = threading.Thread(target=fork_it)
        thread.start()
        return thread

    with registered(Redraft):
        original = drive(services.workflow_launch(kind="redraft", goal="Publish the notes").pk)
        Workflow.objects.filter(pk=original.pk).update(updated_at=clock.now() - timedelta(days=DAYS + 1))
        threads: list[threading.Thread] = []
        if when == "after_the_archive_is_written":
            def written(point: str, **context: Any) -> None:
                threads.append(meanwhile())
                threads[-1].join(timeout=60)  # committed before retention takes the row lock
            monkeypatch.setattr(retention.faults, "faultpoint", written)
        else:
            delete = retention.blobs_unreferenced_delete

            def deleting(workflow: Workflow, **kwargs: Any) -> int:
                threads.append(meanwhile())
                assert waiting_for_a_lock() == 1, "the fork waits for the row lock retention holds"
                return delete(workflow, **kwargs)
            monkeypatch.setattr(retention, "blobs_unreferenced_delete", deleting)

        assert retention.histories_archive_due() == 1
        threads[0].join(timeout=60)

    assert blobs_of(original) == {second, note}
    [outcome] = made
    if when == "after_the_archive_is_written":
        assert isinstance(outcome, Workflow), outcome
        monkeypatch.setattr(statestore, "_cache", statestore._BlobCache(max_chars=1_000_000))  # read the rows
        assert {first, note} <= blobs_of(outcome)
        assert statestore.state_at(outcome, 2) == {"draft": "first draft " * 200,
                                                   "notes": ["kept note " * 200, "short"]}
    else:
        assert isinstance(outcome, TransitionRefused) and "were archived to" in str(outcome), outcome
