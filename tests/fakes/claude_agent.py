"""A fake Claude for the autonomous agent: answers the fake API's requests the way Claude would.

It plans three tasks and works each one with tools the way a careful agent does (look around,
read the two documents of the workspace, write a note, read it back, check it sits with the
other notes, report: seven model calls), then judges the goal from the task list. Structured
answers come as the forced tool call when the request forces one, else as JSON in a fenced
block with a sentence before it, as Claude often writes them.
"""
from __future__ import annotations

import json
import re
from typing import Any

from tests.fakes import anthropic_api as fake
from tests.fakes.anthropic_api import Answer

TASKS = [
    {"title": "Summarise the guide", "instructions": "Read docs/guide.md and docs/faq.md; write what matters."},
    {"title": "List open questions", "instructions": "From the documents, list what is still undecided."},
    {"title": "Draft the onboarding note", "instructions": "Write a one-page note for a newcomer."},
]

# Two documents of ~3.9 KB each (read_file returns at most 4000 characters).
GUIDE = "".join(f"Section {n}: the service keeps its state in PostgreSQL and replays recorded steps. " * 3 + "\n"
                for n in range(16))
FAQ = "".join(f"Q{n}: what happens when a worker dies? A: its lease runs out and another attempt resumes. " * 2
              + "\n" for n in range(20))


def task_of(body: dict[str, Any]) -> str:
    system = body.get("system")
    text = system[0]["text"] if isinstance(system, list) else str(system or "")
    match = re.search(r"<task>([a-z_]+)</task>", text)
    return match.group(1) if match else "chat"


def structured(body: dict[str, Any], value: dict[str, Any], *, preamble: str) -> Answer:
    choice = body.get("tool_choice") or {}
    if choice.get("type") == "tool":
        return fake.tool_use(choice["name"], value)
    return fake.fenced_json(value, preamble=preamble)


def tool_results(body: dict[str, Any]) -> int:
    return sum(1 for m in body["messages"] if isinstance(m.get("content"), list)
               for block in m["content"] if block.get("type") == "tool_result")


def first_text(body: dict[str, Any]) -> str:
    content = body["messages"][0]["content"]
    return content if isinstance(content, str) else content[0].get("text", "")


class ClaudeForAutonomous:
    """``api.responder = ClaudeForAutonomous()``: plays every model call of an autonomous workflow."""

    def __init__(self) -> None:
        self.calls: dict[str, int] = {}

    def __call__(self, body: dict[str, Any]) -> Answer:
        task = task_of(body)
        self.calls[task] = self.calls.get(task, 0) + 1
        if task in ("plan_tasks", "replan"):
            return structured(body, {"tasks": TASKS}, preamble="Here is the plan:")
        if task == "verify_goal":
            return structured(body, self.verdict(first_text(body)), preamble="My assessment:")
        if task == "execute_task":
            return self.work(body)
        return fake.text("Hello.")

    def work(self, body: dict[str, Any]) -> Answer:
        title = re.search(r"<task_title>(.*?)</task_title>", first_text(body))
        slug = re.sub(r"[^a-z0-9]+", "-", (title.group(1) if title else "task").lower()).strip("-")
        step = tool_results(body)
        if step == 0:
            return fake.tool_use("list_files", {"path": "."}, say="Let me look at the workspace first.")
        if step == 1:
            return fake.tool_use("read_file", {"path": "docs/guide.md"}, say="I'll read the guide.")
        if step == 2:
            return fake.tool_use("read_file", {"path": "docs/faq.md"}, say="Now the FAQ.")
        if step == 3:
            note = f"# {slug}\n\n" + "- the state lives in PostgreSQL; a dead worker's lease runs out.\n" * 8
            return fake.tool_use("write_file", {"path": f"notes/{slug}.md", "content": note},
                                 say="Writing the note.")
        if step == 4:
            return fake.tool_use("read_file", {"path": f"notes/{slug}.md"}, say="Checking what I wrote.")
        if step == 5:
            return fake.tool_use("list_files", {"path": "notes"}, say="And that it sits with the other notes.")
        return fake.text(f"Read the guide and the FAQ and wrote notes/{slug}.md with what a newcomer needs.")

    @staticmethod
    def verdict(prompt: str) -> dict[str, Any]:
        lines = [line for line in prompt.splitlines() if line.startswith("- [")]
        done = [line[2:] for line in lines if line.startswith("- [done]")]
        met = bool(lines) and len(done) == len(lines)
        return {"goal_met": met, "reason": f"{len(done)} of {len(lines)} tasks done.",
                "progress": {"percent": round(100 * len(done) / max(len(lines), 1)), "achievements": done,
                             "remaining": [line[2:] for line in lines if not line.startswith("- [done]")],
                             "confidence": 0.9, "estimated_hours_left": 0 if met else 1}}


def seed_workspace(root: Any) -> None:
    (root / "docs").mkdir(parents=True, exist_ok=True)
    (root / "docs" / "guide.md").write_text(GUIDE)
    (root / "docs" / "faq.md").write_text(FAQ)


__all__ = ["ClaudeForAutonomous", "json", "seed_workspace"]
