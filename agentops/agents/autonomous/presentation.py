"""How the autonomous agent's workflows look in the admin: the task list of every round."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from agentops.kind import AdminPanel, state_at, state_of
from agentops.kind.presentation import Checkpoint, Workflow

# Task statuses the agent writes, with what they mean to an operator.
TASK_STATUS_HELP = {
    "pending": "not started yet",
    "done": "finished; its summary is the agent's report",
    "skipped": "failed after its retries and was skipped; the reason is the last error",
}


@dataclass(frozen=True)
class TaskRow:
    id: str
    round: str
    title: str
    instructions: str
    status: str
    outcome: str
    current: bool


# Earlier rounds shown in full (the admin, ``agent show``); the rest are counted, and
# ``agent export-history`` has them all: a page costs the same on round 200 as on round 3.
EARLIER_ROUNDS_SHOWN = 3
# Of a task's instructions and outcome, the start shown on the page, and in ``agent show --json``
# for the earlier rounds' tasks (a task's instructions may be 4 KB, a round has up to 12 tasks).
TASK_TEXT_CHARS = 600


def cut(text: str, where: str) -> str:
    """``text``'s first TASK_TEXT_CHARS, and how many characters follow and ``where`` they are."""
    if len(text) <= TASK_TEXT_CHARS:
        return text
    return f"{text[:TASK_TEXT_CHARS]} [… {len(text) - TASK_TEXT_CHARS:,} more characters: {where}]"


def _cut_task(task: dict[str, Any]) -> dict[str, Any]:
    return {key: cut(value, "agent export-history") if key in ("instructions", "summary", "reason")
            and isinstance(value, str) else value for key, value in task.items()}


def earlier_tasks(workflow: Workflow, *, rounds: int | None = None) -> list[dict[str, Any]]:
    """The tasks of the earlier rounds since the agent last planned from scratch, oldest first;
    with ``rounds``, of the last ``rounds`` of them only (``earlier_rounds`` counts them all).

    A replan moves a finished round out of the state; the round stays in the state its ADAPTATION
    visit was entered with (its checkpoint, ``workflows.statestore``). Only the checkpoints of the
    rounds asked for are rebuilt, each from the last whole checkpoint before it. A state that kept
    every round in ``state["history"]`` keeps them there until its next replan; those rounds are in
    its checkpoints too, so both read the same way.
    """
    visits = _adaptation_visits(workflow)
    if rounds is not None:
        visits = visits[-rounds:] if rounds else []
    found = []
    for visit in visits:
        tasks = state_at(workflow, visit).get("tasks")
        found += [t for t in tasks if isinstance(t, dict)] if isinstance(tasks, list) else []
    return found


def earlier_rounds(workflow: Workflow) -> int:
    """How many earlier rounds there are since the agent last planned from scratch."""
    return len(_adaptation_visits(workflow))


def _adaptation_visits(workflow: Workflow) -> list[int]:
    rows = Checkpoint.objects.filter(workflow=workflow, node_visit__lt=workflow.node_visit)
    planned = rows.filter(node="PLANNING").order_by("-node_visit").values_list("node_visit", flat=True).first()
    return list(rows.filter(node="ADAPTATION", node_visit__gt=planned or 0).order_by("node_visit")
                .values_list("node_visit", flat=True))


def shown_tasks(workflow: Workflow) -> list[dict[str, Any]]:
    """The tasks of the last EARLIER_ROUNDS_SHOWN earlier rounds (their texts cut), then the
    current round's (whole)."""
    state = state_of(workflow) if isinstance(workflow.state, dict) else {}
    tasks = state.get("tasks")
    if not isinstance(tasks, list):
        return []
    return [*map(_cut_task, earlier_tasks(workflow, rounds=EARLIER_ROUNDS_SHOWN)),
            *(t for t in tasks if isinstance(t, dict))]


def task_rows(workflow: Workflow) -> list[TaskRow]:
    """The agent's tasks: the last EARLIER_ROUNDS_SHOWN earlier rounds, then the current round.

    The state is written by node handlers from validated model output; anything unexpected in it
    is shown as text rather than trusted.
    """
    state = state_of(workflow) if isinstance(workflow.state, dict) else {}
    tasks = state.get("tasks")
    if not isinstance(tasks, list):
        return []
    history = earlier_tasks(workflow, rounds=EARLIER_ROUNDS_SHOWN)
    current_round = str(state.get("round", ""))
    executing = workflow.current_node == "EXECUTION" and not workflow.is_terminal
    rows: list[TaskRow] = []
    for n, task in enumerate([*history, *tasks]):
        if not isinstance(task, dict):
            continue
        whole = "agent export-history" if n < len(history) else "agent show --json"
        round_label = str(task.get("round", "")) or "earlier"
        status = str(task.get("status", ""))
        is_next = (executing and status == "pending" and round_label == current_round
                   and not any(r.current for r in rows))
        rows.append(TaskRow(
            id=str(task.get("id", "")), round=round_label, title=str(task.get("title", "")),
            instructions=cut(str(task.get("instructions", "")), whole), status=status,
            outcome=cut(str(task.get("summary") or task.get("reason") or ""), whole), current=is_next,
        ))
    return rows


def tasks_panel(workflow: Workflow) -> AdminPanel:
    tasks = task_rows(workflow)
    return AdminPanel(template="agents/autonomous/tasks.html", context={
        "tasks": tasks, "rounds_left_out": max(0, earlier_rounds(workflow) - EARLIER_ROUNDS_SHOWN),
        "task_counts": {status: sum(t.status == status for t in tasks) for status in TASK_STATUS_HELP},
        "task_status_help": TASK_STATUS_HELP,
    })
