"""History files as JSON Lines: `agent export-history` writes one, retention archives are one,
`agent replay-check` reads them (and the one-object fixtures of ``agentops.history/1``).

The format, ``agentops.history/2`` (docs/authoring.md, "The history file"): one JSON object per
line, each with a ``"type"``, in this order:

1. ``header``: ``format`` and the workflow's summary (kind, definition version, params,
   release fingerprint, status, node, counters, result, reason, times);
2. ``visit``: one per node visit, ascending: node, visit, intent version, goal, the state it
   was entered with (its checkpoint) and its steps (activities and waits, in the order the
   handler asked for them);
3. ``event``: one per event of the history, ascending by ``seq``;
4. ``end``: how many visits and events the file holds. A file without it was cut off.

Readers skip record types they do not know (a later version may add some before ``end``).
Writing and reading stream: memory holds one visit (or one fetch of rows), however long the run.

A file is a snapshot or nothing: ``write`` reads the workflow row, its checkpoints, blobs,
activities, waits and events in one transaction, REPEATABLE READ on PostgreSQL (one snapshot
for every statement of it, whatever commits meanwhile: a retention prune, a new event); on
SQLite a transaction is one snapshot already. Inside a caller's transaction (retention's) the
reads are that transaction's, and ``write`` checks before the end line that it wrote the events
1 to the header's ``event_seq``, refusing otherwise. ``replaced`` puts a file at its path whole
or not at all.
"""
from __future__ import annotations

import itertools
import json
import os
import tempfile
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Protocol

from django.db import connection, transaction

from workflows import commands, replay
from workflows.errors import NotFound, Refused
from workflows.models import Event, Workflow
from workflows.sql.server import repeatable_read

FORMAT = "agentops.history/2"
EVENTS_PER_FETCH = 500


class HistoryArchived(NotFound):
    """The workflow's checkpoints and events are in its archive file, no longer in the database."""


class HistoryChanged(Refused):
    """The history changed while it was read outside a snapshot: what was read is not one history."""


@dataclass
class Written:
    """What a history file holds: counts, and the last visit and event it covers."""

    visits: int = 0
    events: int = 0
    last_visit: int = 0
    last_event_seq: int = 0


def header(workflow: Workflow) -> dict[str, Any]:
    """The first line's object: the workflow's summary, enough to replay and to recognise it."""
    return {
        "type": "header", "format": FORMAT, **replay.header_of(workflow),
        "current_node": workflow.current_node, "node_visit": workflow.node_visit,
        "intent_version": workflow.intent_version, "event_seq": workflow.event_seq, "result": workflow.result,
        "reason": workflow.reason, "created_at": workflow.created_at.isoformat(),
        "updated_at": workflow.updated_at.isoformat(),
    }


def lines_of(workflow: Workflow, written: Written | None = None, *, seq_checked: bool = False) -> Iterator[str]:
    """The history of ``workflow`` as JSON Lines (each line ends in a newline), read as it is
    yielded; ``written`` is filled in on the way. The caller holds a transaction open while it
    iterates (``write`` does), so the cursors live in it. With ``seq_checked``, HistoryChanged
    instead of the end line unless the events were 1 to ``workflow.event_seq``."""
    written = written if written is not None else Written()
    yield _line(header(workflow))
    for visit in replay.visits_of(workflow):
        yield _line({"type": "visit", "node": visit.node, "visit": visit.visit,
                     "intent_version": visit.intent_version, "goal": visit.goal, "state": visit.state,
                     "steps": [asdict(s) for s in visit.steps]})
        written.visits += 1
        written.last_visit = visit.visit
    events = Event.objects.filter(workflow=workflow).order_by("seq").iterator(chunk_size=EVENTS_PER_FETCH)
    for event in events:
        yield _line({"type": "event", "seq": event.seq, "kind": event.kind, "data": event.data,
                     "created_at": event.created_at.isoformat()})
        written.events += 1
        written.last_event_seq = event.seq
    if seq_checked and (written.events, written.last_event_seq) != (workflow.event_seq, workflow.event_seq):
        raise HistoryChanged(
            f"Workflow {workflow.pk}'s history changed while it was read: {written.events} events, the last "
            f"#{written.last_event_seq}, where its row counts {workflow.event_seq}; read it again (outside a "
            "transaction, `agent export-history` reads one snapshot).", workflow_id=workflow.pk)
    yield _line({"type": "end", "visits": written.visits, "events": written.events})


class TextOut(Protocol):
    """Where a history is written: a text file, or anything with its ``write``."""

    def write(self, text: str, /) -> object: ...


def write(workflow: Workflow, out: TextOut) -> Written:
    """Write the history of ``workflow`` to ``out`` line by line, in constant memory, as one
    snapshot (the module's docstring): the workflow row is read again inside it.

    Raises HistoryArchived when the snapshot shows the history archived (before the call, or
    meanwhile if called inside a transaction that began before), HistoryChanged when, inside a
    caller's transaction, events were deleted or added while they were read; either after
    writing part of it to ``out``, so write to a file that ``replaced`` puts in place."""
    written = Written()
    with snapshot():
        workflow = Workflow.objects.select_related("release").get(pk=workflow.pk)
        if workflow.history_archived:
            raise HistoryArchived(
                f"Workflow {workflow.pk}'s history was archived on {workflow.history_archived_at:%Y-%m-%d} to "
                f"{workflow.history_archive_path}; it is no longer in the database.", workflow_id=workflow.pk,
                path=workflow.history_archive_path)
        for line in lines_of(workflow, written, seq_checked=True):
            out.write(line)
    return written


@contextmanager
def snapshot() -> Iterator[None]:
    """A transaction whose statements all read one snapshot: REPEATABLE READ on PostgreSQL when it
    is the outermost one (the isolation level must be set before its first query); on SQLite
    every transaction is one. Nested in a caller's transaction, that transaction."""
    outermost = not connection.in_atomic_block
    with transaction.atomic():
        if outermost and connection.vendor == "postgresql":
            repeatable_read()
        yield


@contextmanager
def replaced(path: Path) -> Iterator[TextOut]:
    """A text file that appears at ``path`` whole, or not at all: written to a temporary file
    beside it (mode 0600: states hold what the agent saw), fsynced and renamed over ``path`` when
    the block ends; removed when it raises. The caller fsyncs the directory if it needs the name
    to survive a crash."""
    fd, temporary = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as out:
            yield out
            out.flush()
            os.fsync(out.fileno())
        os.replace(temporary, path)
    except BaseException:
        Path(temporary).unlink(missing_ok=True)
        raise


def _line(record: dict[str, Any]) -> str:
    return json.dumps(record, sort_keys=True, separators=(",", ":"), ensure_ascii=False, default=str) + "\n"


def read(lines: Iterable[str]) -> tuple[replay.History, Iterator[replay.Visit]]:
    """The header of a JSON Lines history and an iterator over its visits, read as they are
    asked for. ValueError (or KeyError, TypeError) names the line of a malformed record; the
    visit iterator raises it too when the file ends before its ``end`` line."""
    stream = iter(lines)
    first = next(stream, "")
    record = _record(first, 1)
    if record.get("type") != "header" or record.get("format") != FORMAT:
        raise ValueError(f"line 1 is not a history header (\"type\": \"header\", \"format\": {FORMAT!r})")
    fields = {k: record[k] for k in ("workflow_id", "kind", "definition_version", "params", "release_fingerprint",
                                     "status")}
    return replay.History(**fields, visits=[]), _visits(stream)


def _visits(stream: Iterator[str]) -> Iterator[replay.Visit]:
    visits = events = 0
    for number, line in enumerate(stream, start=2):
        if not line.strip():
            continue
        record = _record(line, number)
        kind = record.get("type")
        if kind == "visit":
            visits += 1
            yield replay.Visit(
                node=record["node"], visit=record["visit"], intent_version=record["intent_version"],
                goal=record["goal"], state=record["state"],
                steps=[commands.Step(**{**s, "node": record["node"]}) for s in record["steps"]])
        elif kind == "event":
            events += 1
        elif kind == "end":
            if (record.get("visits"), record.get("events")) != (visits, events):
                raise ValueError(f"line {number}: the end line counts {record.get('visits')} visits and "
                                 f"{record.get('events')} events, the file holds {visits} and {events}")
            if next(stream, "").strip():
                raise ValueError(f"line {number + 1}: a record after the end line")
            return
    raise ValueError("the file ends before its \"end\" line: it was cut off (an export or archive that did not "
                     "finish); export it again")


def _record(line: str, number: int) -> dict[str, Any]:
    try:
        record = json.loads(line)
    except json.JSONDecodeError as exc:
        raise ValueError(f"line {number} is not JSON: {exc.msg} at column {exc.colno}") from None
    if not isinstance(record, dict) or not isinstance(record.get("type"), str):
        raise ValueError(f"line {number} is not a history record (an object with a \"type\")")
    return record


@contextmanager
def opened(path: Path) -> Iterator[tuple[replay.History, Iterator[replay.Visit]]]:
    """A history file, JSON Lines or the one-object ``agentops.history/1`` of older fixtures:
    its header and an iterator over its visits (streamed for JSON Lines; the older format is
    read whole, as it always was). OSError, ValueError, KeyError or TypeError when it is not one."""
    with path.open(encoding="utf-8") as file:
        first = file.readline()
        try:
            record = json.loads(first)
        except json.JSONDecodeError:
            record = None
        if isinstance(record, dict) and record.get("type") == "header":
            history, visits = read(itertools.chain([first], file))
            yield history, visits
            return
        file.seek(0)
        history = replay.History.from_json(json.load(file))
        yield history, iter(history.visits)

