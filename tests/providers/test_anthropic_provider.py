"""The anthropic provider through the real SDK, with realistic API responses replayed by a mock transport.

Nothing here reaches the network: every client has ``base_url=http://anthropic.test`` and an
``httpx2.MockTransport`` (the SDK is built on httpx2, so httpx mocks would not see its requests).
"""
from __future__ import annotations

import json
import os
import pickle
import subprocess
import sys
import time
import warnings
from collections.abc import Callable, Iterator
from datetime import timedelta
from pathlib import Path
from typing import Any

import anthropic
import httpx2
import pytest
from django.core.exceptions import ImproperlyConfigured

from agentops import providers
from agentops.providers.anthropic import AnthropicProvider
from agentops.providers.scripted import ScriptedProvider
from workflows.errors import Permanent, Retryable

MODEL = "claude-sonnet-5-5"
BASE_URL = "http://anthropic.test"
API_KEY = "sk-ant-test-0000-secret"
REPO_ROOT = Path(__file__).resolve().parents[2]

Handler = Callable[[httpx2.Request], httpx2.Response]


# --- realistic API payloads -------------------------------------------------------------------

def message(content: list[dict[str, Any]], *, stop_reason: str | None = "end_turn", usage: dict[str, Any] | None = None,
            **extra: Any) -> dict[str, Any]:
    return {
        "id": "msg_01XFDUDYJgAACzvnptvVoYEL", "type": "message", "role": "assistant", "model": MODEL,
        "content": content, "stop_reason": stop_reason, "stop_sequence": None,
        "usage": usage or {"input_tokens": 25, "output_tokens": 12},
        **extra,
    }


def ok(body: dict[str, Any]) -> httpx2.Response:
    return httpx2.Response(200, json=body, headers={"request-id": "req_011CSHoEeqs5C35K2UUqR7Fy"})


def api_error(status: int, kind: str, text: str, *, headers: dict[str, str] | None = None,
              error_code: str | None = None) -> httpx2.Response:
    error: dict[str, Any] = {"type": kind, "message": text}
    if error_code:
        error["details"] = {"error_code": error_code}
    return httpx2.Response(status, json={"type": "error", "error": error, "request_id": "req_011CSHoEerr"},
                           headers={"request-id": "req_011CSHoEerr", **(headers or {})})


def rate_limited(**headers: str) -> httpx2.Response:
    return api_error(429, "rate_limit_error",
                     "This request would exceed the rate limit for your organization of 50,000 input tokens "
                     "per minute.",
                     headers={"anthropic-ratelimit-input-tokens-limit": "50000",
                              "anthropic-ratelimit-input-tokens-remaining": "0", **headers})


WORKSPACE_TOOLS = [
    {"name": "read_file", "description": "Read a file of the workspace.",
     "input_schema": {"type": "object", "properties": {"path": {"type": "string"}}, "required": ["path"]}},
    {"name": "list_files", "description": "List the workspace's files.",
     "input_schema": {"type": "object", "properties": {}}},
]


# --- harness ----------------------------------------------------------------------------------

class Transport:
    """Serves the given responses in order (the last one repeats) and keeps every request it saw."""

    def __init__(self, *responses: httpx2.Response | Handler) -> None:
        self.responses = list(responses)
        self.requests: list[httpx2.Request] = []

    def __call__(self, request: httpx2.Request) -> httpx2.Response:
        self.requests.append(request)
        answer = self.responses[min(len(self.requests), len(self.responses)) - 1]
        return answer(request) if callable(answer) else answer

    def bodies(self) -> list[dict[str, Any]]:
        return [json.loads(r.content) for r in self.requests]

    def client(self) -> httpx2.Client:
        return anthropic.DefaultHttpxClient(transport=httpx2.MockTransport(self))


def make_provider(transport: Transport, *, max_retries: int = 1, **kwargs: Any) -> AnthropicProvider:
    return AnthropicProvider(api_key=API_KEY, model=MODEL, base_url=BASE_URL, max_retries=max_retries,
                             http_client=transport.client(), **kwargs)


def ask(provider: AnthropicProvider, **kwargs: Any) -> Any:
    return provider.complete(**{"system": "You are terse.", "messages": [{"role": "user", "content": "Hello"}],
                                "max_tokens": 256, **kwargs})


RecordedSleeps = list[float]


@pytest.fixture(autouse=True)
def sdk_sleeps(monkeypatch: pytest.MonkeyPatch) -> RecordedSleeps:
    """The SDK's in-process retry waits, recorded instead of slept (only the SDK's ``time`` is replaced)."""
    sleeps = RecordedSleeps()

    class SdkTime:
        def __getattr__(self, name: str) -> Any:
            return getattr(time, name)

        def sleep(self, seconds: float) -> None:
            sleeps.append(seconds)

    monkeypatch.setattr(anthropic._base_client, "time", SdkTime())
    return sleeps


@pytest.fixture(autouse=True)
def deprecated_models_are_errors() -> Iterator[None]:
    with warnings.catch_warnings():
        warnings.filterwarnings("error", message="The model .* is deprecated", category=DeprecationWarning)
        yield


# --- answers ----------------------------------------------------------------------------------

def test_text_answer_joins_text_blocks_and_counts_cache_tokens() -> None:
    transport = Transport(ok(message(
        [{"type": "text", "text": "Release notes are ready", "citations": None}, {"type": "text", "text": "."}],
        usage={"input_tokens": 310, "output_tokens": 42, "cache_creation_input_tokens": 0,
               "cache_read_input_tokens": 1980, "cache_creation": {"ephemeral_5m_input_tokens": 0,
                                                                    "ephemeral_1h_input_tokens": 0},
               "service_tier": "standard"},
    )))
    response = ask(make_provider(transport))

    assert response.text == "Release notes are ready."
    assert response.stop_reason == "end_turn"
    assert response.tool_calls == []
    assert (response.usage.input_tokens, response.usage.output_tokens) == (310, 42)
    assert (response.usage.cache_read_input_tokens, response.usage.cache_creation_input_tokens) == (1980, 0)
    assert response.request_id == "req_011CSHoEeqs5C35K2UUqR7Fy"
    assert len(transport.requests) == 1
    assert transport.requests[0].url == "http://anthropic.test/v1/messages"


def test_cache_writes_are_counted_and_absent_cache_fields_are_zero() -> None:
    writes = Transport(ok(message([{"type": "text", "text": "ok"}], usage={
        "input_tokens": 12, "output_tokens": 3, "cache_creation_input_tokens": 2048, "cache_read_input_tokens": None})))
    assert ask(make_provider(writes)).usage.cache_creation_input_tokens == 2048
    assert ask(make_provider(writes)).usage.cache_read_input_tokens == 0

    bare = Transport(ok(message([{"type": "text", "text": "ok"}], usage={"input_tokens": 12, "output_tokens": 3})))
    usage = ask(make_provider(bare)).usage
    assert (usage.cache_read_input_tokens, usage.cache_creation_input_tokens) == (0, 0)


def test_the_request_marks_the_system_prompt_and_last_tool_for_caching() -> None:
    transport = Transport(ok(message([{"type": "text", "text": "ok"}])))
    tools = json.loads(json.dumps(WORKSPACE_TOOLS))
    ask(make_provider(transport), system="<task>plan</task> You plan.", tools=tools, max_tokens=900)

    body = transport.bodies()[0]
    assert body["model"] == MODEL
    assert body["max_tokens"] == 900
    assert body["system"] == [{"type": "text", "text": "<task>plan</task> You plan.",
                               "cache_control": {"type": "ephemeral"}}]
    assert "cache_control" not in body["tools"][0]
    assert body["tools"][-1] == {**WORKSPACE_TOOLS[-1], "cache_control": {"type": "ephemeral"}}
    assert "temperature" not in body
    assert tools == WORKSPACE_TOOLS, "the caller's tool definitions are not modified"


def test_tool_use_then_tool_result_round_trip() -> None:
    first = ok(message(
        [{"type": "text", "text": "I'll look at the changelog first."},
         {"type": "tool_use", "id": "toolu_01A09q90qw90lq917835lq9", "name": "read_file",
          "input": {"path": "CHANGELOG.md"}}],
        stop_reason="tool_use", usage={"input_tokens": 520, "output_tokens": 61, "cache_creation_input_tokens": 480},
    ))
    second = ok(message([{"type": "text", "text": "The changelog lists 3 fixes."}],
                        usage={"input_tokens": 95, "output_tokens": 9, "cache_read_input_tokens": 480}))
    transport = Transport(first, second)
    provider = make_provider(transport)
    messages: list[dict[str, Any]] = [{"role": "user", "content": "Summarise the changelog."}]

    response = provider.complete(system="You read files.", messages=messages, max_tokens=512, tools=WORKSPACE_TOOLS)
    assert response.stop_reason == "tool_use"
    assert response.text == "I'll look at the changelog first."
    assert response.tool_calls == [{"id": "toolu_01A09q90qw90lq917835lq9", "name": "read_file",
                                    "input": {"path": "CHANGELOG.md"}}]

    # The conversation is plain JSON: it can be stored durably between the two calls.
    messages = json.loads(json.dumps([
        *messages,
        response.assistant_turn(),
        {"role": "user", "content": [{"type": "tool_result", "tool_use_id": call["id"], "content": "- fix 1\n- fix 2"}
                                     for call in response.tool_calls]},
    ]))
    final = provider.complete(system="You read files.", messages=messages, max_tokens=512, tools=WORKSPACE_TOOLS)

    assert final.text == "The changelog lists 3 fixes."
    assert final.usage.cache_read_input_tokens == 480
    sent = transport.bodies()[1]["messages"]
    assert sent[1] == {"role": "assistant", "content": [
        {"type": "text", "text": "I'll look at the changelog first."},
        {"type": "tool_use", "id": "toolu_01A09q90qw90lq917835lq9", "name": "read_file",
         "input": {"path": "CHANGELOG.md"}}]}
    assert sent[2]["content"][0]["type"] == "tool_result"
    assert sent[2]["content"][0]["tool_use_id"] == "toolu_01A09q90qw90lq917835lq9"


def test_thinking_blocks_are_kept_for_the_round_trip() -> None:
    transport = Transport(ok(message(
        [{"type": "thinking", "thinking": "The user wants a file.", "signature": "EqQBCgIYAhIM1gbcDa9GJwZA"},
         {"type": "tool_use", "id": "toolu_02", "name": "list_files", "input": {}}],
        stop_reason="tool_use")))
    response = ask(make_provider(transport), tools=WORKSPACE_TOOLS)
    assert response.content[0] == {"type": "thinking", "thinking": "The user wants a file.",
                                   "signature": "EqQBCgIYAhIM1gbcDa9GJwZA"}
    assert response.assistant_turn()["content"] == response.content


# --- retryable failures -----------------------------------------------------------------------

@pytest.mark.parametrize("max_retries", [0, 1, 2])
def test_429_with_retry_after_is_retryable_after_the_sdk_retries(max_retries: int, sdk_sleeps: RecordedSleeps) -> None:
    transport = Transport(rate_limited(**{"retry-after": "7"}))
    with pytest.raises(Retryable) as caught:
        ask(make_provider(transport, max_retries=max_retries))

    assert caught.value.retry_after_seconds == 7
    assert caught.value.status_code == 429
    assert len(transport.requests) == max_retries + 1
    assert sdk_sleeps == [7.0] * max_retries, "the SDK honoured the server's retry-after between its retries"
    assert "wait 7 s" in str(caught.value)


def test_a_long_retry_after_becomes_a_stored_window_without_sleeping(sdk_sleeps: RecordedSleeps) -> None:
    transport = Transport(rate_limited(**{"retry-after": "3600"}))
    with pytest.raises(Retryable) as caught:
        ask(make_provider(transport, max_retries=2))
    assert caught.value.retry_after_seconds == 3600
    assert len(transport.requests) == 1
    assert sdk_sleeps == []


def test_retry_after_ms_is_preferred_and_a_missing_header_gives_none() -> None:
    with pytest.raises(Retryable) as caught:
        ask(make_provider(Transport(rate_limited(**{"retry-after-ms": "2500", "retry-after": "3"})), max_retries=0))
    assert caught.value.retry_after_seconds == 2.5

    with pytest.raises(Retryable) as caught:
        ask(make_provider(Transport(rate_limited()), max_retries=0))
    assert caught.value.retry_after_seconds is None


def test_529_overloaded_is_retryable() -> None:
    transport = Transport(api_error(529, "overloaded_error", "Overloaded"))
    with pytest.raises(Retryable) as caught:
        ask(make_provider(transport, max_retries=1))
    assert caught.value.status_code == 529
    assert caught.value.retry_after_seconds is None
    assert "overloaded_error" in str(caught.value)
    assert len(transport.requests) == 2


@pytest.mark.parametrize(("status", "kind"), [(500, "api_error"), (503, "api_error"), (504, "timeout_error")])
def test_server_errors_are_retryable(status: int, kind: str) -> None:
    transport = Transport(api_error(status, kind, "Internal server error", headers={"retry-after": "2"}))
    with pytest.raises(Retryable) as caught:
        ask(make_provider(transport, max_retries=0))
    assert (caught.value.status_code, caught.value.retry_after_seconds) == (status, 2)


def test_a_server_error_then_success_is_absorbed_by_the_sdk_retry() -> None:
    transport = Transport(api_error(529, "overloaded_error", "Overloaded"),
                          ok(message([{"type": "text", "text": "hi"}])))
    assert ask(make_provider(transport, max_retries=1)).text == "hi"
    assert len(transport.requests) == 2


def test_connection_errors_and_timeouts_are_retryable() -> None:
    def refuse(request: httpx2.Request) -> httpx2.Response:
        raise httpx2.ConnectError("[Errno 111] Connection refused", request=request)

    def stall(request: httpx2.Request) -> httpx2.Response:
        raise httpx2.ReadTimeout("timed out", request=request)

    refused = Transport(refuse)
    with pytest.raises(Retryable) as caught:
        ask(make_provider(refused, max_retries=1))
    assert "could not be reached (ConnectError)" in str(caught.value)
    assert caught.value.retry_after_seconds is None
    assert len(refused.requests) == 2

    with pytest.raises(Retryable) as caught:
        ask(make_provider(Transport(stall), max_retries=0, timeout_seconds=30))
    assert "within 30 s (AGENTOPS_ANTHROPIC_TIMEOUT_SECONDS)" in str(caught.value)


def test_retryable_errors_survive_pickling_with_their_retry_window() -> None:
    with pytest.raises(Retryable) as caught:
        ask(make_provider(Transport(rate_limited(**{"retry-after": "7"})), max_retries=0))
    copy = pickle.loads(pickle.dumps(caught.value))
    assert (type(copy), copy.retry_after_seconds, str(copy)) == (Retryable, 7, str(caught.value))


# --- permanent failures -----------------------------------------------------------------------

def test_401_is_permanent_and_names_the_key_variable_not_its_value() -> None:
    transport = Transport(api_error(401, "authentication_error", "invalid x-api-key"))
    with pytest.raises(Permanent) as caught:
        ask(make_provider(transport, max_retries=2))
    assert "ANTHROPIC_API_KEY" in str(caught.value)
    assert API_KEY not in str(caught.value) and API_KEY not in repr(caught.value.__dict__)
    assert len(transport.requests) == 1, "the SDK does not retry a 401"


@pytest.mark.parametrize(("status", "kind", "hint"), [
    (400, "invalid_request_error", "fix the request"),
    (403, "permission_error", "workspace may use claude-sonnet-5-5"),
    (404, "not_found_error", "AGENTOPS_MODEL"),
    (413, "request_too_large", "trim the context"),
])
def test_client_errors_are_permanent_with_what_to_do(status: int, kind: str, hint: str) -> None:
    with pytest.raises(Permanent) as caught:
        ask(make_provider(Transport(api_error(status, kind, "messages: text content blocks must be non-empty"))))
    assert hint in str(caught.value)
    assert caught.value.status_code == status


def test_a_spend_limit_429_is_permanent() -> None:
    transport = Transport(api_error(429, "rate_limit_error", "Monthly usage limit reached.",
                                    error_code="enforced_spend_limit_reached"))
    with pytest.raises(Permanent) as caught:
        ask(make_provider(transport, max_retries=0))
    assert "spend limit" in str(caught.value)


@pytest.mark.parametrize(("response", "what"), [
    (httpx2.Response(200, content=b'{"id": "msg_01", "type": "mess', headers={"content-type": "application/json"}),
     "not JSON"),
    (httpx2.Response(200, content=b"<html><body>502 Bad Gateway</body></html>", headers={"content-type": "text/html"}),
     "a str, not a message"),
    (httpx2.Response(200, json={"id": "msg_01", "type": "message"}), "no content list"),
    (httpx2.Response(200, json=message([{"type": "text", "text": "hi"}], stop_reason=None)), "no stop_reason"),
    (httpx2.Response(200, json={**message([{"type": "text", "text": "hi"}]), "usage": None}), "no usage"),
    (httpx2.Response(200, json=message([{"type": "tool_use", "id": "toolu_1", "name": "read_file"}],
                                       stop_reason="tool_use")), "tool_use block without"),
    (httpx2.Response(200, json=message([{"type": "text"}])), "text block without text"),
])
def test_malformed_responses_are_permanent(response: httpx2.Response, what: str) -> None:
    with pytest.raises(Permanent) as caught:
        ask(make_provider(Transport(response)))
    assert what in str(caught.value)


def test_a_refusal_is_permanent() -> None:
    transport = Transport(ok(message(
        [], stop_reason="refusal", stop_details={"type": "refusal", "category": "cyber",
                                                 "explanation": "The request could enable malware development."},
        usage={"input_tokens": 40, "output_tokens": 1})))
    with pytest.raises(Permanent) as caught:
        ask(make_provider(transport))
    assert "declined the request (refusal, category cyber)" in str(caught.value)
    assert caught.value.stop_reason == "refusal"
    assert caught.value.usage["input_tokens"] == 40


# --- configuration ----------------------------------------------------------------------------

def test_get_provider_picks_scripted_or_anthropic(settings: Any) -> None:
    settings.AGENTOPS_MODEL_PROVIDER = "scripted"
    assert isinstance(providers.get_provider(), ScriptedProvider)
    assert providers.current_release_spec()["provider"] == "scripted"
    assert providers.current_release_spec()["model"] == f"scripted/{settings.AGENTOPS_MODEL}"

    settings.AGENTOPS_MODEL_PROVIDER = "anthropic"
    settings.ANTHROPIC_API_KEY = API_KEY
    settings.AGENTOPS_MODEL = MODEL
    provider = providers.get_provider()
    assert isinstance(provider, AnthropicProvider)
    assert (provider.name, provider.model, provider.max_retries) == ("anthropic", MODEL,
                                                                     settings.AGENTOPS_ANTHROPIC_MAX_RETRIES)
    assert API_KEY not in repr(provider)
    assert providers.current_release_spec()["provider"] == "anthropic"
    assert providers.current_release_spec()["model"] == MODEL

    settings.ANTHROPIC_API_KEY = ""
    with pytest.raises(ImproperlyConfigured, match="ANTHROPIC_API_KEY is not set"):
        providers.get_provider()

    settings.AGENTOPS_MODEL_PROVIDER = "openai"
    with pytest.raises(ImproperlyConfigured, match="'openai' is not a provider"):
        providers.get_provider()


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


def test_the_default_model_is_not_deprecated_by_the_sdk() -> None:
    from anthropic._data import DEPRECATED_MODELS

    assert MODEL not in DEPRECATED_MODELS
    ask(make_provider(Transport(ok(message([{"type": "text", "text": "ok"}])))))  # would raise on a warning


def test_constructing_a_provider_does_not_build_a_client(settings: Any) -> None:
    settings.ANTHROPIC_API_KEY = API_KEY
    provider = AnthropicProvider.from_settings()
    assert provider._client is None
    assert provider.timeout_seconds == settings.AGENTOPS_ANTHROPIC_TIMEOUT_SECONDS


# --- the release agent end to end -------------------------------------------------------------

PROPOSAL = {"title": "Release: notes for 1.4", "summary": "Adds release notes for 1.4.",
            "files": {"release-notes/1.4.md": "# 1.4\n\nThree fixes.\n"}}


@pytest.fixture
def claude(settings: Any, monkeypatch: pytest.MonkeyPatch) -> Callable[..., Transport]:
    """Run the release agent on the anthropic provider, answering through the given responses."""

    def use(*responses: httpx2.Response | Handler, max_retries: int = 0) -> Transport:
        settings.AGENTOPS_MODEL_PROVIDER = "anthropic"
        settings.ANTHROPIC_API_KEY = API_KEY
        settings.ANTHROPIC_BASE_URL = BASE_URL
        settings.AGENTOPS_MODEL = MODEL
        settings.AGENTOPS_ANTHROPIC_MAX_RETRIES = max_retries
        transport = Transport(*responses)
        build = AnthropicProvider.from_settings.__func__  # type: ignore[attr-defined]
        # get_provider() builds the provider from settings; only the HTTP client is swapped for the mock.
        monkeypatch.setattr(AnthropicProvider, "from_settings",
                            classmethod(lambda cls, model=None, http_client=None: build(
                                cls, model=model, http_client=transport.client())))
        return transport

    return use


@pytest.mark.django_db
def test_the_release_agent_proposes_through_claude(git_repo: Path, deploy_target: Any, requester: Any,
                                                   claude: Callable[..., Transport]) -> None:
    from tests.conftest import drive, open_approval, release_params
    from workflows import services

    def answer(request: httpx2.Request) -> httpx2.Response:
        body = json.loads(request.content)
        assert "<task>propose_change</task>" in body["system"][0]["text"]
        assert "<goal>Ship the 1.4 release notes</goal>" in body["messages"][0]["content"]
        return ok(message([{"type": "text", "text": json.dumps(PROPOSAL)}],
                          usage={"input_tokens": 180, "output_tokens": 75, "cache_read_input_tokens": 0}))

    transport = claude(answer)
    workflow = services.workflow_launch(kind="release", goal="Ship the 1.4 release notes",
                                        params=release_params(git_repo), user=requester)
    workflow = drive(workflow.pk)

    assert (workflow.status, workflow.current_node) == ("waiting", "WAIT_FOR_APPROVAL"), workflow.reason
    assert (workflow.release.provider, workflow.release.model) == ("anthropic", MODEL)
    proposal = workflow.state["proposal"]
    assert (proposal["title"], proposal["files"]) == (PROPOSAL["title"], PROPOSAL["files"])
    assert proposal["model"] == {"provider": "anthropic", "model": MODEL, "input_tokens": 180, "output_tokens": 75}
    assert open_approval(workflow.pk).candidate["title"] == PROPOSAL["title"]
    assert len(transport.requests) == 1


@pytest.mark.django_db
def test_a_429_in_the_release_agent_stores_the_retry_window(
    git_repo: Path, deploy_target: Any, requester: Any, claude: Callable[..., Transport], time_machine: Any,
) -> None:
    from tests.conftest import drive, release_params
    from workflows import clock, services
    from workflows.models import Activity

    transport = claude(rate_limited(**{"retry-after": "30"}),
                       ok(message([{"type": "text", "text": json.dumps(PROPOSAL)}])))
    time_machine.move_to(clock.now(), tick=False)
    workflow = services.workflow_launch(kind="release", goal="Ship the 1.4 release notes",
                                        params=release_params(git_repo), user=requester)
    started = clock.now()
    drive(workflow.pk, max_rounds=3)

    proposing = Activity.objects.get(workflow=workflow, name="propose_change")
    assert proposing.status == Activity.Status.SCHEDULED
    assert proposing.next_attempt_at == started + timedelta(seconds=30)
    assert "the server asked to wait 30 s" in proposing.error
    assert len(transport.requests) == 1

    time_machine.shift(timedelta(seconds=31))
    workflow = drive(workflow.pk)
    assert (workflow.status, workflow.current_node) == ("waiting", "WAIT_FOR_APPROVAL"), workflow.reason
    assert len(transport.requests) == 2
