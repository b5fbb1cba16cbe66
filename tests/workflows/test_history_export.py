"""`agent export-history` writes JSON Lines (``agentops.history/2``) in constant memory, and
`agent replay-check` reads it, visit by visit, beside the older one-object fixtures."""
from __future__ import annotations

import gc
import json
import shutil
import threading
import tracemalloc
from datetime import timedelta
from io import StringIO
from pathlib import Path

import pytest
from django.core.management import call_command
from django.db import connection, transaction

from bench.history_export import long_history
from tests.conftest import drive, release_params
from tests.workflows.test_replay_check import HISTORIES, SkipsTheTests, replay_check
from workflows import clock, histories, replay, services
from workflows.features.retention import services as retention
from workflows.models import Event, Workflow
from workflows.services.common import event_record, workflow_lock
from workflows.testing import deployed


@pytest.fixture(autouse=True)
def workspaces(settings, tmp_path):
    settings.AGENTOPS_WORKSPACE_DIR = tmp_path / "workspaces"


def exported(workflow_id: int) -> str:
    out = StringIO()
    call_command("agent", "export-history", str(workflow_id), stdout=out)
    return out.getvalue()


@pytest.mark.django_db
def test_export_history_prints_a_header_the_visits_the_events_and_an_end_line_in_that_order():
    workflow = drive(services.workflow_launch(kind="autonomous", goal="Prepare onboarding notes").pk)
    text = exported(workflow.pk)

    assert text.endswith("\n") and "\n\n" not in text
    records = [json.loads(line) for line in text.splitlines()]
    types = [r["type"] for r in records]
    visits = [r for r in records if r["type"] == "visit"]
    events = [r for r in records if r["type"] == "event"]
    assert types == ["header"] + ["visit"] * len(visits) + ["event"] * len(events) + ["end"]
    header, end = records[0], records[-1]
    assert header["format"] == "agentops.history/2"
    assert (header["workflow_id"], header["kind"], header["status"], header["node_visit"], header["event_seq"]) == (
        workflow.pk, "autonomous", "completed", workflow.node_visit, workflow.event_seq)
    assert [v["visit"] for v in visits] == sorted(v["visit"] for v in visits) and visits[0]["visit"] == 1
    assert [e["seq"] for e in events] == list(range(1, workflow.event_seq + 1))
    assert [e["kind"] for e in events] == list(Event.objects.filter(workflow=workflow).values_list("kind", flat=True))
    assert end == {"type": "end", "visits": len(visits), "events": len(events)}
    # the visits are those the replay check reads from the database
    header_history, streamed = histories.read(text.splitlines(keepends=True))
    assert list(streamed) == replay.history_of(workflow).visits
    assert header_history.kind == "autonomous"


@pytest.mark.django_db
def test_replay_check_reads_json_lines_histories_beside_the_older_fixtures(tmp_path):
    workflow = drive(services.workflow_launch(kind="autonomous", goal="Prepare onboarding notes").pk)
    (tmp_path / "autonomous-now.jsonl").write_text(exported(workflow.pk), encoding="utf-8")
    shutil.copy(HISTORIES / "release-completed.json", tmp_path)

    assert replay_check("--fixtures", str(tmp_path)) == (0, "2 of 2 histories replay on the current definitions.\n")


@pytest.mark.django_db
def test_a_changed_definition_is_named_against_a_json_lines_history(tmp_path, git_repo, deploy_target, requester):
    workflow = drive(services.workflow_launch(kind="release", goal="Ship the release notes",
                                              params=release_params(git_repo), user=requester).pk)
    path = tmp_path / "release-waiting.jsonl"
    path.write_text(exported(workflow.pk), encoding="utf-8")

    with deployed(SkipsTheTests):
        code, out = replay_check("--fixtures", str(path), "--json")

    assert code == 1
    [found] = json.loads(out[: out.rindex("}") + 1])["diverged"]
    assert (found["workflow_id"], found["node"], found["visit"]) == (workflow.pk, "BUILD_CANDIDATE", 2)
    assert "the handler now goes to REQUEST_APPROVAL, where the workflow went to VERIFY_CANDIDATE" in found["reason"]


@pytest.mark.django_db
@pytest.mark.parametrize(("damage", "message"), [
    (lambda lines: lines[:-1], "ends before its \"end\" line: it was cut off"),
    (lambda lines: lines[:2] + ['{"type": "visit", "node": \n'] + lines[2:], "line 3 is not JSON"),
    (lambda lines: lines[:1] + ["[1, 2]\n"] + lines[1:], "line 2 is not a history record"),
    (lambda lines: [lines[0].replace("agentops.history/2", "agentops.history/9")] + lines[1:],
     "is not a history written by `agent export-history`"),
    (lambda lines: lines[:-1] + ['{"type":"end","visits":1,"events":0}\n'], "the end line counts 1 visits"),
])
def test_a_cut_off_or_damaged_history_is_refused_with_exit_status_2(tmp_path, damage, message):
    workflow = drive(services.workflow_launch(kind="autonomous", goal="Prepare onboarding notes").pk)
    path = tmp_path / "damaged.jsonl"
    path.write_text("".join(damage(exported(workflow.pk).splitlines(keepends=True))), encoding="utf-8")

    code, out = replay_check("--fixtures", str(path))

    assert code == 2 and message in out, out


def traced_peak(fn) -> int:
    gc.collect()
    tracemalloc.start()
    try:
        fn()
        return tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()


class Counted:
    """A sink that keeps nothing but the count of what was written."""

    def __init__(self) -> None:
        self.chars = 0

    def write(self, text: str) -> int:
        self.chars += len(text)
        return len(text)


@pytest.mark.django_db
def test_export_and_read_memory_does_not_grow_with_the_number_of_visits(tmp_path):
    """Eight times the visits (each the same size, past the fetch sizes): the export's and the
    reader's peak grow by a few per cent of the output's growth at most, and hold a small
    fraction of it; building the history in memory (as before) holds all of it."""
    peaks = {}
    for visits in (120, 960):
        pk = long_history(visits=visits, state_growth_bytes=0, state_bytes=20_000, result_bytes=2_000)
        workflow = Workflow.objects.select_related("release").get(pk=pk)
        sink = Counted()
        export_peak = traced_peak(lambda workflow=workflow, sink=sink: histories.write(workflow, sink))
        path = tmp_path / f"{visits}.jsonl"
        with path.open("w", encoding="utf-8") as file:
            histories.write(workflow, file)

        def read_all(path: Path = path, visits: int = visits) -> None:
            with histories.opened(path) as (_, stream):
                assert sum(1 for _ in stream) == visits

        peaks[visits] = (export_peak, traced_peak(read_all), sink.chars)
    (small_export, small_read, small_chars), (large_export, large_read, large_chars) = peaks[120], peaks[960]
    grown = large_chars - small_chars
    assert grown > 6 * small_chars
    assert large_export - small_export < grown / 20, peaks
    assert large_read - small_read < grown / 20, peaks
    assert large_export < large_chars / 10 and large_read < large_chars / 10, peaks


def in_another_connection(fn) -> None:
    """Run ``fn`` to its commit in a thread of its own (its own database connection), and wait."""
    failed: list[BaseException] = []

    def run() -> None:
        try:
            fn()
        except BaseException as exc:  # noqa: BLE001 - re-raised in the caller's thread
            failed.append(exc)
        finally:
            connection.close()

    thread = threading.Thread(target=run)
    thread.start()
    thread.join(timeout=60)
    assert not thread.is_alive() and not failed, failed


def paused_after_the_first_visit(monkeypatch, meanwhile) -> list[bool]:
    """Make the next export run ``meanwhile`` (once) after it has read its first visit, its
    cursors open; the list it returns says whether it ran."""
    ran: list[bool] = []
    visits_of = replay.visits_of

    def paused(workflow, **kwargs):
        stream = visits_of(workflow, **kwargs)
        yield next(stream)
        if not ran:
            ran.append(True)
            meanwhile()
        yield from stream

    monkeypatch.setattr(replay, "visits_of", paused)
    return ran


def event_records(text: str) -> tuple[dict, list[dict], dict]:
    records = [json.loads(line) for line in text.splitlines()]
    return records[0], [r for r in records if r["type"] == "event"], records[-1]


def archive_now() -> None:
    assert retention.histories_archive_due() == 1


def event_appended(workflow_id: int):
    def append() -> None:
        with transaction.atomic():
            event_record(workflow=workflow_lock(workflow_id), kind="operator.note", at=clock.now(), text="meanwhile")
    return append


@pytest.mark.skipif(connection.vendor != "postgresql", reason="a reader and a writer at once: PostgreSQL")
@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize("meanwhile", ["archived", "event_appended"])
def test_an_export_is_the_snapshot_it_started_from_whatever_commits_meanwhile(
        meanwhile, monkeypatch, settings, tmp_path):
    """Retention archives the workflow (deleting its checkpoints, events and blobs), or a new
    event is recorded, while the export is paused after its first visit: the file is the history
    as it was when the export began, byte for byte (its events 1 to the header's ``event_seq``,
    the end line counting them); the change is wholly out of it and in the next export."""
    settings.AGENTOPS_RETENTION_DAYS = 30
    settings.AGENTOPS_ARCHIVE_DIR = tmp_path / "archive"
    workflow = drive(services.workflow_launch(kind="autonomous", goal="Prepare onboarding notes").pk)
    Workflow.objects.filter(pk=workflow.pk).update(updated_at=clock.now() - timedelta(days=31))
    before = exported(workflow.pk)
    events_before = Event.objects.filter(workflow=workflow).count()
    ran = paused_after_the_first_visit(monkeypatch, lambda: in_another_connection(
        archive_now if meanwhile == "archived" else event_appended(workflow.pk)))

    during = exported(workflow.pk)

    assert ran == [True]
    header, events, end = event_records(during)
    assert [e["seq"] for e in events] == list(range(1, header["event_seq"] + 1)), (
        f"{len(events)} events of {header['event_seq']}")
    assert end["events"] == len(events) == events_before
    assert during == before
    after = Event.objects.filter(workflow=workflow).values_list("kind", flat=True)
    if meanwhile == "archived":
        assert list(after) == ["history.archived"]
        assert exported(workflow.pk) == before, "the archive is the history the export printed"
    else:
        assert len(after) == events_before + 1
        assert event_records(exported(workflow.pk))[1][-1]["kind"] == "operator.note"


def failing() -> None:
    raise RuntimeError("the database connection went away")


@pytest.mark.django_db(transaction=True)
def test_an_export_that_fails_midway_leaves_no_file_and_prints_nothing(monkeypatch, tmp_path):
    """--output PATH: the file appears whole on success; a failure after the first visit leaves
    the path as it was (absent, or the earlier whole file) and no temporary file beside it. On
    stdout nothing is printed, not a part."""
    workflow = drive(services.workflow_launch(kind="autonomous", goal="Prepare onboarding notes").pk)
    path = tmp_path / "exports" / "history.jsonl"
    path.parent.mkdir()
    whole = exported(workflow.pk)
    paused_after_the_first_visit(monkeypatch, failing)
    out = StringIO()

    with pytest.raises(RuntimeError, match="went away"):
        call_command("agent", "export-history", str(workflow.pk), "--output", str(path), stdout=out)
    assert list(path.parent.iterdir()) == [] and out.getvalue() == ""

    monkeypatch.undo()
    call_command("agent", "export-history", str(workflow.pk), "--output", str(path), stdout=out)
    assert path.read_text(encoding="utf-8") == whole and out.getvalue() == ""
    assert path.stat().st_mode & 0o777 == 0o600

    paused_after_the_first_visit(monkeypatch, failing)
    with pytest.raises(RuntimeError, match="went away"):
        call_command("agent", "export-history", str(workflow.pk), "--output", str(path), stdout=out)
    paused_after_the_first_visit(monkeypatch, failing)
    with pytest.raises(RuntimeError, match="went away"):
        call_command("agent", "export-history", str(workflow.pk), stdout=out)
    assert [p.name for p in path.parent.iterdir()] == [path.name] and out.getvalue() == ""
    assert path.read_text(encoding="utf-8") == whole


@pytest.mark.skipif(connection.vendor != "postgresql", reason="a reader and a writer at once: PostgreSQL")
@pytest.mark.django_db(transaction=True)
def test_inside_a_callers_transaction_an_event_recorded_meanwhile_is_refused_not_written(monkeypatch):
    """Nested in a READ COMMITTED transaction (retention's), the reads are not one snapshot: an
    event committed while the export is paused makes it raise HistoryChanged, with no end line."""
    workflow = drive(services.workflow_launch(kind="autonomous", goal="Prepare onboarding notes").pk)
    paused_after_the_first_visit(monkeypatch, lambda: in_another_connection(event_appended(workflow.pk)))
    out = StringIO()

    with pytest.raises(histories.HistoryChanged, match=f"Workflow {workflow.pk}'s history changed while it was "
                                                        f"read: {workflow.event_seq + 1} events"), transaction.atomic():
        histories.write(workflow, out)
    assert '"type":"end"' not in out.getvalue()
