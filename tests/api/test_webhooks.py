"""Inbound webhooks over real HTTP: a sender written from the README's "Webhooks" section alone
signs deliveries; a signed delivery wakes the workflow once, and every refused one changes nothing."""
from __future__ import annotations

import hashlib
import hmac
import json
import os
import re
import shutil
import subprocess
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Iterator
from io import StringIO
from pathlib import Path
from typing import Any

import pytest
from django.core.management import CommandError, call_command

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


def signed_headers(url: str, body: bytes, *, secret: str = SECRET, delivery: str = "d-1",
                   stamp: int | None = None) -> dict[str, str]:
    """A v2 signer written from the README's "Webhooks" section alone: HMAC-SHA256 with the shared
    secret of "v2", the timestamp, the delivery id, the method, the path and the body, joined by
    newlines. It imports nothing of agentops."""
    stamp = int(time.time()) if stamp is None else stamp
    path = urllib.parse.unquote(urllib.parse.urlsplit(url).path)
    message = b"\n".join([b"v2", str(stamp).encode(), delivery.encode(), b"POST", path.encode(), body])
    return {"Content-Type": "application/json", "X-Agentops-Timestamp": str(stamp), "X-Agentops-Delivery": delivery,
            "X-Agentops-Signature": "v2=" + hmac.new(secret.encode(), message, hashlib.sha256).hexdigest()}


def post(url: str, body: bytes, headers: dict[str, str]) -> tuple[int, dict[str, Any]]:
    request = urllib.request.Request(url, data=body, method="POST", headers=headers)
    try:
        with urllib.request.urlopen(request, timeout=10) as response:
            return response.status, json.loads(response.read())
    except urllib.error.HTTPError as error:
        return error.code, json.loads(error.read())


def send(url: str, body: bytes, *, signature: str | None = None, **signing: Any) -> tuple[int, dict[str, Any]]:
    headers = signed_headers(url, body, **signing)
    if signature is not None:
        headers["X-Agentops-Signature"] = signature
    return post(url, body, headers)


def unversioned_signature(body: bytes, stamp: int, secret: str = SECRET) -> str:
    """The retired scheme: "sha256=" and the hex HMAC-SHA256 of "<timestamp>.<body>"."""
    return "sha256=" + hmac.new(secret.encode(), f"{stamp}.".encode() + body, hashlib.sha256).hexdigest()


def state(workflow: Workflow) -> tuple[str, int, list[str]]:
    """What a refused delivery must leave as it was: the status, the history, the stored signals."""
    return (Workflow.objects.get(pk=workflow.pk).status, Event.objects.filter(workflow=workflow).count(),
            list(Signal.objects.filter(workflow=workflow).order_by("pk").values_list("dedupe_key", flat=True)))


def waiting() -> Workflow:
    workflow = services.workflow_launch(kind=KIND, goal="Wait for CI")
    assert Workflow.objects.get(pk=workflow.pk).status == "waiting"
    return workflow


def hook(live_server: Any, workflow: Workflow, source: str = "ci", signal: str = "ci.done") -> str:
    return f"{live_server.url}/api/hooks/{source}/workflows/{workflow.pk}/signals/{signal}"


def test_a_signed_delivery_wakes_the_workflow_once(live_server):
    workflow = waiting()
    body = json.dumps({"payload": {"build": 812, "passed": True}}).encode()

    status, answer = send(hook(live_server, workflow), body, delivery="build-812")
    again = send(hook(live_server, workflow), body, delivery="build-812")

    assert (status, answer["outcome"], answer["status"]) == (200, "applied", "running")
    assert (again[0], again[1]["outcome"]) == (200, "already_applied")
    [signal] = Signal.objects.filter(workflow=workflow)
    assert (signal.dedupe_key, signal.payload) == ("webhook:ci:build-812", {"build": 812, "passed": True})
    services.workflow_advance_if_runnable(workflow_id=workflow.pk)
    assert Workflow.objects.get(pk=workflow.pk).result == {"ci": {"build": 812, "passed": True}}


def test_a_delivery_sent_again_after_the_workflow_finished_is_already_applied(live_server, caplog):
    """A signed delivery redelivered after its workflow finished gets `already_applied`, as the README
    promises, not 409; a new delivery to the finished workflow is still refused (409), and the
    refusal is logged with its reason, source and workflow."""
    workflow = waiting()
    body = json.dumps({"payload": {"passed": True}}).encode()
    assert send(hook(live_server, workflow), body, delivery="build-9")[0] == 200
    services.workflow_advance_if_runnable(workflow_id=workflow.pk)
    assert Workflow.objects.get(pk=workflow.pk).status == "completed"

    status, answer = send(hook(live_server, workflow), body, delivery="build-9")
    assert (status, answer["outcome"], answer["status"]) == (200, "already_applied", "completed")
    with caplog.at_level("WARNING", logger="agentops.webhooks"):
        new = send(hook(live_server, workflow), body, delivery="build-10")
    assert new[0] == 409 and "takes no more signals" in new[1]["error"]
    [record] = [r for r in caplog.records if r.getMessage() == "webhook.refused"]
    assert (record.status, record.source, record.workflow_id) == (409, "webhook:ci", workflow.pk)
    assert "takes no more signals" in record.reason
    assert Signal.objects.filter(workflow=workflow).count() == 1


@pytest.mark.parametrize(("case", "status", "message"), [
    ("wrong secret", 401, "does not match this delivery"),
    ("tampered body", 401, "does not match this delivery"),
    ("no scheme", 401, "must name its scheme"),
    ("old timestamp", 401, "within 300 s"),
    ("no delivery id", 400, "X-Agentops-Delivery"),
    ("line break in the path", 400, "name: String should match pattern"),
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
        signature = signed_headers(url, body, stamp=stamp)["X-Agentops-Signature"]
        body, kwargs = body.replace(b"true", b"false"), {"stamp": stamp, "signature": signature}
    elif case == "no scheme":
        kwargs["signature"] = signed_headers(url, body)["X-Agentops-Signature"].removeprefix("v2=")
    elif case == "old timestamp":
        kwargs["stamp"] = int(time.time()) - 3600
    elif case == "no delivery id":
        kwargs["delivery"] = ""
    elif case == "line break in the path":
        url = hook(live_server, workflow, signal="ci.done%0Aevil")
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


# --- Replays of a captured delivery -----------------------------------------------------------


def test_a_captured_delivery_replayed_under_a_new_delivery_id_is_refused(live_server):
    """The delivery id is signed: the same request with another X-Agentops-Delivery verifies no longer."""
    workflow = waiting()
    url, body = hook(live_server, workflow), json.dumps({"payload": {"build": 812}}).encode()
    captured = signed_headers(url, body, delivery="build-812")
    assert post(url, body, captured)[1]["outcome"] == "applied"
    before = state(workflow)

    status, answer = post(url, body, {**captured, "X-Agentops-Delivery": "build-813"})

    assert status == 401 and "does not match this delivery" in answer["error"], answer
    assert state(workflow) == before == ("running", before[1], ["webhook:ci:build-812"])


def test_a_captured_delivery_sent_to_another_workflow_or_signal_is_refused(live_server):
    """The path is signed: a delivery for workflow A's ci.done applies neither to workflow B nor to
    another signal of A; A still takes it as it was sent."""
    first, second = waiting(), waiting()
    url, body = hook(live_server, first), json.dumps({"payload": {"passed": True}}).encode()
    captured = signed_headers(url, body, delivery="build-812")
    before = (state(first), state(second))

    elsewhere = [post(hook(live_server, second), body, captured),
                 post(hook(live_server, first, signal="deploy.approved"), body, captured)]

    assert [status for status, _ in elsewhere] == [401, 401], elsewhere
    assert all("does not match this delivery" in answer["error"] for _, answer in elsewhere)
    assert (state(first), state(second)) == before
    assert post(url, body, captured)[1]["outcome"] == "applied"
    assert state(second) == before[1]


def test_a_delivery_signed_for_another_source_is_refused(live_server, settings):
    """The source is in the signed path: two sources sharing a secret still cannot stand in for each other."""
    settings.AGENTOPS_WEBHOOK_SECRETS = {"ci": SECRET, "tickets": SECRET}
    workflow = waiting()
    body = json.dumps({"payload": {"passed": True}}).encode()
    captured = signed_headers(hook(live_server, workflow, source="ci"), body)
    before = state(workflow)

    status, answer = post(hook(live_server, workflow, source="tickets"), body, captured)

    assert status == 401 and "does not match this delivery" in answer["error"], answer
    assert state(workflow) == before


# --- Rotation ---------------------------------------------------------------------------------

OLD_SECRET = "ci-previous-secret-0123456789abcdef01"
OTHER_SECRET = "ci-unrelated-secret-0123456789abcdef0"


def test_during_a_rotation_the_current_and_the_previous_secret_verify_and_a_third_does_not(
        live_server, settings, caplog):
    settings.AGENTOPS_WEBHOOK_PREVIOUS_SECRETS = {"ci": OLD_SECRET}
    workflow = waiting()
    url, body = hook(live_server, workflow), json.dumps({"payload": {"passed": True}}).encode()

    with caplog.at_level("INFO", logger="agentops.webhooks"):
        current = send(url, body, delivery="d-current", secret=SECRET)
        previous = send(url, body, delivery="d-previous", secret=OLD_SECRET)
        third = send(url, body, delivery="d-third", secret=OTHER_SECRET)

    assert [current[0], previous[0], third[0]] == [200, 200, 401]
    # The first delivery satisfies the wait; the second, with no wait left open, is queued (not lost).
    assert (current[1]["outcome"], previous[1]["outcome"]) == ("applied", "queued")
    assert "does not match this delivery" in third[1]["error"]
    assert state(workflow)[2] == ["webhook:ci:d-current", "webhook:ci:d-previous"]
    delivered = {r.delivery: r.secret for r in caplog.records if r.getMessage() == "webhook.delivered"}
    assert delivered == {"d-current": "current", "d-previous": "previous"}


def test_without_a_rotation_the_previous_secret_no_longer_verifies(live_server):
    """Once the previous secret is removed from the settings, deliveries signed with it are refused."""
    workflow = waiting()
    before = state(workflow)
    status, answer = send(hook(live_server, workflow), b'{"payload": 1}', secret=OLD_SECRET)
    assert status == 401 and "does not match this delivery" in answer["error"]
    assert state(workflow) == before


# --- The retired unversioned scheme -----------------------------------------------------------


def test_an_unversioned_signature_is_refused_by_default_with_what_to_do(live_server):
    workflow = waiting()
    url, body, stamp = hook(live_server, workflow), b'{"payload": {"passed": true}}', int(time.time())
    before = state(workflow)

    status, answer = send(url, body, stamp=stamp, signature=unversioned_signature(body, stamp))

    assert status == 401, answer
    assert "uses the unversioned scheme (sha256=), which covers neither the delivery id nor the path" in answer["error"]
    assert 'send v2=<lowercase hex> (README, "Webhooks")' in answer["error"]
    assert state(workflow) == before


def test_a_source_listed_as_unversioned_may_still_sign_the_old_way(live_server, settings, caplog):
    """The opt-in is per source and logged at WARNING; other sources stay refused."""
    settings.AGENTOPS_WEBHOOK_SECRETS = {"ci": SECRET, "tickets": OTHER_SECRET}
    settings.AGENTOPS_WEBHOOK_UNVERSIONED_SOURCES = frozenset({"ci"})
    workflow = waiting()
    body, stamp = b'{"payload": {"passed": true}}', int(time.time())

    with caplog.at_level("WARNING", logger="agentops.webhooks"):
        tickets = send(hook(live_server, workflow, source="tickets"), body, stamp=stamp,
                       signature=unversioned_signature(body, stamp, OTHER_SECRET))
        ci = send(hook(live_server, workflow), body, stamp=stamp, signature=unversioned_signature(body, stamp))

    assert tickets[0] == 401 and "unversioned scheme" in tickets[1]["error"]
    assert (ci[0], ci[1]["outcome"]) == (200, "applied")
    assert state(workflow)[2] == ["webhook:ci:d-1"]
    assert [r.source for r in caplog.records if r.getMessage() == "webhook.unversioned_accepted"] == ["ci"]


# --- The dedupe namespace of deliveries -------------------------------------------------------


def test_a_token_holder_cannot_take_a_deliverys_key_first(live_server, http, operator_token):
    """The key-squatting attack: a signal sent with the key a genuine delivery will be stored under is
    refused at the HTTP API and on the command line; the old key shape is an ordinary key, and the
    genuine delivery still wakes the workflow."""
    workflow = waiting()
    before = state(workflow)

    answers = [http.post(f"/workflows/{workflow.pk}/signal", {"name": "ci.done", "dedupe_key": key},
                         token=operator_token) for key in ("webhook:ci:build-812", "webhook:")]
    with pytest.raises(CommandError) as cli:
        call_command("agent", "signal", str(workflow.pk), "ci.done", "--dedupe-key", "webhook:ci:build-812",
                     stdout=StringIO())

    assert [a.status for a in answers] == [400, 400]
    assert answers[0].body == {"error": "The dedupe key 'webhook:ci:build-812' starts with 'webhook:', which is "
                                        "reserved for signed webhook deliveries; choose a key without that prefix."}
    assert cli.value.returncode == 2 and str(cli.value) == answers[0].body["error"]
    assert state(workflow) == before

    taken = http.post(f"/workflows/{workflow.pk}/signal", {"name": "ci.other", "dedupe_key": "ci:build-812"},
                      token=operator_token)
    assert (taken.status, taken.body["outcome"]) == (200, "queued")  # no wait for ci.other: queued for one

    status, answer = send(hook(live_server, workflow), b'{"payload": {"passed": true}}', delivery="build-812")

    assert (status, answer["outcome"], answer["status"]) == (200, "applied", "running")
    assert state(workflow)[2] == ["ci:build-812", "webhook:ci:build-812"]



# --- The published contract -------------------------------------------------------------------


def readme_webhooks_section() -> str:
    readme = (Path(__file__).resolve().parents[2] / "README.md").read_text()
    return readme[readme.index("## Webhooks: signals from outside systems"):readme.index("## The release agent")]


@pytest.mark.skipif(not (shutil.which("openssl") and shutil.which("curl")), reason="needs openssl and curl")
def test_the_readmes_shell_sender_is_accepted(live_server):
    """The README's own lines (printf, openssl, curl), run as they are but for the server and workflow."""
    workflow = waiting()
    [script] = re.findall(r"```sh\n(.*?)```", readme_webhooks_section(), re.S)
    assert "base=http://127.0.0.1:8000 " in script and "/workflows/7/" in script
    script = script.replace("base=http://127.0.0.1:8000 ", f"base={live_server.url} ")
    script = script.replace("/workflows/7/", f"/workflows/{workflow.pk}/")

    done = subprocess.run(["bash", "-c", script], env={"PATH": os.environ["PATH"], "SECRET": SECRET},
                          capture_output=True, text=True, timeout=30, check=False)

    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout)["outcome"] == "applied", done.stdout
    [signal] = Signal.objects.filter(workflow=workflow)
    assert (signal.dedupe_key, signal.payload) == ("webhook:ci:build-812", {"build": 812, "passed": True})


def test_the_readmes_python_line_signs_as_the_server_verifies(live_server):
    """The one-line Python signer of the README, evaluated as written, over a body with a newline and
    a signal name that must be percent-encoded in the URL (the path is signed decoded)."""
    workflow = waiting()
    [line] = re.findall(r"The same in Python: `(.*?)`\.", readme_webhooks_section(), re.S)
    name = "ci done ü"
    url = hook(live_server, workflow, signal=urllib.parse.quote(name))
    body, ts, delivery = b'{"payload":\n {"passed": true}}', str(int(time.time())), "gh.7f3e-01"
    path = f"/api/hooks/ci/workflows/{workflow.pk}/signals/{name}"
    digest = eval(" ".join(line.split()), {"hmac": hmac, "hashlib": hashlib},  # noqa: S307 - the doc's own line
                  {"secret": SECRET, "ts": ts, "delivery": delivery, "path": path, "body": body})

    status, answer = post(url, body, {"Content-Type": "application/json", "X-Agentops-Timestamp": ts,
                                      "X-Agentops-Delivery": delivery, "X-Agentops-Signature": f"v2={digest}"})

    assert (status, answer.get("outcome")) == (200, "queued"), answer  # accepted; no wait for this name is open
    assert state(workflow)[2] == [f"webhook:ci:{delivery}"]
