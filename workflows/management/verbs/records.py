"""`manage.py agent export-history | replay-check | usage | new-kind`: histories, the ledger's
uncertain requests, a new kind's project."""
from __future__ import annotations

import json
import sys
import tempfile
from pathlib import Path
from typing import Any

from django.core.management.base import CommandError
from rich.table import Table

from workflows import histories, replay, selectors, services, skeleton
from workflows.errors import InvalidInput, NotFound
from workflows.management.verbs.common import (
    Output,
    Verb,
    day,
    user_or_none,
    workflow_by_id,
)
from workflows.models import Workflow


def add_parsers(verb: Verb) -> None:
    export = verb("export-history", "Print a workflow's history as JSON Lines (a header, its node visits, its "
                                    "events, an end line), streamed: a replay-check fixture, the retention "
                                    "archive's format. One snapshot, printed once it is read whole, or an "
                                    "error and nothing printed. An archived workflow's prints its archive.")
    export.add_argument("id", type=int)
    export.add_argument("--output", metavar="PATH",
                        help="write it to PATH instead (mode 0600): the file appears whole when the export "
                             "succeeds and is left as it was (or absent) when it fails")

    usage = verb("usage", "The usage ledger's requests whose outcome is unknown: `usage uncertain [--workflow ID]` "
                          "lists them; `usage settle --file REPORT.jsonl` charges or releases them from the "
                          "provider's usage (docs/operators.md, \"Settling uncertain requests\").")
    usage.add_argument("action", choices=("uncertain", "settle"))
    usage.add_argument("--workflow", type=int, metavar="ID", help="uncertain: only this workflow's requests")
    usage.add_argument("--file", metavar="PATH", help="settle: the usage report, JSON Lines ('-': standard input)")
    usage.add_argument("--user", help="settle: username of who settled (recorded in the events)")

    check = verb("replay-check", "Replay recorded histories against the current definitions; exit status 1 "
                                 "naming each one that would no longer replay (docs/authoring.md).")
    check.add_argument("--kind", help="only workflows of this kind")
    check.add_argument("--since", type=day, metavar="YYYY-MM-DD", help="only workflows launched on or after")
    check.add_argument("--fixtures", action="append", default=[], metavar="PATH",
                       help="a history file (export-history) or a folder of them, checked at every visit; "
                            "repeatable. Without --fixtures, the workflows in flight are checked.")

    new_kind = verb("new-kind", "Write the project of a new agent kind (a pip-installable package with a "
                                "passing test) into --dir/NAME (docs/authoring.md).")
    new_kind.add_argument("name", help="the kind, e.g. followup")
    new_kind.add_argument("--dir", default=".", help="the folder to write it in (default: the current one)")


def export_history(command: Output, options: dict[str, Any]) -> None:
    workflow = workflow_by_id(options["id"])
    if options["output"]:
        path = Path(options["output"])
        if not path.parent.is_dir():
            raise InvalidInput(f"--output {options['output']}: no folder {path.parent} to write it in.")
        with histories.replaced(path) as out:
            history_copy(workflow, out)
        return
    # Spooled to disk (memory stays flat), printed once whole: a refusal prints nothing.
    with tempfile.TemporaryFile("w+", encoding="utf-8") as spool:
        history_copy(workflow, spool)
        spool.seek(0)
        while chunk := spool.read(COPY_CHARS):
            command.stdout.write(chunk, ending="")


def usage(command: Output, options: dict[str, Any]) -> None:
    if options["action"] == "uncertain":
        if options["file"]:
            raise InvalidInput("`usage uncertain` takes no --file; did you mean `usage settle --file`?")
        rows = selectors.usage_uncertain(workflow_id=options["workflow"])
        if options["json"]:
            command.emit(options, rows, "")
            return
        table = Table("workflow", "key", "model", "held USD", "since", "why")
        for row in rows:
            table.add_row(str(row["workflow_id"]), row["key"], row["model"], row["reserved_usd"],
                          row["created_at"][:19], row["outcome"][:60])
        command.console.print(table if rows else "No uncertain requests: every request's outcome is known.")
        return
    if not options["file"]:
        raise InvalidInput("`usage settle` needs --file PATH: the usage report (JSON Lines), or - for stdin.")
    if options["file"] == "-":
        lines = sys.stdin.read().splitlines()
    else:
        path = Path(options["file"])
        if not path.is_file():
            raise InvalidInput(f"--file {options['file']}: no such file.")
        try:
            lines = path.read_text(encoding="utf-8").splitlines()
        except UnicodeDecodeError:
            raise InvalidInput(f"--file {options['file']} is not UTF-8 text (a JSON Lines report).") from None
    summary = services.usage_settle_from_report(report=services.usage_report_parse(lines),
                                                user=user_or_none(options["user"]))
    command.emit(options, summary.to_json(), summary.message)


def replay_check(command: Output, options: dict[str, Any]) -> None:
    checked: list[tuple[str, replay.Divergence | None]] = []
    if options["fixtures"]:
        for path in fixture_files(options["fixtures"]):
            checked.append((str(path), check_file(path)))
    else:
        for workflow in selectors.workflows_in_flight(kind=options["kind"] or "", since=options["since"]):
            history = replay.history_of(workflow, current_visit_only=True)
            checked.append((f"workflow {workflow.pk}", replay.check(history)))
    found = [(label, d) for label, d in checked if d is not None]
    if options["json"]:
        command.stdout.write(json.dumps({"checked": len(checked), "diverged": [
            {"source": label, "workflow_id": d.workflow_id, "kind": d.kind, "node": d.node, "visit": d.visit,
             "operation_id": d.operation_id, "reason": d.reason} for label, d in found]}, indent=2))
    else:
        for label, divergence in found:
            command.console.print(f"{label}: {divergence}", markup=False, soft_wrap=True)
        command.console.print(f"{len(checked) - len(found)} of {len(checked)} histories replay on the current "
                           "definitions.")
    if found:
        raise CommandError(f"{len(found)} of {len(checked)} histories would no longer replay; keep the old "
                           "path for them (docs/authoring.md, \"Changing a definition\").", returncode=1)



def new_kind(command: Output, options: dict[str, Any]) -> None:
    root = skeleton.write_skeleton(options["name"], Path(options["dir"]))
    module = options["name"].replace("-", "_")
    command.emit(options, {"kind": options["name"], "path": str(root)},
               f"Wrote the {options['name']} kind to {root}. Next:\n"
               f"  cd {root} && pip install -e . && python -m pytest   # the kit's tests, no database\n"
               f"  edit {module}/definition.py and {module}/activities.py (docs/authoring.md)")


COPY_CHARS = 1 << 16


def history_copy(workflow: Workflow, out: histories.TextOut) -> None:
    """The history of ``workflow`` as one snapshot, or its archive file when the snapshot shows
    it archived (before the export, or by retention before its snapshot began)."""
    try:
        histories.write(workflow, out)
    except histories.HistoryArchived:
        archive_copy(workflow_by_id(workflow.pk), out)


def archive_copy(workflow: Workflow, out: histories.TextOut) -> None:
    """Copy an archived workflow's archive file to ``out``, a chunk at a time."""
    try:
        with open(workflow.history_archive_path, encoding="utf-8") as archive:
            while chunk := archive.read(COPY_CHARS):
                out.write(chunk)
    except OSError as exc:
        raise NotFound(f"Workflow {workflow.pk}'s history was archived on {workflow.history_archived_at:%Y-%m-%d} to "
                       f"{workflow.history_archive_path}, which cannot be read here ({exc.strerror}); run this where "
                       "AGENTOPS_ARCHIVE_DIR is mounted, or read the file from your backups.") from None


def fixture_files(paths: list[str]) -> list[Path]:
    """The history files named, folders expanded to their *.json and *.jsonl files; InvalidInput
    for a missing path."""
    files: list[Path] = []
    for raw in paths:
        path = Path(raw)
        if path.is_dir():
            files.extend(sorted([*path.glob("*.json"), *path.glob("*.jsonl")]))
        elif path.is_file():
            files.append(path)
        else:
            raise InvalidInput(f"--fixtures {raw}: no such file or folder.")
    return files


def check_file(path: Path) -> replay.Divergence | None:
    """Replay every visit of a history file (JSON Lines, or the older one-object JSON), read as
    it is checked; InvalidInput when the file is not a whole history."""
    try:
        with histories.opened(path) as (history, visits):
            return replay.check_stream(history, visits)
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise InvalidInput(f"{path} is not a history written by `agent export-history`: {exc}") from None



RUN = {"export-history": export_history, "usage": usage, "replay-check": replay_check, "new-kind": new_kind}
