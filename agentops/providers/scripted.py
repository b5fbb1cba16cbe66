"""The offline scripted provider: deterministic answers, no network, clearly reported as such.

It is a real provider behind the same interface as the anthropic one. Its answers are
derived from the request alone (a hash of the prompt), so a replayed run gets the same
answer and tests can rely on it.
"""
from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Callable
from typing import Any

from agentops.providers.base import ModelResponse, RequestMeter, Usage

TASK_MARKER = re.compile(r"<task>(?P<task>[a-z_]+)</task>")


class ScriptedProvider:
    name = "scripted"

    def __init__(self, *, model: str) -> None:
        self.model = f"scripted/{model}"

    def complete(
        self, *, system: str, messages: list[dict[str, Any]], max_tokens: int,
        tools: list[dict[str, Any]] | None = None, tool_choice: dict[str, Any] | None = None,
        meter: RequestMeter | None = None, prefix_cache_ttl: str = "5m",
        on_delta: Callable[[dict[str, str]], None] | None = None,
    ) -> ModelResponse:
        """An answer computed in-process: one "request", always answered (all at once, so it
        sends no deltas)."""
        if meter is not None:
            meter.sending(0)
            meter.answered(0, status=200, request_id="")
        prompt = "\n".join(str(m.get("content", "")) for m in messages)
        match = TASK_MARKER.search(system)
        task = match.group("task") if match else "chat"
        if task == "execute_task" and tools:
            return self._execute_turn(prompt, messages, system)
        if task in ("harness_initialize", "harness_session") and tools:
            # The harness demo's schedule: data files of that package, keyed by (feature, attempt).
            from agentops.agents.harness.script import scripted_turn

            return scripted_turn(system=system, messages=messages)
        answer = getattr(self, f"_answer_{task}", self._answer_chat)(prompt)
        if tool_choice and tool_choice.get("type") == "tool":
            # A forced tool call: the structured answer comes back as the tool's input, as from Claude.
            call = {"id": f"toolu_scripted_{task}", "name": tool_choice["name"], "input": json.loads(answer)}
            return ModelResponse(text="", stop_reason="tool_use", tool_calls=[call],
                                 usage=_usage(system, prompt, answer))
        return ModelResponse(text=answer, stop_reason="end_turn", usage=_usage(system, prompt, answer))

    def count_tokens(
        self, *, system: str, messages: list[dict[str, Any]], tools: list[dict[str, Any]] | None = None,
    ) -> int | None:
        """No tokenizer offline: the caller's estimate from the prompt's length stands."""
        return None

    def _execute_turn(self, prompt: str, messages: list[dict[str, Any]], system: str) -> ModelResponse:
        """Write a note for the task, look at the workspace, then report: three turns, always the same."""
        done_calls = sum(
            1 for m in messages if isinstance(m.get("content"), list)
            for block in m["content"] if isinstance(block, dict) and block.get("type") == "tool_result"
        )
        title = _between(prompt, "<task_title>", "</task_title>") or "task"
        slug = re.sub(r"[^a-z0-9]+", "-", title.lower()).strip("-")[:40] or "task"
        if done_calls == 0:
            content = f"# {title}\n\nGoal: {_between(prompt, '<goal>', '</goal>')}\n\nDone by the scripted agent.\n"
            call = {"id": f"toolu_{slug}_1", "name": "write_file", "input": {"path": f"notes/{slug}.md",
                                                                           "content": content}}
        elif done_calls == 1:
            call = {"id": f"toolu_{slug}_2", "name": "list_files", "input": {"path": "notes"}}
        else:
            text = f"Wrote notes/{slug}.md for '{title}' and checked it is in the workspace."
            return ModelResponse(text=text, stop_reason="end_turn", usage=_usage(system, prompt, text))
        return ModelResponse(text="", stop_reason="tool_use", tool_calls=[call],
                             usage=_usage(system, prompt, json.dumps(call)))

    def _answer_plan_tasks(self, prompt: str) -> str:
        goal = _between(prompt, "<goal>", "</goal>")[:120] or "the goal"
        return json.dumps({"tasks": [
            {"title": "Write a brief",
             "instructions": f"Describe what '{goal}' means and how we will know it is done."},
            {"title": "Lay out the steps", "instructions": "Write the steps to reach the goal, in order."},
            {"title": "Record the outcome", "instructions": "Write down what was produced and what is left."},
        ]})

    def _answer_verify_goal(self, prompt: str) -> str:
        lines = [line for line in _between(prompt, "<tasks>", "</tasks>").splitlines() if line.startswith("- [")]
        done = sum(line.startswith("- [done]") for line in lines)
        percent = round(100 * done / len(lines)) if lines else 0
        met = bool(lines) and done == len(lines)
        return json.dumps({
            "goal_met": met,
            "reason": f"{done} of {len(lines)} tasks done" + ("; the goal is met." if met else "; work remains."),
            "progress": {"percent": percent,
                         "achievements": [ln[2:][:200] for ln in lines if ln.startswith("- [done]")],
                         "remaining": [ln[2:][:200] for ln in lines if not ln.startswith("- [done]")],
                         "confidence": 0.8, "estimated_hours_left": 0 if met else 1},
        })

    def _answer_replan(self, prompt: str) -> str:
        lines = _between(prompt, "<tasks>", "</tasks>").splitlines()
        retry = [ln.split("] ", 1)[1].split(":", 1)[0] for ln in lines if ln.startswith("- [skipped]")]
        tasks = [{"title": f"Retry {title}"[:200], "instructions": "Try again, more simply."} for title in retry]
        return json.dumps({"tasks": tasks or [{"title": "Finish the goal", "instructions": "Close the gaps left."}]})

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


def _usage(system: str, prompt: str, answer: str) -> Usage:
    return Usage(input_tokens=(len(system) + len(prompt)) // 4, output_tokens=len(answer) // 4)


def _between(text: str, start: str, end: str) -> str:
    i = text.find(start)
    j = text.find(end, i + len(start))
    return text[i + len(start):j].strip() if i >= 0 and j > i else ""
