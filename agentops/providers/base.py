"""The provider interface: one ``complete`` call in the shape of the Messages API."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Protocol


@dataclass(frozen=True)
class Usage:
    input_tokens: int = 0
    output_tokens: int = 0
    cache_read_input_tokens: int = 0
    cache_creation_input_tokens: int = 0


@dataclass(frozen=True)
class ModelResponse:
    """What a model said: text blocks joined, tool calls, why it stopped, and usage."""

    text: str
    stop_reason: str
    usage: Usage
    tool_calls: list[dict[str, Any]] = field(default_factory=list)


class ModelProvider(Protocol):
    name: str
    model: str

    def complete(
        self, *, system: str, messages: list[dict[str, Any]], max_tokens: int, tools: list[dict[str, Any]] | None = None
    ) -> ModelResponse: ...
