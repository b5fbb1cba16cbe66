"""The scripted provider's answers for the harness demo: a schedule of tool calls keyed by (feature, attempt).

The schedule is data (``demo/schedule.json``, or the file AGENTOPS_HARNESS_SCHEDULE_FILE names);
file contents come from ``demo/scaffold/`` and from
``demo/todo.py.in`` rendered with the tags a step names. Each answer is derived from the request
alone (the briefing's feature and attempt, and how many tool results the conversation holds), so
a retried or replayed session gets the same answers. A feature or attempt the schedule does not
know ends the session with a report saying so.

Workflows that share one schedule may play different sessions: a goal that names a variant,
``[script: NAME]``, plays ``NAME:<feature>/<attempt>`` where the schedule has that key, and the
plain key elsewhere (the soak's agents that propose a feature change, ``bench/soak_harness.py``,
beside the ones that do not, all reading one file on every worker).
"""
from __future__ import annotations

import functools
import json
import re
from pathlib import Path
from typing import Any

from django.conf import settings

from agentops.kind import ModelResponse, Usage
from agentops.providers.scripted import offline_turn

DEMO = Path(__file__).resolve().parent / "demo"
TAG = re.compile(r"^#<(?P<close>/?)(?P<negate>!?)(?P<tag>[A-Z0-9]+)>$")
VARIANT = re.compile(r"\[script: *(?P<name>[\w-]+)\]")


def schedule() -> dict[str, list[dict[str, Any]]]:
    """The sessions of AGENTOPS_HARNESS_SCHEDULE_FILE, or of the todo demo when it is empty."""
    return _load(settings.AGENTOPS_HARNESS_SCHEDULE_FILE or str(DEMO / "schedule.json"))


@functools.cache
def _load(path: str) -> dict[str, list[dict[str, Any]]]:
    data: dict[str, list[dict[str, Any]]] = json.loads(Path(path).read_text())["sessions"]
    return data


def render(tags: list[str]) -> str:
    """``todo.py.in`` with the blocks of ``tags`` kept: ``#<T>``…``#</T>`` when T is on,
    ``#<!T>``…``#</!T>`` when it is off (blocks nest)."""
    on, keep, out = set(tags), [True], []
    for raw in (DEMO / "todo.py.in").read_text().splitlines():
        match = TAG.match(raw.strip())
        if match is None:
            if all(keep):
                out.append(raw)
        elif match["close"]:
            keep.pop()
        else:
            keep.append((match["tag"] in on) != bool(match["negate"]))
    return "\n".join(out) + "\n"


def step_call(step: dict[str, Any], number: int) -> dict[str, Any]:
    args = dict(step.get("input", {}))
    if "render" in step:
        args = {"path": step["path"], "content": render(step["render"])}
    elif "scaffold" in step:
        args = {"path": step["path"], "content": (DEMO / "scaffold" / step["scaffold"]).read_text()}
    return {"id": f"toolu_harness_{number}", "name": step["tool"], "input": args}


def _between(text: str, tag: str) -> str:
    match = re.search(rf"<{tag}>(.*?)</{tag}>", text, re.S)
    return match.group(1).strip() if match else ""


@offline_turn("harness_initialize", "harness_session")
def scripted_turn(*, system: str, messages: list[dict[str, Any]]) -> ModelResponse:
    brief = str(messages[0].get("content", "")) if messages else ""
    key = f"{_between(brief, 'feature')}/{_between(brief, 'attempt')}"
    done = sum(1 for m in messages if isinstance(m.get("content"), list)
               for block in m["content"] if isinstance(block, dict) and block.get("type") == "tool_result")
    variant = VARIANT.search(_between(brief, "goal"))
    sessions = schedule()
    steps = sessions.get(f"{variant['name']}:{key}") if variant else None
    if steps is None:
        steps = sessions.get(key)
    usage = Usage(input_tokens=(len(system) + sum(len(str(m.get("content", ""))) for m in messages)) // 4,
                  output_tokens=50)
    if steps is None or done >= len(steps):
        text = f"The demo schedule has no step {done + 1} for {key}; ending the session."
        return ModelResponse(text=text, stop_reason="end_turn", usage=usage)
    call = step_call(steps[done], done)
    return ModelResponse(text="", stop_reason="tool_use", tool_calls=[call], usage=usage)
