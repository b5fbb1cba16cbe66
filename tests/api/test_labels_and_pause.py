"""Labels and the operator pause over real HTTP: launch with labels, filter by them, pause and resume."""
from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import pytest

from tests.api.conftest import Http
from tests.conftest import one_event_kind
from workflows.models import Event, Intent, Workflow, WorkflowLabel
from workflows.testing import registered

pytestmark = pytest.mark.django_db(transaction=True)

Labelled = one_event_kind("labelled")


@pytest.fixture(autouse=True)
def labelled() -> Iterator[None]:
    with registered(Labelled):
        yield


def launch(http: Http, token: str, **labels: str) -> int:
    answer = http.post("/workflows", {"kind": "labelled", "goal": "g", "labels": labels}, token=token)
    assert answer.status == 201, answer.body
    return int(answer.body["id"])


def test_labels_given_at_launch_are_shown_and_filter_the_list(http: Http, requester_token: str) -> None:
    """`label=key=value`, repeatable: every one must hold; the read and the list show them."""
    a = launch(http, requester_token, team="infra", env="prod")
    b = launch(http, requester_token, team="infra", env="dev")
    launch(http, requester_token, team="web")

    def listed(query: str) -> list[int]:
        answer = http.get(f"/workflows?{query}", token=requester_token)
        assert answer.status == 200, answer.body
        return [item["id"] for item in answer.body["items"]]

    assert listed("label=team=infra") == [b, a]
    assert listed("label=team=infra&label=env=prod") == [a]
    assert listed("label=team=infra&label=team=web") == []
    assert listed("label=team=infra&label=env=prod&kind=labelled&status=waiting") == [a]
    page = http.get("/workflows?label=team=infra&limit=1", token=requester_token).body
    assert [item["labels"] for item in page["items"]] == [{"env": "dev", "team": "infra"}]
    assert listed(f"label=team=infra&limit=1&cursor={page['next_cursor']}") == [a]
    assert http.get(f"/workflows/{a}", token=requester_token).body["labels"] == {"env": "prod", "team": "infra"}


@pytest.mark.parametrize("labels", [
    {"Team": "infra"}, {"team": ""}, {"team": "in fra"}, {"team": 5}, {"team": "x" * 129}, ["team=infra"],
    {f"k{i}": "v" for i in range(17)},
])
def test_a_bad_label_at_launch_gets_400_and_launches_nothing(http: Http, requester_token: str, labels: Any) -> None:
    answer = http.request("POST", "/workflows", raw=json.dumps({"kind": "labelled", "goal": "g",
                                                                 "labels": labels}).encode(), token=requester_token)
    assert answer.status == 400, answer.body
    assert set(answer.body) == {"error"} and "labels" in answer.body["error"], answer.body
    assert (Workflow.objects.count(), WorkflowLabel.objects.count(), Intent.objects.count()) == (0, 0, 0)


@pytest.mark.parametrize("query", ["label=team", "label=Team=infra", "label=team=in%20fra", "label=team%3D",
                                   "&".join(f"label=k{i}=v" for i in range(17))])
def test_a_bad_label_filter_gets_400(http: Http, requester_token: str, query: str) -> None:
    answer = http.get(f"/workflows?{query}", token=requester_token)
    assert answer.status == 400, answer.body
    assert set(answer.body) == {"error"}


def test_pause_and_resume_need_the_change_permission_and_are_recorded_with_who(
    http: Http, requester_token: str, operator_token: str,
) -> None:
    """403 without `workflows.change_workflow`; a pause answers applied, again already_applied; the
    resume puts it back to waiting; pausing a finished workflow is 409."""
    workflow_id = launch(http, requester_token)
    base = f"/workflows/{workflow_id}"
    denied = http.post(f"{base}/pause", {"reason": "mine"}, token=requester_token)
    assert denied.status == 403 and "rita may not pause workflows" in denied.body["error"]
    assert http.post(f"{base}/pause", {"reason": "x\x00"}, token=operator_token).status == 400
    assert http.post(f"{base}/pause", {"why": "typo"}, token=operator_token).status == 400

    paused = http.post(f"{base}/pause", {"reason": "checking the inputs"}, token=operator_token)
    assert paused.status == 200, paused.body
    assert (paused.body["outcome"], paused.body["status"]) == ("applied", "paused")
    shown = http.get(base, token=requester_token).body
    assert (shown["status"], shown["pause_cause"], shown["reason"]) == ("paused", "operator", "checking the inputs")
    again = http.post(f"{base}/pause", token=operator_token)
    assert (again.status, again.body["outcome"]) == (200, "already_applied")
    event = Event.objects.get(workflow_id=workflow_id, kind="workflow.paused")
    assert (event.data["by"], event.data["was"]) == ("olga", "waiting")

    resumed = http.post(f"{base}/resume", token=operator_token)
    assert (resumed.body["outcome"], resumed.body["status"]) == ("applied", "waiting")
    assert Event.objects.get(workflow_id=workflow_id, kind="workflow.resumed").data["by"] == "olga"
    assert http.post(f"{base}/cancel", {}, token=operator_token).status == 200
    refused = http.post(f"{base}/pause", token=operator_token)
    assert refused.status == 409
    assert refused.body == {"error": f"Workflow {workflow_id} is cancelled; only a running or waiting workflow can be "
                                     "paused."}
    assert http.post("/workflows/999999/pause", token=operator_token).status == 404
