"""The `todo` demo of docs/harness.md, driven in process with the scripted provider to `completed`."""
from __future__ import annotations

import json
import subprocess
import time
from pathlib import Path
from typing import Any

import pytest

from tests.harness.conftest import approve_feature_list, drive_all
from workflows import services
from workflows.models import Event, Workflow

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.timeout(300)]

FEATURES = [f"F{n:02d}" for n in range(1, 11)]
# The worker "dies" after F03's second session wrote todo.py and before it committed.
KILL_F03_SESSION = [{"point": "harness.after_tool", "action": "raise",
                     "when": {"tool": "write_file", "feature": "F03", "feature_attempt": 2, "attempt": 1}}]


def events(workflow_id: int, kind: str) -> list[dict[str, Any]]:
    return [e.data for e in Event.objects.filter(workflow_id=workflow_id, kind=kind).order_by("seq")]


def test_the_todo_demo_reaches_completed_with_every_guard_of_the_schedule(harness_approver, settings, tmp_path):
    """Ten features pass on the engine's evidence; tamper, refused passes, the killed session's WIP,
    the group kill, the outside write, the F02 regression and its repair and the premature
    "all done" each leave their event."""
    settings.AGENTOPS_TESTING_FAULTS = json.dumps(KILL_F03_SESSION)
    settings.AGENTOPS_FAULT_LOG = str(tmp_path / "faults.log")
    started = time.monotonic()
    wf = services.workflow_launch(kind="harness", goal="Build the todo CLI of the demo", params={})
    workflow = drive_all(wf.pk)
    assert (workflow.status, workflow.current_node) == ("waiting", "WAIT_FOR_APPROVAL")
    assert all(f["status"] == "failing" for f in workflow.state["features"])  # all red on the scaffold
    approve_feature_list(wf.pk, harness_approver)
    workflow = drive_all(wf.pk)
    elapsed = time.monotonic() - started

    assert workflow.status == "completed", (workflow.status, workflow.reason, workflow.state.get("progress"))
    assert workflow.result["features_passing"] == 10
    board = {f["id"]: f for f in workflow.state["features"]}
    head = workflow.state["head"]
    for fid in FEATURES:
        evidence = board[fid]["evidence"]
        assert (board[fid]["status"], evidence["exit_code"], evidence["commit"], evidence["where"]) == (
            "passing", 0, head, "clone")
        assert evidence["command"].startswith(f"python checks/check_{fid.lower()}_")
    root = Path(workflow.state["workspace"])

    # H2: the tamper of session 2 was reverted; features.json is the approved one.
    tamper = events(wf.pk, "harness.tamper_reverted")
    assert [t["paths"] for t in tamper] == [["features.json"]]
    assert json.loads((root / "features.json").read_text())[2]["passes"] is False
    # H3: the pass asked for another feature was refused; H1: the buggy F03 was refused by its check.
    refused = events(wf.pk, "harness.tool_refused")
    assert any("holds the lease on F02, not F03" in r["reason"] for r in refused)
    verifies = [e for e in events(wf.pk, "harness.check_ran") if e["purpose"] == "verify"]
    assert [(v["feature"], v["passed"]) for v in verifies if v["feature"] == "F03"] == [("F03", False), ("F03", True)]
    # H4: the killed session's half-work is on wip/F03/2 and the retry started from its base.
    wips = events(wf.pk, "harness.wip_saved")
    assert [w["ref"] for w in wips] == ["wip/F03/2"] and wips[0]["files"] == ["todo.py"]
    assert subprocess.run(["git", "-C", str(root), "rev-parse", "--verify", "refs/heads/wip/F03/2"],
                          capture_output=True).returncode == 0
    # H6 (partly): the blocking child was killed with its group; the write outside was refused.
    commands = [e for e in events(wf.pk, "tool.called") if e["tool"] == "run_command"]
    assert any("timed out" in c["output"] for c in commands)
    assert any("outside the workspace" in r["reason"] for r in refused)
    assert not (root.parent / "outside.txt").exists()
    # H5: F04's session broke F02; the regression run flipped it back, the next session repaired it.
    regressions = [e for e in events(wf.pk, "harness.check_ran") if e["purpose"] == "regression" and not e["passed"]]
    assert [r["feature"] for r in regressions] == ["F02"]
    assert board["F02"]["attempts"] == 2 and board["F03"]["attempts"] == 2
    # H10: "all done" from F10's first session only triggered VERIFY_ALL, which found F10 red.
    verify_all = [e for e in events(wf.pk, "harness.check_ran") if e["purpose"] == "verify_all"]
    assert [e["feature"] for e in verify_all if not e["passed"]] == ["F10"]
    assert board["F10"]["attempts"] == 2
    checks_run = len(events(wf.pk, "harness.check_ran"))
    print(f"\n[figures] harness todo demo: wall={elapsed:.1f}s sessions={workflow.state['sessions']} "
          f"checks_run={checks_run} verify_all_runs={len(verify_all) // 10}")
    assert workflow.state["sessions"] == 13  # coding sessions, after the initializer
    assert not Workflow.objects.filter(pk=wf.pk, status="failed").exists()
