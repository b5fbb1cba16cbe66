"""`manage.py agent launch | list | show`: start agents and look at them."""
from __future__ import annotations

import argparse
from typing import Any

from rich.table import Table

from workflows import registry, selectors, services
from workflows.management.verbs.common import (
    LABEL_HELP,
    Output,
    Verb,
    labels_text,
    parse_params,
    usd,
    user_or_none,
    workflow_by_id,
)
from workflows.management.verbs.detail import render_detail
from workflows.models import Workflow
from workflows.services.labels import label_filters_parsed, label_pairs_parsed
from workflows.services.launch_options import HELP


def add_parsers(verb: Verb) -> None:
    launch = verb("launch", "Launch an agent; prints its workflow id.")
    # Each kind's parameters as it declares them (WorkflowDefinition.launch_params), line by line.
    launch.formatter_class = argparse.RawDescriptionHelpFormatter
    launch.epilog = registry.launch_params_help()
    launch.add_argument("kind", help="workflow kind, e.g. release")
    launch.add_argument("--goal", required=True, help="what the agent should achieve")
    launch.add_argument("--param", action="append", default=[], metavar="KEY=VALUE", help="launch parameter")
    launch.add_argument("--user", help="username of the requester (may not approve its own candidates)")
    launch.add_argument("--idempotency-key", default="", metavar="KEY",
                        help="launch at most once per key: the same launch again prints the workflow it made; "
                             "the key with other values is refused")
    # The launch options (LaunchOptions), each flag's value under the option's own name.
    launch.add_argument("--max-hours", dest="max_hours", type=float, help=HELP["max_hours"])
    launch.add_argument("--budget-total", dest="budget_total_usd", type=usd, metavar="USD",
                        help=HELP["budget_total_usd"])
    launch.add_argument("--budget-hourly", dest="budget_hourly_usd", type=usd, metavar="USD",
                        help=HELP["budget_hourly_usd"])
    launch.add_argument("--priority", type=int, default=5, help=HELP["priority"])
    launch.add_argument("--stagnation-policy", default=Workflow.StagnationPolicy.RECORD,
                        choices=Workflow.StagnationPolicy.values, help=HELP["stagnation_policy"])
    launch.add_argument("--release-policy", default="", choices=Workflow.ReleasePolicy.values,
                        help=HELP["release_policy"])
    launch.add_argument("--fallback-model", default="", metavar="MODEL", help=HELP["fallback_model"])
    launch.add_argument("--label", action="append", default=[], metavar="KEY=VALUE", help=LABEL_HELP)

    lst = verb("list", "List workflows, newest first.")
    lst.add_argument("--status", choices=Workflow.Status.values, help="only this status")
    lst.add_argument("--kind", help="only this kind")
    lst.add_argument("--label", action="append", default=[], metavar="KEY=VALUE",
                     help="only workflows with this label (repeatable: all of them)")
    lst.add_argument("--limit", type=int, default=50,
                     help=f"at most this many, 1 to {selectors.MAX_LIST_ROWS:,} (default 50)")

    show = verb("show", "Show a workflow: node, waits, activities, commitments, recent events.")
    show.add_argument("id", type=int)
    show.add_argument("--events", type=int, default=50,
                      help=f"how many recent events, 0 to {selectors.MAX_EVENTS:,} (default 50)")


def launch(command: Output, options: dict[str, Any]) -> None:
    workflow, created = services.workflow_launch_once(
        idempotency_key=options["idempotency_key"], kind=options["kind"], goal=options["goal"],
        params=parse_params(options["param"]), user=user_or_none(options["user"]),
        options=services.LaunchOptions.of({**options, "labels": label_pairs_parsed(options["label"])}),
    )
    what = (f"Launched {workflow.kind} workflow {workflow.pk} on {workflow.release}." if created else
            f"Workflow {workflow.pk} ({workflow.kind}) was launched before with this idempotency key; "
            f"nothing new was launched. It is {workflow.status}.")
    command.emit(options, {"id": workflow.pk, "kind": workflow.kind, "status": workflow.status},
               f"{what}\nFollow it with: manage.py agent show {workflow.pk}")


def list_(command: Output, options: dict[str, Any]) -> None:
    workflows = selectors.workflow_list(status=options["status"] or "", kind=options["kind"] or "",
                                        labels=label_filters_parsed(options["label"]))
    rows = [selectors.workflow_summary(w) for w in workflows.select_related("release")[: options["limit"]]]
    if options["json"]:
        command.emit(options, rows, "")
        return
    retrying = selectors.workflows_retrying([row["id"] for row in rows])
    table = Table("id", "kind", "status", "node", "intent", "goal", "labels", "updated")
    for row in rows:
        status = f"{row['status']} (retrying)" if row["id"] in retrying and row["status"] == "running" else \
            row["status"]
        table.add_row(str(row["id"]), row["kind"], status, row["current_node"],
                      f"v{row['intent_version']}", row["goal"][:50], labels_text(row["labels"])[:40],
                      row["updated_at"][:19])
    command.console.print(table if rows else "No workflows yet. Launch one with `manage.py agent launch`.")


def show(command: Output, options: dict[str, Any]) -> None:
    workflow = workflow_by_id(options["id"])
    detail = selectors.workflow_detail(workflow, events=options["events"])
    if options["json"]:
        command.emit(options, detail, "")
        return
    command.console.print(render_detail(detail))


RUN = {"launch": launch, "list": list_, "show": show}
