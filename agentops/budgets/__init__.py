"""Model prices and cost arithmetic (USD); the durable ledger lives in ``workflows.services.budgets``."""
from __future__ import annotations

import json
import time
from dataclasses import dataclass
from decimal import ROUND_UP, Decimal
from typing import Any

from django.conf import settings

from agentops.providers import provider_for
from agentops.providers.base import ModelResponse, Usage
from workflows.activity_context import ActivityContext
from workflows.errors import AgentOpsError, Permanent

MILLION = Decimal(1_000_000)
CHARS_PER_TOKEN = 4


@dataclass(frozen=True)
class Price:
    """USD per million tokens."""

    input: Decimal
    output: Decimal
    cache_read: Decimal
    cache_write: Decimal


def price_for(model: str) -> Price:
    """The price of ``model``; the scripted provider's ``scripted/<model>`` is priced as ``<model>``
    so offline runs show believable (simulated) spend."""
    table: dict[str, dict[str, Any]] = settings.AGENTOPS_MODEL_PRICES_USD_PER_MTOK
    name = model.removeprefix("scripted/")
    row = table.get(name) or table.get("default")
    if row is None:
        raise Permanent(f"No price for model {model!r} in AGENTOPS_MODEL_PRICES_USD_PER_MTOK and no 'default' row.")
    return Price(**{k: Decimal(str(row[k])) for k in ("input", "output", "cache_read", "cache_write")})


def estimate_usd(model: str, *, prompt_chars: int, max_tokens: int) -> Decimal:
    """An upper estimate of a call's cost: the whole prompt uncached and every allowed output token."""
    price = price_for(model)
    tokens_in = Decimal(prompt_chars // CHARS_PER_TOKEN + 1)
    return _usd(tokens_in * price.input + Decimal(max_tokens) * price.output)


def cost_usd(model: str, usage: Usage) -> Decimal:
    """The cost of reported usage; cache reads and writes at their own prices."""
    price = price_for(model)
    return _usd(
        Decimal(usage.input_tokens) * price.input
        + Decimal(usage.output_tokens) * price.output
        + Decimal(usage.cache_read_input_tokens) * price.cache_read
        + Decimal(usage.cache_creation_input_tokens) * price.cache_write
    )


def _usd(per_million_total: Decimal) -> Decimal:
    return (per_million_total / MILLION).quantize(Decimal("0.000001"), rounding=ROUND_UP)


def metered_complete(
    ctx: ActivityContext,
    *,
    call: int,
    system: str,
    messages: list[dict[str, Any]],
    max_tokens: int,
    tools: list[dict[str, Any]] | None = None,
    tool_choice: dict[str, Any] | None = None,
) -> ModelResponse:
    """One model call of an activity, inside the workflow's budget.

    Reserves the estimated cost under the ledger key ``<operation_id>#<call>`` (raising
    BudgetDeferred or BudgetExhausted at the limits), calls the provider, then charges
    the reported usage once: a retried attempt reuses its key and is never counted twice.
    The call is fenced: an attempt whose work is no longer wanted raises LeaseLost instead.
    Each call that reached the provider is recorded as a ``model.called`` event (request id,
    model, latency, tokens, stop reason, cost; or the error of a failed call).
    """
    from workflows.services.budgets import budget_charge_once, budget_reserve_ensure

    ctx.fence(f"model call {call}")
    provider = provider_for(ctx)
    key = f"{ctx.operation_id}#{call}"
    prompt_chars = len(system) + len(json.dumps(messages, default=str)) + len(json.dumps(tools or []))
    budget_reserve_ensure(
        workflow_id=ctx.workflow_id, key=key, operation_id=ctx.operation_id, provider=provider.name,
        model=provider.model, estimate_usd=estimate_usd(provider.model, prompt_chars=prompt_chars,
                                                        max_tokens=max_tokens),
    )
    started = time.monotonic()
    try:
        response = provider.complete(system=system, messages=messages, max_tokens=max_tokens, tools=tools,
                                     tool_choice=tool_choice)
    except AgentOpsError as exc:
        ctx.note("model.called", call=call, model=provider.model, latency_ms=_ms_since(started),
                 request_id=str(getattr(exc, "request_id", "") or ""), error=f"{type(exc).__name__}: {exc}"[:500],
                 status_code=getattr(exc, "status_code", None))
        raise
    usage = response.usage
    cost = cost_usd(provider.model, usage)
    budget_charge_once(key=key, cost_usd=cost, usage={
        "input_tokens": usage.input_tokens, "output_tokens": usage.output_tokens,
        "cache_read_tokens": usage.cache_read_input_tokens, "cache_write_tokens": usage.cache_creation_input_tokens,
    })
    ctx.note("model.called", call=call, model=provider.model, latency_ms=_ms_since(started),
             request_id=response.request_id, stop_reason=response.stop_reason, input_tokens=usage.input_tokens,
             output_tokens=usage.output_tokens, cache_read_tokens=usage.cache_read_input_tokens,
             cache_write_tokens=usage.cache_creation_input_tokens, cost_usd=str(cost))
    return response


def _ms_since(started: float) -> int:
    return round((time.monotonic() - started) * 1000)
