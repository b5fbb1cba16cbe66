"""The deploy target server and its client: idempotency, faults, persistence and error mapping."""
from __future__ import annotations

import json
import re
import select
import signal
import socket
import subprocess
import sys
import threading
import urllib.error
import urllib.request
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, HTTPServer
from pathlib import Path
from typing import Any

import pytest

from agentops.deploytarget.client import create_deployment, delete_deployment, get_deployment
from agentops.deploytarget.server import DeployTargetServer
from workflows.errors import Permanent, Retryable

REPO_ROOT = Path(__file__).resolve().parent.parent
TIMEOUT = 5.0
BODY = {"release": "v1.2.3", "service": "web"}


@pytest.fixture
def target(tmp_path: Path) -> Iterator[DeployTargetServer]:
    server = DeployTargetServer(state_path=tmp_path / "state.json").start()
    yield server
    server.stop()


def _raw(method: str, url: str, *, body: bytes | None = None, key: str | None = None) -> tuple[int, Any]:
    """Send one request without the client; return (status, decoded JSON)."""
    headers = {"Content-Type": "application/json"}
    if key is not None:
        headers["Idempotency-Key"] = key
    request = urllib.request.Request(url, data=body, method=method, headers=headers)
    try:
        with urllib.request.urlopen(request, timeout=TIMEOUT) as response:
            return response.status, json.loads(response.read())
    except urllib.error.HTTPError as exc:
        return exc.code, json.loads(exc.read())


def _stats(base_url: str) -> dict[str, Any]:
    status, data = _raw("GET", f"{base_url}/_stats")
    assert status == 200 and isinstance(data, dict)
    return data


def _set_fault(base_url: str, **fault: Any) -> None:
    status, data = _raw("POST", f"{base_url}/_faults", body=json.dumps(fault).encode())
    assert status == 200, data


def _effects(base_url: str, key: str) -> dict[str, int]:
    effects: dict[str, int] = _stats(base_url)["effects"].get(key, {"created": 0, "deleted": 0})
    return effects


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def test_repeated_key_returns_the_same_deployment(target: DeployTargetServer) -> None:
    """Two POSTs with one key make one deployment: 201 then 200, same deployment_id, one effect."""
    first_status, first = _raw("POST", f"{target.url}/deployments", body=json.dumps(BODY).encode(), key="k1")
    second = create_deployment(base_url=target.url, idempotency_key="k1", body=BODY, timeout=TIMEOUT)
    third_status, third = _raw("POST", f"{target.url}/deployments", body=json.dumps(BODY).encode(), key="k1")

    assert (first_status, third_status) == (201, 200)
    assert first["deployment_id"] == second["deployment_id"] == third["deployment_id"]
    assert second["status"] == "deployed" and second["body"] == BODY and second["idempotency_key"] == "k1"
    assert _effects(target.url, "k1") == {"created": 1, "deleted": 0}
    assert _stats(target.url)["deployments"] == 1


def test_get_returns_404_before_create_and_the_deployment_after(target: DeployTargetServer) -> None:
    """GET of an unknown key is a 404 JSON error (None from the client); after create it is the deployment."""
    status, data = _raw("GET", f"{target.url}/deployments/k1")
    assert status == 404 and "error" in data
    assert get_deployment(base_url=target.url, idempotency_key="k1", timeout=TIMEOUT) is None

    created = create_deployment(base_url=target.url, idempotency_key="k1", body=BODY, timeout=TIMEOUT)

    assert get_deployment(base_url=target.url, idempotency_key="k1", timeout=TIMEOUT) == created


def test_key_with_a_slash_round_trips_through_the_url(target: DeployTargetServer) -> None:
    """Keys are quoted into one path segment, so operation ids like "wf/7/deploy" work."""
    created = create_deployment(base_url=target.url, idempotency_key="wf/7/deploy", body=BODY, timeout=TIMEOUT)

    assert get_deployment(base_url=target.url, idempotency_key="wf/7/deploy", timeout=TIMEOUT) == created


def test_delete_is_idempotent_and_counts_one_effect(target: DeployTargetServer) -> None:
    """Deleting twice answers 200 both times with status "deleted" and counts one delete effect."""
    create_deployment(base_url=target.url, idempotency_key="k1", body=BODY, timeout=TIMEOUT)

    assert delete_deployment(base_url=target.url, idempotency_key="k1", timeout=TIMEOUT) is True
    status, data = _raw("DELETE", f"{target.url}/deployments/k1")

    assert status == 200 and data["status"] == "deleted"
    assert _effects(target.url, "k1") == {"created": 1, "deleted": 1}
    fetched = get_deployment(base_url=target.url, idempotency_key="k1", timeout=TIMEOUT)
    assert fetched is not None and fetched["status"] == "deleted"


def test_delete_of_a_key_never_deployed_is_404(target: DeployTargetServer) -> None:
    """DELETE of an unknown key is a 404 (False from the client) and records no effect."""
    status, data = _raw("DELETE", f"{target.url}/deployments/nope")

    assert status == 404 and "error" in data
    assert delete_deployment(base_url=target.url, idempotency_key="nope", timeout=TIMEOUT) is False
    assert _stats(target.url)["effects"] == {}


def test_accept_then_drop_commits_the_effect_but_the_caller_sees_retryable(target: DeployTargetServer) -> None:
    """The dropped POST deployed; the retry with the same key returns that deployment, one effect."""
    _set_fault(target.url, mode="accept_then_drop", count=1)

    with pytest.raises(Retryable, match="closed the connection without a response") as excinfo:
        create_deployment(base_url=target.url, idempotency_key="k1", body=BODY, timeout=TIMEOUT)
    assert excinfo.value.idempotency_key == "k1"

    stored = get_deployment(base_url=target.url, idempotency_key="k1", timeout=TIMEOUT)
    retried = create_deployment(base_url=target.url, idempotency_key="k1", body=BODY, timeout=TIMEOUT)
    assert stored is not None and retried["deployment_id"] == stored["deployment_id"]
    assert _effects(target.url, "k1") == {"created": 1, "deleted": 0}


def test_fail_mode_raises_retryable_with_retry_after_and_no_effect(target: DeployTargetServer) -> None:
    """A 503 with Retry-After: 1 maps to Retryable(retry_after_seconds=1); nothing is deployed."""
    _set_fault(target.url, mode="fail", count=1)

    with pytest.raises(Retryable, match="503") as excinfo:
        create_deployment(base_url=target.url, idempotency_key="k1", body=BODY, timeout=TIMEOUT)

    assert excinfo.value.retry_after_seconds == 1
    assert excinfo.value.status == 503
    assert get_deployment(base_url=target.url, idempotency_key="k1", timeout=TIMEOUT) is None
    assert _stats(target.url)["effects"] == {}
    # count=1: the fault is used up and the next POST deploys.
    create_deployment(base_url=target.url, idempotency_key="k1", body=BODY, timeout=TIMEOUT)
    assert _effects(target.url, "k1")["created"] == 1


def test_no_idempotency_mode_counts_every_post_as_an_effect(target: DeployTargetServer) -> None:
    """Without idempotency a repeated key deploys twice: the oracle sees two created effects."""
    _set_fault(target.url, mode="no_idempotency")

    first = create_deployment(base_url=target.url, idempotency_key="k1", body=BODY, timeout=TIMEOUT)
    second = create_deployment(base_url=target.url, idempotency_key="k1", body=BODY, timeout=TIMEOUT)

    assert first["deployment_id"] != second["deployment_id"]
    assert _effects(target.url, "k1") == {"created": 2, "deleted": 0}
    assert _stats(target.url)["deployments"] == 2


def test_slow_mode_makes_the_client_time_out_as_retryable(target: DeployTargetServer) -> None:
    """A target slower than the client's timeout is a Retryable naming the timeout."""
    _set_fault(target.url, mode="slow", seconds=1.0, count=1)

    with pytest.raises(Retryable, match=r"no answer within 0.2s"):
        get_deployment(base_url=target.url, idempotency_key="k1", timeout=0.2)


def test_post_without_idempotency_key_is_400_and_has_no_effect(target: DeployTargetServer) -> None:
    """A POST without Idempotency-Key is refused with a JSON error and deploys nothing."""
    status, data = _raw("POST", f"{target.url}/deployments", body=json.dumps(BODY).encode())

    assert status == 400 and "Idempotency-Key" in data["error"]
    assert _stats(target.url)["deployments"] == 0


@pytest.mark.parametrize("body", [b"[1, 2]", b'"text"', b"not json", b""])
def test_post_with_a_body_that_is_not_an_object_is_400_and_has_no_effect(
    target: DeployTargetServer, body: bytes
) -> None:
    """Only a JSON object is a deployment body; anything else is a 400 with no effect."""
    status, data = _raw("POST", f"{target.url}/deployments", body=body, key="k1")

    assert status == 400 and "error" in data
    assert _stats(target.url)["effects"] == {}


def test_client_maps_a_4xx_to_permanent(target: DeployTargetServer) -> None:
    """A key over the target's length limit is a 400, which retrying cannot fix: Permanent."""
    with pytest.raises(Permanent, match="rejected with 400"):
        create_deployment(base_url=target.url, idempotency_key="k" * 300, body=BODY, timeout=TIMEOUT)


def test_unknown_fault_mode_is_400(target: DeployTargetServer) -> None:
    """POST /_faults refuses a mode it does not know and keeps the current one."""
    status, data = _raw("POST", f"{target.url}/_faults", body=b'{"mode": "explode"}')

    assert status == 400 and "explode" in data["error"]
    assert _stats(target.url)["fault"]["mode"] == "none"


def test_client_maps_a_closed_port_to_retryable() -> None:
    """Nothing listening: connection refused is a Retryable that says so."""
    url = f"http://127.0.0.1:{_free_port()}"

    with pytest.raises(Retryable, match="refused") as excinfo:
        create_deployment(base_url=url, idempotency_key="k1", body=BODY, timeout=TIMEOUT)
    assert excinfo.value.url == f"{url}/deployments"


class _BadShapeHandler(BaseHTTPRequestHandler):
    """Answers every request 200 with JSON that is not a deployment."""

    def do_POST(self) -> None:
        self.rfile.read(int(self.headers.get("Content-Length") or 0))
        data = json.dumps({"status": "deployed"}).encode()
        self.send_response(200)
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def log_message(self, format: str, *args: Any) -> None:
        pass


def test_client_maps_a_2xx_without_deployment_id_to_permanent() -> None:
    """A 200 that is not a deployment means a wrong URL or a broken target: Permanent, not retried."""
    httpd = HTTPServer(("127.0.0.1", 0), _BadShapeHandler)
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    try:
        with pytest.raises(Permanent, match="no deployment_id"):
            create_deployment(
                base_url=f"http://127.0.0.1:{httpd.server_address[1]}",
                idempotency_key="k1", body=BODY, timeout=TIMEOUT,
            )
    finally:
        httpd.shutdown()
        httpd.server_close()


def _start_process(state: Path, log: Path) -> tuple[subprocess.Popen[str], str]:
    """Start the server as `python -m`; return the process and the URL from its listening line."""
    with log.open("a") as stderr:
        proc = subprocess.Popen(
            [sys.executable, "-m", "agentops.deploytarget.server", "--port", "0", "--state", str(state)],
            cwd=REPO_ROOT, stdout=subprocess.PIPE, stderr=stderr, text=True,
        )
    assert proc.stdout is not None
    ready, _, _ = select.select([proc.stdout], [], [], 15)
    if not ready:
        proc.kill()
        proc.wait(timeout=10)
        pytest.fail(f"deploy target printed nothing in 15s; stderr: {log.read_text()}")
    line = proc.stdout.readline()
    match = re.fullmatch(r"deploy-target listening on (http://127\.0\.0\.1:(\d+))\n", line)
    assert match, f"unexpected first line {line!r}; stderr: {log.read_text()}"
    return proc, match.group(1)


def _end_process(proc: subprocess.Popen[str], sig: signal.Signals) -> int:
    """Send sig, reap the process and close its pipe; return the exit status."""
    proc.send_signal(sig)
    status = proc.wait(timeout=10)
    if proc.stdout is not None:
        proc.stdout.close()
    return status


def test_deployments_survive_a_sigkill_and_restart_on_the_same_state_file(tmp_path: Path) -> None:
    """A deployment acknowledged before SIGKILL is still there, with one effect, after a restart."""
    state, log = tmp_path / "state.json", tmp_path / "target.log"
    proc, url = _start_process(state, log)
    try:
        created = create_deployment(base_url=url, idempotency_key="k1", body=BODY, timeout=TIMEOUT)
    finally:
        _end_process(proc, signal.SIGKILL)

    proc, url = _start_process(state, log)
    try:
        assert get_deployment(base_url=url, idempotency_key="k1", timeout=TIMEOUT) == created
        again = create_deployment(base_url=url, idempotency_key="k1", body=BODY, timeout=TIMEOUT)
        assert again["deployment_id"] == created["deployment_id"]
        assert _effects(url, "k1") == {"created": 1, "deleted": 0}
    finally:
        _end_process(proc, signal.SIGKILL)
    assert "deploy-target POST /deployments 201 key=k1" in log.read_text()


def test_sigterm_stops_the_server_cleanly(tmp_path: Path) -> None:
    """SIGTERM ends the process with status 0 and the port stops answering."""
    proc, url = _start_process(tmp_path / "state.json", tmp_path / "target.log")

    status = _end_process(proc, signal.SIGTERM)

    assert status == 0
    with pytest.raises(Retryable, match="refused"):
        get_deployment(base_url=url, idempotency_key="k1", timeout=TIMEOUT)
