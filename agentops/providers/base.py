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


class ModelProvider(Protocol):
    name: str
    model: str

    def complete(
        self, *, system: str, messages: list[dict[str, Any]], max_tokens: int,
        tools: list[dict[str, Any]] | None = None, tool_choice: dict[str, Any] | None = None,
    ) -> ModelResponse:
        """One Messages API call; ``tool_choice`` (``{"type": "tool", "name": …}``) forces a tool call."""
        ...
