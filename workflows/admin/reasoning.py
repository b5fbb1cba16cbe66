"""What the workflow page shows about the reasoning plane: budget and spend, progress, and the task list."""
from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timedelta
from decimal import Decimal
from typing import Any

from django.db.models import Count

from workflows.admin.charts import Reading, TimeChart, time_chart, usd, when
from workflows.models import Activity, Event, ProgressSample, UsageEntry, Workflow
from workflows.selectors import spend_summary
from workflows.services.steps import BUDGET_PAUSE_PREFIX

# The offline provider: deterministic answers, priced as if a real model had given them.
SCRIPTED = "scripted"
# What ``stagnation_flag_if_due`` writes as the reason of a workflow its "pause" policy paused.
# Task statuses the autonomous agent writes, with what they mean to an operator.
TASK_STATUS_HELP = {
    "pending": "not started yet",
    "done": "finished; its summary is the agent's report",
    "skipped": "failed after its retries and was skipped; the reason is the last error",
}


def is_budget_paused(workflow: Workflow) -> bool:
    return workflow.status == Workflow.Status.PAUSED and workflow.reason.startswith(BUDGET_PAUSE_PREFIX)


def spend_chart(workflow: Workflow, entries: list[UsageEntry], *, simulated: bool) -> TimeChart | None:
    """Cumulative spend after each model call: charged costs, and the estimate of a call still running."""
    readings, total = [], Decimal(0)
    for n, entry in enumerate(entries, start=1):
        amount = entry.amount_usd or Decimal(0)
        total += amount
        kind = "charged" if entry.status == UsageEntry.Status.CHARGED else "estimate held while it runs"
        readings.append(Reading(entry.created_at, float(total),
                                f"{when(entry.created_at)}: {total:.6f} USD after {n} call{'s' if n > 1 else ''} "
                                f"(this call {amount:.6f} USD, {kind})"))
    if not readings:
        return None
    top = float(total)
    budget = workflow.budget_total_usd
    limit = None
    if budget is not None and float(budget) <= 5 * top:  # higher, the line would flatten the curve
        top = max(top, float(budget))
        limit = (float(budget), f"total budget {usd(budget, scale=top)}")
    what = "Simulated cumulative spend" if simulated else "Cumulative spend"
    budget_text = f"; the total budget is {budget} USD" if budget is not None else "; there is no total budget"
    return time_chart(
        readings, slug=f"spend-{workflow.pk}", title=f"{what} of workflow {workflow.pk} in USD",
        description=(f"{what}: {total:.6f} USD over {len(readings)} model call{'s' if len(readings) > 1 else ''} "
                     f"from {when(readings[0].at)} to {when(readings[-1].at)}{budget_text}."),
        y_max=top, y_label=lambda value: usd(value, scale=top), limit=limit,
    )


def progress_chart(workflow: Workflow, samples: list[ProgressSample]) -> TimeChart | None:
    """The model-assessed percent after each verification, on a 0–100 scale."""
    readings = [Reading(s.created_at, float(s.percent),
                        f"{when(s.created_at)}: {s.percent}% (confidence {s.confidence:.0%})") for s in samples]
    if not readings:
        return None
    first, last = samples[0], samples[-1]
    return time_chart(
        readings, slug=f"progress-{workflow.pk}", title=f"Progress of workflow {workflow.pk} in percent",
        description=(f"Progress over {len(samples)} verification{'s' if len(samples) > 1 else ''}: "
                     f"{first.percent}% at {when(first.created_at)}, {last.percent}% at {when(last.created_at)}."),
        y_max=100.0, y_label="{:.0f}%".format,
    )


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
    """The autonomous agent's tasks: earlier rounds (``state["history"]``), then the current round.

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


def reasoning_panel(workflow: Workflow, *, now: datetime) -> dict[str, Any]:
    """Budget and spend, progress and stagnation, and tasks, for the workflow page."""
    entries = list(UsageEntry.objects.filter(workflow=workflow).order_by("created_at", "pk")
                   .only("created_at", "status", "cost_usd", "reserved_usd"))
    models = list(UsageEntry.objects.filter(workflow=workflow).values("provider", "model")
                  .annotate(calls=Count("pk")).order_by("provider", "model"))
    simulated = workflow.release.provider == SCRIPTED or any(m["provider"] == SCRIPTED for m in models)
    samples = list(ProgressSample.objects.filter(workflow=workflow).order_by("created_at", "pk"))
    window = timedelta(hours=workflow.stagnation_window_hours)
    flagged = workflow.stagnation_flagged_at
    last_flag = (Event.objects.filter(workflow=workflow, kind="workflow.stagnating").order_by("-seq").first()
                 if flagged else None)
    tasks = task_rows(workflow)
    return {
        "spend": spend_summary(workflow),
        "spend_chart": spend_chart(workflow, entries, simulated=simulated),
        "models": models,
        "simulated": simulated,
        "budget_paused": is_budget_paused(workflow),
        "progress_chart": progress_chart(workflow, samples),
        "latest": samples[-1] if samples else None,
        "samples": len(samples),
        "stagnating": bool(flagged and flagged > now - window and not workflow.is_terminal),
        "last_flag": last_flag,
        "tasks": tasks,
        "task_counts": {status: sum(t.status == status for t in tasks) for status in TASK_STATUS_HELP},
        "task_status_help": TASK_STATUS_HELP,
        "help": {f.name: str(getattr(f, "help_text", "") or "") for f in Workflow._meta.get_fields()},
    }
