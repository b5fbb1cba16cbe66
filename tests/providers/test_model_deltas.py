"""The model call in flight, live: with AGENTOPS_LIVE_REDIS_URL set, calls go
through the SDK's streaming against the fake Messages API and their deltas are published as
ephemeral model.delta events; the answer, the ledger and the recorded result are the same."""
from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import redis

from agentops.providers.anthropic import AnthropicProvider
from tests.conftest import drive
from tests.fakes import anthropic_api as fake
from tests.fakes.anthropic_api import FakeAnthropicAPI
from tests.fakes.claude_agent import ClaudeForAutonomous, seed_workspace
from tests.providers.conftest import API_KEY, MODEL
from workflows import livewire, services
from workflows.errors import Throttled
from workflows.models import Event, UsageEntry

LIVE_REDIS = "redis://127.0.0.1:6379/4"


def ask(api: FakeAnthropicAPI, answer: fake.Answer, **kwargs: Any) -> Any:
    api.script(answer)
    provider = AnthropicProvider(api_key=API_KEY, model=MODEL, base_url=api.url, max_retries=0)
    return provider.complete(system="You are terse.", messages=[{"role": "user", "content": "Hello"}],
                             max_tokens=256, **kwargs)


def test_a_streamed_call_answers_as_a_plain_one_and_tells_each_delta(anthropic_api: FakeAnthropicAPI) -> None:
    answer = fake.tool_use("read_file", {"path": "docs/README.md"}, say="Let me read the overview first.")
    plain = ask(anthropic_api, answer)
    deltas: list[dict[str, str]] = []
    streamed = ask(anthropic_api, answer, on_delta=deltas.append)

    assert [r.body.get("stream") for r in anthropic_api.requests] == [None, True]
    assert (streamed.text, streamed.stop_reason, streamed.usage.output_tokens) == (
        plain.text, plain.stop_reason, plain.usage.output_tokens)
    assert [{k: v for k, v in c.items() if k != "id"} for c in streamed.tool_calls] == [
        {"name": "read_file", "input": {"path": "docs/README.md"}}]
    assert streamed.request_id == anthropic_api.requests[1].request_id
    assert len(deltas) > 3
    assert "".join(d.get("text", "") for d in deltas) == "Let me read the overview first."
    assert json.loads("".join(d.get("tool_input", "") for d in deltas)) == {"path": "docs/README.md"}


def test_a_streamed_call_refused_with_429_maps_as_before(anthropic_api: FakeAnthropicAPI) -> None:
    with pytest.raises(Throttled):
        ask(anthropic_api, fake.rate_limited(retry_after=30), on_delta=lambda d: None)


@pytest.fixture
def live(settings: Any) -> Iterator[list[dict[str, Any]]]:
    """Deltas as a stream's reader gets them: a subscriber to every workflow's live channel."""
    settings.AGENTOPS_LIVE_REDIS_URL = LIVE_REDIS
    settings.AGENTOPS_MODEL_DELTA_SECONDS = 0
    pubsub = redis.Redis.from_url(LIVE_REDIS).pubsub(ignore_subscribe_messages=True)
    pubsub.psubscribe("agentops:live:*")
    got: list[dict[str, Any]] = []
    stop = threading.Event()

    def read() -> None:
        while not stop.is_set():
            message = pubsub.get_message(timeout=0.1)
            if message and message["type"] == "pmessage":
                got.append(json.loads(message["data"]))

    reader = threading.Thread(target=read)
    reader.start()
    yield got
    stop.set()
    reader.join()
    pubsub.close()


@pytest.mark.django_db
def test_an_autonomous_run_on_claude_publishes_each_calls_deltas_and_records_the_same(
    claude: FakeAnthropicAPI, live: list[dict[str, Any]], settings: Any, tmp_path: Path
) -> None:
    settings.AGENTOPS_WORKSPACE_DIR = tmp_path / "workspaces"
    claude.responder = ClaudeForAutonomous()
    workflow = services.workflow_launch(kind="autonomous", goal="Prepare onboarding notes from the docs")
    seed_workspace(tmp_path / "workspaces" / f"wf-{workflow.pk}")
    workflow = drive(workflow.pk, max_rounds=80)
    assert workflow.status == "completed", workflow.reason
    assert all(r.body.get("stream") is True for r in claude.requests)

    calls = Event.objects.filter(workflow=workflow, kind="model.called").count()
    assert calls == len(claude.requests) == UsageEntry.objects.filter(workflow=workflow, status="charged").count()
    threading.Event().wait(0.5)  # the subscriber's last reads
    mine = [d for d in live if d["workflow_id"] == workflow.pk]
    assert {d["kind"] for d in mine} == {"model.delta"} and {d["model"] for d in mine} == {MODEL}
    per_call: dict[tuple[str, int], list[dict[str, Any]]] = {}
    for d in mine:
        per_call.setdefault((d["operation_id"], d["call"]), []).append(d)
    assert len(per_call) == len(claude.requests)
    for deltas in per_call.values():
        assert [d["n"] for d in deltas] == list(range(len(deltas)))
        tool_input = "".join(d["tool_input"] for d in deltas)
        assert not tool_input or isinstance(json.loads(tool_input), dict)


def test_deltas_are_off_by_default(settings: Any) -> None:
    assert settings.AGENTOPS_LIVE_REDIS_URL == "" and not livewire.enabled()
