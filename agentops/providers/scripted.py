"""The offline scripted provider: deterministic answers, no network, clearly reported as such.

It is a real provider behind the same interface as the anthropic one. Its answers are
derived from the request alone (a hash of the prompt), so a replayed run gets the same
answer and tests can rely on it.
"""
from __future__ import annotations

import hashlib
import json
import re
from typing import Any

from agentops.providers.base import ModelResponse, Usage

TASK_MARKER = re.compile(r"<task>(?P<task>[a-z_]+)</task>")


class ScriptedProvider:
    name = "scripted"

    def __init__(self, *, model: str) -> None:
        self.model = f"scripted/{model}"

    def complete(
        self, *, system: str, messages: list[dict[str, Any]], max_tokens: int, tools: list[dict[str, Any]] | None = None
    ) -> ModelResponse:
        prompt = "\n".join(str(m.get("content", "")) for m in messages)
        match = TASK_MARKER.search(system)
        task = match.group("task") if match else "chat"
        answer = getattr(self, f"_answer_{task}", self._answer_chat)(prompt)
        return ModelResponse(
            text=answer,
            stop_reason="end_turn",
            usage=Usage(input_tokens=(len(system) + len(prompt)) // 4, output_tokens=len(answer) // 4),
        )

    def _answer_chat(self, prompt: str) -> str:
        return "I am the offline scripted provider; set ANTHROPIC_API_KEY for a real model."

    def _answer_propose_change(self, prompt: str) -> str:
        """Propose a small, reviewable change: a release note describing the goal."""
        goal = _between(prompt, "<goal>", "</goal>") or "unspecified goal"
        digest = hashlib.sha256(prompt.encode()).hexdigest()[:8]
        slug = re.sub(r"[^a-z0-9]+", "-", goal.lower()).strip("-")[:40] or "change"
        proposal = {
            "title": f"Release: {goal[:80]}",
            "summary": f"Adds release notes for '{goal[:200]}'. Proposed offline by the scripted provider.",
            "files": {f"release-notes/{slug}-{digest}.md": f"# {goal[:200]}\n\nPrepared by agentops.\n"},
        }
        return json.dumps(proposal)


def _between(text: str, start: str, end: str) -> str:
    i = text.find(start)
    j = text.find(end, i + len(start))
    return text[i + len(start):j].strip() if i >= 0 and j > i else ""
