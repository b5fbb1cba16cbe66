"""POST /api/workflows/ID/steer and /fork over real HTTP: permissions, shapes, refusals."""
from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from tests.api.conftest import Http
from tests.api.test_http_api import launch_release
from tests.conftest import drive
from workflows.models import SteerMessage, Workflow

pytestmark = pytest.mark.django_db(transaction=True)


def test_steer_needs_the_change_permission_and_answers_the_clis_shape(
    http: Http, requester_token: str, operator_token: str, git_repo: Path, deploy_target: Any, rung: Any
) -> None:
    workflow_id = launch_release(http, requester_token, git_repo)
    drive(workflow_id)
    base = f"/workflows/{workflow_id}/steer"
    denied = http.post(base, {"message": "hi"}, token=requester_token)
    assert denied.status == 403
    assert "rita may not steer workflows: that needs the permission 'workflows.change_workflow'" \
        in denied.body["error"]
    sent = http.post(base, {"message": "Mention the migration.", "dedupe_key": "m1"}, token=operator_token)
    assert sent.status == 200
    assert (sent.body["outcome"], sent.body["seq"], sent.body["status"]) == ("applied", 1, "waiting")
    assert http.post(base, {"message": "Mention the migration.", "dedupe_key": "m1"},
                     token=operator_token).body["outcome"] == "already_applied"
    assert SteerMessage.objects.get().sender == "olga"
    for bad in ({}, {"message": ""}, {"message": "   "}, {"message": "x" * 10_001}, {"message": "a", "extra": 1},
                {"message": "a", "dedupe_key": "a\nb"}, {"message": 5}):
        answer = http.post(base, bad, token=operator_token)
        assert answer.status == 400, (bad, answer.body)
        assert set(answer.body) == {"error"}
    assert SteerMessage.objects.count() == 1
    shown = http.get(f"/workflows/{workflow_id}", token=requester_token).body
    assert [(m["seq"], m["sender"], m["status"]) for m in shown["steering"]] == [(1, "olga", "pending")]
    assert (shown["forked_from"], shown["forked_from_visit"], shown["forks"]) == (None, None, [])


def test_fork_needs_the_launch_permission_and_refuses_a_visit_out_of_range(
    http: Http, requester_token: str, operator_token: str, git_repo: Path, deploy_target: Any, rung: Any
) -> None:
    workflow_id = launch_release(http, requester_token, git_repo)
    drive(workflow_id)
    base = f"/workflows/{workflow_id}/fork"
    assert http.post(base, {"from_visit": 2}, token=operator_token).status == 403
    forked = http.post(base, {"from_visit": 2}, token=requester_token)
    assert forked.status == 201, forked.body
    assert forked.body == {"id": forked.body["id"], "kind": "release", "status": "running",
                           "current_node": "VERIFY_CANDIDATE", "node_visit": 3, "forked_from": workflow_id,
                           "forked_from_visit": 2}
    refused = http.post(base, {"from_visit": 9}, token=requester_token)
    assert refused.status == 409
    assert refused.body["error"].startswith("The visit to fork from must be between 1 and 4")
    for bad in ({}, {"from_visit": 0}, {"from_visit": "2"}, {"from_visit": 2.5}, {"from_visit": True}):
        assert http.post(base, bad, token=requester_token).status == 400, bad
    assert http.post("/workflows/999999/fork", {"from_visit": 1}, token=requester_token).status == 404
    assert Workflow.objects.count() == 2
    shown = http.get(f"/workflows/{workflow_id}", token=requester_token).body
    assert shown["forks"] == [{"id": forked.body["id"], "from_visit": 2, "status": "running"}]
