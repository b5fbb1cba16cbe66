"""The anthropic provider through the real SDK against the fake Messages API server on loopback.

Every request goes over HTTP to ``tests/fakes/anthropic_api.py``, which answers as the API
does (shapes, headers, errors, prompt-cache accounting); nothing reaches the network.
"""
from __future__ import annotations

import json
import os
import pickle
import socket
import subprocess
import sys
import warnings
from collections.abc import Iterator
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
from django.core.exceptions import ImproperlyConfigured

from agentops.providers.anthropic import AnthropicProvider
from agentops.providers.scripted import ScriptedProvider
from tests.fakes import anthropic_api as fake
from tests.fakes.anthropic_api import Answer, FakeAnthropicAPI
from tests.providers.conftest import API_KEY, MODEL, RecordedSleeps
from workflows import releases
from workflows.errors import Permanent, Retryable

REPO_ROOT = Path(__file__).resolve().parents[2]

WORKSPACE_TOOLS = [
    {"name": "read_file", "description": "Read a file of the workspace.",
     "input_schema": {"type": "object", "properties": {"path": {"type": "string"}}, "required": ["path"]}},
    {"name": "list_files", "description": "List the workspace's files.",
     "input_schema": {"type": "object", "properties": {}}},
]


def make_provider(api: FakeAnthropicAPI, *answers: Answer, max_retries: int = 1, **kwargs: Any) -> AnthropicProvider:
    api.script(*answers)
    return AnthropicProvider(api_key=API_KEY, model=MODEL, base_url=api.url, max_retries=max_retries, **kwargs)


def ask(provider: AnthropicProvider, **kwargs: Any) -> Any:
    return provider.complete(**{"system": "You are terse.", "messages": [{"role": "user", "content": "Hello"}],
                                "max_tokens": 256, **kwargs})


@pytest.fixture(autouse=True)
def deprecated_models_are_errors() -> Iterator[None]:
    with warnings.catch_warnings():
        warnings.filterwarnings("error", message="The model .* is deprecated", category=DeprecationWarning)
        yield


# --- answers ----------------------------------------------------------------------------------

def test_text_answer_joins_text_blocks_and_carries_the_servers_usage_and_request_id(
    anthropic_api: FakeAnthropicAPI,
) -> None:
    answer = Answer(content=[{"type": "text", "text": "Release notes are ready"}, {"type": "text", "text": "."}])
    response = ask(make_provider(anthropic_api, answer))

    served = anthropic_api.requests[0]
    assert response.text == "Release notes are ready."
    assert response.stop_reason == "end_turn"
    assert response.tool_calls == []
    assert response.request_id == served.request_id and served.request_id.startswith("req_")
    assert served.usage is not None
    assert (response.usage.input_tokens, response.usage.output_tokens) == (served.usage["input_tokens"],
                                                                           served.usage["output_tokens"])
    assert (response.usage.cache_read_input_tokens, response.usage.cache_creation_input_tokens) == (0, 0), \
        "a prompt under the minimum cacheable length is neither written nor read"
    assert fake.api_key_of(served.headers) == API_KEY and "anthropic-version" in served.headers


def test_the_sdk_makes_no_spans_of_its_own_beside_agentops_chat_span(
    anthropic_api: FakeAnthropicAPI, monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A model call's span is agentops's ``chat <model>`` (tests/workflows/test_traces.py); the SDK's
    own, on the global tracer provider, would be a second one for the same call."""
    from opentelemetry import trace
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import SimpleSpanProcessor
    from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

    exporter = InMemorySpanExporter()
    global_provider = TracerProvider()
    global_provider.add_span_processor(SimpleSpanProcessor(exporter))
    monkeypatch.setattr(trace, "get_tracer_provider", lambda: global_provider)

    response = ask(make_provider(anthropic_api, Answer(content=[{"type": "text", "text": "ok"}])))

    assert response.text == "ok" and len(anthropic_api.requests) == 1
    assert exporter.get_finished_spans() == ()


def test_a_long_prompt_is_written_once_then_read_from_cache(anthropic_api: FakeAnthropicAPI) -> None:
    """Over the minimum cacheable length (1024 tokens for Sonnet), the first call writes the
    prefix and the same prompt again reads it back: the provider counts both, as reported."""
    provider = make_provider(anthropic_api, fake.text("first"), fake.text("second"))
    document = "A paragraph of the design document. " * 150  # ~1350 tokens
    first = ask(provider, messages=[{"role": "user", "content": document}])
    second = ask(provider, messages=[{"role": "user", "content": document}])

    assert first.usage.cache_creation_input_tokens > 1024 and first.usage.cache_read_input_tokens == 0
    assert second.usage.cache_read_input_tokens == first.usage.cache_creation_input_tokens
    assert second.usage.cache_creation_input_tokens == 0
    assert second.usage.input_tokens == first.usage.input_tokens, "what follows the last breakpoint is uncached"


def test_absent_cache_fields_count_as_zero(anthropic_api: FakeAnthropicAPI) -> None:
    bare = fake.raw({"id": "msg_01", "type": "message", "role": "assistant", "model": MODEL, "stop_reason": "end_turn",
                     "stop_sequence": None, "content": [{"type": "text", "text": "ok"}],
                     "usage": {"input_tokens": 12, "output_tokens": 3}})
    usage = ask(make_provider(anthropic_api, bare)).usage
    assert (usage.input_tokens, usage.cache_read_input_tokens, usage.cache_creation_input_tokens) == (12, 0, 0)


def test_the_request_marks_tools_system_and_the_last_message_for_caching(anthropic_api: FakeAnthropicAPI) -> None:
    tools = json.loads(json.dumps(WORKSPACE_TOOLS))
    messages = [{"role": "user", "content": "Summarise the changelog."},
                {"role": "assistant", "content": [{"type": "text", "text": "Reading it."}]},
                {"role": "user", "content": [{"type": "text", "text": "Go on."}]}]
    sent = json.loads(json.dumps(messages))
    ask(make_provider(anthropic_api, fake.text("ok")), system="<task>plan</task> You plan.", tools=tools,
        max_tokens=900, messages=messages)

    body = anthropic_api.bodies()[0]
    assert body["model"] == MODEL
    assert body["max_tokens"] == 900
    assert body["system"] == [{"type": "text", "text": "<task>plan</task> You plan.",
                               "cache_control": {"type": "ephemeral"}}]
    assert "cache_control" not in body["tools"][0]
    assert body["tools"][-1] == {**WORKSPACE_TOOLS[-1], "cache_control": {"type": "ephemeral"}}
    assert body["messages"][:2] == messages[:2], "only the last message carries the moving breakpoint"
    assert body["messages"][2]["content"] == [{"type": "text", "text": "Go on.",
                                               "cache_control": {"type": "ephemeral"}}]
    assert "temperature" not in body and "tool_choice" not in body
    assert (tools, messages) == (WORKSPACE_TOOLS, sent), "the caller's tools and messages are not modified"


def test_a_string_message_is_sent_as_one_marked_text_block(anthropic_api: FakeAnthropicAPI) -> None:
    ask(make_provider(anthropic_api, fake.text("ok")))
    assert anthropic_api.bodies()[0]["messages"] == [
        {"role": "user", "content": [{"type": "text", "text": "Hello", "cache_control": {"type": "ephemeral"}}]}]


def test_tool_use_then_tool_result_round_trip(anthropic_api: FakeAnthropicAPI) -> None:
    first = fake.tool_use("read_file", {"path": "CHANGELOG.md"}, say="I'll look at the changelog first.")
    provider = make_provider(anthropic_api, first, fake.text("The changelog lists 3 fixes."))
    messages: list[dict[str, Any]] = [{"role": "user", "content": "Summarise the changelog."}]

    response = provider.complete(system="You read files.", messages=messages, max_tokens=512, tools=WORKSPACE_TOOLS)
    tool_id = first.content[1]["id"]
    assert response.stop_reason == "tool_use"
    assert response.text == "I'll look at the changelog first."
    assert response.tool_calls == [{"id": tool_id, "name": "read_file", "input": {"path": "CHANGELOG.md"}}]

    # The conversation is plain JSON: it can be stored durably between the two calls.
    messages = json.loads(json.dumps([
        *messages,
        response.assistant_turn(),
        {"role": "user", "content": [{"type": "tool_result", "tool_use_id": call["id"], "content": "- fix 1\n- fix 2"}
                                     for call in response.tool_calls]},
    ]))
    final = provider.complete(system="You read files.", messages=messages, max_tokens=512, tools=WORKSPACE_TOOLS)

    assert final.text == "The changelog lists 3 fixes."
    sent = anthropic_api.bodies()[1]["messages"]
    assert sent[1] == {"role": "assistant", "content": [
        {"type": "text", "text": "I'll look at the changelog first."},
        {"type": "tool_use", "id": tool_id, "name": "read_file", "input": {"path": "CHANGELOG.md"}}]}
    assert sent[2]["content"][0]["type"] == "tool_result"
    assert sent[2]["content"][0]["tool_use_id"] == tool_id
    assert sent[2]["content"][0]["cache_control"] == {"type": "ephemeral"}


def test_a_forced_tool_call_sends_tool_choice(anthropic_api: FakeAnthropicAPI) -> None:
    tools = [{"name": "submit_plan", "description": "Submit the plan.", "input_schema": {"type": "object"}}]
    response = ask(make_provider(anthropic_api, fake.tool_use("submit_plan", {"tasks": []})), tools=tools,
                   tool_choice={"type": "tool", "name": "submit_plan"})
    assert anthropic_api.bodies()[0]["tool_choice"] == {"type": "tool", "name": "submit_plan"}
    assert response.tool_calls[0]["input"] == {"tasks": []}


def test_thinking_blocks_are_kept_for_the_round_trip(anthropic_api: FakeAnthropicAPI) -> None:
    answer = Answer(content=[
        {"type": "thinking", "thinking": "The user wants a file.", "signature": "EqQBCgIYAhIM1gbcDa9GJwZA"},
        {"type": "tool_use", "id": "toolu_02", "name": "list_files", "input": {}}], stop_reason="tool_use")
    response = ask(make_provider(anthropic_api, answer), tools=WORKSPACE_TOOLS)
    assert response.content[0] == {"type": "thinking", "thinking": "The user wants a file.",
                                   "signature": "EqQBCgIYAhIM1gbcDa9GJwZA"}
    assert response.assistant_turn()["content"] == response.content


def test_a_server_tool_block_is_kept_without_its_null_fields(anthropic_api: FakeAnthropicAPI) -> None:
    """A block agentops does not read is sent back as it came, less its null fields (as the SDK's
    ``model_dump(exclude_none=True)`` gave it when answers were parsed into its types)."""
    answer = Answer(content=[
        {"type": "server_tool_use", "id": "srvtoolu_01", "name": "web_search", "input": {"query": "release notes"},
         "caller": None, "extra": {"kept": 1, "dropped": None}},
        {"type": "text", "text": "Found them."}], stop_reason="end_turn")
    response = ask(make_provider(anthropic_api, answer))
    assert response.content[0] == {"type": "server_tool_use", "id": "srvtoolu_01", "name": "web_search",
                                   "input": {"query": "release notes"}, "extra": {"kept": 1}}
    assert response.text == "Found them."


# --- retryable failures -----------------------------------------------------------------------

@pytest.mark.parametrize("max_retries", [0, 1, 2])
def test_429_with_retry_after_is_retryable_after_the_sdk_retries(
    max_retries: int, sdk_sleeps: RecordedSleeps, anthropic_api: FakeAnthropicAPI,
) -> None:
    provider = make_provider(anthropic_api, *[fake.rate_limited(retry_after=7)] * (max_retries + 1),
                             max_retries=max_retries)
    with pytest.raises(Retryable) as caught:
        ask(provider)

    assert caught.value.retry_after_seconds == 7
    assert caught.value.status_code == 429
    assert caught.value.request_id == anthropic_api.requests[-1].request_id
    assert len(anthropic_api.requests) == max_retries + 1
    assert sdk_sleeps == [7.0] * max_retries, "the SDK honoured the server's retry-after between its retries"
    assert "wait 7 s" in str(caught.value)


def test_a_long_retry_after_becomes_a_stored_window_without_sleeping(
    sdk_sleeps: RecordedSleeps, anthropic_api: FakeAnthropicAPI,
) -> None:
    with pytest.raises(Retryable) as caught:
        ask(make_provider(anthropic_api, fake.rate_limited(retry_after=3600), max_retries=2))
    assert caught.value.retry_after_seconds == 3600
    assert len(anthropic_api.requests) == 1
    assert sdk_sleeps == []


def test_retry_after_ms_is_preferred_and_a_missing_header_gives_none(anthropic_api: FakeAnthropicAPI) -> None:
    precise = fake.rate_limited(retry_after=3)
    precise.headers["retry-after-ms"] = "2500"
    with pytest.raises(Retryable) as caught:
        ask(make_provider(anthropic_api, precise, max_retries=0))
    assert caught.value.retry_after_seconds == 2.5

    with pytest.raises(Retryable) as caught:
        ask(make_provider(anthropic_api, fake.rate_limited(retry_after=None), max_retries=0))
    assert caught.value.retry_after_seconds is None


def test_529_overloaded_is_retryable(anthropic_api: FakeAnthropicAPI) -> None:
    with pytest.raises(Retryable) as caught:
        ask(make_provider(anthropic_api, fake.overloaded(), fake.overloaded(), max_retries=1))
    assert caught.value.status_code == 529
    assert caught.value.retry_after_seconds is None
    assert "overloaded_error" in str(caught.value)
    assert len(anthropic_api.requests) == 2


@pytest.mark.parametrize(("status", "kind"), [(500, "api_error"), (503, "api_error"), (504, "timeout_error")])
def test_server_errors_are_retryable(status: int, kind: str, anthropic_api: FakeAnthropicAPI) -> None:
    error = fake.api_error(status, kind, "Internal server error", **{"retry-after": "2"})
    with pytest.raises(Retryable) as caught:
        ask(make_provider(anthropic_api, error, max_retries=0))
    assert (caught.value.status_code, caught.value.retry_after_seconds) == (status, 2)


def test_a_server_error_then_success_is_absorbed_by_the_sdk_retry(anthropic_api: FakeAnthropicAPI) -> None:
    assert ask(make_provider(anthropic_api, fake.overloaded(), fake.text("hi"), max_retries=1)).text == "hi"
    assert len(anthropic_api.requests) == 2


def test_a_dropped_connection_is_retried_by_the_sdk_then_retryable(anthropic_api: FakeAnthropicAPI) -> None:
    with pytest.raises(Retryable) as caught:
        ask(make_provider(anthropic_api, fake.dropped(), fake.dropped(), max_retries=1))
    assert "could not be reached" in str(caught.value)
    assert caught.value.retry_after_seconds is None
    assert [r.status for r in anthropic_api.requests] == [-1, -1]

    assert ask(make_provider(anthropic_api, fake.dropped(), fake.text("back"), max_retries=1)).text == "back"


def test_a_refused_connection_is_retryable() -> None:
    with socket.socket() as sock:  # a port nobody listens on
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    provider = AnthropicProvider(api_key=API_KEY, model=MODEL, base_url=f"http://127.0.0.1:{port}", max_retries=0)
    with pytest.raises(Retryable) as caught:
        ask(provider)
    assert "could not be reached (ConnectError)" in str(caught.value)


def test_a_slow_answer_times_out_as_retryable(anthropic_api: FakeAnthropicAPI) -> None:
    provider = make_provider(anthropic_api, fake.slow(5, fake.text("too late")), max_retries=0, timeout_seconds=0.3)
    with pytest.raises(Retryable) as caught:
        ask(provider)
    assert "within 0.3 s (AGENTOPS_ANTHROPIC_TIMEOUT_SECONDS)" in str(caught.value)


def test_retryable_errors_survive_pickling_with_their_retry_window(anthropic_api: FakeAnthropicAPI) -> None:
    with pytest.raises(Retryable) as caught:
        ask(make_provider(anthropic_api, fake.rate_limited(retry_after=7), max_retries=0))
    copy = pickle.loads(pickle.dumps(caught.value))
    assert (type(copy), copy.retry_after_seconds, str(copy)) == (type(caught.value), 7, str(caught.value))


# --- permanent failures -----------------------------------------------------------------------

def test_401_is_permanent_and_names_the_key_variable_not_its_value(anthropic_api: FakeAnthropicAPI) -> None:
    with pytest.raises(Permanent) as caught:
        ask(make_provider(anthropic_api, fake.api_error(401, "authentication_error", "invalid x-api-key"),
                          max_retries=2))
    assert "ANTHROPIC_API_KEY" in str(caught.value)
    assert API_KEY not in str(caught.value) and API_KEY not in repr(caught.value.__dict__)
    assert len(anthropic_api.requests) == 1, "the SDK does not retry a 401"


@pytest.mark.parametrize(("status", "kind", "hint"), [
    (400, "invalid_request_error", "fix the request"),
    (403, "permission_error", "workspace may use claude-sonnet-5-5"),
    (404, "not_found_error", "AGENTOPS_MODEL"),
    (413, "request_too_large", "trim the context"),
])
def test_client_errors_are_permanent_with_what_to_do(status: int, kind: str, hint: str,
                                                     anthropic_api: FakeAnthropicAPI) -> None:
    error = fake.api_error(status, kind, "messages: text content blocks must be non-empty")
    with pytest.raises(Permanent) as caught:
        ask(make_provider(anthropic_api, error))
    assert hint in str(caught.value)
    assert caught.value.status_code == status


def test_more_than_four_breakpoints_are_refused_by_the_api(anthropic_api: FakeAnthropicAPI) -> None:
    """The fake refuses what the API refuses: the provider must stay within 4 breakpoints."""
    marked = [{"type": "text", "text": f"part {n}", "cache_control": {"type": "ephemeral"}} for n in range(3)]
    with pytest.raises(Permanent, match="A maximum of 4 blocks with cache_control"):
        ask(make_provider(anthropic_api), tools=WORKSPACE_TOOLS,
            messages=[{"role": "user", "content": [*marked, {"type": "text", "text": "the question"}]}])


def test_a_spend_limit_429_is_permanent(anthropic_api: FakeAnthropicAPI) -> None:
    error = fake.api_error(429, "rate_limit_error", "Monthly usage limit reached.",
                           error_code="enforced_spend_limit_reached")
    with pytest.raises(Permanent) as caught:
        ask(make_provider(anthropic_api, error, max_retries=0))
    assert "spend limit" in str(caught.value)


def _message(**fields: Any) -> dict[str, Any]:
    return {"id": "msg_01", "type": "message", "role": "assistant", "model": MODEL, "stop_sequence": None,
            "content": [{"type": "text", "text": "hi"}], "stop_reason": "end_turn",
            "usage": {"input_tokens": 25, "output_tokens": 12}, **fields}


@pytest.mark.parametrize(("answer", "what"), [
    (fake.raw(b'{"id": "msg_01", "type": "mess'), "not JSON"),
    (fake.raw(b"<html><body>502 Bad Gateway</body></html>", content_type="text/html"), "not JSON"),
    (fake.raw({"id": "msg_01", "type": "message"}), "no content list"),
    (fake.raw(_message(stop_reason=None)), "no stop_reason"),
    (fake.raw(_message(usage=None)), "no usage"),
    (fake.raw(_message(content=[{"type": "tool_use", "id": "toolu_1", "name": "read_file"}],
                       stop_reason="tool_use")), "tool_use block without"),
    (fake.raw(_message(content=[{"type": "text"}])), "text block without text"),
])
def test_malformed_responses_are_retried_not_fatal(answer: Answer, what: str, anthropic_api: FakeAnthropicAPI) -> None:
    """A 200 whose body is truncated or not a message is not used; the activity's retry policy
    tries again (it is Retryable, not Permanent: one glitch does not fail the workflow)."""
    with pytest.raises(Retryable) as caught:
        ask(make_provider(anthropic_api, answer))
    assert what in str(caught.value) and not isinstance(caught.value, Permanent)


def test_a_refusal_is_permanent(anthropic_api: FakeAnthropicAPI) -> None:
    refusal = fake.refusal("cyber", "The request could enable malware development.")
    with pytest.raises(Permanent) as caught:
        ask(make_provider(anthropic_api, refusal))
    assert "declined the request (refusal, category cyber)" in str(caught.value)
    assert caught.value.stop_reason == "refusal"
    assert caught.value.usage["input_tokens"] == anthropic_api.requests[0].usage["input_tokens"]


# --- configuration ----------------------------------------------------------------------------

def test_get_provider_picks_scripted_or_anthropic(settings: Any) -> None:
    settings.AGENTOPS_MODEL_PROVIDER = "scripted"
    assert isinstance(releases.get_provider(), ScriptedProvider)
    assert releases.current_release_spec()["provider"] == "scripted"
    assert releases.current_release_spec()["model"] == f"scripted/{settings.AGENTOPS_MODEL}"

    settings.AGENTOPS_MODEL_PROVIDER = "anthropic"
    settings.ANTHROPIC_API_KEY = API_KEY
    settings.AGENTOPS_MODEL = MODEL
    provider = releases.get_provider()
    assert isinstance(provider, AnthropicProvider)
    assert (provider.name, provider.model, provider.max_retries) == ("anthropic", MODEL,
                                                                     settings.AGENTOPS_ANTHROPIC_MAX_RETRIES)
    assert API_KEY not in repr(provider)
    assert releases.current_release_spec()["provider"] == "anthropic"
    assert releases.current_release_spec()["model"] == MODEL

    settings.ANTHROPIC_API_KEY = ""
    with pytest.raises(ImproperlyConfigured, match="ANTHROPIC_API_KEY is not set"):
        releases.get_provider()

    settings.AGENTOPS_MODEL_PROVIDER = "openai"
    with pytest.raises(ImproperlyConfigured, match="'openai' is not a provider"):
        releases.get_provider()


def _settings_in_subprocess(tmp_path: Path, env: dict[str, str], expr: str) -> subprocess.CompletedProcess[str]:
    clean = {k: v for k, v in os.environ.items()
             if not k.startswith(("ANTHROPIC_", "AGENTOPS_MODEL", "AGENTOPS_ANTHROPIC_"))}
    return subprocess.run(
        [sys.executable, "-c", f"import agentops.settings as s; print({expr})"],
        env={**clean, "AGENTOPS_VAR_DIR": str(tmp_path), **env}, cwd=REPO_ROOT,
        capture_output=True, text=True, timeout=60, check=False,
    )


def test_the_default_provider_follows_the_api_key(tmp_path: Path) -> None:
    without = _settings_in_subprocess(tmp_path, {}, "s.AGENTOPS_MODEL_PROVIDER, s.AGENTOPS_MODEL")
    with_key = _settings_in_subprocess(tmp_path, {"ANTHROPIC_API_KEY": API_KEY}, "s.AGENTOPS_MODEL_PROVIDER")
    assert without.stdout.split() == ["scripted", "claude-sonnet-5-5"], without.stderr
    assert with_key.stdout.strip() == "anthropic", with_key.stderr

    bad = _settings_in_subprocess(tmp_path, {"AGENTOPS_ANTHROPIC_MAX_RETRIES": "5"}, "1")
    assert bad.returncode != 0 and "AGENTOPS_ANTHROPIC_MAX_RETRIES=5 must be 0, 1 or 2" in bad.stderr


def test_the_default_model_is_not_deprecated_by_the_sdk(anthropic_api: FakeAnthropicAPI) -> None:
    from anthropic._data import DEPRECATED_MODELS

    assert MODEL not in DEPRECATED_MODELS
    ask(make_provider(anthropic_api, fake.text("ok")))  # would raise on a warning


def test_constructing_a_provider_does_not_build_a_client(settings: Any) -> None:
    settings.ANTHROPIC_API_KEY = API_KEY
    provider = AnthropicProvider.from_settings()
    assert provider._clients is None
    assert provider.timeout_seconds == settings.AGENTOPS_ANTHROPIC_TIMEOUT_SECONDS


# --- the release agent end to end -------------------------------------------------------------

PROPOSAL = {"title": "Release: notes for 1.4", "summary": "Adds release notes for 1.4.",
            "files": {"release-notes/1.4.md": "# 1.4\n\nThree fixes.\n"}}


@pytest.mark.django_db
def test_the_release_agent_proposes_through_claude(git_repo: Path, deploy_target: Any, requester: Any,
                                                   claude: FakeAnthropicAPI) -> None:
    from tests.conftest import drive, open_approval, release_params
    from workflows import services

    claude.script(fake.text(json.dumps(PROPOSAL)))
    workflow = services.workflow_launch(kind="release", goal="Ship the 1.4 release notes",
                                        params=release_params(git_repo), user=requester)
    workflow = drive(workflow.pk)

    assert (workflow.status, workflow.current_node) == ("waiting", "WAIT_FOR_APPROVAL"), workflow.reason
    assert (workflow.release.provider, workflow.release.model) == ("anthropic", MODEL)
    body = claude.bodies()[0]
    assert "<task>propose_change</task>" in body["system"][0]["text"]
    assert "<goal>Ship the 1.4 release notes</goal>" in body["messages"][0]["content"][0]["text"]
    proposal = workflow.state["proposal"]
    assert (proposal["title"], proposal["files"]) == (PROPOSAL["title"], PROPOSAL["files"])
    usage = claude.requests[0].usage or {}
    assert proposal["model"] == {"provider": "anthropic", "model": MODEL, "input_tokens": usage["input_tokens"],
                                 "output_tokens": usage["output_tokens"]}
    assert open_approval(workflow.pk).candidate["title"] == PROPOSAL["title"]
    assert len(claude.requests) == 1


@pytest.mark.django_db
def test_a_429_in_the_release_agent_stores_the_retry_window(
    git_repo: Path, deploy_target: Any, requester: Any, claude: FakeAnthropicAPI, time_machine: Any,
) -> None:
    from tests.conftest import drive, release_params
    from workflows import clock, services
    from workflows.models import Activity

    claude.script(fake.rate_limited(retry_after=30), fake.text(json.dumps(PROPOSAL)))
    time_machine.move_to(clock.now(), tick=False)
    workflow = services.workflow_launch(kind="release", goal="Ship the 1.4 release notes",
                                        params=release_params(git_repo), user=requester)
    started = clock.now()
    drive(workflow.pk, max_rounds=3)

    proposing = Activity.objects.get(workflow=workflow, name="propose_change")
    assert proposing.status == Activity.Status.SCHEDULED
    assert proposing.next_attempt_at == started + timedelta(seconds=30)
    assert "the server asked to wait 30 s" in proposing.error
    assert len(claude.requests) == 1

    time_machine.shift(timedelta(seconds=31))
    workflow = drive(workflow.pk)
    assert (workflow.status, workflow.current_node) == ("waiting", "WAIT_FOR_APPROVAL"), workflow.reason
    assert len(claude.requests) == 2
