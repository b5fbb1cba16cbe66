"""The `todo` demo of docs/harness.md, driven in process with the scripted provider to `completed`."""
from __future__ import annotations

import json
import subprocess
from pathlib import Path
from typing import Any

import pytest

from agentops.kind.presentation import Workflow
from agentops.kind.testing import events as recorded
from tests.harness.demo_run import DemoRun, todo_demo

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.timeout(300)]

FEATURES = [f"F{n:02d}" for n in range(1, 11)]


@pytest.fixture
def demo(settings: Any, tmp_path_factory: pytest.TempPathFactory) -> tuple[Workflow, DemoRun]:
    return todo_demo(settings, tmp_path_factory)


def events(workflow_id: int, kind: str) -> list[dict[str, Any]]:
    return [event.data for event in recorded(workflow_id, kind)]


def test_the_todo_demo_reaches_completed_with_every_guard_of_the_schedule(demo):
    """Ten features pass on the engine's evidence; tamper, refused passes, the killed session's WIP,
    the group kill, the outside write, the F02 regression and its repair and the premature
    "all done" each leave their event (the stops on the way, approval and F09's pause, are asserted
    as tests/harness/demo_run.py drives it)."""
    workflow, run = demo
    wf, elapsed = workflow, run.wall_seconds
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
    # H5: F06's first session broke `add` and left; the next session's smoke was red, so it repaired main.
    smokes = events(wf.pk, "harness.smoke_ran")
    assert [s["passed"] for s in smokes][:2] == [False, False] and smokes[2]["passed"]  # red until F02 passes
    red_after_green = [i for i, s in enumerate(smokes) if not s["passed"] and any(x["passed"] for x in smokes[:i])]
    assert len(red_after_green) == 1
    repairs = [e for e in events(wf.pk, "harness.check_ran") if e["purpose"] == "repair"]
    assert [(r["feature"], r["passed"]) for r in repairs] == [("REPAIR", True)]
    assert board["F06"]["attempts"] == 2
    # H6: str_replace and insert edits, the soft no-output timeout, an engine-owned service stopped at the end.
    tools_used = {e["tool"] for e in events(wf.pk, "tool.called") if e["ok"]}
    assert {"str_replace", "insert", "read_file", "service_start", "service_logs"} <= tools_used
    assert any("printed nothing for 1 s (soft timeout)" in c["output"] for c in commands)
    assert [s["names"] for s in events(wf.pk, "harness.services_stopped")] == [["web"]]
    # H9: three identical read_file calls ended F07's first session.
    loops = events(wf.pk, "harness.loop_breaker")
    assert [(b["breaker"], b["feature"], b["consequence"]) for b in loops] == [
        ("repeated_tool_call", "F07", "session ended")]
    # H8: the feature budget's pause was recorded, and resumed by a person; F09 passed on its third attempt.
    budget = events(wf.pk, "harness.budget_exhausted")
    assert [(b["level"], b["feature"], b["what"]) for b in budget] == [("feature", "F09", "used its 2 attempts")]
    assert [p["cause"] for p in events(wf.pk, "workflow.paused")] == ["definition"]
    assert board["F09"]["attempts"] == 3 and board["F09"]["attempt_limit"] == 4
    # H4/H11: every session ended with a recorded outcome; progress rows are bounded and structured.
    outcomes = [e["outcome"] for e in events(wf.pk, "harness.session_ended")]
    assert outcomes.count("repeated_call") == 1 and "timeout" not in outcomes
    assert len(workflow.state["memory"]) <= 20 and workflow.state["memory"][-1]["feature"] == "F10"
    assert workflow.state["patterns"] == ["add saves the list before the new task is in it"]  # F06's learning
    checks_run = len(events(wf.pk, "harness.check_ran"))
    print(f"\n[figures] harness todo demo: wall={elapsed:.1f}s sessions={workflow.state['sessions']} "
          f"checks_run={checks_run} verify_all_runs={len(verify_all) // 10}")
    assert workflow.state["sessions"] == 18  # coding sessions, after the initializer
    assert not Workflow.objects.filter(pk=wf.pk, status="failed").exists()
