"""The provider interface: one ``complete`` call in the shape of the Messages API."""
from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Protocol

from workflows.ratelimits.limiter import RateLimitInfo


@dataclass(frozen=True)
class Usage:
    input_tokens: int = 0
    output_tokens: int = 0
    cache_read_input_tokens: int = 0
    cache_creation_input_tokens: int = 0
    # The part of cache_creation_input_tokens written with the 1-hour TTL (priced higher).
    cache_creation_1h_input_tokens: int = 0


@dataclass(frozen=True)
class ModelResponse:
    """What a model said: text blocks joined, tool calls, why it stopped, and usage."""

    text: str
    stop_reason: str
    usage: Usage
    tool_calls: list[dict[str, Any]] = field(default_factory=list)
    # The assistant's content blocks as plain JSON-able dicts (text, tool_use, thinking, …), to be
    # sent back verbatim in a tool_use → tool_result round trip; empty from providers that answer
    # with text and tool calls only (``assistant_turn`` then rebuilds the blocks).
    content: list[dict[str, Any]] = field(default_factory=list)
    request_id: str = ""

    def assistant_turn(self) -> dict[str, Any]:
        """This answer as the assistant message of the next request."""
        blocks = self.content or [
            *([{"type": "text", "text": self.text}] if self.text else []),
            *({"type": "tool_use", **call} for call in self.tool_calls),
        ]
        return {"role": "assistant", "content": blocks}


class RequestMeter(Protocol):
    """Told about every request a ``complete`` call sends, retries included (the usage ledger,
    ``workflows.metering.LedgerMeter``). ``n`` numbers the call's requests from 0."""

    def sending(self, n: int) -> dict[str, str]:
        """Before request ``n`` leaves the process; may raise to stop it (over budget). Returns
        headers to send with it."""
        ...

    def answered(self, n: int, *, status: int, request_id: str, rate: RateLimitInfo | None = None) -> None:
        """Request ``n`` was answered with HTTP ``status``; ``rate`` is what the answer said about
        the provider's rate limits (its headers), None when it said nothing."""
        ...

    def lost(self, n: int, *, sent: bool, reason: str) -> None:
        """Request ``n`` got no answer: ``sent`` when it may have reached the provider (a read
        timeout, a dropped connection), False when it surely did not (connection refused)."""
        ...


class ModelProvider(Protocol):
    name: str
    model: str

    def complete(
        self, *, system: str, messages: list[dict[str, Any]], max_tokens: int,
        tools: list[dict[str, Any]] | None = None, tool_choice: dict[str, Any] | None = None,
        meter: RequestMeter | None = None, prefix_cache_ttl: str = "5m",
        on_delta: Callable[[dict[str, str]], None] | None = None,
    ) -> ModelResponse:
        """One Messages API call; ``tool_choice`` (``{"type": "tool", "name": …}``) forces a tool
        call; ``meter`` is told about each HTTP request the call sends; ``prefix_cache_ttl``
        ("5m" or "1h") is the prompt-cache lifetime of the stable prefix (tools and system);
        ``on_delta``, when given, is told the answer's partial text (``{"text": …}``) and tool input
        (``{"tool_input": …}``) while it comes (workflows.livewire); it never changes the answer."""
        ...

    def count_tokens(
        self, *, system: str, messages: list[dict[str, Any]], tools: list[dict[str, Any]] | None = None,
    ) -> int | None:
        """The request's input tokens as the provider counts them, or None when it cannot say
        (the caller then estimates from the prompt's length)."""
        ...
