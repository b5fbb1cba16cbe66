"""Metered model calls: each request of a call fenced, reserved in the usage ledger before it leaves
(``workflows.services.budgets``), charged or released from its answer; prices in ``workflows.prices``."""
from __future__ import annotations

import contextvars
import json
import logging
import time
import weakref
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from decimal import Decimal
from typing import TYPE_CHECKING, Any, Protocol

from opentelemetry.trace import SpanKind

from workflows import lane, livewire, ratelimits, telemetry
from workflows.activity_context import ActivityContext
from workflows.connections import connection_release_while_waiting
from workflows.errors import AgentOpsError
from workflows.heartbeats import keep_alive
from workflows.leases import Fence
from workflows.prices import CHARS_PER_TOKEN, cost_usd, estimate_usd, estimated_input_tokens, usage_fields
from workflows.provider import ModelProvider, ModelResponse, Usage
from workflows.ratelimits.limiter import RateLimitInfo
from workflows.releases import provider_for

if TYPE_CHECKING:
    from workflows.sql import RowWrite

log = logging.getLogger("agentops.budgets")

# The lease of an activity that calls the model (``@activity(lease_seconds=MODEL_CALL_LEASE)``): a
# setting, 20 s by default. metered_complete heartbeats it from a background thread while an answer
# is awaited, so a slow answer keeps it and a dead worker's attempt is taken over within seconds.
MODEL_CALL_LEASE = "AGENTOPS_MODEL_CALL_LEASE_SECONDS"


class Ledger(Protocol):
    """Where a model call's requests are reserved and settled: the usage ledger in the database
    (``DatabaseLedger``), or the test kit's ``workflows.testing.FakeLedger``."""

    def reserve(self, *, workflow_id: int, key: str, operation_id: str, attempt: int, provider: str, model: str,
                estimate_usd: Decimal, fence: Fence) -> bool:
        """Hold ``estimate_usd`` for request ``key`` or raise BudgetDeferred/BudgetExhausted; checks ``fence`` first."""
        ...

    def charge(self, *, key: str, cost_usd: Decimal, usage: dict[str, int], request_id: str) -> bool: ...

    def release(self, *, key: str, reason: str, http_status: int | None = None, request_id: str = "") -> bool: ...

    def uncertain(self, *, key: str, reason: str) -> bool: ...


class DatabaseLedger:
    """The usage ledger of ``workflows.services.budgets`` (one row per request)."""

    def reserve(self, *, workflow_id: int, key: str, operation_id: str, attempt: int, provider: str, model: str,
                estimate_usd: Decimal, fence: Fence) -> bool:
        from workflows.services.budgets import budget_reserve_ensure

        return budget_reserve_ensure(workflow_id=workflow_id, key=key, operation_id=operation_id, attempt=attempt,
                                     provider=provider, model=model, estimate_usd=estimate_usd, fence=fence)

    def charge(self, *, key: str, cost_usd: Decimal, usage: dict[str, int], request_id: str) -> bool:
        from workflows.services.budgets import budget_charge_once

        return budget_charge_once(key=key, cost_usd=cost_usd, usage=usage, request_id=request_id)

    def release(self, *, key: str, reason: str, http_status: int | None = None, request_id: str = "") -> bool:
        from workflows.services.budgets import budget_release_once

        return budget_release_once(key=key, reason=reason, http_status=http_status, request_id=request_id)

    def uncertain(self, *, key: str, reason: str) -> bool:
        from workflows.services.budgets import budget_uncertain_once

        return budget_uncertain_once(key=key, reason=reason)


# The model and ledger of the block, when the test kit put fakes in place (``answered_by``);
# None: the workflow's release answers and the database ledger meters.
_stand_ins: contextvars.ContextVar[tuple[ModelProvider, Ledger] | None] = contextvars.ContextVar(
    "agentops_model_stand_ins", default=None)


@contextmanager
def answered_by(model: ModelProvider, ledger: Ledger) -> Iterator[None]:
    """Within the block, ``metered_complete`` calls ``model`` and meters with ``ledger``: the test
    kit's ``ActivityEnvironment(model=FakeModel(...))`` runs a model-calling activity this way,
    without a database or a provider."""
    token = _stand_ins.set((model, ledger))
    try:
        yield
    finally:
        _stand_ins.reset(token)


@lane.turn()  # the provider's count, its answer and the rate limits' waits run outside it
def metered_complete(
    ctx: ActivityContext,
    *,
    call: int,
    system: str,
    messages: list[dict[str, Any]],
    max_tokens: int,
    tools: list[dict[str, Any]] | None = None,
    tool_choice: dict[str, Any] | None = None,
    prefix_cache_ttl: str = "5m",
) -> ModelResponse:
    """One model call of an activity, inside the workflow's budget and with its lease kept alive.

    Every request the call sends (the SDK's in-process retries included) has its own ledger
    row, ``<operation_id>#<call>@<attempt>.<n>`` (``LedgerMeter``): reserved before it leaves the
    process at an upper estimate (the provider's token count of the input when the workflow had a
    budget limit at the attempt's claim, else one token per four characters, all of it priced as a
    cache write of ``prefix_cache_ttl``, plus every
    allowed output token; a later turn of the same conversation, whose messages extend the
    previous call's, adds that call's reported input and output to an estimate of what was
    added, and asks the provider nothing), checked against the budget (raising BudgetDeferred or BudgetExhausted at the
    limits), then charged with the reported usage, released when it was answered with an error
    or never sent, or left uncertain at its estimate when no answer was seen. While the call
    is prepared (the provider's token count) and waits for the answer, the process's heartbeat
    thread beats the lease (``keep_alive``), so the lease can be short and a dead worker's
    attempt is taken over in seconds. Each request is
    fenced (``ctx.fence``) in its reservation's transaction: an attempt whose work is no longer
    wanted raises LeaseLost instead of sending it (or, when the answer came back meanwhile,
    after recording what it cost). Each call that reached the provider is recorded as a
    ``model.called`` event (request id, model, latency, tokens, stop reason, cost; or the error
    of a failed call).
    """
    stand_ins = _stand_ins.get()
    # Under heartbeats too: the first call of a process imports the provider's SDK (seconds), and a
    # token count is a request to the provider.
    with keep_alive(ctx, f"preparing model call {call}") as beat:
        provider, ledger = stand_ins if stand_ins is not None else (provider_for(ctx), DATABASE_LEDGER)
        input_tokens = _continued_conversation_tokens(ctx, system=system, messages=messages, tools=tools)
        if input_tokens is None and ctx.claim.budget_limited:
            # A count is a request too (a third of them, in a short conversation); it only makes the
            # reservation exact, which matters only where a budget can refuse it.
            with lane.waiting():
                input_tokens = provider.count_tokens(system=system, messages=messages, tools=tools)
    beat.raise_if_lost()
    if input_tokens is None:
        input_tokens = estimated_input_tokens(system=system, messages=messages, tools=tools)
    estimate = estimate_usd(provider.model, input_tokens=input_tokens, max_tokens=max_tokens,
                            prefix_cache_ttl=prefix_cache_ttl)
    meter = LedgerMeter(ctx, call=call, provider=provider.name, model=provider.model, estimate=estimate,
                        ledger=ledger)
    shared = ratelimits.limiter() if stand_ins is None else None
    with telemetry.span(f"chat {provider.model}", kind=SpanKind.CLIENT,
                        attributes=model_call_attributes(provider.name, provider.model, call, max_tokens)) as span:
        return _metered_call(ctx, provider, meter, span, call=call, system=system, messages=messages,
                             max_tokens=max_tokens, tools=tools, tool_choice=tool_choice,
                             prefix_cache_ttl=prefix_cache_ttl, limiter=shared, input_tokens=input_tokens)


def model_call_attributes(provider: str, model: str, call: int, max_tokens: int) -> dict[str, Any]:
    """A model call span's request attributes (OpenTelemetry GenAI semantic conventions)."""
    return {"gen_ai.operation.name": "chat", "gen_ai.system": provider, "gen_ai.provider.name": provider,
            "gen_ai.request.model": model, "gen_ai.request.max_tokens": max_tokens, "agentops.model_call": call}


def _metered_call(ctx: ActivityContext, provider: Any, meter: LedgerMeter, span: Any, *, call: int, system: str,
                  messages: list[dict[str, Any]], max_tokens: int, tools: list[dict[str, Any]] | None,
                  tool_choice: dict[str, Any] | None, prefix_cache_ttl: str, limiter: ratelimits.RedisLimiter | None,
                  input_tokens: int) -> ModelResponse:
    started = time.monotonic()
    deltas = (livewire.DeltaBuffer(workflow_id=ctx.workflow_id, operation_id=ctx.operation_id, call=call,
                                   model=provider.model) if livewire.enabled() else None)
    gate: ratelimits.RateGate | None = None
    try:
        with keep_alive(ctx, f"waiting for model call {call}") as beat:
            sent_through: Any = meter
            if limiter is not None:
                # Each request waits for its share here, inside keep_alive: its lease is kept while it
                # waits, and a lease lost meanwhile ends the wait.
                gate = ratelimits.RateGate(limiter=limiter, provider=provider.name, model=provider.model,
                                           tenant=ctx.claim.tenant, kind=ctx.claim.kind, priority=ctx.claim.priority,
                                           input_tokens=input_tokens, max_tokens=max_tokens, stop=lambda: beat.lost)
                sent_through = ratelimits.GatedMeter(meter, gate)
            with lane.waiting():  # the meter takes a turn for its reservations and releases
                response = provider.complete(system=system, messages=messages, max_tokens=max_tokens, tools=tools,
                                             tool_choice=tool_choice, meter=sent_through,
                                             prefix_cache_ttl=prefix_cache_ttl,
                                             **({"on_delta": deltas} if deltas is not None else {}))
        if deltas is not None:
            deltas.flush()
    except AgentOpsError as exc:
        if gate is not None:
            gate.close()
        meter.failed(exc)
        telemetry.failed(span, exc)
        if meter.sent:
            ctx.note("model.called", call=call, model=provider.model, latency_ms=_ms_since(started),
                     request_id=str(getattr(exc, "request_id", "") or ""), error=f"{type(exc).__name__}: {exc}"[:500],
                     status_code=getattr(exc, "status_code", None), requests=meter.sent, **_waited(gate))
        raise
    except BaseException as exc:
        if gate is not None:
            gate.close()
        meter.failed(exc)
        raise
    usage = response.usage
    if gate is not None:
        gate.finish(input_tokens=usage.input_tokens + usage.cache_creation_input_tokens,
                    output_tokens=usage.output_tokens)
    cost, charge = meter.charge(response)
    telemetry.annotate(span, {
        "gen_ai.response.model": provider.model, "gen_ai.response.id": response.request_id or None,
        "gen_ai.response.finish_reasons": [response.stop_reason],
        "gen_ai.usage.input_tokens": usage.input_tokens, "gen_ai.usage.output_tokens": usage.output_tokens,
        "gen_ai.usage.cache_read.input_tokens": usage.cache_read_input_tokens,
        "gen_ai.usage.cache_creation.input_tokens": usage.cache_creation_input_tokens,
        "agentops.cost_usd": float(cost), "agentops.requests": meter.sent})
    if beat.lost is not None and charge is not None:
        charge.run()  # the provider billed it: charged even though the attempt stops here
    beat.raise_if_lost()
    _conversation_remember(ctx, system=system, messages=messages, tools=tools, usage=usage)
    # The charge in the note's statement: charged whether or not the attempt still holds its lease.
    ctx.note_with(charge, "model.called", call=call, model=provider.model, latency_ms=_ms_since(started),
             request_id=response.request_id, stop_reason=response.stop_reason, input_tokens=usage.input_tokens,
             output_tokens=usage.output_tokens, cache_read_tokens=usage.cache_read_input_tokens,
             cache_write_tokens=usage.cache_creation_input_tokens,
             cache_write_1h_tokens=usage.cache_creation_1h_input_tokens, cost_usd=str(cost), requests=meter.sent,
             **_waited(gate))
    return response


def _waited(gate: ratelimits.RateGate | None) -> dict[str, int]:
    """``rate_wait_ms``: how long the call's requests waited for their share of the rate limits."""
    return {"rate_wait_ms": round(gate.waited_seconds * 1000)} if gate is not None and gate.waited_seconds else {}


@dataclass(frozen=True)
class _Conversation:
    """What the last answered call of an attempt sent, and how many tokens it was."""

    system: str
    tools: list[dict[str, Any]] | None
    messages: list[dict[str, Any]]  # a shallow copy: the same message objects, in order
    tokens: int  # the request's input as the provider reported it, plus the answer's output


# The last answered call of each running attempt, by id() of its context; an entry goes with its context.
_conversations: dict[int, _Conversation] = {}


def _conversation_remember(ctx: ActivityContext, *, system: str, messages: list[dict[str, Any]],
                           tools: list[dict[str, Any]] | None, usage: Usage) -> None:
    tokens = (usage.input_tokens + usage.cache_read_input_tokens + usage.cache_creation_input_tokens
              + usage.output_tokens)
    if id(ctx) not in _conversations:
        weakref.finalize(ctx, _conversations.pop, id(ctx), None)
    _conversations[id(ctx)] = _Conversation(system, tools, list(messages), tokens)


def _continued_conversation_tokens(ctx: ActivityContext, *, system: str, messages: list[dict[str, Any]],
                                   tools: list[dict[str, Any]] | None) -> int | None:
    """The input of a request that continues this attempt's last call (the same system prompt
    and tools, its messages followed by more): that call's reported tokens plus an estimate of
    the messages added (its answer among them); None for any other request."""
    last = _conversations.get(id(ctx))
    if last is None or len(messages) <= len(last.messages) or last.system != system or last.tools != tools:
        return None
    if any(sent is not now for sent, now in zip(last.messages, messages, strict=False)):
        return None
    added = messages[len(last.messages):]
    return last.tokens + len(json.dumps(added, default=str)) // CHARS_PER_TOKEN + 1


class LedgerMeter:
    """The ledger rows of one model call, one per request; the provider reports each request to it
    (``workflows.provider.RequestMeter``).

    ``sending(n)`` runs before request n leaves the process: it reserves ``<operation_id>#<call>
    @<attempt>.<n>`` (a budget check) and returns the headers that tag the request with that key
    (``x-agentops-usage-key``), so the provider's or a gateway's logs can be matched to the row.
    ``answered`` releases a request answered with an error (the API bills none); ``lost`` marks
    one without an answer uncertain, or releases it when it never left (connection refused).
    """

    def __init__(self, ctx: ActivityContext, *, call: int, provider: str, model: str, estimate: Decimal,
                 ledger: Ledger | None = None) -> None:
        self.ctx, self.call, self.provider, self.model, self.estimate = ctx, call, provider, model, estimate
        self.ledger = ledger or DATABASE_LEDGER
        self.sent = 0
        self._open: dict[int, str] = {}  # requests reserved and not yet settled: n -> key
        self._ok: tuple[int, str] | None = None  # the request answered 2xx, (n, request id)

    def key(self, n: int) -> str:
        from workflows.services.budgets import usage_key

        return usage_key(operation_id=self.ctx.operation_id, call=self.call, attempt=self.ctx.attempt, request=n)

    def sending(self, n: int) -> dict[str, str]:
        key = self.key(n)
        with lane.turn():
            self.ledger.reserve(workflow_id=self.ctx.workflow_id, key=key, operation_id=self.ctx.operation_id,
                                attempt=self.ctx.attempt, provider=self.provider, model=self.model,
                                estimate_usd=self.estimate, fence=self.ctx.fence_of(f"model call {self.call}"))
        connection_release_while_waiting()  # the request goes out now; the answer takes seconds
        self._open[n] = key
        self.sent += 1
        return {USAGE_KEY_HEADER: key}

    def answered(self, n: int, *, status: int, request_id: str, rate: RateLimitInfo | None = None) -> None:
        if 200 <= status < 300:
            self._ok = (n, request_id)
            return
        key = self._open.pop(n, None)
        if key is not None:
            with lane.turn():
                self.ledger.release(key=key, reason=f"answered {status}: the API does not bill errors",
                                    http_status=status, request_id=request_id)

    def lost(self, n: int, *, sent: bool, reason: str) -> None:
        key = self._open.pop(n, None)
        if key is None:
            return
        with lane.turn():
            if sent:
                self.ledger.uncertain(key=key, reason=reason)
            else:
                self.ledger.release(key=key, reason=f"never reached the provider: {reason}")

    def charge(self, response: ModelResponse) -> tuple[Decimal, RowWrite | None]:
        """Charge the request that brought ``response``; returns its cost, and the database
        ledger's charge as a write still to make (in the statement of the call's ``model.called``
        note: ``ActivityContext.note_with``), None when the ledger charged it now."""
        return self._settle(usage=response.usage, request_id=response.request_id, deferred=True)

    def failed(self, error: BaseException) -> None:
        """Settle what a failed call leaves open: an answer whose usage the error carries (a
        refusal) is charged; any other request still open had no usable answer and is uncertain."""
        usage = getattr(error, "attrs", {}).get("usage") if isinstance(error, AgentOpsError) else None
        if self._ok is not None and isinstance(usage, dict):
            self._settle(usage=Usage(**usage), request_id=self._ok[1])
        for n in list(self._open):
            self.lost(n, sent=True, reason=f"no usable answer ({type(error).__name__})")

    def _settle(self, *, usage: Usage, request_id: str, deferred: bool = False) -> tuple[Decimal, RowWrite | None]:
        """Charge the answered request ``usage``; its cost, and with ``deferred`` the database
        ledger's charge as a write still to make (``charge``)."""
        n = self._ok[0] if self._ok is not None else max(self._open, default=0)
        key = self._open.pop(n, None) or self.key(n)
        cost = cost_usd(self.model, usage)
        charge: dict[str, Any] = {"key": key, "cost_usd": cost, "usage": usage_fields(usage),
                                  "request_id": request_id or (self._ok[1] if self._ok else "")}
        write = None
        if deferred and self.ledger is DATABASE_LEDGER:
            from workflows.services.budgets import budget_charge_write

            write = budget_charge_write(**charge)
        else:
            self.ledger.charge(**charge)
        for other in list(self._open):  # a provider that reported no outcome for them: unknown
            self.lost(other, sent=True, reason="no outcome reported")
        return cost, write


USAGE_KEY_HEADER = "x-agentops-usage-key"
DATABASE_LEDGER: Ledger = DatabaseLedger()


def _ms_since(started: float) -> int:
    return round((time.monotonic() - started) * 1000)
