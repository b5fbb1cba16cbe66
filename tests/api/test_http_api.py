"""The HTTP API over real HTTP (the live server): the release agent end to end, tokens, roles, errors."""
from __future__ import annotations

import json
from io import StringIO
from pathlib import Path
from typing import Any

import pytest
from django.core.management import call_command

from tests.api.conftest import Http, token_for
from tests.conftest import drive, open_approval, release_params
from workflows.models import ApiToken, Event, Intent, Wait, Workflow

pytestmark = pytest.mark.django_db(transaction=True)

RESULT_KEYS = {"id", "outcome", "status", "intent_version", "message"}  # signal, supersede, cancel, resume


def launch_release(http: Http, token: str, repo: Path, **extra: Any) -> int:
    answer = http.post("/workflows", {"kind": "release", "goal": "Publish release notes",
                                      "params": release_params(repo), **extra}, token=token)
    assert answer.status == 201, answer.body
    return int(answer.body["id"])


def cli_json(*args: str) -> Any:
    out = StringIO()
    call_command("agent", *args, "--json", stdout=out)
    return json.loads(out.getvalue())


def test_a_release_is_launched_listed_shown_approved_and_completed_over_http(
    http: Http, requester_token: str, approver_token: str, git_repo: Path, deploy_target: Any, rung: Any
) -> None:
    """The whole path an outside system takes, with real requests; the answers are the CLI's JSON shapes."""
    launched = http.post("/workflows", {"kind": "release", "goal": "Publish release notes",
                                        "params": release_params(git_repo)}, token=requester_token)
    assert launched.status == 201
    workflow_id = launched.body["id"]
    assert launched.body == {"id": workflow_id, "kind": "release", "status": "running"}
    assert Workflow.objects.get(pk=workflow_id).launched_by.username == "rita"
    assert drive(workflow_id).status == Workflow.Status.WAITING

    listed = http.get("/workflows?status=waiting", token=approver_token)
    assert listed.status == 200
    assert [w["id"] for w in listed.body["items"]] == [workflow_id]
    assert listed.body == {"items": cli_json("list", "--status", "waiting"), "next_cursor": None}

    shown = http.get(f"/workflows/{workflow_id}", token=approver_token)
    assert shown.status == 200
    assert shown.body == cli_json("show", str(workflow_id))
    [wait] = [w for w in shown.body["waits"] if w["status"] == "open"]

    approved = http.post(f"/waits/{wait['id']}/approve", {"candidate_hash": wait["candidate_hash"],
                                                          "comment": "Read them; fine."}, token=approver_token)
    assert approved.status == 200
    assert approved.body == {"wait_id": wait["id"], "workflow_id": workflow_id, "outcome": "applied",
                             "message": f"Wait {wait['id']} approved by alice."}
    again = http.post(f"/waits/{wait['id']}/approve", {"candidate_hash": wait["candidate_hash"]},
                      token=approver_token)
    assert (again.status, again.body["outcome"]) == (200, "already_applied")

    assert drive(workflow_id).status == Workflow.Status.COMPLETED
    done = http.get(f"/workflows/{workflow_id}?events=5", token=approver_token).body
    assert done["status"] == "completed"
    assert len(done["events"]) == 5
    assert deploy_target.store.stats()["active"] == 1


def test_a_revoked_or_missing_token_gets_401(http: Http, approver_token: str) -> None:
    """No header, a wrong scheme, an unknown token and a revoked one all get 401 saying which."""
    assert http.get("/workflows", token=approver_token).status == 200
    missing = http.get("/workflows")
    assert missing.status == 401
    assert "Authorization: Bearer" in missing.body["error"]
    assert missing.headers["WWW-Authenticate"].startswith("Bearer")
    basic = http.get("/workflows", headers={"Authorization": "Basic YWxpY2U6YWxpY2U="})
    assert (basic.status, "'Basic'" in basic.body["error"]) == (401, True)
    unknown = http.get("/workflows", token="ao_not-a-token-this-server-issued")
    assert (unknown.status, "not one this server issued" in unknown.body["error"]) == (401, True)

    token = ApiToken.objects.get(user__username="alice")
    assert cli_json("token", "revoke", str(token.pk)) == {"id": token.pk, "outcome": "applied"}
    revoked = http.get("/workflows", token=approver_token)
    assert revoked.status == 401
    assert f"API token {token.pk} ({token.prefix}…) was revoked" in revoked.body["error"]
    assert http.post("/workflows/1/resume", token=approver_token).status == 401


def test_the_launcher_approving_gets_403_with_the_reason(
    http: Http, requester_token: str, approver_token: str, outsider: Any, git_repo: Path, deploy_target: Any,
    rung: Any,
) -> None:
    """Self-approval and a missing role are refused as in the admin (403, the service's words); nothing changes."""
    workflow_id = launch_release(http, requester_token, git_repo)
    drive(workflow_id)
    wait = open_approval(workflow_id)
    events = Event.objects.filter(workflow_id=workflow_id).count()

    own = http.post(f"/waits/{wait.pk}/approve", {"candidate_hash": wait.candidate_hash}, token=requester_token)
    assert own.status == 403
    assert own.body == {"error": f"rita launched workflow {workflow_id} and may not decide its approvals "
                                 "(AGENTOPS_ALLOW_SELF_APPROVAL is off); another approver must decide."}
    assert http.post(f"/waits/{wait.pk}/reject", {"comment": "no"}, token=requester_token).status == 403

    stranger = http.post(f"/waits/{wait.pk}/approve", {"candidate_hash": wait.candidate_hash},
                         token=token_for(outsider.username))
    assert stranger.status == 403
    assert "needs a member of group 'release-approvers', and oscar is not one" in stranger.body["error"]

    wait.refresh_from_db()
    assert wait.status == Wait.Status.OPEN
    assert Event.objects.filter(workflow_id=workflow_id).count() == events


def test_a_stale_candidate_hash_gets_409_and_an_unknown_id_404(
    http: Http, requester_token: str, approver_token: str, git_repo: Path, deploy_target: Any, rung: Any
) -> None:
    """Approving another candidate than the open one is a conflict with the service's reason."""
    workflow_id = launch_release(http, requester_token, git_repo)
    drive(workflow_id)
    wait = open_approval(workflow_id)

    stale = http.post(f"/waits/{wait.pk}/approve", {"candidate_hash": "0" * 64}, token=approver_token)
    assert stale.status == 409
    assert f"Wait {wait.pk} is bound to candidate {wait.candidate_hash[:12]}…, not 000000000000…" \
        in stale.body["error"]
    wait.refresh_from_db()
    assert wait.status == Wait.Status.OPEN

    assert http.post("/waits/999999/approve", {"candidate_hash": "x"}, token=approver_token).status == 404
    missing = http.get("/workflows/999999", token=approver_token)
    assert (missing.status, missing.body["error"].startswith("Workflow 999999 does not exist")) == (404, True)


def test_bad_input_gets_400_and_writes_nothing(http: Http, requester_token: str, git_repo: Path) -> None:
    """Malformed JSON, a missing or unknown field, a wrong type and a value the service refuses: 400, no rows."""
    cases: list[tuple[bytes, str]] = [
        (b'{"kind": "release", "goal": ', "The request body is not valid JSON: Expecting value at position 28"),
        (b'["release"]', "The request body must be a JSON object, not list"),
        (json.dumps({"kind": "release"}).encode(), "goal: Field required"),
        (json.dumps({"kind": "release", "goal": "g", "gaol": "typo"}).encode(), "gaol: Extra inputs"),
        (json.dumps({"kind": "release", "goal": "g", "priority": "high"}).encode(), "priority: Input should be"),
        (json.dumps({"kind": "nope", "goal": "g"}).encode(), "nope"),
        (json.dumps({"kind": "release", "goal": "g", "params": release_params(git_repo), "priority": 11}).encode(),
         "priority: Input should be less than or equal to 10"),
        (json.dumps({"kind": "release", "goal": "g", "params": {"repo": "/nowhere", "test_command": "true"}}).encode(),
         "is not a git repository"),
    ]
    for raw, expected in cases:
        answer = http.request("POST", "/workflows", raw=raw, token=requester_token)
        assert answer.status == 400, (raw, answer.body)
        assert set(answer.body) == {"error"}
        assert expected in answer.body["error"], (raw, answer.body)
    assert (Workflow.objects.count(), Intent.objects.count(), Event.objects.count()) == (0, 0, 0)

    assert http.get("/workflows?limit=0", token=requester_token).status == 400
    assert http.get("/workflows?status=sleeping", token=requester_token).status == 400
    assert http.get("/workflows/1?events=-1", token=requester_token).status == 400


def test_operator_verbs_need_the_change_permission_and_answer_like_the_cli(
    http: Http, requester_token: str, operator_token: str, git_repo: Path, deploy_target: Any, rung: Any
) -> None:
    """signal, supersede, budget, resume and cancel: 403 without `workflows.change_workflow`; with it, the
    CLI's shapes; a refused transition is 409."""
    workflow_id = launch_release(http, requester_token, git_repo)
    drive(workflow_id)
    denied = http.post(f"/workflows/{workflow_id}/cancel", {"reason": "mine"}, token=requester_token)
    assert denied.status == 403
    assert "rita may not cancel workflows: that needs the permission 'workflows.change_workflow'" \
        in denied.body["error"]

    base = f"/workflows/{workflow_id}"
    signal = http.post(f"{base}/signal", {"name": "ci.done", "payload": {"ok": True}, "dedupe_key": "ci-1"},
                       token=operator_token)
    # The release agent waits for an approval, not for ci.done: the signal is queued, and says so.
    assert signal.body == {"id": workflow_id, "outcome": "queued", "status": "waiting", "intent_version": 1,
                           "message": f"No wait for signal 'ci.done' is open on workflow {workflow_id}; the signal is "
                                      "queued and the next wait for 'ci.done' receives it (oldest first)."}
    repeat = http.post(f"{base}/signal", {"name": "ci.done", "dedupe_key": "ci-1"}, token=operator_token)
    assert (repeat.body["outcome"], repeat.body["message"]) == (
        "already_applied", "A signal with dedupe key 'ci-1' was received before (still queued); nothing changed.")

    budget = http.post(f"{base}/budget", {"total_usd": "12.50"}, token=operator_token)
    assert budget.status == 200
    assert budget.body["spend"]["budget_total_usd"] == "12.50"
    assert set(budget.body) == {"id", "status", "spend"}
    assert http.post(f"{base}/budget", {}, token=operator_token).status == 400

    superseded = http.post(f"{base}/supersede", {"goal": "Publish shorter notes"}, token=operator_token)
    assert (superseded.body["id"], superseded.body["intent_version"]) == (workflow_id, 2)
    assert Intent.objects.get(workflow_id=workflow_id, version=2).created_by.username == "olga"

    resumed = http.post(f"{base}/resume", token=operator_token)
    assert resumed.status == 200
    assert set(resumed.body) == RESULT_KEYS

    cancelled = http.post(f"{base}/cancel", {"reason": "changed our minds"}, token=operator_token)
    assert cancelled.status == 200
    assert set(cancelled.body) == RESULT_KEYS
    drive(workflow_id)
    assert Workflow.objects.get(pk=workflow_id).status == Workflow.Status.CANCELLED
    refused = http.post(f"{base}/resume", token=operator_token)
    assert refused.status == 409
    assert refused.body == {"error": f"Workflow {workflow_id} is cancelled; it cannot be resumed."}
    assert http.post(f"{base}/supersede", {"goal": "again"}, token=operator_token).status == 409


def test_the_openapi_document_lists_every_path(http: Http, live_server: Any) -> None:
    """/api/openapi.json (no token needed) describes every endpoint, with bearer auth and the error shape;
    /api/docs serves the interactive docs from the app."""
    answer = http.get("/openapi.json")
    assert answer.status == 200
    paths = answer.body["paths"]
    operations = {(method.upper(), path) for path, item in paths.items() for method in item}
    assert operations == {
        ("POST", "/api/workflows"), ("GET", "/api/workflows"), ("GET", "/api/workflows/{workflow_id}"),
        ("POST", "/api/workflows/{workflow_id}/signal"), ("POST", "/api/workflows/{workflow_id}/supersede"),
        ("POST", "/api/workflows/{workflow_id}/cancel"), ("POST", "/api/workflows/{workflow_id}/pause"),
        ("POST", "/api/workflows/{workflow_id}/resume"),
        ("POST", "/api/workflows/{workflow_id}/budget"), ("POST", "/api/workflows/{workflow_id}/priority"),
        ("POST", "/api/waits/{wait_id}/approve"),
        ("POST", "/api/waits/{wait_id}/reject"), ("GET", "/api/workflows/{workflow_id}/events"),
        ("POST", "/api/hooks/{source}/workflows/{workflow_id}/signals/{name}"),
        # docs/live.md: streams, outbound webhooks, cost per step
        ("GET", "/api/workflows/{workflow_id}/events/stream"), ("GET", "/api/events/stream"),
        ("GET", "/api/webhooks"), ("POST", "/api/webhooks"), ("DELETE", "/api/webhooks/{subscription_id}"),
        ("GET", "/api/webhooks/{subscription_id}/deliveries"),
        ("POST", "/api/webhooks/deliveries/{delivery_pk}/redeliver"), ("GET", "/api/workflows/{workflow_id}/costs"),
        # docs/operators.md, "Schedules"; the kinds and their launch parameters
        ("GET", "/api/schedules"), ("POST", "/api/schedules"), ("POST", "/api/schedules/{name}/pause"),
        ("POST", "/api/schedules/{name}/resume"), ("POST", "/api/schedules/{name}/trigger"),
        ("DELETE", "/api/schedules/{name}"), ("GET", "/api/kinds"),
        # docs/operators.md, "Steering" and "Forks"
        ("POST", "/api/workflows/{workflow_id}/steer"), ("POST", "/api/workflows/{workflow_id}/fork"),
    }
    for path, item in paths.items():
        for operation in item.values():
            # A webhook is authenticated by its signature, every other route by a token.
            assert operation.get("security") == (None if "/hooks/" in path else [{"TokenAuth": []}])
            assert operation["responses"]["409"]["content"]["application/json"]["schema"] == {
                "$ref": "#/components/schemas/ErrorOut"}
    assert answer.body["components"]["securitySchemes"]["TokenAuth"]["scheme"] == "bearer"
    assert "candidate_hash" in answer.body["components"]["schemas"]["ApproveIn"]["properties"]

    docs = http.get("/docs")
    assert docs.status == 200
    assert "/api/openapi.json" in docs.body
    assert "cdn" not in docs.body.lower()
