"""`manage.py agent schedule …`: recurring launches (docs/operators.md, 'Schedules')."""
from __future__ import annotations

import dataclasses
from typing import Any

from rich.table import Table

from workflows import selectors
from workflows.errors import InvalidInput
from workflows.features.schedules import services as schedules
from workflows.features.schedules import sync
from workflows.management.verbs.common import (
    Output,
    Verb,
    parse_params,
    user_or_none,
)
from workflows.models import Schedule
from workflows.services.labels import label_pairs_parsed


def add_parsers(verb: Verb) -> None:
    sched = verb("schedule", "Recurring launches (docs/operators.md, \"Schedules\"): `schedule add NAME --kind K "
                             "--goal G (--cron \"0 3 * * *\" | --every 6h)`; `list`; `pause`, `resume`, `remove`, "
                             "`trigger NAME`; `sync [--dry-run]` (the schedules declared in code).")
    sched.add_argument("action", choices=("add", "list", "pause", "resume", "remove", "trigger", "sync"))
    sched.add_argument("name", nargs="?", help="the schedule's name (all but list and sync)")
    sched.add_argument("--kind", help="add: the workflow kind each occurrence launches")
    sched.add_argument("--goal", help="add: the goal of each launch")
    sched.add_argument("--param", action="append", default=[], metavar="KEY=VALUE", help="add: launch parameter")
    sched.add_argument("--label", action="append", default=[], metavar="KEY=VALUE",
                       help="add: a label each launch carries (repeatable)")
    sched.add_argument("--cron", default="", metavar="\"M H DOM MON DOW\"",
                       help="add: when, as a five-field cron expression in UTC")
    sched.add_argument("--every", default="", metavar="DURATION", help="add: or an interval, e.g. 6h, 30m, 1h30m")
    sched.add_argument("--overlap", default=Schedule.Overlap.SKIP, choices=Schedule.Overlap.values,
                       help="add: while the previous run is live: skip (default), buffer_one, cancel_previous, "
                            "allow_all")
    sched.add_argument("--catch-up", default="0", metavar="DURATION",
                       help="add: occurrences missed up to this long ago are still launched (default 0)")
    sched.add_argument("--jitter", default="0", metavar="DURATION",
                       help="add: launch each occurrence up to this long after its time (default 0)")
    sched.add_argument("--user", help="add: whose launches they are; trigger: who asked")
    sched.add_argument("--dry-run", action="store_true",
                       help="sync: print what would change and change nothing")


def schedule(command: Output, options: dict[str, Any]) -> None:
    action, name = options["action"], options["name"]
    if (action in ("list", "sync")) != (name is None):
        raise InvalidInput(f"`schedule {action}` " + ("takes no name." if action in ("list", "sync") else "needs the "
                           "schedule's NAME (see `schedule list`)."))
    if action == "add":
        if not options["kind"] or options["goal"] is None:
            raise InvalidInput("`schedule add NAME` needs --kind KIND and --goal GOAL.")
        added = schedules.schedule_add(
            name=name, kind=options["kind"], goal=options["goal"], params=parse_params(options["param"]),
            cron=options["cron"], every=options["every"], overlap=options["overlap"],
            catch_up=options["catch_up"], jitter=options["jitter"], user=user_or_none(options["user"]),
            labels=label_pairs_parsed(options["label"]))
        command.emit(options, selectors.schedule_summary(added),
                   f"Schedule {added.name}: {added.kind}, {added.when}; next at "
                   f"{added.next_due_at:%Y-%m-%d %H:%M:%S} UTC.")
    elif action == "list":
        rows = [selectors.schedule_summary(s) for s in selectors.schedules()]
        if options["json"]:
            command.emit(options, rows, "")
            return
        table = Table("name", "kind", "when", "overlap", "paused", "next (UTC)", "last", "launched")
        for row in rows:
            last = row["last_occurrence"]
            table.add_row(row["name"], row["kind"], row["when"], row["overlap"], "yes" if row["paused"] else "",
                          row["next_due_at"][:19], f"{last['outcome']} {last['at'][:19]}" if last else "—",
                          str(row["launched"]))
        command.console.print(table if rows else "No schedules yet; add one: `agent schedule add NAME --kind K "
                                              "--goal G --every 6h`.")
    elif action == "sync":
        dry = options["dry_run"]
        changes = sync.schedules_sync(dry_run=dry)
        lines = [f"  {'would be ' if dry else ''}{change}" for change in changes]
        command.emit(options, {"dry_run": dry, "changes": [dataclasses.asdict(c) for c in changes]},
                     "\n".join([f"Schedules declared in code: {len(changes) or 'none'} "
                                 f"{'would change' if dry else 'changed'}" + (":" if changes else " (in step)."),
                                 *lines]))
    elif action == "trigger":
        occurrence = schedules.schedule_trigger(name=name, user=user_or_none(options["user"]))
        command.emit(options, selectors.occurrence_summary(occurrence),
                   f"Schedule {name}: {occurrence.outcome}"
                   + (f" workflow {occurrence.workflow_id}" if occurrence.workflow_id else "")
                   + (f" ({occurrence.reason})" if occurrence.reason else "") + ".")
    elif action == "remove":
        schedules.schedule_remove(name=name)
        command.emit(options, {"name": name, "removed": True},
                   f"Schedule {name} removed; the workflows it launched go on.")
    else:
        changed = schedules.schedule_pause(name=name) if action == "pause" else schedules.schedule_resume(name=name)
        command.emit(options, selectors.schedule_summary(changed),
                   f"Schedule {name} {'paused' if changed.paused else 'resumed'}.")


RUN = {"schedule": schedule}
