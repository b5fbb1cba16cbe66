"""A 500-feature list (MAX_FEATURES) is launched, validated, approved and worked on; its evidence
(500 failing checks' output tails, over 1 MB together) is stored once and referenced."""
from __future__ import annotations

import json
from typing import Any

import pytest

from tests.harness.conftest import approve_feature_list, drive_all
from workflows import services, statestore
from workflows.models import Activity, StateBlob

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.timeout(300)]

CHECK = 'if [ -f "done/$1" ]; then exit 0; fi\ni=0\nwhile [ $i -lt 25 ]; do echo "FAIL $1 line $i: nothing yet (pid $$), the end-to-end check saw no file ......"; i=$((i+1)); done\nexit 1\n'  # noqa: E501


def _write(path: str, content: str) -> dict[str, Any]:
    return {"tool": "write_file", "input": {"path": path, "content": content}}


def test_a_500_feature_list_is_validated_approved_and_worked_on(harness_approver, settings, tmp_path):
    features = [{"id": f"F{i:03d}", "description": f"feature {i}", "steps": [f"step {i}"], "priority": i,
                 "check": f"sh checks/check.sh F{i:03d}", "passes": False} for i in range(1, 501)]
    schedule = tmp_path / "schedule.json"
    schedule.write_text(json.dumps({"sessions": {
        "INIT/1": [_write("features.json", json.dumps(features)), _write("checks/check.sh", CHECK),
                   _write("checks/smoke.sh", "exit 0\n"), _write("init.sh", "true\n"),
                   _write("progress.md", "# Progress\n"), {"tool": "git_commit", "input": {"message": "scaffold"}},
                   {"tool": "end_session", "input": {"summary": "scaffold"}}],
        "F001/1": [_write("done/F001", "ok\n"), {"tool": "git_commit", "input": {"message": "F001"}},
                   {"tool": "request_pass", "input": {"feature_id": "F001"}}]}}))
    settings.AGENTOPS_HARNESS_SCHEDULE_FILE = str(schedule)
    wf = services.workflow_launch(kind="harness", goal="Build 500 features", params={
        "isolation": "none", "max_sessions": "1"})
    workflow = drive_all(wf.pk)
    assert (workflow.status, workflow.current_node) == ("waiting", "WAIT_FOR_APPROVAL"), workflow.reason

    validation = Activity.objects.get(workflow=workflow, name="harness_validate")
    resolved = statestore.resolve(workflow.pk, validation.result)
    assert len(json.dumps(resolved)) > 1_000_000 > len(json.dumps(validation.result))  # tails stored once
    assert StateBlob.objects.filter(workflow=workflow).count() >= 500
    assert len(json.dumps(workflow.state)) < 20_000  # 16 chunk references, not 500 features
    board = statestore.state_of(workflow)["features"]
    assert len(board) == 500 and all(f["status"] == "failing" for f in board)
    assert board[0]["evidence"]["output_tail"].startswith("FAIL F001 line 0")

    approve_feature_list(wf.pk, harness_approver)
    workflow = drive_all(wf.pk)
    # One session (max_sessions=1): F001 passes, then the budget of sessions asks a person.
    assert (workflow.status, workflow.current_node) == ("paused", "DECIDE"), workflow.reason
    board = {f["id"]: f for f in statestore.state_of(workflow)["features"]}
    assert board["F001"]["status"] == "passing" and board["F002"]["status"] == "failing"
