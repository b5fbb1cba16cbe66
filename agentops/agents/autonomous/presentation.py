"""How the autonomous agent's workflows look in the admin: the task list of every round."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from workflows import statestore
from workflows.models import Checkpoint, Workflow
from workflows.presentation import AdminPanel

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


def earlier_tasks(workflow: Workflow) -> list[dict[str, Any]]:
    """The tasks of the earlier rounds since the agent last planned from scratch, oldest first.

    A replan moves a finished round out of the state; the round stays in the state its ADAPTATION
    visit was entered with (its checkpoint, ``workflows.statestore``), read here in one pass over
    the checkpoints. A workflow started before that keeps ``state["history"]`` until its next
    replan; its rounds are in its checkpoints too, so both read the same way.
    """
    rounds: list[list[dict[str, Any]]] = []
    checkpoints = Checkpoint.objects.filter(workflow=workflow).order_by("node_visit").only(
        "node", "node_visit", "state", "delta")
    for checkpoint, stored in statestore.stored_states(checkpoints):
        if checkpoint.node == "PLANNING":
            rounds = []
        elif checkpoint.node == "ADAPTATION" and checkpoint.node_visit < workflow.node_visit:
            tasks = stored.get("tasks") if isinstance(stored, dict) else None
            rounds.append(tasks if isinstance(tasks, list) else [])
    resolved = statestore.resolve(workflow.pk, rounds)
    return [t for round_ in resolved for t in round_ if isinstance(t, dict)]


def all_tasks(workflow: Workflow) -> list[dict[str, Any]]:
    """Every task: earlier rounds first, then the current one."""
    state = statestore.state_of(workflow) if isinstance(workflow.state, dict) else {}
    tasks = state.get("tasks")
    return [*earlier_tasks(workflow), *(t for t in tasks if isinstance(t, dict))] if isinstance(tasks, list) else []


def task_rows(workflow: Workflow) -> list[TaskRow]:
    """The agent's tasks: earlier rounds (``earlier_tasks``), then the current round.

    The state is written by node handlers from validated model output; anything unexpected in it
    is shown as text rather than trusted.
    """
    state = statestore.state_of(workflow) if isinstance(workflow.state, dict) else {}
    tasks = state.get("tasks")
    if not isinstance(tasks, list):
        return []
    history = earlier_tasks(workflow)
    current_round = str(state.get("round", ""))
    executing = workflow.current_node == "EXECUTION" and not workflow.is_terminal
    rows: list[TaskRow] = []
    for task in [*history, *tasks]:
        if not isinstance(task, dict):
            continue
        round_label = str(task.get("round", "")) or "earlier"
        status = str(task.get("status", ""))
        is_next = (executing and status == "pending" and round_label == current_round
                   and not any(r.current for r in rows))
        rows.append(TaskRow(
            id=str(task.get("id", "")), round=round_label, title=str(task.get("title", "")),
            instructions=str(task.get("instructions", "")), status=status,
            outcome=str(task.get("summary") or task.get("reason") or ""), current=is_next,
        ))
    return rows


def tasks_panel(workflow: Workflow) -> AdminPanel:
    tasks = task_rows(workflow)
    return AdminPanel(template="agents/autonomous/tasks.html", context={
        "tasks": tasks,
        "task_counts": {status: sum(t.status == status for t in tasks) for status in TASK_STATUS_HELP},
        "task_status_help": TASK_STATUS_HELP,
    })
