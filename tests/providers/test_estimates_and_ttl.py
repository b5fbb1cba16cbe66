"""What a request is reserved at (the API's token count, else the prompt's length) and the
1-hour prompt-cache TTL of the stable prefix, against the fake Messages API through the SDK."""
from __future__ import annotations

import json
from decimal import ROUND_UP, Decimal
from pathlib import Path
from typing import Any

import pytest

from agentops.providers.anthropic import AnthropicProvider
from tests.fakes import anthropic_api as fake
from tests.fakes.anthropic_api import FakeAnthropicAPI, rendered_blocks, tokens_of
from tests.providers.conftest import API_KEY, MODEL
from workflows.activity_context import ActivityContext
from workflows.leases import Claim, LeaseLost
from workflows.metering import metered_complete
from workflows.models import UsageEntry
from workflows.prices import CHARS_PER_TOKEN, cost_usd, estimate_usd, estimated_input_tokens, price_for
from workflows.testing import FakeLease

# Over the 1,024-token minimum cacheable length of Sonnet: the prefix alone is cacheable.
LONG_SYSTEM = "You review release notes for a payments team. " + "Follow the house style guide closely. " * 140
MESSAGES = [{"role": "user", "content": "Summarise the changes since 1.3."}]


def provider(api: FakeAnthropicAPI) -> AnthropicProvider:
    return AnthropicProvider(api_key=API_KEY, model=MODEL, base_url=api.url, max_retries=0)


def test_the_count_is_the_apis_and_costs_nothing(anthropic_api: FakeAnthropicAPI, settings: Any) -> None:
    """count_tokens asks the API's free endpoint; no message is created and nothing is billed."""
    settings.AGENTOPS_ANTHROPIC_COUNT_TOKENS = True
    counted = provider(anthropic_api).count_tokens(system=LONG_SYSTEM, messages=MESSAGES)

    body = {"model": MODEL, "system": LONG_SYSTEM, "messages": MESSAGES}
    assert counted == sum(tokens_of(block) for _, block in rendered_blocks(body))
    assert (len(anthropic_api.counts), len(anthropic_api.requests)) == (1, 0)


def test_a_failed_or_disabled_count_says_none(anthropic_api: FakeAnthropicAPI, settings: Any) -> None:
    """A throttled count (or counting turned off) returns None, so the caller estimates instead;
    the count is never retried in-process."""
    settings.AGENTOPS_ANTHROPIC_COUNT_TOKENS = True
    anthropic_api.count_faults.append(fake.rate_limited(retry_after=30))
    assert provider(anthropic_api).count_tokens(system="s", messages=MESSAGES) is None
    assert len(anthropic_api.counts) == 1

    settings.AGENTOPS_ANTHROPIC_COUNT_TOKENS = False
    assert provider(anthropic_api).count_tokens(system="s", messages=MESSAGES) is None
    assert len(anthropic_api.counts) == 1, "no request when counting is off"


@pytest.mark.django_db
@pytest.mark.parametrize("count_fails", [False, True], ids=["counted", "count throttled"])
def test_a_request_is_reserved_at_the_counted_tokens_else_the_estimate(
    claude: FakeAnthropicAPI, settings: Any, count_fails: bool,
) -> None:
    """The reservation prices the API's count of the input (or, when the count fails, one token
    per four characters) as a cache write, plus every allowed output token; the call goes ahead
    either way and is charged what the server reported."""
    from workflows import services

    settings.AGENTOPS_ANTHROPIC_COUNT_TOKENS = True
    if count_fails:
        claude.count_faults.append(fake.overloaded())
    claude.script(fake.text("Three fixes and one new endpoint."))
    workflow = services.workflow_launch(kind="autonomous", goal="Summarise the release")

    response = metered_complete(_context(workflow.pk), call=0, system=LONG_SYSTEM, messages=MESSAGES, max_tokens=300)

    [entry] = UsageEntry.objects.filter(workflow=workflow)
    body = claude.requests[0].body
    if count_fails:
        tokens = estimated_input_tokens(system=LONG_SYSTEM, messages=MESSAGES, tools=None)
    else:
        tokens = sum(tokens_of(block) for _, block in rendered_blocks(body))
    assert entry.reserved_usd == estimate_usd(MODEL, input_tokens=tokens, max_tokens=300)
    assert entry.status == "charged"
    assert entry.cost_usd == cost_usd(MODEL, response.usage) <= entry.reserved_usd


@pytest.mark.django_db
@pytest.mark.parametrize(("budget", "counted"), [
    ({}, False), ({"budget_total_usd": Decimal("5")}, True), ({"budget_hourly_usd": Decimal("1")}, True),
], ids=["no budget", "total budget", "hourly budget"])
def test_only_a_workflow_with_a_budget_limit_has_its_input_counted(
    claude: FakeAnthropicAPI, settings: Any, budget: dict[str, Decimal], counted: bool,
) -> None:
    """The count only makes a reservation exact, which matters where a budget can refuse it: an
    attempt claimed while its workflow had no limit is reserved from the prompt's length, with
    no request to the counting endpoint."""
    from workflows import services
    from workflows.models import Activity

    settings.AGENTOPS_ANTHROPIC_COUNT_TOKENS = True
    claude.script(fake.text("Three fixes and one new endpoint."))
    workflow = services.workflow_launch(kind="autonomous", goal="Summarise the release",
                                        options=services.LaunchOptions(**budget))
    activity = Activity.objects.get(workflow=workflow, status="scheduled")
    claim = services.activity_claim_if_runnable(activity_id=activity.pk, worker="w", task_id="t")
    assert claim is not None and claim.budget_limited is counted

    metered_complete(ActivityContext(claim=claim, lease=FakeLease()), call=0, system=LONG_SYSTEM, messages=MESSAGES,
                     max_tokens=300)

    assert len(claude.counts) == (1 if counted else 0)
    [entry] = UsageEntry.objects.filter(workflow=workflow)
    tokens = (sum(tokens_of(block) for _, block in rendered_blocks(claude.requests[0].body)) if counted
              else estimated_input_tokens(system=LONG_SYSTEM, messages=MESSAGES, tools=None))
    assert entry.reserved_usd == estimate_usd(MODEL, input_tokens=tokens, max_tokens=300)
    assert entry.status == "charged"


def _context(workflow_id: int) -> ActivityContext:
    claim = Claim(activity_id=0, workflow_id=workflow_id, operation_id=f"wf-{workflow_id}/EXECUTION.1/i1/0",
                  name="summarise", attempt=1, lease_token="t", input={}, previous_attempt_lost=False)
    return ActivityContext(claim=claim, lease=FakeLease())


@pytest.mark.django_db
def test_a_later_turn_of_the_conversation_is_reserved_from_the_last_answer_without_a_count(
    claude: FakeAnthropicAPI, settings: Any,
) -> None:
    """The second turn extends the first call's messages: its reservation is the first request's
    reported input plus the answer's output plus the added messages by length, and the API is
    not asked to count; a request that does not extend it is counted again."""
    from workflows import services

    settings.AGENTOPS_ANTHROPIC_COUNT_TOKENS = True
    claude.script(fake.text("Three fixes and one new endpoint."), fake.text("The fixes: a, b, c."), fake.text("ok"))
    workflow = services.workflow_launch(kind="autonomous", goal="Summarise the release")
    ctx = _context(workflow.pk)
    messages = list(MESSAGES)
    first = metered_complete(ctx, call=0, system=LONG_SYSTEM, messages=messages, max_tokens=300)
    messages += [first.assistant_turn(), {"role": "user", "content": "Now list the fixes, one per line."}]
    metered_complete(ctx, call=1, system=LONG_SYSTEM, messages=messages, max_tokens=300)

    assert len(claude.counts) == 1
    _, second = UsageEntry.objects.filter(workflow=workflow).order_by("pk")
    u = first.usage
    tokens = (u.input_tokens + u.cache_read_input_tokens + u.cache_creation_input_tokens + u.output_tokens
              + len(json.dumps(messages[1:])) // CHARS_PER_TOKEN + 1)
    assert second.reserved_usd == estimate_usd(MODEL, input_tokens=tokens, max_tokens=300)
    served = sum(tokens_of(block) for _, block in rendered_blocks(claude.requests[1].body))
    assert tokens >= served, "the reservation covers the request the server saw"
    assert second.status == "charged" and second.cost_usd <= second.reserved_usd

    metered_complete(ctx, call=2, system=LONG_SYSTEM, messages=[{"role": "user", "content": "Other."}], max_tokens=50)
    assert len(claude.counts) == 2


@pytest.mark.django_db
def test_a_request_of_an_attempt_that_lost_its_lease_is_neither_reserved_nor_sent(
    claude: FakeAnthropicAPI, settings: Any,
) -> None:
    """The fence runs in the reservation's transaction: nothing is written, nothing leaves."""
    from workflows import services

    claude.script(fake.text("never sent"))
    workflow = services.workflow_launch(kind="autonomous", goal="Summarise the release")
    ctx = _context(workflow.pk)
    ctx.lease.cancel()  # type: ignore[attr-defined]

    with pytest.raises(LeaseLost, match="model call 0 was not made"):
        metered_complete(ctx, call=0, system="s", messages=MESSAGES, max_tokens=50)
    assert claude.requests == []
    assert not UsageEntry.objects.filter(workflow=workflow).exists()


def test_the_1h_ttl_marks_the_prefix_and_keeps_the_moving_breakpoint_at_5m(anthropic_api: FakeAnthropicAPI) -> None:
    """Tools and system carry ttl 1h, the last message the default 5 minutes: longer-lived
    breakpoints first, as the API requires (it refuses the other order)."""
    anthropic_api.script(fake.text("ok"))
    provider(anthropic_api).complete(system=LONG_SYSTEM, messages=MESSAGES, max_tokens=50,
                                     tools=[{"name": "t", "description": "d", "input_schema": {"type": "object"}}],
                                     prefix_cache_ttl="1h")
    body = anthropic_api.requests[0].body
    assert body["tools"][-1]["cache_control"] == {"type": "ephemeral", "ttl": "1h"}
    assert body["system"][0]["cache_control"] == {"type": "ephemeral", "ttl": "1h"}
    assert body["messages"][-1]["content"][-1]["cache_control"] == {"type": "ephemeral"}


def test_the_api_refuses_a_1h_breakpoint_after_a_5m_one(anthropic_api: FakeAnthropicAPI) -> None:
    """The fake keeps the real API's ordering rule, so the provider's order is proven, not assumed."""
    from workflows.errors import Permanent

    anthropic_api.script(fake.text("never sent"))
    early = {"type": "text", "text": "hi", "cache_control": {"type": "ephemeral", "ttl": "1h"}}
    messages = [{"role": "user", "content": [early]}, {"role": "assistant", "content": "Hello."},
                {"role": "user", "content": "Go on."}]
    with pytest.raises(Permanent, match="must not come after"):
        provider(anthropic_api).complete(system="sys", messages=messages, max_tokens=50)
    anthropic_api.queue.clear()


@pytest.mark.parametrize(("ttl", "read_after_20_minutes"), [("5m", False), ("1h", True)])
def test_a_prefix_cached_for_an_hour_is_read_after_a_long_wait(
    anthropic_api: FakeAnthropicAPI, time_machine: Any, ttl: str, read_after_20_minutes: bool,
) -> None:
    """A call, 20 minutes of waiting, the next call with the same prefix: on the 5-minute TTL the
    prefix is written again; on the 1-hour TTL it is read (a tenth of the price) and the first
    write is priced at the 1-hour rate."""
    time_machine.move_to("2026-12-01 09:00:00", tick=False)
    anthropic_api.script(fake.text("first"), fake.text("second"))
    claude = provider(anthropic_api)
    first = claude.complete(system=LONG_SYSTEM, messages=MESSAGES, max_tokens=50, prefix_cache_ttl=ttl)
    time_machine.move_to("2026-12-01 09:20:00", tick=False)
    second = claude.complete(system=LONG_SYSTEM, messages=[{"role": "user", "content": "And since 1.2?"}],
                             max_tokens=50, prefix_cache_ttl=ttl)

    prefix = tokens_of({"type": "text", "text": LONG_SYSTEM})
    assert prefix > 1024
    assert first.usage.cache_creation_1h_input_tokens == (prefix if ttl == "1h" else 0)
    assert first.usage.cache_creation_input_tokens > prefix, "the moving breakpoint wrote the message too (5m)"
    assert second.usage.cache_read_input_tokens == (prefix if read_after_20_minutes else 0)
    price = price_for(MODEL)
    written_1h = first.usage.cache_creation_1h_input_tokens
    written_5m = first.usage.cache_creation_input_tokens - written_1h
    per_million = (written_1h * price.cache_write_1h + written_5m * price.cache_write
                   + first.usage.output_tokens * price.output)
    assert cost_usd(MODEL, first.usage) == (per_million / Decimal(1_000_000)).quantize(
        Decimal("0.000001"), rounding=ROUND_UP)


def test_a_1h_ttl_reserves_at_the_1h_write_price() -> None:
    price = price_for(MODEL)
    assert price.cache_write_1h == 2 * price.input
    assert estimate_usd(MODEL, input_tokens=1_000_000, max_tokens=0, prefix_cache_ttl="1h") == price.cache_write_1h
    assert estimate_usd(MODEL, input_tokens=1_000_000, max_tokens=0) == price.cache_write


def test_a_price_row_without_a_1h_rate_prices_it_at_twice_input(settings: Any, tmp_path: Path) -> None:
    settings.AGENTOPS_MODEL_PRICES_USD_PER_MTOK = {"default": {"input": 2, "output": 10, "cache_read": 0.2,
                                                               "cache_write": 2.5}}
    assert price_for("claude-any").cache_write_1h == Decimal(4)
