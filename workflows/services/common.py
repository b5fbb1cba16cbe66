"""Shared pieces of the services: row locks, versioned saves, the event history, releases."""
from __future__ import annotations

from collections.abc import Iterable, Iterator, Mapping
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from django.db import connection, models, transaction
from django_fsm import ConcurrentTransition

from workflows import releases
from workflows.errors import InvalidInput, NotFound
from workflows.models import BehavioralRelease, Event, Workflow
from workflows.sql import (
    RowWrite,
    Where,
    concrete_field,
    db_value,
    row_exists,
    row_get,
    row_get_with,
    row_update,
    rows_insert,
    where_params,
    where_shape,
)
from workflows.sql import workflow as sql_workflow


def workflow_lock(workflow_id: int, *, advance: bool = False) -> Workflow:
    """Lock the workflow row for the rest of the transaction (every writer locks it first). With
    ``advance``, for a caller that advances it, the same statement also reads what every advance
    asks: its current goal (``selectors.current_goal``), its last checkpoint's state hash and
    chain length (the next checkpoint's delta, ``visits.enter_node``), whether it has an open
    child wait (``cancellation.children_cancel_live``), and whether it has any steer message (a
    chained activity's first steering question, ``steps.activity_schedule``)."""
    if not advance:
        workflow = row_get(Workflow, workflow_id, lock=True, related="release")
    else:
        got = row_get_with(Workflow, workflow_id, sql_workflow.advance_reads(), lock=True, related="release")
        workflow = None
        if got is not None:
            workflow, (goal, state_hash, chain_bytes, child_waits_open, steered) = got
            if goal is not None:
                workflow.goal_read = (workflow.intent_version, str(goal))
            if workflow.checkpoint_id is not None and state_hash is not None:
                workflow.checkpoint_read = (workflow.checkpoint_id, str(state_hash), int(chain_bytes))
            workflow.child_waits_open, workflow.steered_read = bool(child_waits_open), bool(steered)
    if workflow is None:
        raise workflow_not_found(workflow_id)
    return workflow


def workflow_not_found(workflow_id: int) -> NotFound:
    return NotFound(f"Workflow {workflow_id} does not exist; `manage.py agent list` (GET /api/workflows) shows "
                    "the existing ones.",
                    workflow_id=workflow_id)


def event_seq_take(workflow_id: int, count: int) -> int:
    """Lock the workflow's row, as ``workflow_lock`` does, and take the next ``count`` sequence
    numbers of its history; returns the first. For writers that record events and need nothing
    else of the row (an attempt's notes and checkpoints): one statement instead of reading the
    whole row. The caller inserts exactly those events (``events_insert``) in the same
    transaction, or rolls it back.
    """
    first = sql_workflow.seq_take(workflow_id, count)
    if first is None:
        raise workflow_not_found(workflow_id)
    return first


def events_insert(workflow_id: int, first_seq: int, events: list[tuple[str, datetime, dict[str, Any]]]) -> None:
    """Insert ``events`` (kind, time, data) with the sequence numbers ``event_seq_take`` gave, in
    one INSERT; as SQL (``rows_insert``), since it is written on every turn of every running attempt."""
    rows_insert(Event, [{"workflow": workflow_id, "seq": first_seq + n, "kind": kind, "data": data, "created_at": at}
                        for n, (kind, at, data) in enumerate(events)])


def events_append(workflow_id: int, events: list[tuple[str, datetime, dict[str, Any]]]) -> None:
    """``event_seq_take`` and ``events_insert`` at once: lock the workflow's row, take the next
    sequence numbers and insert ``events`` (kind, time, data) with them. One statement on
    PostgreSQL (the UPDATE in a WITH, the INSERT reading what it returned), the two elsewhere:
    an attempt's notes and checkpoints write them on every turn."""
    if connection.vendor != "postgresql":
        events_insert(workflow_id, event_seq_take(workflow_id, len(events)), events)
        return
    if sql_workflow.events_with_seq(workflow_id, len(events), _numbered(events), numbered=False)[0] != len(events):
        raise workflow_not_found(workflow_id)


def _numbered(events: list[tuple[str, datetime, dict[str, Any]]]) -> list[tuple[int, str, datetime, dict[str, Any]]]:
    return [(n, kind, at, data) for n, (kind, at, data) in enumerate(events)]


@dataclass(frozen=True)
class Appended:
    """What ``events_append_while`` did: ``ok`` (true as a whole), the events appended because the
    row matched; with ``steer_probe``, ``steer_messages``: whether the workflow had any steer
    message then (None: not asked, or not known on this database)."""

    ok: bool
    steer_messages: bool | None = None

    def __bool__(self) -> bool:
        return self.ok


def events_append_while(workflow_id: int, events: list[tuple[str, datetime, dict[str, Any]]], *,
                        model: type[models.Model], where: Where, values: Mapping[str, Any],
                        also: RowWrite | None = None, steer_probe: bool = False) -> Appended:
    """``events_append`` (one event or more) while a row of ``model`` matches ``where``, read after
    the workflow's row lock is taken, so a transaction that changed that row while holding the
    lock has committed by then and is seen; ``values`` are written to that row. Truthy when
    appended; falsy, writing nothing, when no row matches. An attempt's notes and checkpoints are
    fenced this way (``where``: the attempt's lease; ``values``: its extension) on every turn.
    ``also`` is written whether or not the row matches (a model call's charge, which its note
    records: the provider billed it either way).

    One statement on PostgreSQL: the workflow's row locked, then the row updated under the
    condition, whose latest version PostgreSQL checks again after the lock, then the sequence
    numbers taken and the events inserted, each only when the one before gave a row; ``also`` is
    a CTE nothing reads, which PostgreSQL runs to completion after the rest, so the workflow's row
    is locked first, as by every writer; with ``steer_probe`` the inserted events return whether
    the workflow has steer messages. Elsewhere ``also`` alone, then a transaction of the same
    steps."""
    if connection.vendor != "postgresql":
        if also is not None:
            also.run()
        with transaction.atomic():
            events_append(workflow_id, events)
            if not row_update(model, values, where):
                transaction.set_rollback(True)
                return Appended(False)
        return Appended(True)
    fence_params = [*(also.params() if also is not None else ()), workflow_id,
                    *(db_value(model, name, v) for name, v in values.items()), *where_params(model, where)]
    fenced = sql_workflow.fenced_sql(model, tuple(values), where_shape(where))
    count, probed = sql_workflow.events_with_seq(
        workflow_id, len(events), _numbered(events), numbered=False,
        fenced=f"also AS ({also.sql()}), {fenced}" if also is not None else fenced, fence_params=fence_params,
        returning=sql_workflow.steer_probe_sql() if steer_probe else "")
    return Appended(bool(count), bool(probed) if count and steer_probe else None)


def workflow_save(workflow: Workflow, *fields: str, at: datetime, with_events: bool = False) -> None:
    """Save named fields and ``updated_at``, as ``workflow.save(update_fields=...)`` does, as SQL
    (every node entry and every result writes the row): raises ``ConcurrentTransition``, writing
    nothing, when the row's status is no longer the one the instance was read with.

    Saving ``status`` saves ``pause_cause`` too: the transitions set the cause with the status
    (``pause`` sets it, every way out of paused clears it), so the two never disagree.

    ``with_events``, inside ``events_batched(workflow)``: the fields are written when the block
    ends, by the statement that writes its events and ``event_seq`` to the same row (a node entry,
    on every step: one statement instead of two), or by a save without it meanwhile. A save of
    ``status`` is never put off.
    """
    workflow.updated_at = at
    batch = _batch_of(workflow)
    if with_events and batch is not None and "status" not in fields:
        batch.fields.update(dict.fromkeys(fields))
        return
    extra = ["pause_cause"] if "status" in fields and "pause_cause" not in fields else []
    names = list(dict.fromkeys([*fields, *extra, *(batch.fields if batch is not None else ()), "updated_at"]))
    if not row_update(Workflow, _field_values(workflow, names), {"id": workflow.pk, "status": workflow.status_as_read}):
        raise _save_refused(workflow)
    if batch is not None:
        batch.fields.clear()
    workflow.status_saved()


def workflow_save_put_off(workflow: Workflow) -> None:
    """Write now what ``workflow_save(with_events=True)`` put off in the open ``events_batched``
    block: before a savepoint that may be rolled back alone, so that it takes only its own."""
    batch = _batch_of(workflow)
    if batch is not None and batch.fields:
        workflow_save(workflow, at=workflow.updated_at)


def _field_values(workflow: Workflow, names: Iterable[str]) -> dict[str, Any]:
    return {name: getattr(workflow, concrete_field(Workflow, name).attname) for name in names}


def _save_refused(workflow: Workflow) -> NotFound | ConcurrentTransition:
    if row_exists(Workflow, {"id": workflow.pk}):
        return ConcurrentTransition(f"Workflow {workflow.pk} is no longer {workflow.status_as_read}: another "
                                    "transaction moved it since this one read it; nothing was saved.")
    return workflow_not_found(workflow.pk)


def event_record(*, workflow: Workflow, kind: str, at: datetime, **data: Any) -> Event:
    """Append to the workflow's history.

    The caller holds the workflow's row lock, which keeps the per-workflow sequence
    contiguous; the unique constraint ``uniq_event_seq`` catches a caller that does not.
    Inside ``events_batched(workflow)`` the row is written when the block ends.
    """
    workflow.event_seq += 1
    event = Event(workflow_id=workflow.pk, seq=workflow.event_seq, kind=kind, data=data, created_at=at)
    batch = _batch_of(workflow)
    if batch is not None:
        batch.events.append(event)
        return event
    _events_write(workflow, [event])
    return event


@dataclass
class _Batch:
    """An ``events_batched`` block's workflow, its events, and the fields saved with them."""

    workflow_id: int
    events: list[Event] = field(default_factory=list)
    fields: dict[str, None] = field(default_factory=dict)  # an ordered set


_event_batch: ContextVar[_Batch | None] = ContextVar("event_batch", default=None)


def _batch_of(workflow: Workflow) -> _Batch | None:
    batch = _event_batch.get()
    return batch if batch is not None and batch.workflow_id == workflow.pk else None


@contextmanager
def events_batched(workflow: Workflow) -> Iterator[None]:
    """Write the events the block records for ``workflow``, its ``event_seq`` and the fields saved
    ``with_events``, with one statement when the block ends (the hot path records three or four;
    ``_events_write``).

    The caller holds the row lock for the whole block; an exception writes nothing (and rolls
    the caller's transaction back). Nothing inside the block may read those events back, nor the
    fields saved with them from the row.
    """
    batch = _Batch(workflow.pk)
    token = _event_batch.set(batch)
    try:
        yield
        if batch.events:
            _events_write(workflow, batch.events, tuple(batch.fields))
        else:
            workflow_save_put_off(workflow)
    finally:
        _event_batch.reset(token)


def _events_write(workflow: Workflow, events: list[Event], fields: tuple[str, ...] = ()) -> None:
    """Insert ``events`` (numbered in a row) and write the workflow's ``event_seq``, and ``fields``
    while its status is the one it was read with (SQL: every step does it). One statement on
    PostgreSQL (the UPDATE in a WITH, the INSERT beside it), the two elsewhere."""
    values = _field_values(workflow, (*fields, "updated_at")) if fields else {}
    status = workflow.status_as_read if fields else None
    if connection.vendor != "postgresql":
        events_insert(workflow.pk, events[0].seq, [(e.kind, e.created_at, e.data) for e in events])
        written = row_update(Workflow, {"event_seq": workflow.event_seq, **values},
                             {"id": workflow.pk, **({"status": status} if status is not None else {})})
        if fields and not written:
            raise _save_refused(workflow)
        return
    rows = [(e.seq, e.kind, e.created_at, e.data) for e in events]
    if sql_workflow.events_with_seq(workflow.pk, workflow.event_seq, rows, numbered=True, sets=values,
                                    status=status)[0] != len(events):
        raise _save_refused(workflow)


def events_pending(workflow: Workflow) -> int:
    """How many events ``events_batched(workflow)`` holds unwritten (0 outside such a block)."""
    batch = _batch_of(workflow)
    return len(batch.events) if batch is not None else 0


def events_pending_truncate(workflow: Workflow, count: int) -> None:
    """Drop the batched events recorded after the first ``count``, and the fields saved with
    events (their savepoint rolled back; the caller restores ``workflow.event_seq`` to match, and
    wrote the fields saved before the savepoint first: ``workflow_save_put_off``)."""
    batch = _batch_of(workflow)
    if batch is not None:
        del batch.events[count:]
        batch.fields.clear()


# Set in Celery worker processes (agentops.celery, before the pool forks): there, the current
# release is the process's own; elsewhere it is the one the workers announced.
in_worker = False


def release_current(*, at: datetime) -> BehavioralRelease:
    """The behavioral release new work runs on: the one the Celery workers run.

    In a worker, its own (its settings). Elsewhere (a shell launching, the admin or a command
    waking a workflow, beat) the release a worker announced most recently when it started
    (``release_announce``), so the settings of the process that happens to launch (a shell
    without ``ANTHROPIC_API_KEY``, say) never decide what the workers run; this process's own
    settings only when no worker ever announced one (tests, a first launch before any worker).
    """
    if not in_worker:
        announced = BehavioralRelease.objects.filter(announced_at__isnull=False).order_by("-announced_at").first()
        if announced is not None:
            return announced
    return release_ensure(releases.current_release_spec(), at=at)


def release_ensure(spec: dict[str, Any], *, at: datetime) -> BehavioralRelease:
    """The release row of ``spec`` (provider, model, prompt and tool versions).

    Idempotent: get-or-create on the unique ``fingerprint``.
    """
    release, _ = BehavioralRelease.objects.get_or_create(
        fingerprint=releases.release_fingerprint(spec),
        defaults={
            "provider": spec["provider"], "model": spec["model"], "prompt_version": spec["prompt_version"],
            "tool_versions": spec["tool_versions"], "created_at": at,
        },
    )
    return release


def release_announce(*, at: datetime) -> BehavioralRelease:
    """A worker starting says which release it runs: launches and wakes elsewhere then record it.

    Idempotent: the release row is ensured, and ``announced_at`` set to ``at`` (a later start moves it).
    """
    release = release_ensure(releases.current_release_spec(), at=at)
    BehavioralRelease.objects.filter(pk=release.pk).update(announced_at=at)
    return release


def priority_checked(value: int) -> int:
    """A workflow's priority: a whole number from 0 to 10 (a boolean is not one). Raises InvalidInput."""
    if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= 10:
        raise InvalidInput(f"The priority must be a whole number from 0 to 10; got {value!r}. Nothing was changed.")
    return value


def text_checked(value: str, *, what: str, max_length: int) -> str:
    """Validate free text from people: non-empty, bounded, no NUL or lone surrogates."""
    if not isinstance(value, str) or not value.strip():
        raise InvalidInput(f"{what} must be non-empty text.")
    if len(value) > max_length:
        raise InvalidInput(f"{what} is {len(value)} characters long; the limit is {max_length}.")
    if "\x00" in value:
        raise InvalidInput(f"{what} contains a NUL character.")
    try:
        value.encode("utf-8")
    except UnicodeEncodeError:
        raise InvalidInput(f"{what} contains characters that are not valid Unicode (lone surrogates).") from None
    return value.strip()


def in_transaction() -> bool:
    return transaction.get_connection().in_atomic_block
