"""The HTTP tier's contract over real HTTP: every input checked where it enters, refused and
never rounded; the one JSON error shape for every 4xx and 5xx of /api and /hooks; request ids and log
lines an operator can use; cursor pages; and the checks at the command line's door."""
from __future__ import annotations

import json
import logging
from decimal import Decimal
from io import StringIO
from typing import Any

import pytest
from django.contrib.auth.models import User
from django.core.management import CommandError, call_command

from tests.api.conftest import Http, grant, token_for
from workflows import engine, services
from workflows.errors import InvalidInput
from workflows.logs import JsonFormatter, RequestIdFilter
from workflows.models import Signal, Workflow
from workflows.testing import registered

pytestmark = pytest.mark.django_db(transaction=True)

KIND = "test-http-tier"
BIG = str(10**20)


class WaitForever(engine.WorkflowDefinition):
    """A workflow that launches in one transaction and then waits for a signal: cheap to make many of."""
    kind = KIND
    start_node = "WAIT"
    revalidate_node = "WAIT"

    @engine.node("WAIT")
    def wait(self, ctx: engine.NodeContext[Any]) -> engine.Decision:
        outcome = ctx.wait_for_event("go")
        return engine.Complete({"go": outcome.payload})


@pytest.fixture(autouse=True)
def kind_registered() -> Any:
    with registered(WaitForever):
        yield


@pytest.fixture
def root_token(db: None) -> str:
    """A superuser's token: past every permission check, so what is checked is the input."""
    User.objects.create_superuser("root", password="root-password")
    return token_for("root")


def launch_body(**extra: Any) -> dict[str, Any]:
    return {"kind": KIND, "goal": "Wait for go", **extra}


@pytest.mark.parametrize("path", [
    f"/workflows?limit={BIG}", "/workflows?limit=201", f"/workflows/1?events={BIG}", f"/workflows/{BIG}",
    f"/workflows/1/events?cursor={BIG}", "/workflows?kind=%00", "/workflows?status=%00", "/workflows?cursor=abc",
    "/workflows?launcher=%00",
])
def test_out_of_range_and_unstorable_query_values_are_400_not_500(http: Http, root_token: str, path: str) -> None:
    """`limit=10**20`, `events=10**20` (bigint out of range) and `kind=%00` are refused where they enter,
    in the one shape, before they reach the database (where they would be an HTML 500)."""
    answer = http.get(path, token=root_token)
    assert answer.status == 400, (path, answer.body)
    assert set(answer.body) == {"error"}


def test_a_nul_in_a_dedupe_key_is_refused_and_stores_nothing(http: Http, root_token: str) -> None:
    workflow = services.workflow_launch(kind=KIND, goal="Wait for go")
    answer = http.post(f"/workflows/{workflow.pk}/signal", {"name": "go", "dedupe_key": "a\x00b"}, token=root_token)
    assert answer.status == 400 and set(answer.body) == {"error"}
    with pytest.raises(InvalidInput, match="control character"):  # the service's own check (the CLI's path)
        services.workflow_signal(workflow_id=workflow.pk, name="go", dedupe_key="a\x00b")
    assert not Signal.objects.exists()


@pytest.mark.parametrize(("field", "value"), [
    ("priority", "5"), ("priority", True), ("priority", 11), ("priority", 10**20), ("max_hours", True),
    ("max_hours", "2"), ("budget_total_usd", "0.000001"), ("budget_total_usd", "1.00001"),
    ("budget_hourly_usd", 10**20), ("budget_total_usd", "NaN"), ("fallback_model", "bad model!"),
    ("stagnation_policy", "sometimes"), ("release_policy", "never"), ("kind", "x\x00"),
])
def test_launch_values_of_the_wrong_type_or_precision_are_refused_never_coerced(
        http: Http, root_token: str, field: str, value: Any) -> None:
    """`"priority": "5"` and `true` are refused, not coerced; a budget of 0.000001 is refused rather than
    stored as 0.0000 (paused for budget at once), 1.00001 rather than as 1.0000. Nothing is launched."""
    answer = http.post("/workflows", launch_body(**{field: value}), token=root_token)
    assert answer.status == 400, answer.body
    assert field in answer.body["error"]
    assert not Workflow.objects.exists()


def test_a_budget_is_stored_exactly_as_given(http: Http, root_token: str) -> None:
    answer = http.post("/workflows", launch_body(budget_total_usd="1.2345", budget_hourly_usd=2), token=root_token)
    assert answer.status == 201, answer.body
    workflow = Workflow.objects.get(pk=answer.body["id"])
    assert (workflow.budget_total_usd, workflow.budget_hourly_usd) == (Decimal("1.2345"), Decimal(2))
    refused = http.post(f"/workflows/{workflow.pk}/budget", {"total_usd": "0.00001"}, token=root_token)
    assert refused.status == 400 and "decimal places" in refused.body["error"].lower()
    with pytest.raises(InvalidInput, match="more than 4 decimal places"):  # the command line's path
        services.workflow_budget_set(workflow_id=workflow.pk, user=None, total_usd=Decimal("0.000001"))
    assert Workflow.objects.get(pk=workflow.pk).budget_total_usd == Decimal("1.2345")


def test_a_body_not_declared_json_is_415_for_the_api_and_the_webhooks(http: Http, root_token: str,
                                                                       live_server: Any) -> None:
    """The Content-Type is checked: a body not declared JSON is 415, whatever it holds."""
    body = json.dumps(launch_body()).encode()
    for ctype in ("text/plain", "application/x-www-form-urlencoded"):
        answer = http.request("POST", "/workflows", raw=body, token=root_token, headers={"Content-Type": ctype})
        assert (answer.status, set(answer.body)) == (415, {"error"})
        assert "application/json" in answer.body["error"]
    hook = http.request("POST", "/hooks/ci/workflows/1/signals/go", raw=b"{}", headers={"Content-Type": "text/plain"})
    assert (hook.status, set(hook.body)) == (415, {"error"})
    assert not Workflow.objects.exists()
    # A POST without a body (resume) needs none.
    workflow = services.workflow_launch(kind=KIND, goal="Wait for go")
    assert http.request("POST", f"/workflows/{workflow.pk}/resume", token=root_token).status in (200, 409)


@pytest.mark.parametrize(("method", "path", "status"), [
    ("GET", "/nowhere", 404), ("GET", "/workflows/1/nowhere", 404), ("PUT", "/workflows", 405),
    ("DELETE", "/workflows/1", 405), ("OPTIONS", "/workflows", 405), ("GET", "/hooks/ci/workflows/1/signals/go", 405),
    ("OPTIONS", "/hooks/ci/workflows/1/signals/go", 405),
])
def test_unknown_routes_and_methods_answer_in_the_one_error_shape(http: Http, root_token: str, method: str,
                                                                   path: str, status: int) -> None:
    """An unknown path is a JSON 404 and OPTIONS a JSON 405, not Django's HTML 404 or an empty 405."""
    answer = http.request(method, path, token=root_token)
    assert answer.status == status
    assert set(answer.body) == {"error"}, answer.body
    if status == 405:
        assert answer.headers["Allow"]


def test_a_body_over_djangos_limit_is_a_json_413(http: Http, root_token: str, settings: Any) -> None:
    """A 3 MB body is a JSON 413 naming the limit in bytes, not Django's HTML 400."""
    body = json.dumps(launch_body(goal="x" * 3_000_000)).encode()
    answer = http.request("POST", "/workflows", raw=body, token=root_token)
    assert answer.status == 413
    assert "bytes" in answer.body["error"]


def test_an_unhandled_error_is_a_json_500_with_a_request_id_and_a_logged_traceback(
        http: Http, root_token: str, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture) -> None:
    """A 500 is traceable (a probe's 87 HTTP 500s with 0 tracebacks in the log were not): the answer names
    the request id, which is also the X-Request-Id header and is on the log record with the traceback."""
    from workflows import selectors

    def broken(**_: Any) -> Any:
        raise RuntimeError("the disk is on fire")

    monkeypatch.setattr(selectors, "workflow_list", broken)
    with caplog.at_level(logging.ERROR, logger="agentops.api"):
        answer = http.get("/workflows", token=root_token, headers={"X-Request-Id": "client-chosen-id-1"})
    assert answer.status == 500
    assert answer.headers["X-Request-Id"] == "client-chosen-id-1"
    assert "client-chosen-id-1" in answer.body["error"] and "fire" not in answer.body["error"]
    [record] = [r for r in caplog.records if r.getMessage() == "api.internal_error"]
    assert record.exc_info and "the disk is on fire" in str(record.exc_info[1])
    assert record.request_id == "client-chosen-id-1"  # type: ignore[attr-defined]
    # Every answer has an id, made by the server when the client sent none (or an unusable one).
    other = http.get("/workflows", token=root_token, headers={"X-Request-Id": "bad id\twith tab"})
    assert len(other.headers["X-Request-Id"]) == 32


def test_a_refusal_is_logged_with_its_reason_source_and_workflow(http: Http, caplog: pytest.LogCaptureFixture) -> None:
    """An `api.refused` line carries the reason, the source and the workflow."""
    viewer = grant(User.objects.create_user("vera"), "view_workflow")
    token = token_for(viewer.username)
    workflow = services.workflow_launch(kind=KIND, goal="Wait for go")
    with caplog.at_level(logging.WARNING, logger="agentops"):
        answer = http.post(f"/workflows/{workflow.pk}/cancel", {}, token=token)
    assert answer.status == 403
    [record] = [r for r in caplog.records if r.getMessage() == "api.refused"]
    assert (record.status, record.source, str(record.workflow_id)) == (403, "vera", str(workflow.pk))  # type: ignore[attr-defined]
    assert "may not cancel" in record.reason  # type: ignore[attr-defined]


def test_log_lines_can_be_json_with_the_request_id_and_the_traceback() -> None:
    record = logging.LogRecord("agentops.api", logging.ERROR, __file__, 1, "api.refused", None, None)
    record.reason, record.workflow_id = "no", 7
    try:
        raise ValueError("boom")
    except ValueError:
        import sys
        record.exc_info = sys.exc_info()
    RequestIdFilter().filter(record)
    line = json.loads(JsonFormatter().format(record))
    assert {"at", "level", "logger", "message", "request_id", "reason", "workflow_id", "traceback"} <= set(line)
    assert (line["message"], line["reason"], line["workflow_id"]) == ("api.refused", "no", 7)
    assert "ValueError: boom" in line["traceback"]


def test_django_request_errors_are_logged_with_debug_off(settings: Any) -> None:
    """With DEBUG off `django.request` has a handler too, not only `agentops`: Django's own 500s are logged."""
    assert settings.DEBUG is False
    assert settings.LOGGING["loggers"]["django.request"]["handlers"] == ["console"]
    assert logging.getLogger("django.request").handlers


def test_lists_and_events_page_by_cursor_with_filters(http: Http, root_token: str) -> None:
    """`limit=100000` does not return every row: a page is at most 200 rows and the next follows a cursor."""
    rita = User.objects.create_user("rita")
    made = [services.workflow_launch(kind=KIND, goal=f"w{i}", user=rita if i % 2 else None).pk for i in range(5)]
    seen, cursor = [], ""
    while True:
        page = http.get(f"/workflows?limit=2&cursor={cursor}", token=root_token).body
        seen += [w["id"] for w in page["items"]]
        if page["next_cursor"] is None:
            break
        cursor = page["next_cursor"]
    assert seen == sorted(made, reverse=True)
    assert [w["id"] for w in http.get("/workflows?launcher=rita", token=root_token).body["items"]] == \
        sorted(made[1::2], reverse=True)
    assert http.get("/workflows?kind=other", token=root_token).body == {"items": [], "next_cursor": None}
    assert http.get("/workflows?limit=100000", token=root_token).status == 400

    services.workflow_signal(workflow_id=made[0], name="go", payload=1)
    events = http.get(f"/workflows/{made[0]}/events?limit=2", token=root_token).body
    assert [e["seq"] for e in events["items"]] == [1, 2]
    rest = http.get(f"/workflows/{made[0]}/events?cursor={events['next_cursor']}", token=root_token).body
    assert rest["items"][0]["seq"] == 3
    polled = http.get(f"/workflows/{made[0]}/events?cursor={rest['next_cursor']}", token=root_token).body
    assert polled == {"items": [], "next_cursor": rest["next_cursor"]}  # nothing new yet: poll again from here
    signals = http.get(f"/workflows/{made[0]}/events?kind=signal.received", token=root_token).body["items"]
    assert [e["kind"] for e in signals] == ["signal.received"]


def test_the_command_line_refuses_out_of_range_numbers() -> None:
    """`agent list --limit 10**20` and the like are refused with a message, not a traceback."""
    for args in (["list", "--limit", BIG], ["list", "--limit", "0"], ["show", BIG], ["show", "1", "--events", BIG],
                 ["cancel", BIG]):
        with pytest.raises(CommandError, match=r"must be at (least|most)") as refused:
            call_command("agent", *args, stdout=StringIO())
        assert refused.value.returncode == 2


def test_a_stream_keeps_its_request_id_while_it_runs_and_is_closed_with_the_response(rf: Any) -> None:
    """A live stream (server-sent events) is iterated after the middleware returned: its log lines keep
    the request's id, and closing the response closes the stream's generator."""
    from django.http import StreamingHttpResponse

    from workflows.api.middleware import ApiMiddleware
    from workflows.logs import REQUEST_ID

    seen, closed = [], []

    def events() -> Any:
        try:
            for n in range(2):
                seen.append(REQUEST_ID.get())
                yield f"data: {n}\n\n".encode()
        finally:
            closed.append(True)

    response = ApiMiddleware(lambda request: StreamingHttpResponse(events(), content_type="text/event-stream"))(
        rf.get("/api/stream", HTTP_X_REQUEST_ID="stream-request-1"))
    assert response["X-Request-Id"] == "stream-request-1"
    iterator = iter(response)
    next(iterator)
    response.close()
    assert seen == ["stream-request-1"] and closed == [True]
    assert REQUEST_ID.get() == "-"


def test_the_openapi_document_types_every_answer_and_states_the_limits(client: Any) -> None:
    """Every 2xx body has a schema (not an open object), the limits are stated, the webhook route is there."""
    doc = client.get("/api/openapi.json").json()
    schemas = doc["components"]["schemas"]
    for path, item in doc["paths"].items():
        for method, operation in item.items():
            for status, answer in operation["responses"].items():
                if path.endswith("/stream") and status == "200":  # docs/live.md: Server-Sent Events
                    assert set(answer["content"]) == {"text/event-stream"}, (path, answer)
                    continue
                schema = answer["content"]["application/json"]["schema"]
                assert "$ref" in schema, (method, path, status, schema)
                if int(status) >= 400:
                    assert schema == {"$ref": "#/components/schemas/ErrorOut"}
    launch = schemas["LaunchIn"]["properties"]
    priority = launch["priority"]
    assert (priority["minimum"], priority["maximum"], priority["type"]) == (0, 10, "integer")
    assert launch["stagnation_policy"]["enum"] and launch["goal"]["maxLength"] == 10_000
    assert launch["budget_total_usd"]["anyOf"][0]["anyOf"][0]["multipleOf"] == 0.0001
    listing = {p["name"]: p["schema"] for p in doc["paths"]["/api/workflows"]["get"]["parameters"]}
    assert listing["limit"]["maximum"] == 200 and "enum" in str(listing["status"])
    hook = doc["paths"]["/api/hooks/{source}/workflows/{workflow_id}/signals/{name}"]["post"]
    assert {p["name"] for p in hook["parameters"]} >= {"X-Agentops-Signature", "X-Agentops-Delivery"}
    assert hook["requestBody"]["content"]["application/json"]["example"]
    assert schemas["ResultOut"]["properties"]["outcome"]["enum"]
