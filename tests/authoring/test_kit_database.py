"""The test kit's database tier refuses misuse with a message that says what to do, and its list of
fault points is the code's and the page's."""
from __future__ import annotations

import re
from datetime import timedelta
from pathlib import Path

import pytest

from agentops.kind.testing import FAULT_POINTS, Clock, Faults, WorkflowRun, drive, launch, registered
from tests.conftest import one_event_kind
from workflows.errors import NotFound
from workflows.testing.database import doorbells_recorded

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.django_db
def test_drive_names_a_workflow_that_does_not_exist() -> None:
    with pytest.raises(NotFound, match="Workflow 999999 does not exist in this test's database"):
        drive(999999)


def test_drive_refuses_an_in_memory_run() -> None:
    with registered(one_event_kind("kit_db_in_memory")):
        run = WorkflowRun(one_event_kind("kit_db_in_memory"))
        with pytest.raises(TypeError, match="drive takes a workflow row or its id .*, not WorkflowRun"):
            drive(run)


def test_an_unknown_fault_point_is_refused_with_the_known_ones(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="Unknown fault point 'activity.after_clam'; the points are: activity.after_"):
        with Faults(tmp_path / "faults.log").crash_at("activity.after_clam"):
            pass


@pytest.mark.django_db
def test_a_crash_the_block_never_reaches_fails_the_test(tmp_path: Path) -> None:
    """A rule matching no activity the block runs (a misspelt name, say) does not pass silently."""
    faults = Faults(tmp_path / "faults.log")
    with registered(one_event_kind("kit_db_waits")), doorbells_recorded() as rung:
        workflow = launch("kit_db_waits")
        with pytest.raises(AssertionError, match=r"No crash at activity.after_claim \(activity='no_such_activity'\)"):
            with faults.crash_at("activity.after_claim", activity="no_such_activity"):
                assert drive(workflow).status == "waiting"
    assert faults.fired == []
    assert rung.rung == []  # a launch that opens a wait rings nothing


@pytest.mark.django_db
def test_the_clock_moves_forward_only_and_only_while_running() -> None:
    with pytest.raises(RuntimeError, match="not running"):
        Clock().advance(seconds=1)
    with Clock().running() as clock:
        start = clock.now()
        assert timedelta(hours=2) <= clock.advance(hours=2) - start < timedelta(hours=2, minutes=1)
        with pytest.raises(ValueError, match="only moves forward"):
            clock.advance(seconds=-1)
    assert clock.now() < start + timedelta(hours=1)  # real time again


def test_the_fault_points_are_the_code_s_and_the_authoring_page_s() -> None:
    fired = set()
    for path in [*(ROOT / "workflows").rglob("*.py"), *(ROOT / "agentops").rglob("*.py")]:
        fired |= set(re.findall(r"faultpoint\(\s*\"([a-z_.]+)\"", path.read_text()))
    assert fired == set(FAULT_POINTS)
    page = (ROOT / "docs" / "authoring.md").read_text()
    table = re.findall(r"^\| `([a-z_.]+)` \|", page.split("### Fault points", 1)[1], re.M)
    assert table == list(FAULT_POINTS)
