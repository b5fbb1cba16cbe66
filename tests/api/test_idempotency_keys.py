"""`Idempotency-Key` on the launch and supersede endpoints, over real HTTP."""
from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.api.conftest import Http
from tests.conftest import one_event_kind
from workflows.models import Intent, Workflow
from workflows.testing import registered

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.usefixtures("rung")]

KIND = "test-api-keys"


WaitForGo = one_event_kind(KIND)


@pytest.fixture(autouse=True)
def kind() -> Iterator[None]:
    with registered(WaitForGo):
        yield


BODY = {"kind": KIND, "goal": "Answer ticket 7", "params": {}, "priority": 5}


def test_a_launch_sent_again_with_its_key_returns_the_same_workflow(http: Http, requester_token: str) -> None:
    """201 the first time, 200 with the same workflow the second; one workflow exists."""
    key = {"Idempotency-Key": "launch-7"}
    first = http.post("/workflows", BODY, token=requester_token, headers=key)
    again = http.post("/workflows", BODY, token=requester_token, headers=key)

    assert first.status == 201 and again.status == 200, (first.body, again.body)
    assert again.body == first.body == {"id": first.body["id"], "kind": KIND, "status": "waiting"}
    assert Workflow.objects.count() == 1


def test_the_key_with_another_body_is_409_in_the_error_shape(http: Http, requester_token: str) -> None:
    key = {"Idempotency-Key": "launch-8"}
    first = http.post("/workflows", BODY, token=requester_token, headers=key)
    other = http.post("/workflows", {**BODY, "goal": "Another goal"}, token=requester_token, headers=key)

    assert other.status == 409
    assert other.body == {"error": f"Idempotency key 'launch-8' was used for another launch request (workflow "
                                   f"{first.body['id']}), with other values; nothing was changed. Send that request "
                                   "again to get its result, or use a new key for a new launch."}
    assert Workflow.objects.count() == 1


def test_a_bad_key_is_400_and_launches_nothing(http: Http, requester_token: str) -> None:
    answer = http.post("/workflows", BODY, token=requester_token, headers={"Idempotency-Key": "k" * 201})
    assert answer.status == 400
    assert "Idempotency-Key: String should have at most 200 characters" in answer.body["error"]
    assert not Workflow.objects.exists()


def test_a_supersede_sent_again_with_its_key_makes_no_second_version(
    http: Http, requester_token: str, operator_token: str
) -> None:
    """The repeat answers already_applied at v2; the key with another goal is 409."""
    workflow_id = http.post("/workflows", BODY, token=requester_token).body["id"]
    key = {"Idempotency-Key": "goal-2"}
    path = f"/workflows/{workflow_id}/supersede"
    first = http.post(path, {"goal": "Answer in French"}, token=operator_token, headers=key)
    again = http.post(path, {"goal": "Answer in French"}, token=operator_token, headers=key)
    other = http.post(path, {"goal": "Answer in German"}, token=operator_token, headers=key)

    assert (first.status, first.body["outcome"], first.body["intent_version"]) == (200, "applied", 2)
    assert (again.status, again.body["outcome"], again.body["intent_version"]) == (200, "already_applied", 2)
    assert other.status == 409 and "'goal-2' was used for another supersede request" in other.body["error"]
    assert Intent.objects.filter(workflow_id=workflow_id).count() == 2


def test_the_openapi_document_names_the_header(http: Http) -> None:
    """Both endpoints declare the optional Idempotency-Key header; launch answers 200 or 201."""
    doc = http.get("/openapi.json").body
    for path in ("/api/workflows", "/api/workflows/{workflow_id}/supersede"):
        [header] = [p for p in doc["paths"][path]["post"]["parameters"] if p["in"] == "header"]
        assert (header["name"], header["required"]) == ("Idempotency-Key", False)
    assert {"200", "201", "409"} <= set(doc["paths"]["/api/workflows"]["post"]["responses"])
