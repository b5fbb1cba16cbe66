"""Activities of the ``autonomous`` agent: planning, a tool-use loop per task, verification, re-planning.

Every model call goes through ``metered_complete`` (budgets). Tools act only inside the
workflow's own workspace directory; each tool call is recorded in the event history.
"""
from __future__ import annotations

import json
import shlex
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypedDict

from django.conf import settings

from agentops import sandbox
from agentops.kind import (
    MODEL_CALL_LEASE,
    ActivityContext,
    InvalidInput,
    Permanent,
    Retryable,
    RetryPolicy,
    activity,
    annotate,
    keep_alive,
    metered_complete,
    progress_validate,
    tool_span,
)
from agentops.providers.answers import AnswerTool, ask_structured
from agentops.sandbox import files
from agentops.steering import steered

MAX_TASKS = 12
MAX_TURNS = 8
MAX_OUTPUT_CHARS = 4000
COMMAND_TIMEOUT_SECONDS = 60
TASK_RETRY = RetryPolicy(max_attempts=3, initial_interval_seconds=2.0, backoff=2.0)
# Model-calling activities hold a short lease (agentops.kind.MODEL_CALL_LEASE): metered_complete
# and the tool calls below heartbeat it from a background thread while they wait. They are
# io_bound: they go to the I/O queue, where a threads-pool worker keeps hundreds in flight.

TOOLS: list[dict[str, Any]] = [
    {"name": "list_files", "description": "List files under a directory of the workspace.",
     "input_schema": {"type": "object", "properties": {"path": {"type": "string"}}}},
    {"name": "read_file", "description": "Read a text file of the workspace.",
     "input_schema": {"type": "object", "properties": {"path": {"type": "string"}}, "required": ["path"]}},
    {"name": "write_file", "description": "Write a text file in the workspace (creates folders).",
     "input_schema": {"type": "object", "properties": {"path": {"type": "string"}, "content": {"type": "string"}},
                      "required": ["path", "content"]}},
    {"name": "run_command", "description": "Run a command (no shell) in the workspace with a timeout.",
     "input_schema": {"type": "object", "properties": {"command": {"type": "string"},
                                                       "timeout_seconds": {"type": "integer"}},
                      "required": ["command"]}},
]


def workspace(ctx: ActivityContext) -> Path:
    root = Path(settings.AGENTOPS_WORKSPACE_DIR) / f"wf-{ctx.workflow_id}"
    root.mkdir(parents=True, exist_ok=True)
    return root.resolve()


class Task(TypedDict, total=False):
    """One task of the plan, as the definition stores it in its state."""

    id: int
    title: str
    instructions: str
    status: str
    round: int
    summary: str
    reason: str


class Plan(TypedDict):
    tasks: list[Task]


@dataclass(frozen=True)
class PlanInput:
    goal: str


@dataclass(frozen=True)
class TaskInput:
    goal: str
    task: Task


class TaskOutcome(TypedDict):
    summary: str
    turns: int


@dataclass(frozen=True)
class VerifyInput:
    goal: str
    tasks: list[Task]


class Verdict(TypedDict):
    goal_met: bool
    reason: str
    progress: Any


@dataclass(frozen=True)
class ReplanInput:
    goal: str
    tasks: list[Task]
    verdict: Verdict | None = None
    stagnation: Any = None


def validate_tasks(data: dict[str, Any]) -> list[Task]:
    """Model output is data: a list of 1–12 tasks, each a short title and instructions."""
    tasks = data.get("tasks")
    if not isinstance(tasks, list) or not 0 < len(tasks) <= MAX_TASKS:
        raise InvalidInput(f"The model's plan must list between 1 and {MAX_TASKS} tasks.")
    clean: list[Task] = []
    for number, task in enumerate(tasks, start=1):
        if not isinstance(task, dict) or not isinstance(task.get("title"), str) or not task["title"].strip():
            raise InvalidInput(f"Task {number} of the model's plan has no title.")
        instructions = task.get("instructions", "")
        if not isinstance(instructions, str) or len(instructions) > 4000 or len(task["title"]) > 200:
            raise InvalidInput(f"Task {number} of the model's plan is too long or malformed.")
        clean.append({"id": number, "title": task["title"].strip(), "instructions": instructions})
    return clean


PLAN_TOOL = AnswerTool("submit_plan", "Submit the ordered list of tasks that reaches the goal.", {
    "type": "object", "required": ["tasks"], "properties": {"tasks": {
        "type": "array", "minItems": 1, "maxItems": MAX_TASKS, "items": {
            "type": "object", "required": ["title", "instructions"], "properties": {
                "title": {"type": "string", "maxLength": 200}, "instructions": {"type": "string", "maxLength": 4000}},
        }}},
})

PLAN_SYSTEM = ("<task>plan_tasks</task>\nBreak the goal into a short ordered list of concrete tasks. Answer by "
               "calling submit_plan.")


def _plan(data: dict[str, Any]) -> Plan:
    return {"tasks": validate_tasks(data)}


@activity("plan_tasks", retry=RetryPolicy(max_attempts=4, initial_interval_seconds=2.0),
          lease_seconds=MODEL_CALL_LEASE, io_bound=True)
def plan_tasks(ctx: ActivityContext, input: PlanInput) -> Plan:
    plan, _ = ask_structured(ctx, system=PLAN_SYSTEM, prompt=f"<goal>{input.goal}</goal>", tool=PLAN_TOOL,
                             validate=_plan, max_tokens=1500, what="plan", steer=True)
    return plan


EXECUTE_SYSTEM = ("<task>execute_task</task>\nYou carry out one task inside a workspace directory using the tools. "
                  "When the task is done, answer with a one-paragraph summary of what you did.")


@activity("execute_task", retry=TASK_RETRY, lease_seconds=MODEL_CALL_LEASE, io_bound=True)
def execute_task(ctx: ActivityContext, input: TaskInput) -> TaskOutcome:
    """A tool-use loop: the model asks for tools, we run them in the workspace and send results back.

    The conversation is checkpointed after each turn (AGENTOPS_CHECKPOINT_SECONDS, 0 by default:
    every turn): a retried attempt carries on from the last saved turn instead of redoing its
    tool calls. The lease is heartbeated while the model answers and while a tool runs.
    """
    task = input.task
    root = workspace(ctx)
    messages: list[dict[str, Any]] = [{"role": "user", "content": (
        f"<goal>{input.goal}</goal>\n<task_title>{task['title']}</task_title>\n"
        f"<instructions>{task['instructions']}</instructions>")}]
    first_turn = 0
    if ctx.resume is not None:
        messages, first_turn = ctx.resume["messages"], ctx.resume["turn"]
        ctx.note("task.resumed", task=task["id"], turn=first_turn)
    stopped = ""
    for turn in range(first_turn, MAX_TURNS):
        ctx.faultpoint("activity.before_external_call", turn=turn)
        # Steer messages join the conversation kept (and checkpointed) below.
        messages = steered(ctx, call=turn, messages=messages)
        response = metered_complete(ctx, call=turn, system=EXECUTE_SYSTEM, messages=messages, max_tokens=2000,
                                    tools=TOOLS)
        stopped = response.stop_reason
        if stopped == "model_context_window_exceeded":
            raise Permanent(f"Task {task['id']} ({task['title']}) filled the model's context window after {turn + 1} "
                            "turns; split the task or give it less to read.")
        if stopped in UNFINISHED:
            messages.extend(_carry_on(response))
            continue
        if not response.tool_calls:
            return {"summary": response.text[:2000] or "done", "turns": turn + 1}
        messages.append(response.assistant_turn())
        results = []
        tool_notes: list[tuple[str, dict[str, Any]]] = []  # recorded with the turn's checkpoint
        for n, call in enumerate(response.tool_calls):
            # A taken-over or unwanted attempt must not touch the workspace the current one uses. The
            # first tool's fence is the call's model.called note, metered_complete's last write.
            if n:
                ctx.fence(f"tool {call['name']}")
            with (tool_span(call["name"]) as span,
                  keep_alive(ctx, f"task {task['id']} turn {turn + 1}: tool {call['name']}") as beat):
                ok, output, isolation = run_tool_isolated(root, call["name"], call.get("input") or {})
                annotate(span, {"agentops.tool.ok": ok})
            beat.raise_if_lost()
            tool_notes.append(("tool.called", {
                "tool": call["name"], "input": sandbox.redact(_short(call.get("input"))), "ok": ok,
                "output": output[:300], **({"isolation": isolation} if isolation else {})}))
            results.append({"type": "tool_result", "tool_use_id": call["id"], "content": output, "is_error": not ok})
        messages.append({"role": "user", "content": results})
        progress = f"task {task['id']} turn {turn + 1}"
        if not ctx.checkpoint({"messages": messages, "turn": turn + 1}, progress, notes=tool_notes):
            ctx.heartbeat(progress)
    if stopped in UNFINISHED:
        raise Retryable(f"Task {task['id']} ({task['title']}) was still unfinished after {MAX_TURNS} model turns, the "
                        f"last one stopped by {stopped}; the next attempt resumes from the last checkpoint.")
    raise Permanent(f"Task {task['id']} ({task['title']}) did not finish within {MAX_TURNS} model turns.")


# Stop reasons that are not a finished answer: cut off by the output limit, or a server-side
# pause of a long turn. The turn goes on (within MAX_TURNS); its tool calls, possibly cut off
# mid-input, are not run.
UNFINISHED = frozenset({"max_tokens", "pause_turn"})


def _carry_on(response: Any) -> list[dict[str, Any]]:
    """The turns that let the model go on after an unfinished answer.

    ``pause_turn`` is continued by sending the assistant turn back as it is. A ``max_tokens``
    cut-off keeps the text said so far (a half-written tool call cannot be sent back without
    its result) and asks the model to carry on in shorter steps."""
    if response.stop_reason == "pause_turn":
        return [response.assistant_turn()]
    said = [block for block in response.assistant_turn()["content"] if block.get("type") == "text" and block["text"]]
    return [*([{"role": "assistant", "content": said}] if said else []), {"role": "user", "content": (
        "Your last answer was cut off at the output limit (max_tokens) and was not used. Carry on from there "
        "in shorter steps: one tool call at a time, and a short summary when the task is done.")}]


def _short(value: Any) -> str:
    return json.dumps(value, default=str)[:300]


def run_tool(root: Path, name: str, args: dict[str, Any]) -> tuple[bool, str]:
    """Run one tool confined to ``root``; returns (ok, output). Bad input is an error result, not a crash."""
    ok, output, _ = run_tool_isolated(root, name, args)
    return ok, output


def run_tool_isolated(root: Path, name: str, args: dict[str, Any]) -> tuple[bool, str, str]:
    """``run_tool``, plus the isolation a command ran under ("bwrap", "none"; "" for other tools).

    The output is text the database can store: NUL characters (a binary file read, a command's
    raw bytes) are shown as ``\\x00``; and known secret values are ``[redacted]`` before it
    reaches an event, a checkpoint or the model (``sandbox.redact``).
    """
    isolation = ""
    if name == "run_command":
        ok, output, isolation = _run_command_tool(root, args)
    else:
        ok, output = _run_tool(root, name, args)
    return ok, sandbox.redact(output.replace("\x00", "\\x00")), isolation


def _run_command_tool(root: Path, args: dict[str, Any]) -> tuple[bool, str, str]:
    try:
        return _run(root, str(args["command"]), int(args.get("timeout_seconds") or 30))
    except (KeyError, ValueError, OSError) as exc:
        return False, f"{type(exc).__name__}: {exc}", ""


def _run_tool(root: Path, name: str, args: dict[str, Any]) -> tuple[bool, str]:
    try:
        if name == "list_files":
            listed = files.list_files(root, str(args.get("path") or "."), limit=500)
            return True, "\n".join(listed) or "(no files)"
        if name == "read_file":
            return True, files.read_text(root, str(args["path"]))[:MAX_OUTPUT_CHARS]
        if name == "write_file":
            content = str(args["content"])
            if len(content) > 200_000:
                return False, "content is over 200,000 characters"
            sandbox.resource_limits.room_check(root, adding_bytes=len(content.encode()))
            return True, f"wrote {len(content)} characters to {files.write_text(root, str(args['path']), content)}"
        return False, f"unknown tool {name!r}; tools are {', '.join(t['name'] for t in TOOLS)}"
    except (KeyError, ValueError, OSError, UnicodeDecodeError) as exc:
        return False, f"{type(exc).__name__}: {exc}"


def _run(root: Path, command: str, timeout: int) -> tuple[bool, str, str]:
    """Run a command in the sandbox (agentops/sandbox/); returns (ok, output, isolation)."""
    argv = shlex.split(command)
    if not argv:
        return False, "empty command", ""
    timeout = max(1, min(timeout, COMMAND_TIMEOUT_SECONDS))
    try:
        done = sandbox.run(argv, workspace=root, timeout_seconds=timeout, max_output_bytes=4 * MAX_OUTPUT_CHARS)
    except FileNotFoundError:
        return False, f"command {argv[0]!r} not found", sandbox.isolation()
    output = sandbox.redacted_tail(done.output, MAX_OUTPUT_CHARS)
    if done.limit_hit:
        return False, f"command stopped: {done.limit_note()} (sandbox: {done.isolation})\n{output}", done.isolation
    if done.timed_out:
        return False, f"command timed out after {timeout} s and was stopped (sandbox: {done.isolation})\n{output}", \
            done.isolation
    return done.exit_code == 0, f"exit {done.exit_code} (sandbox: {done.isolation})\n{output}", done.isolation


PROGRESS_SCHEMA: dict[str, Any] = {
    "type": "object", "required": ["percent", "achievements", "remaining", "confidence"], "properties": {
        "percent": {"type": "integer", "minimum": 0, "maximum": 100},
        "achievements": {"type": "array", "items": {"type": "string", "maxLength": 500}},
        "remaining": {"type": "array", "items": {"type": "string", "maxLength": 500}},
        "confidence": {"type": "number", "minimum": 0, "maximum": 1},
        "estimated_hours_left": {"type": "number", "minimum": 0}},
}
VERDICT_TOOL = AnswerTool("submit_verdict", "Submit whether the goal is met, why, and the progress made.", {
    "type": "object", "required": ["goal_met", "reason", "progress"], "properties": {
        "goal_met": {"type": "boolean"}, "reason": {"type": "string", "maxLength": 2000},
        "progress": PROGRESS_SCHEMA},
})

VERIFY_SYSTEM = ("<task>verify_goal</task>\nJudge whether the goal is met from the tasks and the workspace. Answer "
                 "by calling submit_verdict.")


def validate_verdict(data: dict[str, Any]) -> Verdict:
    """Model output is data: a verdict needs goal_met and a reason; progress is checked when recorded."""
    if not isinstance(data.get("goal_met"), bool) or not isinstance(data.get("reason"), str):
        raise InvalidInput("The model's verdict needs goal_met (true or false) and a reason.")
    progress = data.get("progress")
    if progress is not None:
        progress_validate({"progress": progress})  # refused here, where the model can be told why
    return {"goal_met": data["goal_met"], "reason": data["reason"][:2000], "progress": progress}


@activity("verify_goal", retry=RetryPolicy(max_attempts=4, initial_interval_seconds=2.0), records_progress=True,
          lease_seconds=MODEL_CALL_LEASE, io_bound=True)
def verify_goal(ctx: ActivityContext, input: VerifyInput) -> Verdict:
    root = workspace(ctx)
    listed = files.list_files(root, limit=200)
    lines = [f"- [{t['status']}] {t['title']}" + (f" ({t.get('reason')})" if t.get("reason") else "")
             for t in input.tasks]
    prompt = (f"<goal>{input.goal}</goal>\n<tasks>\n" + "\n".join(lines)
              + f"\n</tasks>\n<files>{', '.join(listed)}</files>")
    verdict, _ = ask_structured(ctx, system=VERIFY_SYSTEM, prompt=prompt, tool=VERDICT_TOOL,
                                validate=validate_verdict, max_tokens=1000, what="verdict", steer=True)
    return verdict


REPLAN_SYSTEM = ("<task>replan</task>\nSome tasks failed or the goal is not met. Plan the next tasks from what "
                 "worked and what did not. Answer by calling submit_plan.")


@activity("replan", retry=RetryPolicy(max_attempts=4, initial_interval_seconds=2.0),
          lease_seconds=MODEL_CALL_LEASE, io_bound=True)
def replan(ctx: ActivityContext, input: ReplanInput) -> Plan:
    lines = [f"- [{t['status']}] {t['title']}: {t.get('summary') or t.get('reason') or ''}"[:400]
             for t in input.tasks]
    reason = input.verdict["reason"] if input.verdict else ""
    prompt = (f"<goal>{input.goal}</goal>\n<tasks>\n" + "\n".join(lines) + f"\n</tasks>\n<verdict>{reason}</verdict>"
              + (f"\n<stagnation>{input.stagnation}</stagnation>" if input.stagnation else ""))
    plan, _ = ask_structured(ctx, system=REPLAN_SYSTEM, prompt=prompt, tool=PLAN_TOOL, validate=_plan,
                             max_tokens=1500, what="plan", steer=True)
    return plan
