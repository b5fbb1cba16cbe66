"""Inbound webhooks over real HTTP: a sender written from the README's "Webhooks" section alone
signs deliveries; a signed delivery wakes the workflow once, and every refused one changes nothing."""
from __future__ import annotations

import hashlib
import hmac
import json
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from typing import Any

import pytest

from workflows import engine, services
from workflows.models import Event, Signal, Workflow
from workflows.testing import registered

pytestmark = pytest.mark.django_db(transaction=True)

SECRET = "ci-shared-secret-0123456789abcdef0123"
KIND = "test-webhook"


class WaitForCI(engine.WorkflowDefinition):
    kind = KIND
    start_node = "WAIT"
    revalidate_node = "WAIT"

    @engine.node("WAIT")
    def wait(self, ctx: engine.NodeContext[Any]) -> engine.Decision:
        outcome = ctx.wait_for_event("ci.done")
        return engine.Goto("DONE", {"ci": outcome.payload})

    @engine.node("DONE")
    def done(self, ctx: engine.NodeContext[Any]) -> engine.Decision:
        return engine.Complete({"ci": ctx.state["ci"]})


@pytest.fixture(autouse=True)
def webhook_setup(settings: Any) -> Iterator[None]:
    settings.AGENTOPS_WEBHOOK_SECRETS = {"ci": SECRET}
    with registered(WaitForCI):
        yield


def send(url: str, body: bytes, *, secret: str = SECRET, delivery: str = "d-1", stamp: int | None = None,
         signature: str | None = None) -> tuple[int, dict[str, Any]]:
    """A sender as the README describes it: HMAC-SHA256 of "<timestamp>.<body>" with the shared secret."""
    stamp = int(time.time()) if stamp is None else stamp
    digest = hmac.new(secret.encode(), f"{stamp}.".encode() + body, hashlib.sha256).hexdigest()
    request = urllib.request.Request(url, data=body, method="POST", headers={
        "Content-Type": "application/json", "X-Agentops-Timestamp": str(stamp), "X-Agentops-Delivery": delivery,
        "X-Agentops-Signature": signature if signature is not None else f"sha256={digest}"})
    try:
        with urllib.request.urlopen(request, timeout=10) as response:
            return response.status, json.loads(response.read())
    except urllib.error.HTTPError as error:
        return error.code, json.loads(error.read())


def waiting() -> Workflow:
    workflow = services.workflow_launch(kind=KIND, goal="Wait for CI")
    assert Workflow.objects.get(pk=workflow.pk).status == "waiting"
    return workflow


def hook(live_server: Any, workflow: Workflow, source: str = "ci") -> str:
    return f"{live_server.url}/api/hooks/{source}/workflows/{workflow.pk}/signals/ci.done"


def test_a_signed_delivery_wakes_the_workflow_once(live_server):
    workflow = waiting()
    body = json.dumps({"payload": {"build": 812, "passed": True}}).encode()

    status, answer = send(hook(live_server, workflow), body, delivery="build-812")
    again = send(hook(live_server, workflow), body, delivery="build-812")

    assert (status, answer["outcome"], answer["status"]) == (200, "applied", "running")
    assert (again[0], again[1]["outcome"]) == (200, "already_applied")
    [signal] = Signal.objects.filter(workflow=workflow)
    assert (signal.dedupe_key, signal.payload) == ("ci:build-812", {"build": 812, "passed": True})
    services.workflow_advance_if_runnable(workflow_id=workflow.pk)
    assert Workflow.objects.get(pk=workflow.pk).result == {"ci": {"build": 812, "passed": True}}


@pytest.mark.parametrize(("case", "status", "message"), [
    ("wrong secret", 401, "does not match the body"),
    ("tampered body", 401, "does not match the body"),
    ("old timestamp", 401, "within 300 s"),
    ("no delivery id", 400, "X-Agentops-Delivery"),
    ("not json", 400, "must be a JSON object"),
    ("unknown source", 404, "No webhook source 'tickets'"),
    ("too large", 413, "at most 262144 bytes"),
])
def test_a_refused_delivery_changes_nothing(live_server, case, status, message):
    workflow = waiting()
    body = json.dumps({"payload": {"passed": True}}).encode()
    before = (Event.objects.filter(workflow=workflow).count(), Signal.objects.count())
    url = hook(live_server, workflow)
    kwargs: dict[str, Any] = {}
    if case == "wrong secret":
        kwargs["secret"] = "not-the-secret-0123456789abcdef012345"
    elif case == "tampered body":
        stamp = int(time.time())
        digest = hmac.new(SECRET.encode(), f"{stamp}.".encode() + body, hashlib.sha256).hexdigest()
        body, kwargs = body.replace(b"true", b"false"), {"stamp": stamp, "signature": f"sha256={digest}"}
    elif case == "old timestamp":
        kwargs["stamp"] = int(time.time()) - 3600
    elif case == "no delivery id":
        kwargs["delivery"] = ""
    elif case == "not json":
        body = b"passed=true"
    elif case == "unknown source":
        url = hook(live_server, workflow, source="tickets")
    elif case == "too large":
        body = json.dumps({"payload": "x" * 300_000}).encode()

    answer = send(url, body, **kwargs)

    assert answer[0] == status and message in answer[1]["error"], answer
    assert (Event.objects.filter(workflow=workflow).count(), Signal.objects.count()) == before
    assert Workflow.objects.get(pk=workflow.pk).status == "waiting"
