"""Ephemeral live events (docs/live.md, "The model call in flight"): a model call's partial text and
tool input, published to Redis for the event streams while the call runs, never stored.

The recorded result stays the durable truth: a delta changes nothing, and a lost one (Redis down,
a stream connected late) is harmless. Off unless AGENTOPS_LIVE_REDIS_URL is set; the providers
then make their calls without streaming, as before.
"""
from __future__ import annotations

import json
import logging
import threading
import time
from typing import Any

from django.conf import settings

logger = logging.getLogger("agentops.livewire")
_clients: dict[str, Any] = {}
_lock = threading.Lock()


def enabled() -> bool:
    return bool(settings.AGENTOPS_LIVE_REDIS_URL)


def channel(workflow_id: int) -> str:
    return f"agentops:live:{workflow_id}"


def client() -> Any:
    import redis

    url = settings.AGENTOPS_LIVE_REDIS_URL
    with _lock:
        if url not in _clients:
            _clients[url] = redis.Redis.from_url(url, socket_timeout=1.0, socket_connect_timeout=1.0)
        return _clients[url]


def publish(workflow_id: int, payload: dict[str, Any]) -> None:
    """Best effort: a delta that cannot be published is dropped (logged at DEBUG)."""
    try:
        client().publish(channel(workflow_id), json.dumps(payload, separators=(",", ":")))
    except Exception:  # noqa: BLE001 - an ephemeral event must never fail the call it describes
        logger.debug("livewire.publish_failed", extra={"workflow_id": workflow_id}, exc_info=True)


class DeltaBuffer:
    """A model call's deltas, gathered and published at most every AGENTOPS_MODEL_DELTA_SECONDS as
    one ``model.delta`` event: ``{"kind", "workflow_id", "operation_id", "call", "n", "text", "tool_input"}``
    (``n`` numbers a call's deltas from 0, so a client can tell that it missed one)."""

    def __init__(self, *, workflow_id: int, operation_id: str, call: int, model: str) -> None:
        self.base = {"kind": "model.delta", "workflow_id": workflow_id, "operation_id": operation_id, "call": call,
                     "model": model}
        self.workflow_id = workflow_id
        self.text: list[str] = []
        self.tool_input: list[str] = []
        self.n = 0
        self.last = time.monotonic()

    def __call__(self, delta: dict[str, str]) -> None:
        self.text.append(delta.get("text", ""))
        self.tool_input.append(delta.get("tool_input", ""))
        if time.monotonic() - self.last >= settings.AGENTOPS_MODEL_DELTA_SECONDS:
            self.flush()

    def flush(self) -> None:
        text, tool_input = "".join(self.text), "".join(self.tool_input)
        self.text, self.tool_input, self.last = [], [], time.monotonic()
        if text or tool_input:
            publish(self.workflow_id, {**self.base, "n": self.n, "text": text, "tool_input": tool_input})
            self.n += 1
