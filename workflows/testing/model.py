"""A fake model and a fake budget ledger: run an activity that calls the model in a unit test.

``ActivityEnvironment(model=FakeModel([...]))`` runs the activity's ``metered_complete`` calls
against ``FakeModel`` and meters them in a ``FakeLedger`` (its ``total_usd``, ``hourly_usd``
limits raise ``BudgetExhausted`` and ``BudgetDeferred`` as the database ledger does): no
database, no provider, no network. What the activity sent is in ``model.calls``; what it cost in
``ledger.spent_usd`` and ``ledger.entries``.
"""
from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass, field
from decimal import Decimal
from typing import Any

from django.conf import settings

from workflows.errors import BudgetDeferred, BudgetExhausted, Throttled
from workflows.leases import Fence
from workflows.provider import ModelResponse, RequestMeter, Usage

__all__ = ["FakeLedger", "FakeModel", "LedgerEntry", "Reply", "Throttle", "cut_off"]


@dataclass(frozen=True)
class Reply:
    """One answer of the fake model. ``data`` is a structured answer: the input of the tool a
    call forces (``tool_choice``), else its JSON as the text. ``usage`` defaults to one token per
    four characters of the request and of the answer, as the scripted provider counts."""

    text: str = ""
    data: dict[str, Any] | None = None
    stop_reason: str = "end_turn"
    usage: Usage | None = None
    tool_calls: tuple[dict[str, Any], ...] = ()


@dataclass(frozen=True)
class Throttle:
    """An answer of 429 (rate limited) or 529 (overloaded): the call raises ``Throttled``, which
    retries the attempt after ``retry_after_seconds`` without using one up."""

    status: int = 429
    retry_after_seconds: float = 30.0


def cut_off(text: str = "", *, data: dict[str, Any] | None = None) -> Reply:
    """An answer stopped by ``max_tokens`` before it was complete."""
    return Reply(text=text, data=data, stop_reason="max_tokens")


Scripted = str | dict[str, Any] | Reply | Throttle | BaseException


class FakeModel:
    """A model provider that plays ``answers`` in order, one per call: a text, a dict (a
    structured answer), a ``Reply``, a ``Throttle``, ``cut_off(...)``, or an exception to raise.
    ``calls`` records each request (``system``, ``messages``, ``max_tokens``, ``tools``,
    ``tool_choice``). A call past the last answer fails the test, naming what was asked."""

    name = "fake"

    def __init__(self, answers: list[Scripted] | None = None, *, model: str = "") -> None:
        self.answers = list(answers or [])
        self.model = model or settings.AGENTOPS_MODEL
        self.calls: list[dict[str, Any]] = []

    def complete(
        self, *, system: str, messages: list[dict[str, Any]], max_tokens: int,
        tools: list[dict[str, Any]] | None = None, tool_choice: dict[str, Any] | None = None,
        meter: RequestMeter | None = None, prefix_cache_ttl: str = "5m",
        on_delta: Callable[[dict[str, str]], None] | None = None,
    ) -> ModelResponse:
        """The next scripted answer, all at once (no deltas)."""
        self.calls.append({"system": system, "messages": json.loads(json.dumps(messages, default=str)),
                           "max_tokens": max_tokens, "tools": tools, "tool_choice": tool_choice})
        n = len(self.calls) - 1
        if n >= len(self.answers):
            raise AssertionError(f"The activity made model call {n} but the FakeModel has {len(self.answers)} "
                                 f"answer(s); the system prompt begins {system[:80]!r}.")
        answer = self.answers[n]
        if meter is not None:
            meter.sending(0)
        if isinstance(answer, Throttle):
            if meter is not None:
                meter.answered(0, status=answer.status, request_id=f"fake-{n}")
            raise Throttled(f"The fake model answered {answer.status}.", status_code=answer.status,
                            retry_after_seconds=answer.retry_after_seconds)
        if isinstance(answer, BaseException):
            if meter is not None:
                meter.lost(0, sent=True, reason=f"{type(answer).__name__}: {answer}")
            raise answer
        if meter is not None:
            meter.answered(0, status=200, request_id=f"fake-{n}")
        return self._response(answer, n=n, system=system, messages=messages, tool_choice=tool_choice)

    def count_tokens(self, *, system: str, messages: list[dict[str, Any]],
                     tools: list[dict[str, Any]] | None = None) -> int | None:
        return None

    def _response(self, answer: str | dict[str, Any] | Reply, *, n: int, system: str,
                  messages: list[dict[str, Any]], tool_choice: dict[str, Any] | None) -> ModelResponse:
        reply = answer if isinstance(answer, Reply) else (
            Reply(text=answer) if isinstance(answer, str) else Reply(data=answer))
        text, calls = reply.text, [dict(c) for c in reply.tool_calls]
        forced = tool_choice.get("name") if tool_choice and tool_choice.get("type") == "tool" else None
        if reply.data is not None and forced:
            calls.append({"id": f"toolu_fake_{n}", "name": forced, "input": reply.data})
        elif reply.data is not None:
            text = text or json.dumps(reply.data)
        stop = reply.stop_reason if reply.stop_reason != "end_turn" or not calls else "tool_use"
        written = text + json.dumps(calls)
        usage = reply.usage or Usage(input_tokens=(len(system) + len(json.dumps(messages, default=str))) // 4,
                                     output_tokens=len(written) // 4)
        return ModelResponse(text=text, stop_reason=stop, usage=usage, tool_calls=calls, request_id=f"fake-{n}")


@dataclass
class LedgerEntry:
    """One request in the fake ledger: reserved, then charged, released or uncertain."""

    key: str
    model: str
    reserved_usd: Decimal
    status: str = "reserved"
    cost_usd: Decimal = Decimal(0)
    usage: dict[str, int] = field(default_factory=dict)
    reason: str = ""


@dataclass
class FakeLedger:
    """The usage ledger in memory, with the database ledger's rules: a reservation over
    ``total_usd`` raises ``BudgetExhausted`` (the workflow would pause for a person), over
    ``hourly_usd`` ``BudgetDeferred`` (the attempt would wait; the fake has no clock: everything
    counts as this hour)."""

    total_usd: Decimal | None = None
    hourly_usd: Decimal | None = None
    entries: dict[str, LedgerEntry] = field(default_factory=dict)

    @property
    def spent_usd(self) -> Decimal:
        """What counts against the budget: charges, and the estimates of open or uncertain requests."""
        return sum((e.cost_usd if e.status == "charged" else e.reserved_usd
                    for e in self.entries.values() if e.status != "released"), Decimal(0))

    def reserve(self, *, workflow_id: int, key: str, operation_id: str, attempt: int, provider: str, model: str,
                estimate_usd: Decimal, fence: Fence) -> bool:
        fence.check()
        if key in self.entries:
            return False
        for limit, error in ((self.total_usd, BudgetExhausted), (self.hourly_usd, BudgetDeferred)):
            if limit is not None and self.spent_usd + estimate_usd > Decimal(str(limit)):
                extra = {"retry_after_seconds": 3600.0} if error is BudgetDeferred else {}
                raise error(f"Workflow {workflow_id} has used {self.spent_usd:.4f} USD and the next call may cost up "
                            f"to {estimate_usd:.4f}; the fake ledger's limit is {Decimal(str(limit)):.4f}.",
                            workflow_id=workflow_id, **extra)
        self.entries[key] = LedgerEntry(key=key, model=model, reserved_usd=estimate_usd)
        return True

    def charge(self, *, key: str, cost_usd: Decimal, usage: dict[str, int], request_id: str) -> bool:
        return self._settle(key, "charged", cost_usd=cost_usd, usage=usage)

    def release(self, *, key: str, reason: str, http_status: int | None = None, request_id: str = "") -> bool:
        return self._settle(key, "released", reason=reason)

    def uncertain(self, *, key: str, reason: str) -> bool:
        entry = self.entries.get(key)
        if entry is None or entry.status != "reserved":
            return False
        entry.status, entry.reason = "uncertain", reason
        return True

    def _settle(self, key: str, status: str, *, cost_usd: Decimal = Decimal(0), usage: dict[str, int] | None = None,
                reason: str = "") -> bool:
        entry = self.entries.get(key)
        if entry is None or entry.status not in ("reserved", "uncertain"):
            return False
        entry.status, entry.cost_usd, entry.usage, entry.reason = status, cost_usd, dict(usage or {}), reason
        return True
