"""The offline scripted provider: deterministic answers, no network, clearly reported as such.

It is a real provider behind the same interface as the anthropic one. Its answers are
derived from the request alone (a hash of the prompt), so a replayed run gets the same
answer and tests can rely on it.

A request names its task in the system prompt (``<task>draft_reply</task>``). The shipped kinds'
tasks are answered here; a kind of one's own declares its offline answers in its package with
``offline_answer`` (a function of the request, a fixed text or JSON object) or
``offline_answers_file`` (a JSON file of them), so an offline run of it produces its kind of
output. A task nobody declared is refused (``Permanent``, naming the task and how to declare it):
a placeholder sentence must never become a candidate someone approves.
"""
from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Callable
from pathlib import Path
from typing import Any, overload

from django.conf import settings

from workflows.errors import Permanent
from workflows.provider import ModelResponse, RequestMeter, Usage

TASK_MARKER = re.compile(r"<task>(?P<task>[a-z_]+)</task>")

# What a kind's offline answer may be: a text, a JSON object, or a function of the request
# (``fn(system, messages) -> str | dict``).
Answer = str | dict[str, Any] | Callable[[str, list[dict[str, Any]]], "str | dict[str, Any]"]
AnswerFn = Callable[[str, list[dict[str, Any]]], "str | dict[str, Any]"]
_declared: dict[str, Answer] = {}
TurnFn = Callable[..., ModelResponse]
_turns: dict[str, TurnFn] = {}  # task → the function that plays its tool-using turns (offline_turn)
SHIPPED_TASKS = ("plan_tasks", "execute_task", "verify_goal", "replan", "propose_change", "harness_initialize",
                 "harness_session")


@overload
def offline_answer(task: str) -> Callable[[AnswerFn], AnswerFn]: ...
@overload
def offline_answer(task: str, answer: str | dict[str, Any]) -> None: ...
def offline_answer(task: str, answer: str | dict[str, Any] | None = None) -> Any:
    """Declare what the scripted provider answers a request whose system prompt has
    ``<task>TASK</task>``: a text, a JSON object (a forced tool call gets it as the tool's input;
    otherwise it comes back as JSON text), or, used as a decorator, a function
    ``fn(system, messages) -> str | dict`` of the request (deterministic: a replayed run must
    get the same answer). Call it at import of the kind's package, as ``@activity`` is."""
    if not TASK_MARKER.fullmatch(f"<task>{task}</task>"):
        raise ValueError(f"offline_answer({task!r}): a task is lower-case letters and underscores, "
                         "as in <task>draft_reply</task>.")
    if task in SHIPPED_TASKS:
        raise ValueError(f"offline_answer({task!r}): {task} is a task of a shipped kind; name yours differently.")
    if answer is not None:
        _declared[task] = answer
        return None

    def declare(fn: AnswerFn) -> AnswerFn:
        _declared[task] = fn
        return fn

    return declare


def offline_turn(*tasks: str) -> Callable[[TurnFn], TurnFn]:
    """Declare, as a decorator, the function that plays a tool-using turn of each of ``tasks``
    offline: ``fn(system=…, messages=…) -> ModelResponse`` (the harness's schedule of tool calls),
    called instead of a declared answer when the request carries tools."""
    def declare(fn: TurnFn) -> TurnFn:
        for task in tasks:
            _turns[task] = fn
        return fn

    return declare


def offline_answers_file(path: str | Path) -> None:
    """Declare the offline answers of a JSON file: ``{"task": "text" or {...}, ...}``
    (e.g. ``offline_answers_file(Path(__file__).with_name("offline_answers.json"))``)."""
    try:
        answers = json.loads(Path(path).read_text(encoding="utf-8"))
    except (OSError, json.JSONDecodeError) as exc:
        raise ValueError(f"offline_answers_file({str(path)!r}) cannot be read as JSON: {exc}") from None
    if not isinstance(answers, dict) or not all(isinstance(a, str | dict) for a in answers.values()):
        raise ValueError(f"offline_answers_file({str(path)!r}) must hold one JSON object of task: text or object.")
    for task, answer in answers.items():
        offline_answer(task, answer)


def declared_tasks() -> list[str]:
    """The tasks kinds declared offline answers for."""
    return sorted(_declared)


class ScriptedProvider:
    name = "scripted"

    def __init__(self, *, model: str) -> None:
        self.model = f"scripted/{model}"

    @classmethod
    def from_settings(cls, *, model: str | None = None) -> ScriptedProvider:
        """The provider the settings configure; ``model`` (a release's, ``scripted/…``) overrides AGENTOPS_MODEL."""
        return cls(model=model.removeprefix("scripted/") if model else settings.AGENTOPS_MODEL)

    def complete(
        self, *, system: str, messages: list[dict[str, Any]], max_tokens: int,
        tools: list[dict[str, Any]] | None = None, tool_choice: dict[str, Any] | None = None,
        meter: RequestMeter | None = None, prefix_cache_ttl: str = "5m",
        on_delta: Callable[[dict[str, str]], None] | None = None,
    ) -> ModelResponse:
        """An answer computed in-process: one "request", always answered (all at once, so it
        sends no deltas); a task nobody declared an answer for is refused before anything is
        metered."""
        task = match_task(system)
        if task not in SHIPPED_TASKS and task not in _declared:
            raise unknown_task(task)
        if meter is not None:
            meter.sending(0)
            meter.answered(0, status=200, request_id="")
        prompt = "\n".join(str(m.get("content", "")) for m in messages)
        if task == "execute_task" and tools:
            return self._execute_turn(prompt, messages, system)
        if task in _turns and tools:
            return _turns[task](system=system, messages=messages)
        answer = self._answer(task, system, messages, prompt)
        if tool_choice and tool_choice.get("type") == "tool":
            # A forced tool call: the structured answer comes back as the tool's input, as from Claude.
            try:
                data = json.loads(answer)
            except json.JSONDecodeError:
                data = None
            if not isinstance(data, dict):
                raise Permanent(f"The offline answer declared for task {task!r} is not a JSON object, and the call "
                                f"forces the tool {tool_choice['name']!r}: declare a dict (the tool's input).")
            call = {"id": f"toolu_scripted_{task}", "name": tool_choice["name"], "input": data}
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

    def _answer(self, task: str, system: str, messages: list[dict[str, Any]], prompt: str) -> str:
        """The text of the answer to ``task``: a shipped kind's, else the one a kind declared."""
        shipped = getattr(self, f"_answer_{task}", None)
        if shipped is not None:
            return str(shipped(prompt))
        declared = _declared.get(task)
        if declared is None:  # a shipped task asked for in a shape it is not answered in (no tools)
            raise unknown_task(task)
        value = declared(system, messages) if callable(declared) else declared
        return value if isinstance(value, str) else json.dumps(value)

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


def unknown_task(task: str) -> Permanent:
    """The refusal of a request for a task no kind declared an offline answer for."""
    known = ", ".join(declared_tasks()) or "none"
    asked = (f"has no answer for task {task!r}" if task else
             "was asked without a <task>NAME</task> marker in the system prompt")
    return Permanent(
        f"The offline scripted provider {asked} (tasks kinds declared: {known}). Declare what it answers in your "
        "kind's package with agentops.providers.scripted.offline_answer(\"TASK\", ...) or offline_answers_file(path) "
        "(docs/authoring.md, \"Offline answers\"), or set ANTHROPIC_API_KEY for a real model.")


def match_task(system: str) -> str:
    """The task a system prompt names (``<task>NAME</task>``), or ""."""
    match = TASK_MARKER.search(system)
    return match.group("task") if match else ""


def _usage(system: str, prompt: str, answer: str) -> Usage:
    return Usage(input_tokens=(len(system) + len(prompt)) // 4, output_tokens=len(answer) // 4)


def _between(text: str, start: str, end: str) -> str:
    i = text.find(start)
    j = text.find(end, i + len(start))
    return text[i + len(start):j].strip() if i >= 0 and j > i else ""
