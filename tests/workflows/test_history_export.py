"""`agent export-history` writes JSON Lines (``agentops.history/2``) in constant memory, and
`agent replay-check` reads it, visit by visit, beside the older one-object fixtures."""
from __future__ import annotations

import gc
import json
import shutil
import tracemalloc
from io import StringIO
from pathlib import Path

import pytest
from django.core.management import call_command

from bench.history_export import long_history
from tests.conftest import drive, release_params
from tests.workflows.test_replay_check import HISTORIES, SkipsTheTests, replay_check
from workflows import histories, replay, services
from workflows.models import Event, Workflow
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
