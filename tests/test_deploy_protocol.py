"""Conformance with docs/deploy-protocol.md: the client against targets written from that page alone, and ours."""
from __future__ import annotations

import json
import re
import threading
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from datetime import UTC, datetime
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any
from urllib.parse import unquote

import pytest
import yaml

from agentops.deploytarget import client
from agentops.deploytarget.server import DeployTargetServer
from workflows.errors import Permanent, Retryable

DOCS = Path(__file__).resolve().parent.parent / "docs"
TIMEOUT = 5.0
# An operation_id as the release agent makes them: the "/" must survive as one path segment.
KEY = "wf-7/COMMIT_OPERATION.1/i1/0"
BODY = {"workflow_id": 7, "candidate_hash": "9f1c", "head": "3e0b", "title": "Fix login", "files": {"a.py": "x"}}

JSONDict = dict[str, Any]


class _TargetHTTPServer(ThreadingHTTPServer):
    daemon_threads = True

    def __init__(self, handler: type[BaseHTTPRequestHandler], target: Any) -> None:
        self.target = target
        super().__init__(("127.0.0.1", 0), handler)


def _serve(handler: type[BaseHTTPRequestHandler], target: Any) -> tuple[_TargetHTTPServer, str]:
    httpd = _TargetHTTPServer(handler, target)
    threading.Thread(target=httpd.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True).start()
    return httpd, f"http://127.0.0.1:{httpd.server_address[1]}"


def _stop(httpd: _TargetHTTPServer) -> None:
    httpd.shutdown()
    httpd.server_close()


class _Handler(BaseHTTPRequestHandler):
    """Reads the request, asks server.target for (status, headers, body bytes) and sends exactly that."""

    server: _TargetHTTPServer

    def do_POST(self) -> None:
        self._handle()

    def do_GET(self) -> None:
        self._handle()

    def do_DELETE(self) -> None:
        self._handle()

    def _handle(self) -> None:
        raw = self.rfile.read(int(self.headers.get("Content-Length") or 0))
        status, headers, data = self.server.target.answer(self.command, self.path, self.headers, raw)
        self.send_response(status)
        for name, value in headers.items():
            self.send_header(name, value)
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def log_message(self, format: str, *args: Any) -> None:
        pass


Answer = tuple[int, dict[str, str], bytes]


def _json(status: int, payload: JSONDict) -> Answer:
    return status, {"Content-Type": "application/json"}, json.dumps(payload).encode()


class ProtocolTarget:
    """A deploy target written from docs/deploy-protocol.md alone, in two dialects.

    "minimal" answers only what the protocol requires: POST 201 (new) or 200 (known) with
    {"deployment_id"}, 410 for a deleted key; GET 200 {"deployment_id"} or an empty 404, also
    for a deleted key; DELETE an empty 204, again 204, 404 for an unknown key, which it then
    keeps as a tombstone (a POST with it answers 410).
    "full" answers every optional field and fields the protocol does not know, 200 for every POST,
    GET of a deleted key 200 with status "deleted", DELETE 200 with the deployment.
    """

    def __init__(self, dialect: str) -> None:
        self.dialect = dialect
        self.deployments: dict[str, JSONDict] = {}
        self.tombstones: set[str] = set()
        self.counts: Counter[tuple[str, str]] = Counter()
        self.lock = threading.Lock()

    def effects(self, key: str) -> dict[str, int]:
        return {"created": self.counts[(key, "created")], "deleted": self.counts[(key, "deleted")]}

    def answer(self, method: str, path: str, headers: Any, raw: bytes) -> Answer:
        if method == "POST" and path == "/deployments":
            return self._create(headers.get("Idempotency-Key"), raw)
        prefix = "/deployments/"
        if path.startswith(prefix) and "/" not in path[len(prefix):] and method in ("GET", "DELETE"):
            key = unquote(path[len(prefix):])
            return self._get(key) if method == "GET" else self._delete(key)
        return 404, {}, b""

    def _create(self, key: str | None, raw: bytes) -> Answer:
        if not key:
            return _json(400, {"error": "missing Idempotency-Key"})
        try:
            body = json.loads(raw)
        except ValueError:
            body = None
        if not isinstance(body, dict):
            return _json(400, {"error": "the body must be a JSON object"})
        with self.lock:
            if key in self.tombstones:
                return 410, {}, b""
            found = self.deployments.get(key)
            if found is None:
                found = self.deployments[key] = {
                    "deployment_id": f"d-{len(self.deployments) + 1}", "body": body,
                    "created_at": datetime.now(UTC).isoformat(), "deleted_at": None,
                }
                self.counts[(key, "created")] += 1
                return _json(200 if self.dialect == "full" else 201, self._view(key, found))
            if found["deleted_at"] and self.dialect == "minimal":
                return 410, {}, b""
            return _json(200, self._view(key, found))

    def _get(self, key: str) -> Answer:
        with self.lock:
            found = self.deployments.get(key)
            if found is None or (found["deleted_at"] and self.dialect == "minimal"):
                return (404, {}, b"") if self.dialect == "minimal" else _json(404, {"error": f"no {key}"})
            return _json(200, self._view(key, found))

    def _delete(self, key: str) -> Answer:
        with self.lock:
            found = self.deployments.get(key)
            if found is None:
                self.tombstones.add(key)
                return 404, {}, b""
            if not found["deleted_at"]:
                found["deleted_at"] = datetime.now(UTC).isoformat()
                self.counts[(key, "deleted")] += 1
            return (204, {}, b"") if self.dialect == "minimal" else _json(200, self._view(key, found))

    def _view(self, key: str, found: JSONDict) -> JSONDict:
        if self.dialect == "minimal":
            return {"deployment_id": found["deployment_id"]}
        return {
            **found, "idempotency_key": key, "status": "deleted" if found["deleted_at"] else "deployed",
            "url": f"https://deploy.example/{found['deployment_id']}", "links": {"self": f"/deployments/{key}"},
        }


@dataclass
class Target:
    name: str
    url: str
    effects: Callable[[str], dict[str, int]]


@pytest.fixture(params=["minimal", "full", "ours"])
def target(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Target]:
    """Each target the client must work with: two written from the protocol page, and our server."""
    if request.param == "ours":
        server = DeployTargetServer(state_path=tmp_path / "state.json").start()

        def effects(key: str) -> dict[str, int]:
            found: dict[str, int] = server.store.stats()["effects"].get(key, {"created": 0, "deleted": 0})
            return found

        yield Target("ours", server.url, effects)
        server.stop()
        return
    protocol_target = ProtocolTarget(request.param)
    httpd, url = _serve(_Handler, protocol_target)
    yield Target(request.param, url, protocol_target.effects)
    _stop(httpd)


def _create(target: Target, key: str = KEY) -> JSONDict:
    return client.create_deployment(base_url=target.url, idempotency_key=key, body=BODY, timeout=TIMEOUT)


def _get(target: Target, key: str = KEY) -> JSONDict | None:
    return client.get_deployment(base_url=target.url, idempotency_key=key, timeout=TIMEOUT)


def _delete(target: Target, key: str = KEY) -> bool:
    return client.delete_deployment(base_url=target.url, idempotency_key=key, timeout=TIMEOUT)


# --- conformance: every target the protocol allows ---------------------------------------------------


def test_create_deploys_once_and_returns_the_client_shape(target: Target) -> None:
    """The first POST deploys; the client returns all six fields whatever the target sent."""
    created = _create(target)

    assert sorted(created) == sorted(client.DEPLOYMENT_FIELDS)
    assert isinstance(created["deployment_id"], str) and created["deployment_id"]
    assert (created["idempotency_key"], created["status"]) == (KEY, "deployed")
    assert created["body"] == (None if target.name == "minimal" else BODY)
    assert target.effects(KEY) == {"created": 1, "deleted": 0}


def test_repeated_create_returns_the_same_deployment_and_deploys_once(target: Target) -> None:
    """A second and third POST with the key answer the first deployment and make nothing new."""
    first, second, third = _create(target), _create(target), _create(target)

    assert first["deployment_id"] == second["deployment_id"] == third["deployment_id"]
    assert second == first and third["status"] == "deployed"
    assert target.effects(KEY) == {"created": 1, "deleted": 0}


def test_get_returns_the_deployment_create_made_and_it_verifies(target: Target) -> None:
    """GET by key answers the created deployment; the postcondition holds on what the target returns."""
    created = _create(target)

    found = _get(target)

    assert found == created
    assert client.check_postcondition(found, deployment_id=created["deployment_id"], body=BODY) == (True, "")


def test_get_of_a_key_never_used_is_none(target: Target) -> None:
    """404 for an unknown key: None, and the postcondition says the deployment is not there."""
    assert _get(target, "never-used") is None
    ok, reason = client.check_postcondition(None, deployment_id="d-1", body=BODY)
    assert not ok and "d-1 is not on the deploy target" in reason


def test_delete_takes_the_deployment_out_of_place(target: Target) -> None:
    """After DELETE the key answers 404 or status "deleted"; either way the postcondition fails."""
    created = _create(target)

    assert _delete(target) is True
    found = _get(target)

    assert found is None or (found["deployment_id"], found["status"]) == (created["deployment_id"], "deleted")
    ok, reason = client.check_postcondition(found, deployment_id=created["deployment_id"], body=BODY)
    assert not ok and re.search(r"is not on the deploy target|is deleted", reason)
    assert target.effects(KEY) == {"created": 1, "deleted": 1}


def test_delete_again_has_no_second_effect(target: Target) -> None:
    """A second DELETE answers without error (204, 200 or 404 are all allowed) and deletes nothing more."""
    _create(target)
    _delete(target)

    again = _delete(target)

    assert isinstance(again, bool)
    assert target.effects(KEY) == {"created": 1, "deleted": 1}


def test_delete_of_a_key_never_used_is_false(target: Target) -> None:
    """DELETE of an unknown key is a 404: False, no effect."""
    assert _delete(target, "never-used") is False
    assert target.effects("never-used") == {"created": 0, "deleted": 0}


def test_a_key_deleted_before_it_deployed_never_deploys(target: Target) -> None:
    """The undo arrived first (a paused worker's POST comes after cancel compensated): the
    DELETE's 404 leaves a tombstone, and the late POST is a 410 Permanent that deploys nothing."""
    assert _delete(target) is False

    with pytest.raises(Permanent) as refused:
        _create(target)

    assert refused.value.status == 410
    assert target.effects(KEY) == {"created": 0, "deleted": 0}
    assert _get(target) is None


def test_create_after_delete_never_deploys_again(target: Target) -> None:
    """A late POST with a deleted key makes nothing: the deleted deployment comes back, or a 410 Permanent."""
    created = _create(target)
    _delete(target)

    try:
        again: JSONDict | None = _create(target)
    except Permanent as exc:
        assert exc.status == 410 and "a key never deploys twice" in str(exc)
        again = None

    if again is not None:
        assert (again["deployment_id"], again["status"]) == (created["deployment_id"], "deleted")
    assert target.effects(KEY) == {"created": 1, "deleted": 1}
    assert not client.check_postcondition(_get(target), deployment_id=created["deployment_id"], body=BODY)[0]


def test_idempotent_round_trip(target: Target) -> None:
    """Deploy, retry, reconcile by GET, verify, compensate twice, verify again: one create, one delete."""
    deployed = _create(target)
    retried = _create(target)
    reconciled = _get(target)
    assert retried["deployment_id"] == deployed["deployment_id"]
    assert reconciled is not None and reconciled["deployment_id"] == deployed["deployment_id"]
    assert client.check_postcondition(
        reconciled, deployment_id=deployed["deployment_id"], body={"candidate_hash": BODY["candidate_hash"]}
    ) == (True, "")

    assert _delete(target) is True
    _delete(target)

    assert not client.check_postcondition(_get(target), deployment_id=deployed["deployment_id"], body=None)[0]
    assert target.effects(KEY) == {"created": 1, "deleted": 1}


def test_each_key_names_its_own_deployment(target: Target) -> None:
    """Two keys make two deployments; a key's GET never answers the other's."""
    first, second = _create(target, "wf-1/DEPLOY/0"), _create(target, "wf-2/DEPLOY/0")

    assert first["deployment_id"] != second["deployment_id"]
    assert (found := _get(target, "wf-2/DEPLOY/0")) is not None
    assert found["deployment_id"] == second["deployment_id"]
    assert not client.check_postcondition(found, deployment_id=first["deployment_id"], body=None)[0]


# --- single answers: what the client tolerates and what it refuses ------------------------------------


class CannedTarget:
    """Answers every request with one fixed answer and records what it was asked."""

    def __init__(self, answer: Answer) -> None:
        self.fixed = answer
        self.requests: list[tuple[str, str]] = []

    def answer(self, method: str, path: str, headers: Any, raw: bytes) -> Answer:
        self.requests.append((method, path))
        return self.fixed


@pytest.fixture
def canned() -> Iterator[Callable[..., tuple[CannedTarget, str]]]:
    servers: list[_TargetHTTPServer] = []

    def start(status: int, body: bytes = b"", headers: dict[str, str] | None = None) -> tuple[CannedTarget, str]:
        canned_target = CannedTarget((status, headers or {}, body))
        httpd, url = _serve(_Handler, canned_target)
        servers.append(httpd)
        return canned_target, url

    yield start
    for httpd in servers:
        _stop(httpd)


def _request(method: str, url: str) -> Any:
    if method == "POST":
        return client.create_deployment(base_url=url, idempotency_key=KEY, body=BODY, timeout=TIMEOUT)
    if method == "GET":
        return client.get_deployment(base_url=url, idempotency_key=KEY, timeout=TIMEOUT)
    return client.delete_deployment(base_url=url, idempotency_key=KEY, timeout=TIMEOUT)


@pytest.mark.parametrize(("method", "status", "body", "expected"), [
    ("POST", 200, b'{"deployment_id": "d-1"}', "d-1"),
    ("POST", 201, b'{"deployment_id": "d-1", "status": null, "body": null, "idempotency_key": null}', "d-1"),
    ("GET", 200, b'{"deployment_id": "d-1", "region": "eu", "links": {"self": "/x"}}', "d-1"),
    ("GET", 200, b'{"deployment_id": "d-1", "idempotency_key": "' + KEY.encode() + b'"}', "d-1"),
    ("GET", 404, b"<html>Not Found</html>", None),
    ("GET", 410, b"", None),
    ("DELETE", 204, b"", True),
    ("DELETE", 200, b"OK", True),
    ("DELETE", 200, b'{"deployment_id": "d-1", "status": "deleted"}', True),
    ("DELETE", 410, b"", True),
    ("DELETE", 404, b"", False),
])
def test_answers_the_protocol_allows_are_accepted(
    canned: Callable[..., tuple[CannedTarget, str]], method: str, status: int, body: bytes, expected: object
) -> None:
    """Missing, null and unknown optional fields, empty DELETE answers, 200 for a new POST: all accepted."""
    # text/plain on purpose: the client reads a JSON object whatever the Content-Type says.
    _, url = canned(status, body, {"Content-Type": "text/plain"})

    result = _request(method, url)

    if isinstance(result, dict):
        assert result == {"deployment_id": expected, "idempotency_key": KEY, "status": "deployed",
                          "body": None, "created_at": None, "deleted_at": None}
    else:
        assert result == expected


def test_an_unknown_status_is_accepted_and_is_not_in_place(canned: Callable[..., tuple[CannedTarget, str]]) -> None:
    """A status the protocol does not name (e.g. "pending") passes through and fails the postcondition."""
    _, url = canned(200, b'{"deployment_id": "d-1", "status": "pending"}')

    found = _request("GET", url)

    assert found["status"] == "pending"
    assert client.check_postcondition(found, deployment_id="d-1", body=BODY) == (False, "deployment d-1 is pending")


@pytest.mark.parametrize(("method", "status", "body", "message"), [
    ("POST", 200, b"<html>deployed</html>", "answered 200 with a body that is not a JSON object"),
    ("POST", 201, b'["d-1"]', "not a JSON object"),
    ("POST", 201, b"{}", "malformed deployment: no deployment_id"),
    ("POST", 200, b'{"deployment_id": 7}', "deployment_id is 7, not a non-empty string"),
    ("POST", 200, b'{"deployment_id": ""}', "deployment_id is '', not a non-empty string"),
    ("POST", 200, b'{"deployment_id": "d-1", "idempotency_key": "other"}', "deployment of idempotency key 'other'"),
    ("GET", 200, b'{"deployment_id": "d-1", "idempotency_key": "wf-8/x"}', "the target confuses keys"),
    ("GET", 200, b"", "not a JSON object"),
    ("GET", 200, b'{"deployment_id": "d-1", "body": "text"}', "body is 'text', not a JSON object or null"),
    ("GET", 200, b'{"deployment_id": "d-1", "status": 3}', "status is 3, not a non-empty string"),
    ("GET", 200, b'{"deployment_id": "d-1", "created_at": 1714550400}', "created_at is 1714550400"),
    ("POST", 202, b'{"deployment_id": "d-1"}', r"answered 202, expected one of \[200, 201\]"),
    ("POST", 204, b"", "answered 204"),
    ("GET", 201, b'{"deployment_id": "d-1"}', r"answered 201, expected one of \[200\]"),
    ("DELETE", 202, b"", r"answered 202, expected one of \[200, 204\]"),
])
def test_answers_the_protocol_forbids_are_permanent(
    canned: Callable[..., tuple[CannedTarget, str]], method: str, status: int, body: bytes, message: str
) -> None:
    """A wrong status, a body that is not a deployment, or another key's deployment: Permanent, saying why."""
    _, url = canned(status, body, {"Content-Type": "application/json"})

    with pytest.raises(Permanent, match=message) as excinfo:
        _request(method, url)

    assert excinfo.value.idempotency_key == KEY
    assert "docs/deploy-protocol.md" in str(excinfo.value)


@pytest.mark.parametrize(("method", "status", "headers", "error", "message", "retry_after"), [
    ("POST", 408, {}, Retryable, "timed out reading the request", None),
    ("POST", 409, {"Retry-After": "2"}, Retryable, "still processing an earlier request with this key", 2),
    ("POST", 429, {"Retry-After": "3"}, Retryable, "retry after 3s with the same idempotency key", 3),
    ("POST", 503, {}, Retryable, "overloaded or failing", None),
    ("GET", 500, {}, Retryable, "500", None),
    ("DELETE", 502, {}, Retryable, "502", None),
    ("POST", 400, {}, Permanent, "Retrying will not help", None),
    ("POST", 403, {}, Permanent, "refuses this worker", None),
    ("POST", 404, {}, Permanent, "no deployments collection at this URL", None),
    ("POST", 410, {}, Permanent, "a key never deploys twice", None),
    ("POST", 422, {}, Permanent, "used before with another body", None),
    ("DELETE", 405, {}, Permanent, "rejected with 405", None),
])
def test_error_answers_map_to_retryable_or_permanent(
    canned: Callable[..., tuple[CannedTarget, str]], method: str, status: int, headers: dict[str, str],
    error: type[Exception], message: str, retry_after: float | None,
) -> None:
    """408, 409, 429 and 5xx are Retryable (with Retry-After); other 4xx are Permanent with what to do next."""
    _, url = canned(status, b'{"error": "nope"}', {"Content-Type": "application/json", **headers})

    with pytest.raises(error, match=message) as excinfo:
        _request(method, url)

    assert excinfo.value.status == status
    assert "nope" in str(excinfo.value)
    if error is Retryable:
        assert excinfo.value.retry_after_seconds == retry_after


@pytest.mark.parametrize(("method", "status"), [("POST", 302), ("POST", 303), ("GET", 307), ("DELETE", 308)])
def test_redirects_are_not_followed(
    canned: Callable[..., tuple[CannedTarget, str]], method: str, status: int
) -> None:
    """A redirect is Permanent naming the new address; a POST is never resent as a GET elsewhere."""
    canned_target, url = canned(status, b"", {"Location": "http://127.0.0.1:9/moved"})

    with pytest.raises(Permanent, match=r"does not follow redirects.*\(http://127\.0\.0\.1:9/moved\)"):
        _request(method, url)

    assert len(canned_target.requests) == 1


def test_a_key_outside_printable_ascii_is_refused_before_sending(
    canned: Callable[..., tuple[CannedTarget, str]]
) -> None:
    """The protocol's keys are printable ASCII; anything else is refused locally with what to do."""
    canned_target, url = canned(201, b'{"deployment_id": "d-1"}')

    with pytest.raises(Permanent, match="non-ASCII characters; send the activity's ctx.idempotency_key"):
        client.create_deployment(base_url=url, idempotency_key="wf-1/dépl", body=BODY, timeout=TIMEOUT)

    assert canned_target.requests == []


def test_a_body_with_nan_is_refused_before_sending(canned: Callable[..., tuple[CannedTarget, str]]) -> None:
    """NaN is not JSON; the client refuses it rather than send a body a strict target rejects."""
    canned_target, url = canned(201, b'{"deployment_id": "d-1"}')

    with pytest.raises(Permanent, match="not JSON-serialisable"):
        client.create_deployment(base_url=url, idempotency_key=KEY, body={"score": float("nan")}, timeout=TIMEOUT)

    assert canned_target.requests == []


# --- the postcondition ----------------------------------------------------------------------------------


def _found(**fields: Any) -> JSONDict:
    return {"deployment_id": "d-1", "idempotency_key": KEY, "status": "deployed", "body": dict(BODY),
            "created_at": None, "deleted_at": None, **fields}


@pytest.mark.parametrize(("found", "body", "reason"), [
    (_found(), BODY, ""),
    (_found(), {"candidate_hash": "9f1c"}, ""),
    (_found(), None, ""),
    (_found(body=None), BODY, ""),
    ({"deployment_id": "d-1"}, BODY, ""),
    (_found(body={**BODY, "files": {"a.py": "x"}, "extra": 1}), {"files": {"a.py": "x"}}, ""),
    (None, BODY, "deployment d-1 is not on the deploy target (GET by its key found nothing)"),
    (_found(deployment_id="d-2"), BODY, "the key of deployment d-1 now names deployment 'd-2'"),
    (_found(status="deleted", deleted_at="2025-05-01T10:00:00+00:00"), BODY,
     "deployment d-1 is deleted since 2025-05-01T10:00:00+00:00"),
    (_found(body={**BODY, "candidate_hash": "77ab"}), BODY,
     "deployment d-1 carries another body: candidate_hash is '77ab', expected '9f1c'"),
    (_found(body={"workflow_id": 8}), {"workflow_id": 7, "candidate_hash": "9f1c"},
     "deployment d-1 carries another body: workflow_id is 8, expected 7 (and 1 more fields)"),
    (_found(body={"workflow_id": 7}), {"candidate_hash": "9f1c"},
     "deployment d-1 carries another body: candidate_hash is missing, expected '9f1c'"),
])
def test_check_postcondition_judges_by_what_the_protocol_guarantees(
    found: JSONDict | None, body: JSONDict | None, reason: str
) -> None:
    """In place: the key names the recorded id, status deployed (or absent), returned body fields match."""
    ok, why = client.check_postcondition(found, deployment_id="d-1", body=body)

    assert ok is (reason == "")
    assert why.startswith(reason) and (why == "") is ok


def test_check_postcondition_compares_bodies_as_json() -> None:
    """A tuple sent comes back a list; that is the same body."""
    found = _found(body={"files": ["a.py", "b.py"]})

    assert client.check_postcondition(found, deployment_id="d-1", body={"files": ("a.py", "b.py")}) == (True, "")


# --- the documents match the client -------------------------------------------------------------------


def test_the_openapi_file_requires_only_deployment_id_and_names_the_client_fields() -> None:
    """deploy-protocol.openapi.yaml and the client agree on the deployment object and the status codes."""
    spec = yaml.safe_load((DOCS / "deploy-protocol.openapi.yaml").read_text())
    deployment = spec["components"]["schemas"]["Deployment"]
    paths = spec["paths"]

    assert deployment["required"] == ["deployment_id"]
    assert sorted(deployment["properties"]) == sorted(client.DEPLOYMENT_FIELDS)
    assert {"200", "201"} <= set(paths["/deployments"]["post"]["responses"])
    assert {"200", "404"} <= set(paths["/deployments/{key}"]["get"]["responses"])
    assert {"200", "204", "404"} <= set(paths["/deployments/{key}"]["delete"]["responses"])


def test_the_protocol_page_lists_each_field_and_requires_only_deployment_id() -> None:
    """The field table of docs/deploy-protocol.md has one row per client field; only deployment_id is required."""
    page = (DOCS / "deploy-protocol.md").read_text()
    rows = dict(re.findall(r"^\| `(\w+)` \| (\*\*yes\*\*|no) \|", page, re.M))

    assert sorted(rows) == sorted(client.DEPLOYMENT_FIELDS)
    assert [name for name, required in rows.items() if required != "no"] == ["deployment_id"]


# --- the release agent against the minimal target -------------------------------------------------------


@pytest.fixture
def minimal_target(tmp_path: Path, settings: Any) -> Iterator[ProtocolTarget]:
    """The minimal target as the release agent's deploy target."""
    protocol_target = ProtocolTarget("minimal")
    httpd, url = _serve(_Handler, protocol_target)
    settings.AGENTOPS_DEPLOY_TARGET_URL = url
    settings.AGENTOPS_WORKSPACE_DIR = tmp_path / "workspaces"
    yield protocol_target
    _stop(httpd)


def _approved_release(repo: Path, requester: Any, approver: Any) -> int:
    from tests.conftest import drive, open_approval, release_params
    from workflows import services

    workflow = drive(services.workflow_launch(kind="release", goal="Ship the release notes",
                                              params=release_params(repo), user=requester).pk)
    wait = open_approval(workflow.pk)
    services.wait_approve(wait_id=wait.pk, user=approver, candidate_hash=wait.candidate_hash)
    return workflow.pk


@pytest.mark.django_db
def test_the_release_agent_deploys_verifies_and_completes_against_the_minimal_target(
    git_repo: Path, minimal_target: ProtocolTarget, requester: Any, approver: Any
) -> None:
    """A target answering only {"deployment_id"} is enough: deploy once, verify, reconcile, complete."""
    from tests.conftest import drive

    workflow = drive(_approved_release(git_repo, requester, approver))

    assert workflow.status == "completed", workflow.reason
    [(key, deployment)] = minimal_target.deployments.items()
    assert workflow.result["deployment_id"] == deployment["deployment_id"]
    assert minimal_target.effects(key) == {"created": 1, "deleted": 0}


@pytest.mark.django_db
def test_cancel_compensates_through_the_minimal_targets_204(
    git_repo: Path, minimal_target: ProtocolTarget, requester: Any, approver: Any
) -> None:
    """Cancelling after the deploy undoes it with a DELETE answered 204 and no body: compensated."""
    from tests.conftest import drive
    from workflows import services
    from workflows.models import Activity, Commitment

    workflow_id = _approved_release(git_repo, requester, approver)
    for _ in range(20):
        services.workflow_advance_if_runnable(workflow_id=workflow_id)
        due = Activity.objects.filter(workflow_id=workflow_id, status=Activity.Status.SCHEDULED).order_by("pk")
        first = due.first()
        assert first is not None, "the deploy was never scheduled"
        services.activity_run_if_runnable(activity_id=first.pk, worker="in-process")
        if first.name == "deploy":
            break

    services.workflow_cancel(workflow_id=workflow_id)
    workflow = drive(workflow_id)

    assert workflow.status == "cancelled", workflow.reason
    assert Commitment.objects.get(workflow_id=workflow_id).status == "compensated"
    [key] = minimal_target.deployments
    assert minimal_target.effects(key) == {"created": 1, "deleted": 1}


@pytest.mark.django_db
def test_a_deploy_paused_after_its_fence_deploys_nothing_on_the_minimal_target_after_cancel(
    git_repo: Path, minimal_target: ProtocolTarget, requester: Any, approver: Any, settings: Any
) -> None:
    """The cancel compensates before the paused worker's POST arrives: the minimal target's 404
    leaves a tombstone, the late POST is a 410, and nothing is deployed for the cancelled workflow."""
    from tests.conftest import drive, worker_context
    from tests.workflows.test_cancel_and_commitments import run_until_scheduled
    from workflows import services

    workflow_id = _approved_release(git_repo, requester, approver)
    deploy = run_until_scheduled(workflow_id, "deploy")
    claim = services.activity_claim_if_runnable(activity_id=deploy.pk, worker="paused", task_id="t1")
    assert claim is not None
    paused = worker_context(claim)
    paused.fence("POST the deployment")

    services.workflow_cancel(workflow_id=workflow_id)
    assert drive(workflow_id).status == "cancelled"
    with pytest.raises(Permanent) as refused:
        client.create_deployment(base_url=settings.AGENTOPS_DEPLOY_TARGET_URL, idempotency_key=paused.idempotency_key,
                                 body=BODY, timeout=TIMEOUT)

    assert refused.value.status == 410
    assert minimal_target.deployments == {}
    assert paused.idempotency_key in minimal_target.tombstones

