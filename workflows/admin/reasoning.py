"""What the workflow page shows about the reasoning plane: budget and spend, and progress."""
from __future__ import annotations

from datetime import datetime, timedelta
from decimal import Decimal
from typing import Any

from django.db.models import Count

from workflows.admin.charts import Reading, TimeChart, time_chart
from workflows.admin.display import usd, when
from workflows.features.costs.breakdown import cost_breakdown
from workflows.models import Event, ProgressSample, UsageEntry, Workflow
from workflows.selectors import spend_summary

# The offline provider: deterministic answers, priced as if a real model had given them.
SCRIPTED = "scripted"


def is_budget_paused(workflow: Workflow) -> bool:
    return workflow.status == Workflow.Status.PAUSED and workflow.pause_cause == Workflow.PauseCause.BUDGET


def spend_chart(workflow: Workflow, entries: list[UsageEntry], *, simulated: bool) -> TimeChart | None:
    """Cumulative spend after each model call: charged costs, and the estimate of a call still running."""
    readings, total = [], Decimal(0)
    for n, entry in enumerate(entries, start=1):
        amount = entry.amount_usd or Decimal(0)
        total += amount
        kind = "charged" if entry.status == UsageEntry.Status.CHARGED else "estimate held while it runs"
        readings.append(Reading(entry.created_at, float(total),
                                f"{when(entry.created_at)}: {usd(total)} after {n} call{'s' if n > 1 else ''} "
                                f"(this call {usd(amount)}, {kind})"))
    if not readings:
        return None
    top = float(total)
    budget = workflow.budget_total_usd
    limit = None
    if budget is not None and float(budget) <= 5 * top:  # higher, the line would flatten the curve
        top = max(top, float(budget))
        limit = (float(budget), f"total budget {usd(budget)}")
    what = "Simulated cumulative spend" if simulated else "Cumulative spend"
    budget_text = f"; the total budget is {usd(budget)}" if budget is not None else "; there is no total budget"
    return time_chart(
        readings, slug=f"spend-{workflow.pk}", title=f"{what} of workflow {workflow.pk} in US dollars",
        description=(f"{what}: {usd(total)} over {len(readings)} model call{'s' if len(readings) > 1 else ''} "
                     f"from {when(readings[0].at)} to {when(readings[-1].at)}{budget_text}."),
        y_max=top, y_label=usd, limit=limit,
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


def costs_tables(workflow: Workflow) -> list[tuple[str, list[dict[str, Any]]]]:
    """The per-step cost tables: (axis, rows with the axis's value as ``key``), per node, activity, model."""
    costs = cost_breakdown(workflow)
    return [(axis, [{**row, "key": row[axis]} for row in costs[f"by_{axis}"]])
            for axis in ("node", "activity", "model")]


def reasoning_panel(workflow: Workflow, *, now: datetime) -> dict[str, Any]:
    """Budget and spend, progress and stagnation, for the workflow page."""
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
    return {
        "spend": spend_summary(workflow),
        "costs_tables": costs_tables(workflow),
        "spend_chart": spend_chart(workflow, entries, simulated=simulated),
        "models": models,
        "simulated": simulated,
        "budget_paused": is_budget_paused(workflow),
        "progress_chart": progress_chart(workflow, samples),
        "latest": samples[-1] if samples else None,
        "samples": len(samples),
        "stagnating": bool(flagged and flagged > now - window and not workflow.is_terminal),
        "last_flag": last_flag,
        "help": {f.name: str(getattr(f, "help_text", "") or "") for f in Workflow._meta.get_fields()},
    }
