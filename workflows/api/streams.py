"""Live event streams (Server-Sent Events): a workflow's history as it is recorded, resumable with
``Last-Event-ID`` because every event is read back from the database, never from memory.

One thread serves one stream (gunicorn's ``gthread`` worker, or runserver). Between polls the
thread holds no database connection, and a stream ends after AGENTOPS_STREAM_MAX_SECONDS so that
threads recycle; clients reconnect with the last id they saw (docs/live.md).
"""
from __future__ import annotations

import json
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

from django.conf import settings
from django.db import connection
from django.http import HttpRequest, StreamingHttpResponse
from ninja import Header, Query, Router

from workflows import livewire
from workflows.api.auth import VIEW_PERMISSIONS, require
from workflows.api.schemas import WORKFLOW_ID, ErrorOut
from workflows.errors import InvalidInput, NotFound, Refused
from workflows.features.webhooks.feed import (
    EventFilter,
    GlobalCursor,
    event_json,
    latest_event_pk,
    workflow_events_after,
    workflow_is_finished,
)
from workflows.models import Workflow

router = Router(tags=["streams"])
# What the OpenAPI document says a stream answers (ninja describes JSON bodies only).
SSE = {"responses": {200: {"description": "Server-Sent Events (docs/live.md)",
                           "content": {"text/event-stream": {"schema": {
                               "type": "object", "description": "each event's data: a history event "
                               "(seq, kind, at, data), a model.delta, or the end of the stream (reconnect)"}}}}}}

PAGE = 200
AFTER = Query("", pattern=r"^[0-9]{0,19}$", description="start after this id (as Last-Event-ID)")
KINDS = Query("", pattern=r"^[a-z0-9_,-]*$", max_length=600, description="only these kinds, comma-separated")
_STATUS = "|".join(Workflow.Status.values)
STATUSES = Query("", pattern=rf"^({_STATUS})?(,({_STATUS})?)*$", max_length=200,
                 description="only workflows in these statuses, comma-separated")
LAUNCHERS = Query("", pattern=r"^[\w.@+,-]*$", max_length=1500,
                  description="only workflows these users launched, comma-separated")
LAST_EVENT_ID = Header(
    default="", alias="Last-Event-ID", pattern=r"^[0-9]{0,19}$",
    description="the `id:` of the last event you received: the stream resumes right after it (an "
                "EventSource sends it by itself when it reconnects). Wins over `after`.",
)


@dataclass
class Poll:
    """One look at the database: the frames to send, whether a full page came back (look again at
    once), and, when the stream should end now, why."""

    frames: list[str]
    more: bool = False
    end: str = ""


def history_frame(event_id: int, payload: dict[str, Any]) -> str:
    return f"id: {event_id}\ndata: {json.dumps(payload, separators=(',', ':'))}\n\n"


def end_frame(reason: str, *, reconnect: bool) -> str:
    # No id: the client's Last-Event-ID stays the last history event's.
    return f"event: end\ndata: {json.dumps({'reason': reason, 'reconnect': reconnect})}\n\n"


def frames(poll: Callable[[], Poll], *, sleep: Callable[[float], None] = time.sleep,
           live: LiveFrames | None = None) -> Iterator[str]:
    """The stream: poll, send, keep alive, and stop after AGENTOPS_STREAM_MAX_SECONDS; between two
    polls, ``live`` (when given) waits instead of ``sleep`` and sends the ephemeral events it gets."""
    started = last_sent = time.monotonic()
    poll_seconds = float(settings.AGENTOPS_STREAM_POLL_SECONDS)
    keepalive = float(settings.AGENTOPS_STREAM_KEEPALIVE_SECONDS)
    # The first bytes send the headers, so a client knows at once that it is connected.
    yield f"retry: {int(settings.AGENTOPS_STREAM_RETRY_MILLISECONDS)}\n: connected\n\n"
    try:
        while True:
            try:
                result = poll()
            finally:
                # Idle streams hold no connection: it goes back to the pool, or is closed.
                connection.close()
            yield from result.frames
            now = time.monotonic()
            if result.frames:
                last_sent = now
            if result.end:
                yield end_frame(result.end, reconnect=False)
                return
            if now - started >= settings.AGENTOPS_STREAM_MAX_SECONDS:
                yield end_frame("time limit: reconnect with Last-Event-ID", reconnect=True)
                return
            if result.more:
                continue
            if now - last_sent >= keepalive:
                yield ": keep-alive\n\n"
                last_sent = now
            pause = max(0.0, min(poll_seconds, keepalive - (now - last_sent)))
            if live is None:
                sleep(pause)
                continue
            ephemeral = live.wait(pause)
            if ephemeral:
                yield from ephemeral
                last_sent = time.monotonic()
    finally:
        connection.close()
        if live is not None:
            live.close()


class LiveFrames:
    """A workflow's ephemeral events (workflows.livewire: ``model.delta``), read from Redis between polls
    and sent as ``event: model.delta`` frames without an id: they never move ``Last-Event-ID``."""

    def __init__(self, workflow_id: int) -> None:
        self.pubsub = livewire.client().pubsub(ignore_subscribe_messages=True)
        self.pubsub.subscribe(livewire.channel(workflow_id))

    def wait(self, seconds: float) -> list[str]:
        deadline = time.monotonic() + seconds
        got: list[str] = []
        try:
            while (left := deadline - time.monotonic()) > 0:
                message = self.pubsub.get_message(timeout=left)
                if message is not None and message.get("type") == "message":
                    data = json.loads(message["data"])
                    got.append(f"event: {data.get('kind', 'model.delta')}\ndata: {json.dumps(data)}\n\n")
        except Exception:  # noqa: BLE001 - Redis gone: the history still streams, the deltas are lost
            time.sleep(max(0.0, deadline - time.monotonic()))
        return got

    def close(self) -> None:
        try:
            self.pubsub.close()
        except Exception:  # noqa: BLE001, S110 - closing a broken connection
            pass


def stream_response(poll: Callable[[], Poll], *, live: LiveFrames | None = None) -> StreamingHttpResponse:
    response = StreamingHttpResponse(frames(poll, live=live), content_type="text/event-stream")
    response["Cache-Control"] = "no-cache"
    response["X-Accel-Buffering"] = "no"  # a proxy in front (nginx) must not hold the frames back
    return response


def cursor_from(last_event_id: str, after: str, *, default: Callable[[], int]) -> int:
    """Where a stream starts: after ``Last-Event-ID``, else after ``after``, else ``default()``."""
    for name, raw in (("Last-Event-ID", last_event_id.strip()), ("after", after.strip())):
        if raw:
            if not raw.isdigit() or len(raw) > 18:
                raise InvalidInput(f"{name} must be the id of an event (a whole number), not {raw[:30]!r}; "
                                   "send the last `id:` you received, or none to start from the beginning.")
            return int(raw)
    return default()


def listed(raw: str, name: str, allowed: tuple[str, ...] = ()) -> tuple[str, ...]:
    values = tuple(v.strip() for v in raw.split(",") if v.strip())
    wrong = [v for v in values if allowed and v not in allowed]
    if wrong:
        raise InvalidInput(f"{name} {wrong[0][:30]!r} is not one of {', '.join(allowed)}.")
    return values


@router.get("/workflows/{workflow_id}/events/stream", summary="Stream a workflow's events",
            response={200: None, 400: ErrorOut, 401: ErrorOut, 403: ErrorOut, 404: ErrorOut, 409: ErrorOut},
            openapi_extra=SSE)
def workflow_events_stream(request: HttpRequest, workflow_id: int = WORKFLOW_ID, after: str = AFTER,
                           last_event_id: str = LAST_EVENT_ID) -> StreamingHttpResponse:
    """`text/event-stream` of the workflow's history: each event as `id: <seq>` and `data: <JSON>`
    (workflow_id, seq, kind, at, data), from the first (or after `Last-Event-ID` / `after`), then
    each new one as it is recorded. `: keep-alive` comments at least every 15 s. Ends with
    `event: end` once the workflow has finished and every event was sent (`reconnect: false`),
    or after AGENTOPS_STREAM_MAX_SECONDS (`reconnect: true`). Needs `workflows.view_workflow`."""
    require(request.auth, VIEW_PERMISSIONS, to="see workflows")  # type: ignore[attr-defined]
    workflow = Workflow.objects.filter(pk=workflow_id).first()
    if workflow is None:
        raise NotFound(f"Workflow {workflow_id} does not exist; GET /api/workflows lists the existing ones.",
                       workflow_id=workflow_id)
    seq = cursor_from(last_event_id, after, default=lambda: 0)
    if workflow.history_archived and seq < workflow.event_seq:
        raise Refused(f"Workflow {workflow_id}'s history was moved to {workflow.history_archive_path} by retention; "
                      f"`manage.py agent export-history {workflow_id}` prints it.")
    return workflow_stream(workflow_id, seq)


def workflow_stream(workflow_id: int, seq: int) -> StreamingHttpResponse:
    """The stream of one workflow's events after ``seq`` (the API's, and the admin page's)."""
    connection.close()  # the stream's first poll opens one again

    def poll() -> Poll:
        nonlocal seq
        finished = workflow_is_finished(workflow_id)  # read first: a finished workflow's last events are in
        events = workflow_events_after(workflow_id, seq, limit=PAGE)
        if events:
            seq = events[-1].seq
        more = len(events) == PAGE
        return Poll([history_frame(e.seq, event_json(e, workflow_id=workflow_id)) for e in events], more=more,
                    end=f"workflow {workflow_id} has finished" if finished and not more else "")

    return stream_response(poll, live=LiveFrames(workflow_id) if livewire.enabled() else None)


@router.get("/events/stream", summary="Stream every workflow's events",
            response={200: None, 400: ErrorOut, 401: ErrorOut, 403: ErrorOut, 409: ErrorOut}, openapi_extra=SSE)
def events_stream(request: HttpRequest, kind: str = KINDS, status: str = STATUSES, launcher: str = LAUNCHERS,
                  after: str = AFTER, last_event_id: str = LAST_EVENT_ID) -> StreamingHttpResponse:
    """`text/event-stream` of the events of all workflows, for dashboards: `id:` is the event's global
    number (not its seq), `data:` as the workflow stream's. Filters (comma-separated lists): `kind`
    (workflow kind), `status` (the workflow's status when the event is read), `launcher` (username).
    Without `Last-Event-ID` or `after` it starts with the next event recorded; `after=0` replays all.
    Never ends by itself before AGENTOPS_STREAM_MAX_SECONDS. Needs `workflows.view_workflow`."""
    require(request.auth, VIEW_PERMISSIONS, to="see workflows")  # type: ignore[attr-defined]
    event_filter = EventFilter(kinds=listed(kind, "kind"), launchers=listed(launcher, "launcher"),
                               statuses=listed(status, "status", tuple(Workflow.Status.values)))
    cursor = GlobalCursor(after=cursor_from(last_event_id, after, default=latest_event_pk))
    connection.close()

    def poll() -> Poll:
        before = cursor.after
        events = cursor.read(event_filter, limit=PAGE)
        return Poll([history_frame(e.pk, event_json(e)) for e in events], more=cursor.after - before >= PAGE)

    return stream_response(poll)
