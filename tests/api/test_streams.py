"""Live event streams over real HTTP: a workflow's history in order, resumed
exactly after `Last-Event-ID`, kept alive, bounded in time; the all-workflows stream with filters."""
from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest
from django.contrib.auth.models import User
from django.db import connection, transaction

from tests.api.conftest import Http, grant, token_for
from tests.api.sse import Stream
from tests.conftest import one_event_kind
from workflows import clock, services
from workflows.api.streams import Poll, frames
from workflows.models import Event, Workflow
from workflows.services.common import event_record, workflow_lock
from workflows.testing import registered

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.usefixtures("rung")]

KIND = "test-streams"
WaitForGo = one_event_kind(KIND)


@pytest.fixture(autouse=True)
def kind(settings: Any) -> Iterator[None]:
    settings.AGENTOPS_STREAM_POLL_SECONDS = 0.05
    with registered(WaitForGo):
        yield


def launch(http: Http, token: str) -> int:
    answer = http.post("/workflows", {"kind": KIND, "goal": "Answer ticket 7"}, token=token)
    assert answer.status == 201, answer.body
    return int(answer.body["id"])


def record(workflow_id: int, count: int, kind: str = "test.tick") -> None:
    """Append events as every service does: under the workflow's row lock."""
    for n in range(count):
        with transaction.atomic():
            event_record(workflow=workflow_lock(workflow_id), kind=kind, at=clock.now(), n=n)


def url(http: Http, path: str) -> str:
    return http.base_url + path


def test_a_workflow_stream_sends_its_history_then_each_new_event_then_ends_when_it_finishes(
    http: Http, requester_token: str
) -> None:
    """`id:` is the seq; data is the event's JSON; the stream ends with `end` once the workflow finished."""
    workflow_id = launch(http, requester_token)
    before = Event.objects.filter(workflow_id=workflow_id).count()
    stream = Stream(url(http, f"/workflows/{workflow_id}/events/stream"), token=requester_token)
    assert stream.status == 200
    assert stream.headers["Content-Type"] == "text/event-stream"
    got = stream.events()
    history = [next(got) for _ in range(before)]
    assert [f.id for f in history] == [str(n) for n in range(1, before + 1)]
    assert history[0].json == {"workflow_id": workflow_id, "seq": 1, "kind": "workflow.launched",
                               "at": history[0].json["at"], "data": history[0].json["data"]}

    services.workflow_signal(workflow_id=workflow_id, name="go", payload={"answer": 42})
    services.workflow_advance_if_runnable(workflow_id=workflow_id)
    rest = list(got)
    stream.close()
    recorded = list(Event.objects.filter(workflow_id=workflow_id).order_by("seq"))
    assert [f.id for f in history + rest[:-1]] == [str(e.seq) for e in recorded]
    assert rest[-2].json["kind"] == recorded[-1].kind
    assert rest[-1].event == "end" and rest[-1].id is None
    assert rest[-1].json == {"reason": f"workflow {workflow_id} has finished", "reconnect": False}


def test_last_event_id_resumes_right_after_it(http: Http, requester_token: str) -> None:
    """The header wins over `after`; nothing before it comes again and nothing after it is missed."""
    workflow_id = launch(http, requester_token)
    record(workflow_id, 5)
    seq = Workflow.objects.get(pk=workflow_id).event_seq
    stream = Stream(url(http, f"/workflows/{workflow_id}/events/stream?after=1"), token=requester_token,
                    last_event_id=str(seq - 2))
    got = stream.events()
    assert [next(got).id, next(got).id] == [str(seq - 1), str(seq)]
    record(workflow_id, 1)
    assert next(got).json["seq"] == seq + 1
    stream.close()

    stream = Stream(url(http, f"/workflows/{workflow_id}/events/stream?after={seq}"), token=requester_token)
    assert next(stream.events()).json["seq"] == seq + 1
    stream.close()


def test_an_idle_stream_sends_keep_alive_comments_and_ends_after_its_time_limit(
    http: Http, requester_token: str, settings: Any
) -> None:
    settings.AGENTOPS_STREAM_KEEPALIVE_SECONDS = 0.3
    settings.AGENTOPS_STREAM_MAX_SECONDS = 1.5
    workflow_id = launch(http, requester_token)
    seq = Workflow.objects.get(pk=workflow_id).event_seq
    started = time.monotonic()
    frames_seen = list(Stream(url(http, f"/workflows/{workflow_id}/events/stream"), token=requester_token,
                              last_event_id=str(seq)))
    took = time.monotonic() - started
    keepalives = [f for f in frames_seen if "keep-alive" in f.comments]
    assert len(keepalives) >= 3
    gaps = [b.received_at - a.received_at for a, b in zip(frames_seen, frames_seen[1:], strict=False)]
    assert max(gaps) < 0.3 + 0.25
    assert frames_seen[-1].event == "end" and frames_seen[-1].json["reconnect"] is True
    assert 1.5 <= took < 4


def test_a_stream_holds_no_database_connection_between_polls(db: None) -> None:
    """The connection the poll used is closed (or back in the pool) before the stream waits."""
    idle_connections: list[object] = []

    def poll() -> Poll:
        Workflow.objects.exists()
        return Poll(["data: {}\n\n"], end="done" if len(idle_connections) == 2 else "")

    def sleep(_: float) -> None:
        idle_connections.append(connection.connection)

    list(frames(poll, sleep=sleep))
    assert idle_connections == [None, None]
    assert connection.connection is None


@pytest.mark.parametrize(("path", "headers", "status", "error"), [
    # The document states the shape of an id (digits), so these are refused by the schema, by name.
    ("/workflows/{id}/events/stream", {"Last-Event-ID": "7a"}, 400,
     "Bad input, nothing was changed: header.Last-Event-ID: String should match pattern '^[0-9]{0,19}$'"),
    ("/workflows/{id}/events/stream?after=-1", {}, 400,
     "Bad input, nothing was changed: after: String should match pattern"),
    ("/workflows/999999/events/stream", {}, 404, "Workflow 999999 does not exist"),
    ("/events/stream?status=sleeping", {}, 400, "Bad input, nothing was changed: status: String should match"),
])
def test_bad_stream_requests_get_the_error_shape(http: Http, requester_token: str, path: str,
                                                 headers: dict[str, str], status: int, error: str) -> None:
    workflow_id = launch(http, requester_token)
    answer = http.get(path.format(id=workflow_id), token=requester_token, headers=headers)
    assert answer.status == status
    assert list(answer.body) == ["error"] and answer.body["error"].startswith(error)


def test_a_stream_needs_a_token_and_the_view_permission(http: Http, requester_token: str) -> None:
    workflow_id = launch(http, requester_token)
    assert http.get(f"/workflows/{workflow_id}/events/stream").status == 401
    nobody = token_for(User.objects.create_user("nobody").username)
    answer = http.get(f"/workflows/{workflow_id}/events/stream", token=nobody)
    assert answer.status == 403
    assert answer.body == {"error": "nobody may not see workflows: that needs the permission "
                                    "'workflows.view_workflow'; ask an administrator to grant it to them or to "
                                    "their group."}


def test_the_all_workflows_stream_starts_now_filters_and_resumes(http: Http, requester_token: str) -> None:
    """Without a cursor it starts with the next event; `launcher` and `kind` filter; `id:` resumes."""
    mine = launch(http, requester_token)
    other_user = grant(User.objects.create_user("otto"), "add_workflow", "view_workflow")
    theirs = launch(http, token_for(other_user.username))
    stream = Stream(url(http, "/events/stream?launcher=rita&kind=" + KIND), token=requester_token)
    got = stream.events()
    record(theirs, 2)
    record(mine, 3)
    first = [next(got) for _ in range(3)]
    stream.close()
    assert [(f.json["workflow_id"], f.json["data"]["n"]) for f in first] == [(mine, 0), (mine, 1), (mine, 2)]
    assert [int(f.id) for f in first] == list(Event.objects.filter(workflow_id=mine, kind="test.tick")
                                              .order_by("pk").values_list("pk", flat=True))
    record(mine, 1, kind="test.later")
    stream = Stream(url(http, "/events/stream?launcher=rita"), token=requester_token, last_event_id=first[1].id)
    got = stream.events()
    assert [next(got).json["kind"], next(got).json["kind"]] == ["test.tick", "test.later"]
    stream.close()


def test_the_all_workflows_stream_waits_for_a_hole_in_the_numbers_to_fill(http: Http, requester_token: str,
                                                                         settings: Any) -> None:
    """An event inserted first but committed last still comes, in its place: the hole holds the stream."""
    settings.AGENTOPS_STREAM_GAP_SECONDS = 30
    workflow_id = launch(http, requester_token)
    other = launch(http, requester_token)
    stream = Stream(url(http, "/events/stream"), token=requester_token)
    got = stream.events()
    inserted, release = threading.Event(), threading.Event()

    def slow_transaction() -> None:
        with transaction.atomic():
            event_record(workflow=workflow_lock(other), kind="test.slow", at=clock.now())
            inserted.set()
            release.wait(10)
        connection.close()

    slow = threading.Thread(target=slow_transaction)
    slow.start()
    assert inserted.wait(10)
    record(workflow_id, 1, kind="test.fast")
    time.sleep(0.5)  # the stream sees the fast event's key, and the hole before it
    release.set()
    slow.join()
    kinds = [next(got).json["kind"], next(got).json["kind"]]
    stream.close()
    assert kinds == ["test.slow", "test.fast"]


def test_model_deltas_reach_the_stream_between_history_events_without_ids(
    http: Http, requester_token: str, settings: Any
) -> None:
    """Ephemeral events (workflows.livewire) come as `event: model.delta`, with no id: Last-Event-ID
    stays the last history event's, so a reconnect neither repeats nor misses history."""
    from workflows import livewire

    settings.AGENTOPS_LIVE_REDIS_URL = "redis://127.0.0.1:6379/4"
    settings.AGENTOPS_MODEL_DELTA_SECONDS = 0
    workflow_id = launch(http, requester_token)
    seq = Workflow.objects.get(pk=workflow_id).event_seq
    stream = Stream(url(http, f"/workflows/{workflow_id}/events/stream"), token=requester_token,
                    last_event_id=str(seq))
    got = stream.events()
    time.sleep(0.3)  # the stream has subscribed and waits
    deltas = livewire.DeltaBuffer(workflow_id=workflow_id, operation_id="op", call=0, model="m")
    deltas({"text": "Hel"})
    deltas({"text": "lo"})
    record(workflow_id, 1)
    frames_got = [next(got), next(got), next(got)]
    stream.close()
    # Two channels, no order between them: the history event may come before the deltas or after.
    live_frames = [f for f in frames_got if f.event == "model.delta"]
    assert [(f.id, f.json["text"], f.json["n"]) for f in live_frames] == [(None, "Hel", 0), (None, "lo", 1)]
    [history] = [f for f in frames_got if f.event == "message"]
    assert history.id == str(seq + 1)
