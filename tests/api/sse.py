"""A Server-Sent Events reader for the tests, on http.client alone: frames as they arrive."""
from __future__ import annotations

import http.client
import json
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import urlsplit


@dataclass
class Frame:
    id: str | None = None
    event: str = "message"
    data: str = ""
    comments: list[str] = field(default_factory=list)
    received_at: float = 0.0

    @property
    def json(self) -> Any:
        return json.loads(self.data)


class Stream:
    """One connection to a stream URL; iterate for frames (comments come as frames without data)."""

    def __init__(self, url: str, *, token: str, last_event_id: str | None = None, timeout: float = 30.0) -> None:
        parts = urlsplit(url)
        self.conn = http.client.HTTPConnection(parts.hostname or "127.0.0.1", parts.port, timeout=timeout)
        headers = {"Authorization": f"Bearer {token}", "Accept": "text/event-stream"}
        if last_event_id is not None:
            headers["Last-Event-ID"] = last_event_id
        self.conn.request("GET", parts.path + (f"?{parts.query}" if parts.query else ""), headers=headers)
        self.response = self.conn.getresponse()
        self.status = self.response.status
        self.headers = self.response.headers

    def body(self) -> Any:
        return json.loads(self.response.read())

    def __iter__(self) -> Iterator[Frame]:
        frame = Frame()
        while True:
            line = self.response.readline()
            if not line:
                return
            text = line.decode().rstrip("\r\n")
            if text == "":
                frame.received_at = time.monotonic()
                yield frame
                frame = Frame()
                continue
            name, _, value = text.partition(":")
            value = value[1:] if value.startswith(" ") else value
            if name == "":
                frame.comments.append(value)
            elif name == "id":
                frame.id = value
            elif name == "event":
                frame.event = value
            elif name == "data":
                frame.data = f"{frame.data}\n{value}" if frame.data else value

    def events(self) -> Iterator[Frame]:
        """History events and `end`, without the comment-only frames."""
        return (f for f in self if f.data)

    def close(self) -> None:
        self.conn.close()
