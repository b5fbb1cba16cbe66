"""A 500-feature list (MAX_FEATURES) is launched, validated, approved and worked on; its evidence
(500 failing checks' output tails, over 1 MB together) is stored once and referenced; the admin
page, ``agent show --json`` and the API's workflow read stay small."""
from __future__ import annotations

import io
import json
import re
from typing import Any

import pytest
from django.contrib.auth.models import User
from django.core.management import call_command
from django.test import Client
from django.urls import reverse

from agentops.kind import resolve, state_of
from agentops.kind.presentation import Activity, Workflow
from agentops.kind.testing import launch
from tests.api.conftest import token_for
from tests.harness.conftest import approve_feature_list, drive_all

READ_LIMIT_BYTES = 300_000

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
    wf = launch("harness", goal="Build 500 features", params={
        "isolation": "none", "max_sessions": "1"})
    workflow = drive_all(wf.pk)
    assert (workflow.status, workflow.current_node) == ("waiting", "WAIT_FOR_APPROVAL"), workflow.reason

    validation = Activity.objects.get(workflow=workflow, name="harness_validate")
    resolved = resolve(workflow.pk, validation.result)
    assert len(json.dumps(resolved)) > 1_000_000 > len(json.dumps(validation.result))  # tails stored once
    assert len(json.dumps(workflow.state)) < 20_000  # 16 chunk references, not 500 features
    board = state_of(workflow)["features"]
    assert len(board) == 500 and all(f["status"] == "failing" for f in board)
    assert board[0]["evidence"]["output_tail"].startswith("FAIL F001 line 0")

    approve_feature_list(wf.pk, harness_approver)
    workflow = drive_all(wf.pk)
    # One session (max_sessions=1): F001 passes, then the budget of sessions asks a person.
    assert (workflow.status, workflow.current_node) == ("paused", "DECIDE"), workflow.reason
    board = {f["id"]: f for f in state_of(workflow)["features"]}
    assert board["F001"]["status"] == "passing" and board["F002"]["status"] == "failing"
    assert_bounded_reads(workflow)


def feature_ids(page: str) -> list[str]:
    return re.findall(r'<tr id="feature-(F\d+)">', page)


def assert_bounded_reads(workflow: Workflow) -> None:
    """The board is paged 50 a page in the list's order and narrows to a status; each read of the
    workflow is under READ_LIMIT_BYTES with 500 features and their evidence."""
    admin = User.objects.create_superuser("root", "root@example.invalid", "root-password")
    client = Client()
    client.force_login(admin)
    url = reverse("admin:workflows_workflow_change", args=[workflow.pk])

    first = client.get(url).content.decode()
    assert len(first) < READ_LIMIT_BYTES, len(first)
    assert feature_ids(first) == [f"F{i:03d}" for i in range(1, 51)]
    assert "Features 1–50 of 500, in the list's order (50 a page)." in first
    assert f'href="{url}?features=10#features">10</a>' in first and "1 passing, 499 failing, 0 blocked." in first

    last = client.get(url, {"features": "10"}).content.decode()
    assert feature_ids(last) == [f"F{i:03d}" for i in range(451, 501)] and "Features 451–500 of 500" in last
    assert feature_ids(client.get(url, {"features": "99"}).content.decode())[0] == "F451"  # the nearest page
    passing = client.get(url, {"feature_status": "passing"}).content.decode()
    assert feature_ids(passing) == ["F001"] and "Features 1–1 of 1 passing" in passing
    failing = client.get(url, {"features": "1", "feature_status": "failing"}).content.decode()
    assert feature_ids(failing)[:2] == ["F002", "F003"] and len(feature_ids(failing)) == 50
    assert f'href="{url}?features=2&amp;feature_status=failing#features">2</a>' in failing
    unknown = client.get(url, {"feature_status": "<b>"}).content.decode()
    assert feature_ids(unknown) == feature_ids(first) and "<b>" not in unknown  # an unknown status shows all

    out = io.StringIO()
    call_command("agent", "show", str(workflow.pk), "--json", stdout=out)
    shown = json.loads(out.getvalue())
    assert len(out.getvalue()) < READ_LIMIT_BYTES and len(shown["features"]) == 500
    api = Client(HTTP_AUTHORIZATION=f"Bearer {token_for(admin.username)}").get(f"/api/workflows/{workflow.pk}")
    assert api.status_code == 200 and len(api.content) < READ_LIMIT_BYTES
    assert api.json()["activities_left_out"] == Activity.objects.filter(workflow=workflow).count() - len(
        api.json()["activities"])
