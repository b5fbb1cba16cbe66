"""A receiver of outbound webhooks written from docs/live.md ("Outbound webhooks") alone: it verifies
each signature, answers 2xx, skips a delivery id it has handled, and can be taken down and brought
back on the same port."""
from __future__ import annotations

import hashlib
import hmac
import json
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any


def verified(secret: str, path: str, headers: Any, body: bytes, tolerance: int = 300) -> bool:
    ts, delivery = headers["X-Agentops-Timestamp"], headers["X-Agentops-Delivery"]
    message = b"\n".join([b"v2", ts.encode(), delivery.encode(), b"POST", path.encode(), body])
    expected = "v2=" + hmac.new(secret.encode(), message, hashlib.sha256).hexdigest()
    return (hmac.compare_digest(expected, headers.get("X-Agentops-Signature", ""))
            and abs(time.time() - int(ts)) <= tolerance)


class Receiver:
    def __init__(self, secret: str, path: str = "/hooks/agentops") -> None:
        self.secret, self.path = secret, path
        self.handled: dict[str, dict[str, Any]] = {}  # delivery id -> body, in the order first received
        # Every signed request answered 2xx, in the order it came: (workflow, seq, X-Agentops-Redelivery).
        self.arrivals: list[tuple[int, int, str]] = []
        self.requests = 0
        self.repeats = 0
        self.bad_signatures = 0
        self.answer_status = 200
        self.lock = threading.Lock()
        self.server: ThreadingHTTPServer | None = None
        self.port = 0

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}{self.path}"

    def start(self) -> Receiver:
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:  # noqa: N802 - the http.server API
                body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
                with receiver.lock:
                    receiver.requests += 1
                    if self.path != receiver.path or not verified(receiver.secret, self.path, self.headers, body):
                        receiver.bad_signatures += 1
                        status = 401
                    elif receiver.answer_status != 200:
                        status = receiver.answer_status
                    else:
                        delivery, event = self.headers["X-Agentops-Delivery"], json.loads(body)["event"]
                        receiver.arrivals.append((event["workflow_id"], event["seq"],
                                                  self.headers.get("X-Agentops-Redelivery", "")))
                        if delivery in receiver.handled:
                            receiver.repeats += 1
                        else:
                            receiver.handled[delivery] = json.loads(body)
                        status = 200
                self.send_response(status)
                self.send_header("Content-Length", "0")
                self.end_headers()

            def log_message(self, *args: Any) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", self.port), Handler)
        self.server.daemon_threads = True
        self.port = self.server.server_address[1]
        threading.Thread(target=self.server.serve_forever, daemon=True).start()
        return self

    def stop(self) -> None:
        if self.server is not None:
            self.server.shutdown()
            self.server.server_close()
            self.server = None

    def events(self) -> list[dict[str, Any]]:
        with self.lock:
            return [body["event"] for body in self.handled.values()]
