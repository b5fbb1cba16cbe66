"""Model prices and cost arithmetic (USD), from AGENTOPS_MODEL_PRICES_USD_PER_MTOK: what a request
may cost (its reservation) and what its reported usage cost (its charge). The ledger that holds
both is ``workflows.services.budgets``; the calls that fill it, ``workflows.metering``."""
from __future__ import annotations

import json
from dataclasses import dataclass
from decimal import ROUND_UP, Decimal
from typing import Any

from django.conf import settings

from workflows.errors import Permanent
from workflows.provider import Usage

MILLION = Decimal(1_000_000)
CHARS_PER_TOKEN = 4


@dataclass(frozen=True)
class Price:
    """USD per million tokens."""

    input: Decimal
    output: Decimal
    cache_read: Decimal
    cache_write: Decimal
    # A cache write with the 1-hour TTL; twice uncached input where the table gives none.
    cache_write_1h: Decimal


def price_for(model: str) -> Price:
    """The price of ``model``; the scripted provider's ``scripted/<model>`` is priced as ``<model>``
    so offline runs show believable (simulated) spend."""
    table: dict[str, dict[str, Any]] = settings.AGENTOPS_MODEL_PRICES_USD_PER_MTOK
    name = model.removeprefix("scripted/")
    row = table.get(name) or table.get("default")
    if row is None:
        raise Permanent(f"No price for model {model!r} in AGENTOPS_MODEL_PRICES_USD_PER_MTOK and no 'default' row.")
    prices = {k: Decimal(str(row[k])) for k in ("input", "output", "cache_read", "cache_write")}
    return Price(**prices, cache_write_1h=Decimal(str(row.get("cache_write_1h", prices["input"] * 2))))


def estimate_usd(model: str, *, input_tokens: int, max_tokens: int, prefix_cache_ttl: str = "5m") -> Decimal:
    """An upper estimate of one request's cost: every input token written to the prompt cache at
    the dearest TTL the request asks for (a write costs 1.25 times uncached input on the 5-minute
    TTL, twice on the 1-hour one) and every allowed output token."""
    price = price_for(model)
    write = price.cache_write_1h if prefix_cache_ttl == "1h" else price.cache_write
    return _usd(Decimal(input_tokens) * max(price.input, write) + Decimal(max_tokens) * price.output)


def estimated_input_tokens(*, system: str, messages: list[dict[str, Any]], tools: list[dict[str, Any]] | None) -> int:
    """The input of a request, in tokens, where the provider cannot count it: one per
    ``CHARS_PER_TOKEN`` characters of the rendered prompt, rounded up."""
    chars = len(system) + len(json.dumps(messages, default=str)) + len(json.dumps(tools or []))
    return chars // CHARS_PER_TOKEN + 1


def cost_usd(model: str, usage: Usage) -> Decimal:
    """The cost of reported usage; cache reads and writes (5-minute and 1-hour) at their own prices."""
    price = price_for(model)
    written_1h = min(usage.cache_creation_1h_input_tokens, usage.cache_creation_input_tokens)
    return _usd(
        Decimal(usage.input_tokens) * price.input
        + Decimal(usage.output_tokens) * price.output
        + Decimal(usage.cache_read_input_tokens) * price.cache_read
        + Decimal(usage.cache_creation_input_tokens - written_1h) * price.cache_write
        + Decimal(written_1h) * price.cache_write_1h
    )


def _usd(per_million_total: Decimal) -> Decimal:
    return (per_million_total / MILLION).quantize(Decimal("0.000001"), rounding=ROUND_UP)


def usage_fields(usage: Usage) -> dict[str, int]:
    """A ``Usage`` as the ledger's token columns."""
    return {"input_tokens": usage.input_tokens, "output_tokens": usage.output_tokens,
            "cache_read_tokens": usage.cache_read_input_tokens, "cache_write_tokens": usage.cache_creation_input_tokens,
            "cache_write_1h_tokens": usage.cache_creation_1h_input_tokens}
