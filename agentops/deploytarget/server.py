"""The deploy target: a stdlib HTTP server with idempotency keys, a JSON state file, effect counts and faults."""
from __future__ import annotations

import argparse
import contextlib
import copy
import json
import os
import signal
import socket
import sys
import tempfile
import threading
import time
import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from http import HTTPStatus
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from types import FrameType
from typing import Any
from urllib.parse import unquote, urlsplit

FAULT_MODES = ("none", "accept_then_drop", "fail", "slow", "no_idempotency")
COLLECTION_PATH = "/deployments"
MAX_BODY_BYTES = 1 << 20
MAX_KEY_LENGTH = 200
RETRY_AFTER_SECONDS = 1
DEFAULT_SLOW_SECONDS = 2.0
STATE_VERSION = 1

JSONDict = dict[str, Any]


class BadRequest(Exception):
    """A request the target refuses with 400; the message is sent back as the JSON error."""


def _now() -> str:
    return datetime.now(UTC).isoformat(timespec="microseconds")


@dataclass
class Fault:
    """A fault mode; count is how many more requests it applies to (None: until it is changed)."""

    mode: str = "none"
    count: int | None = None
    seconds: float = DEFAULT_SLOW_SECONDS

    @classmethod
    def build(cls, mode: str, count: int | None = None, seconds: float | None = None) -> Fault:
        """Validate a fault; raises ValueError with a message meant for the operator."""
        if mode not in FAULT_MODES:
            raise ValueError(f"unknown fault mode {mode!r}; use one of {', '.join(FAULT_MODES)}")
        if count is not None and (isinstance(count, bool) or not isinstance(count, int) or count < 0):
            raise ValueError(f"fault count must be a whole number >= 0 or null, not {count!r}")
        if seconds is None:
            seconds = DEFAULT_SLOW_SECONDS
        if isinstance(seconds, bool) or not isinstance(seconds, (int, float)) or seconds < 0:
            raise ValueError(f"fault seconds must be a number >= 0, not {seconds!r}")
        if count == 0:
            # A fault for zero requests is no fault; normalising keeps /_stats honest.
            return cls()
        return cls(mode=mode, count=count, seconds=float(seconds))

    @classmethod
    def from_json(cls, data: object) -> Fault:
        """Build from a POST /_faults body such as {"mode": "fail", "count": 2}."""
        if not isinstance(data, dict) or not isinstance(data.get("mode"), str):
            raise ValueError('the body must be a JSON object like {"mode": "fail", "count": 1}')
        return cls.build(data["mode"], data.get("count"), data.get("seconds"))

    def to_json(self) -> JSONDict:
        return {"mode": self.mode, "count": self.count, "seconds": self.seconds}

    def applies_to(self, method: str) -> bool:
        # Only "slow" delays reads too; the other modes are about the effect of a POST.
        return self.mode == "slow" or (self.mode != "none" and method == "POST")


class DeploymentStore:
    """Deployments, per-key effect counts and the fault mode, guarded by one lock.

    Every change is written to the state file (temp file, fsync, os.replace) before the
    caller answers, so a killed server never forgets an effect it acknowledged.
    """

    def __init__(self, path: Path, fault: Fault | None = None) -> None:
        self.path = path
        self._lock = threading.Lock()
        self._fault = fault or Fault()
        self._requests = 0
        self._state = self._load()

    def _load(self) -> JSONDict:
        if not self.path.exists():
            return {"version": STATE_VERSION, "deployments": {}, "latest_by_key": {}, "effects": {}, "tombstones": {}}
        try:
            state = json.loads(self.path.read_text(encoding="utf-8"))
        except (OSError, ValueError) as exc:
            raise ValueError(
                f"cannot read deploy-target state {self.path}: {exc}; move the file aside to start empty"
            ) from exc
        if not isinstance(state, dict) or state.get("version") != STATE_VERSION:
            raise ValueError(f"{self.path} is not a version {STATE_VERSION} deploy-target state file")
        state.setdefault("tombstones", {})  # files written before tombstones were kept
        return state

    def _commit(self, state: JSONDict) -> None:
        """Persist state atomically, then make it current; a failed write changes nothing."""
        data = json.dumps(state, indent=1, sort_keys=True)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(prefix=f".{self.path.name}.", suffix=".tmp", dir=self.path.parent)
        try:
            with os.fdopen(fd, "w", encoding="utf-8") as handle:
                handle.write(data)
                handle.flush()
                os.fsync(handle.fileno())
            os.replace(tmp, self.path)
        except BaseException:
            with contextlib.suppress(OSError):
                os.unlink(tmp)
            raise
        self._state = state

    def _latest(self, state: JSONDict, key: str) -> JSONDict | None:
        deployment_id = state["latest_by_key"].get(key)
        return None if deployment_id is None else state["deployments"][deployment_id]

    def create(self, *, key: str, body: JSONDict, idempotent: bool = True) -> tuple[JSONDict | None, bool]:
        """Return (deployment, created): the key's existing deployment, or a new one with one effect;
        (None, False) when the key was deleted before it made anything (a tombstone)."""
        with self._lock:
            if key in self._state["tombstones"]:
                return None, False
            existing = self._latest(self._state, key)
            if existing is not None and idempotent:
                return copy.deepcopy(existing), False
            state = copy.deepcopy(self._state)
            deployment: JSONDict = {
                "deployment_id": f"dep_{uuid.uuid4().hex}",
                "idempotency_key": key,
                "status": "deployed",
                "body": body,
                "created_at": _now(),
                "deleted_at": None,
            }
            state["deployments"][deployment["deployment_id"]] = deployment
            state["latest_by_key"][key] = deployment["deployment_id"]
            self._count_effect(state, key, "created")
            self._commit(state)
            return copy.deepcopy(deployment), True

    def get(self, key: str) -> JSONDict | None:
        with self._lock:
            found = self._latest(self._state, key)
            return None if found is None else copy.deepcopy(found)

    def delete(self, key: str) -> JSONDict | None:
        """Mark the key's deployment deleted (one effect, the first time); None if there never was
        one, and then the key is kept as a tombstone: a later create with it makes nothing."""
        with self._lock:
            existing = self._latest(self._state, key)
            if existing is None:
                if key not in self._state["tombstones"]:
                    state = copy.deepcopy(self._state)
                    state["tombstones"][key] = _now()
                    self._commit(state)
                return None
            if existing["status"] == "deleted":
                return copy.deepcopy(existing)
            state = copy.deepcopy(self._state)
            deployment = self._latest(state, key)
            assert deployment is not None
            deployment["status"] = "deleted"
            deployment["deleted_at"] = _now()
            self._count_effect(state, key, "deleted")
            self._commit(state)
            return copy.deepcopy(deployment)

    @staticmethod
    def _count_effect(state: JSONDict, key: str, kind: str) -> None:
        counts = state["effects"].setdefault(key, {"created": 0, "deleted": 0})
        counts[kind] += 1

    def count_request(self) -> None:
        with self._lock:
            self._requests += 1

    def stats(self) -> JSONDict:
        with self._lock:
            deployments = self._state["deployments"].values()
            return {
                "deployments": len(self._state["deployments"]),
                "active": sum(1 for d in deployments if d["status"] == "deployed"),
                "effects": copy.deepcopy(self._state["effects"]),
                "tombstones": len(self._state["tombstones"]),
                "requests": self._requests,
                "fault": self._fault.to_json(),
            }

    def set_fault(self, fault: Fault) -> None:
        with self._lock:
            self._fault = fault

    def fault(self) -> Fault:
        with self._lock:
            return copy.copy(self._fault)

    def take_fault(self, method: str) -> Fault:
        """Consume one use of the current fault for this request; returns the fault to apply."""
        with self._lock:
            fault = self._fault
            if not fault.applies_to(method):
                return Fault()
            if fault.count is not None:
                fault.count -= 1
                if fault.count <= 0:
                    self._fault = Fault()
            return Fault(mode=fault.mode, count=fault.count, seconds=fault.seconds)


class _HTTPServer(ThreadingHTTPServer):
    # Request threads must not keep a stopping process alive; writes are atomic anyway.
    daemon_threads = True

    def __init__(self, address: tuple[str, int], store: DeploymentStore) -> None:
        self.store = store
        super().__init__(address, _Handler)


class _Handler(BaseHTTPRequestHandler):
    server: _HTTPServer
    server_version = "deploy-target/1"
    _key: str = "-"
    # A stalled client must not pin a handler thread forever.
    timeout = 30

    def do_GET(self) -> None:
        self._dispatch("GET")

    def do_POST(self) -> None:
        self._dispatch("POST")

    def do_DELETE(self) -> None:
        self._dispatch("DELETE")

    def do_PUT(self) -> None:
        self._dispatch("PUT")

    def do_PATCH(self) -> None:
        self._dispatch("PATCH")

    def log_message(self, format: str, *args: Any) -> None:
        """Silence the default access log; _log writes one line per request instead."""

    def _log(self, status: int | str) -> None:
        sys.stderr.write(f"deploy-target {self.command} {self.path} {status} key={self._key}\n")
        sys.stderr.flush()

    def _dispatch(self, method: str) -> None:
        self._key = self.headers.get("Idempotency-Key") or "-"
        self.server.store.count_request()
        try:
            self._route(method, urlsplit(self.path).path)
        except BadRequest as exc:
            self._send(HTTPStatus.BAD_REQUEST, {"error": str(exc)})
        except Exception as exc:  # Process boundary: answer 500 (retryable) and keep serving.
            self._send(HTTPStatus.INTERNAL_SERVER_ERROR, {"error": f"internal error: {exc!r}"})

    def _route(self, method: str, path: str) -> None:
        routes: dict[tuple[str, str], Callable[[], None]] = {
            ("POST", COLLECTION_PATH): self._create,
            ("GET", "/_stats"): lambda: self._send(HTTPStatus.OK, self.server.store.stats()),
            ("GET", "/_faults"): lambda: self._send(HTTPStatus.OK, self.server.store.fault().to_json()),
            ("POST", "/_faults"): self._set_fault,
        }
        if (method, path) in routes:
            routes[(method, path)]()
        elif path.startswith(COLLECTION_PATH + "/") and method in ("GET", "DELETE"):
            self._key = unquote(path[len(COLLECTION_PATH) + 1 :])
            self._read_or_delete(method)
        elif path in {p for _, p in routes} or path.startswith(COLLECTION_PATH + "/"):
            self._send(HTTPStatus.METHOD_NOT_ALLOWED, {"error": f"{method} is not allowed on {path}"})
        else:
            self._send(HTTPStatus.NOT_FOUND, {"error": f"no such endpoint: {path}"})

    def _read_body(self) -> bytes:
        raw_length = self.headers.get("Content-Length") or "0"
        try:
            length = int(raw_length)
        except ValueError:
            raise BadRequest(f"Content-Length {raw_length!r} is not a number") from None
        if length < 0 or length > MAX_BODY_BYTES:
            self.close_connection = True  # The unread body would corrupt the next request.
            raise BadRequest(f"body must be 0..{MAX_BODY_BYTES} bytes, not {length}")
        return self.rfile.read(length)

    def _read_json_object(self) -> JSONDict:
        return _parse_json_object(self._read_body())

    def _create(self) -> None:
        # Validate before taking a fault: bad input is always a 400, and faults count only real POSTs.
        # Read the body even when the key is bad: closing on unread bytes would reset the connection.
        raw = self._read_body()
        key = _validate_key(self.headers.get("Idempotency-Key"))
        body = _parse_json_object(raw)
        fault = self.server.store.take_fault("POST")
        if fault.mode == "slow":
            time.sleep(fault.seconds)
        if fault.mode == "fail":
            self._send(HTTPStatus.SERVICE_UNAVAILABLE, {"error": "injected fault: fail; retry later"},
                       headers={"Retry-After": str(RETRY_AFTER_SECONDS)})
            return
        deployment, created = self.server.store.create(
            key=key, body=body, idempotent=fault.mode != "no_idempotency"
        )
        if deployment is None:
            self._send(HTTPStatus.GONE, {"error": f"idempotency key {key!r} was deleted before it made a "
                                                  "deployment; a new deployment needs a new key"})
            return
        if fault.mode == "accept_then_drop":
            self._drop()
            return
        self._send(HTTPStatus.CREATED if created else HTTPStatus.OK, deployment,
                   headers={"Idempotent-Replayed": "false" if created else "true"})

    def _read_or_delete(self, method: str) -> None:
        fault = self.server.store.take_fault(method)
        if fault.mode == "slow":
            time.sleep(fault.seconds)
        store = self.server.store
        deployment = store.get(self._key) if method == "GET" else store.delete(self._key)
        if deployment is None:
            self._send(HTTPStatus.NOT_FOUND, {"error": f"no deployment for idempotency key {self._key!r}"})
        else:
            self._send(HTTPStatus.OK, deployment)

    def _set_fault(self) -> None:
        try:
            fault = Fault.from_json(self._read_json_object())
        except ValueError as exc:
            raise BadRequest(str(exc)) from None
        self.server.store.set_fault(fault)
        self._send(HTTPStatus.OK, fault.to_json())

    def _send(self, status: HTTPStatus, payload: JSONDict, headers: dict[str, str] | None = None) -> None:
        data = json.dumps(payload).encode("utf-8")
        # Log first: once the caller has the answer it may kill us, and the line must survive that.
        self._log(int(status))
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        for name, value in (headers or {}).items():
            self.send_header(name, value)
        self.end_headers()
        self.wfile.write(data)

    def _drop(self) -> None:
        """Close the connection without a status line: the effect happened, the caller sees a failure."""
        self._log("dropped")
        self.close_connection = True
        with contextlib.suppress(OSError):
            self.connection.shutdown(socket.SHUT_RDWR)


def _parse_json_object(raw: bytes) -> JSONDict:
    try:
        data = json.loads(raw.decode("utf-8"))
    except (UnicodeDecodeError, ValueError):
        raise BadRequest("the body is not valid UTF-8 JSON; send a JSON object") from None
    if not isinstance(data, dict):
        raise BadRequest(f"the body must be a JSON object, not {type(data).__name__}")
    return data


def _validate_key(raw: str | None) -> str:
    if raw is None or not raw.strip():
        raise BadRequest("missing Idempotency-Key header; send one unique key per intended deployment")
    if len(raw) > MAX_KEY_LENGTH:
        raise BadRequest(f"Idempotency-Key is {len(raw)} characters; the limit is {MAX_KEY_LENGTH}")
    if any(ord(ch) < 32 or ord(ch) == 127 for ch in raw):
        raise BadRequest("Idempotency-Key contains control characters")
    return raw


class DeployTargetServer:
    """The deploy target served from a daemon thread: start(), .url, stop(); also a context manager."""

    def __init__(
        self, *, state_path: Path | str, host: str = "127.0.0.1", port: int = 0, fault: Fault | None = None
    ) -> None:
        self.host = host
        self.port = port
        self.store = DeploymentStore(Path(state_path), fault=fault)
        self._httpd: _HTTPServer | None = None
        self._thread: threading.Thread | None = None

    def start(self) -> DeployTargetServer:
        """Bind (port 0 picks a free port) and serve in the background; returns self."""
        if self._httpd is not None:
            raise RuntimeError(f"deploy target already running at {self.url}")
        self._httpd = _HTTPServer((self.host, self.port), self.store)
        self.port = self._httpd.server_address[1]
        self._thread = threading.Thread(
            target=self._httpd.serve_forever, kwargs={"poll_interval": 0.1}, name="deploy-target", daemon=True
        )
        self._thread.start()
        return self

    @property
    def url(self) -> str:
        if self._httpd is None:
            raise RuntimeError("deploy target is not running; call start() first")
        return f"http://{self.host}:{self.port}"

    def stop(self) -> None:
        """Stop accepting requests and close the socket; safe to call twice."""
        httpd, thread = self._httpd, self._thread
        self._httpd = self._thread = None
        if httpd is None:
            return
        httpd.shutdown()
        httpd.server_close()
        if thread is not None:
            thread.join()

    def __enter__(self) -> DeployTargetServer:
        return self.start()

    def __exit__(self, *exc_info: object) -> None:
        self.stop()


def serve(
    *, host: str, port: int, state_path: Path, fault: Fault | None, announce: Callable[[str], None]
) -> None:
    """Run in the foreground until SIGTERM or SIGINT; announce() gets the listening line."""
    server = DeployTargetServer(state_path=state_path, host=host, port=port, fault=fault)
    stop = threading.Event()

    def request_stop(signum: int, frame: FrameType | None) -> None:
        stop.set()

    previous = {sig: signal.signal(sig, request_stop) for sig in (signal.SIGTERM, signal.SIGINT)}
    try:
        server.start()
        announce(f"deploy-target listening on {server.url}")
        while not stop.wait(1.0):
            pass
    finally:
        server.stop()
        for sig, handler in previous.items():
            signal.signal(sig, handler)


def default_state_path() -> Path:
    # Mirrors settings.VAR_DIR without importing Django: this module stays stdlib-only.
    return Path(os.environ.get("AGENTOPS_VAR_DIR", "var")) / "deploy-target.json"


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m agentops.deploytarget.server", description=__doc__)
    parser.add_argument("--host", default="127.0.0.1", help="address to bind (default 127.0.0.1)")
    parser.add_argument("--port", type=int, default=8765, help="port to bind; 0 picks a free one (default 8765)")
    parser.add_argument("--state", type=Path, default=None,
                        help="JSON state file (default $AGENTOPS_VAR_DIR/deploy-target.json or var/deploy-target.json)")
    parser.add_argument("--fault", choices=FAULT_MODES, default="none", help="fault mode at start")
    parser.add_argument("--fault-count", type=int, default=None,
                        help="requests the fault applies to (default: until changed via POST /_faults)")
    parser.add_argument("--fault-seconds", type=float, default=None,
                        help=f"delay for --fault slow (default {DEFAULT_SLOW_SECONDS})")
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Command-line entry: parse, serve until SIGTERM, return the exit status."""
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        fault = Fault.build(args.fault, args.fault_count, args.fault_seconds)
    except ValueError as exc:
        parser.error(str(exc))
    try:
        serve(host=args.host, port=args.port, state_path=args.state or default_state_path(),
              fault=fault, announce=lambda line: print(line, flush=True))
    except (OSError, ValueError) as exc:
        print(f"deploy-target: cannot start: {exc}", file=sys.stderr, flush=True)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
