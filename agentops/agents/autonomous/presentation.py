"""How the autonomous agent's workflows look in the admin: the task list of every round."""
from __future__ import annotations

from dataclasses import dataclass

from workflows.models import Activity, Workflow
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


def task_rows(workflow: Workflow) -> list[TaskRow]:
    """The agent's tasks: earlier rounds (``state["history"]``), then the current round.

    The state is written by node handlers from validated model output; anything unexpected in it
    is shown as text rather than trusted.
    """
    state = workflow.state if isinstance(workflow.state, dict) else {}
    tasks, history = state.get("tasks"), state.get("history")
    if not isinstance(tasks, list):
        return []
    history = [t for t in history if isinstance(t, dict)] if isinstance(history, list) else []
    current_round = str(state.get("round", ""))
    labels = _earlier_rounds(workflow, len(history)) or ["earlier"] * len(history)
    executing = workflow.current_node == "EXECUTION" and not workflow.is_terminal
    rows: list[TaskRow] = []
    for task, round_label in [*zip(history, labels, strict=True), *((t, current_round) for t in tasks)]:
        if not isinstance(task, dict):
            continue
        status = str(task.get("status", ""))
        is_next = (executing and status == "pending" and round_label == current_round
                   and not any(r.current for r in rows))
        rows.append(TaskRow(
            id=str(task.get("id", "")), round=round_label, title=str(task.get("title", "")),
            instructions=str(task.get("instructions", "")), status=status,
            outcome=str(task.get("summary") or task.get("reason") or ""), current=is_next,
        ))
    return rows


def _earlier_rounds(workflow: Workflow, count: int) -> list[str]:
    """The round of each of the ``count`` earlier tasks, from the sizes of the plans the agent made
    since it last planned from scratch (its ``plan_tasks`` activity, then one ``replan`` per round).
    Empty when the recorded plans do not account for exactly ``count`` tasks."""
    plans = list(Activity.objects.filter(workflow=workflow, name__in=("plan_tasks", "replan"),
                                         status=Activity.Status.SUCCEEDED).order_by("pk").values_list("name", "result"))
    starts = [i for i, (name, _) in enumerate(plans) if name == "plan_tasks"]
    labels: list[str] = []
    for number, (_, result) in enumerate(plans[starts[-1]:] if starts else [], start=1):
        planned = result.get("tasks") if isinstance(result, dict) else None
        if len(labels) >= count or not isinstance(planned, list):
            break
        labels += [str(number)] * len(planned)
    return labels if len(labels) == count else []


def tasks_panel(workflow: Workflow) -> AdminPanel:
    tasks = task_rows(workflow)
    return AdminPanel(template="agents/autonomous/tasks.html", context={
        "tasks": tasks,
        "task_counts": {status: sum(t.status == status for t in tasks) for status in TASK_STATUS_HELP},
        "task_status_help": TASK_STATUS_HELP,
    })
