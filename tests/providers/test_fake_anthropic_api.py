"""The fake Messages API keeps the prompt-caching rules of the real one (the ones the provider relies on)."""
from __future__ import annotations

from typing import Any

import anthropic
import pytest

from tests.fakes import anthropic_api as fake
from tests.fakes.anthropic_api import FakeAnthropicAPI
from tests.providers.conftest import API_KEY

LONG = "The release process of the service, step by step, with its checks. " * 80  # ~1380 tokens
MARK = {"type": "ephemeral"}


def create(api: FakeAnthropicAPI, *, model: str = "claude-sonnet-5-5", **request: Any) -> Any:
    api.script(fake.text("ok"))
    client = anthropic.Anthropic(api_key=API_KEY, base_url=api.url, max_retries=0)
    return client.messages.create(model=model, max_tokens=100, **request).usage


def marked(text: str, **control: Any) -> list[dict[str, Any]]:
    return [{"type": "text", "text": text, "cache_control": {**MARK, **control}}]


def test_a_prefix_under_the_minimum_is_not_cached(anthropic_api: FakeAnthropicAPI) -> None:
    short = "A short system prompt. " * 100  # ~600 tokens
    for _ in range(2):
        usage = create(anthropic_api, system=marked(short), messages=[{"role": "user", "content": "Hi"}])
        assert (usage.cache_creation_input_tokens, usage.cache_read_input_tokens) == (0, 0)


@pytest.mark.parametrize(("model", "cached"), [("claude-sonnet-5-5", True), ("claude-3-5-haiku-latest", False),
                                               ("claude-haiku-4-5", False)])
def test_the_minimum_depends_on_the_model(model: str, cached: bool, anthropic_api: FakeAnthropicAPI) -> None:
    usage = create(anthropic_api, model=model, system=marked(LONG), messages=[{"role": "user", "content": "Hi"}])
    assert (usage.cache_creation_input_tokens > 0) is cached


def test_reads_refresh_and_entries_expire_after_their_ttl(anthropic_api: FakeAnthropicAPI, time_machine: Any) -> None:
    time_machine.move_to("2026-01-05 09:00:00", tick=False)
    ask = {"system": marked(LONG), "messages": [{"role": "user", "content": "Hi"}]}
    written = create(anthropic_api, **ask).cache_creation_input_tokens
    assert written > 1024 and create(anthropic_api, **ask).cache_read_input_tokens == written

    time_machine.shift(240)  # 4 min after the last read: still there, and the read refreshes it
    assert create(anthropic_api, **ask).cache_read_input_tokens == written
    time_machine.shift(240)
    assert create(anthropic_api, **ask).cache_read_input_tokens == written
    time_machine.shift(301)  # over 5 min since the last use: gone, written again
    usage = create(anthropic_api, **ask)
    assert (usage.cache_read_input_tokens, usage.cache_creation_input_tokens) == (0, written)

    hour = {"system": marked(LONG + " (long-lived)", ttl="1h"), "messages": [{"role": "user", "content": "Hi"}]}
    usage = create(anthropic_api, **hour)
    assert usage.cache_creation.ephemeral_1h_input_tokens == usage.cache_creation_input_tokens > 0
    time_machine.shift(50 * 60)
    assert create(anthropic_api, **hour).cache_read_input_tokens == usage.cache_creation_input_tokens


def test_a_moving_breakpoint_reads_the_previous_turn_and_writes_only_what_was_added(
    anthropic_api: FakeAnthropicAPI,
) -> None:
    turn1 = [{"role": "user", "content": marked(LONG)}]
    first = create(anthropic_api, messages=turn1)
    turn2 = [{"role": "user", "content": [{"type": "text", "text": LONG}]},
             {"role": "assistant", "content": [{"type": "text", "text": "Noted."}]},
             {"role": "user", "content": marked("And the rollback?")}]
    second = create(anthropic_api, messages=turn2)

    assert second.cache_read_input_tokens == first.cache_creation_input_tokens
    added = sum(fake.tokens_of(block) for _, block in fake.rendered_blocks({"messages": turn2})[1:])
    assert second.cache_creation_input_tokens == added
    assert second.input_tokens == 0, "nothing follows the last breakpoint"


def test_a_cached_prefix_more_than_20_blocks_back_is_not_found(anthropic_api: FakeAnthropicAPI) -> None:
    base = [{"role": "user", "content": marked(LONG)}]
    written = create(anthropic_api, messages=base).cache_creation_input_tokens
    filler = [{"type": "text", "text": f"note {n}"} for n in range(21)]
    far = [{"role": "user", "content": [{"type": "text", "text": LONG}, *filler[:-1],
                                        {**filler[-1], "cache_control": MARK}]}]
    near = [{"role": "user", "content": [{"type": "text", "text": LONG}, *filler[:19],
                                         {**filler[19], "cache_control": MARK}]}]
    assert create(anthropic_api, messages=far).cache_read_input_tokens == 0
    assert create(anthropic_api, messages=near).cache_read_input_tokens == written


def test_changing_tool_choice_keeps_tools_and_system_cached_but_not_the_conversation(
    anthropic_api: FakeAnthropicAPI,
) -> None:
    tools = [{"name": "submit", "description": LONG, "input_schema": {"type": "object"}}]
    ask = {"tools": tools, "system": marked("You plan."), "messages": [{"role": "user", "content": marked(LONG)}]}
    create(anthropic_api, **ask)
    usage = create(anthropic_api, **ask, tool_choice={"type": "tool", "name": "submit"})
    system_prefix = sum(fake.tokens_of(block) for _, block in fake.rendered_blocks(ask)[:2])
    assert usage.cache_read_input_tokens == system_prefix
