"""Statements on a workflow's row and its history, which every step writes: what an advance
reads with its lock, the next sequence numbers, and the events inserted with them in the same
statement, behind a fence on another row when one is given (PostgreSQL; the services write the
same in two statements elsewhere)."""
from __future__ import annotations

import functools
from collections.abc import Mapping
from datetime import datetime
from typing import Any

from django.db import connection, models

from workflows.models import Checkpoint, Event, Intent, SteerMessage, Wait, Workflow
from workflows.sql import WhereShape, concrete_field, db_value, quoted_column, quoted_table, set_sql, where_sql


@functools.cache
def advance_reads() -> tuple[str, ...]:
    """What ``workflow_lock(advance=True)`` reads beside the locked row, as subqueries over it."""
    def column(model: type[models.Model], name: str) -> str:
        return f"{quoted_table(model)}.{quoted_column(concrete_field(model, name))}"

    workflow_id = column(Workflow, "id")
    goal = (f"SELECT {column(Intent, 'goal')} FROM {quoted_table(Intent)} WHERE {column(Intent, 'workflow')} = "
            f"{workflow_id} AND {column(Intent, 'version')} = {column(Workflow, 'intent_version')}")
    last = f"FROM {quoted_table(Checkpoint)} WHERE {column(Checkpoint, 'id')} = {column(Workflow, 'checkpoint')}"
    child_wait = (f"SELECT 1 FROM {quoted_table(Wait)} WHERE {column(Wait, 'workflow')} = {workflow_id} AND "
                  f"{column(Wait, 'kind')} = '{Wait.Kind.CHILD.value}' AND {column(Wait, 'status')} = "
                  f"'{Wait.Status.OPEN.value}'")
    steer = f"SELECT 1 FROM {quoted_table(SteerMessage)} WHERE {column(SteerMessage, 'workflow')} = {workflow_id}"
    return (goal, f"SELECT {column(Checkpoint, 'state_hash')} {last}",
            f"SELECT {column(Checkpoint, 'chain_bytes')} {last}", f"EXISTS ({child_wait})", f"EXISTS ({steer})")


def seq_take(workflow_id: int, count: int) -> int | None:
    """Lock the workflow's row and take the next ``count`` sequence numbers of its history: the
    first of them; None when there is no such workflow."""
    table = quoted_table(Workflow)
    seq, id_ = quoted_column(concrete_field(Workflow, "event_seq")), quoted_column(concrete_field(Workflow, "id"))
    with connection.cursor() as cursor:
        cursor.execute(f"UPDATE {table} SET {seq} = {seq} + %s WHERE {id_} = %s RETURNING {seq}", [count, workflow_id])
        row = cursor.fetchone()
    return None if row is None else int(row[0]) - count + 1


@functools.cache
def steer_probe_sql() -> str:
    """For an event just inserted: whether its workflow has any steer message (``RETURNING``)."""
    steer, workflow = quoted_table(SteerMessage), quoted_column(concrete_field(SteerMessage, "workflow"))
    event_workflow = f"{quoted_table(Event)}.{quoted_column(concrete_field(Event, 'workflow'))}"
    return f"EXISTS (SELECT 1 FROM {steer} WHERE {steer}.{workflow} = {event_workflow})"


@functools.cache
def fenced_sql(model: type[models.Model], names: tuple[str, ...], shape: WhereShape) -> str:
    """The workflow's row locked, then the row of ``model`` matching the condition updated
    (``names``), only after that: CTEs ahead of ``events_with_seq``'s ``taken`` (the parameters:
    the workflow's id, then the values and the condition's)."""
    table, id_ = quoted_table(Workflow), quoted_column(concrete_field(Workflow, "id"))
    fenced = (f"UPDATE {quoted_table(model)} SET {set_sql(model, names)} WHERE {where_sql(model, shape)} "
              "AND EXISTS (SELECT 1 FROM locked) RETURNING 1")
    return f"locked AS (SELECT {id_} FROM {table} WHERE {id_} = %s FOR UPDATE), fenced AS ({fenced}), "


def events_with_seq(workflow_id: int, seq_param: int, rows: list[tuple[int, str, datetime, dict[str, Any]]], *,
                     numbered: bool, fenced: str = "", fence_params: list[Any] | None = None,
                     returning: str = "", sets: Mapping[str, Any] | None = None,
                     status: str | None = None) -> tuple[int, Any]:
    """Write the workflow's ``event_seq`` and insert ``rows`` (n, kind, time, data) in one
    statement (PostgreSQL): ``numbered``, n is each event's number and ``seq_param`` the new
    ``event_seq``; else the next ``seq_param`` numbers are taken and n counts from 0 among them.
    ``fenced`` (``fenced_sql``, with its ``fence_params``) comes first. ``sets`` are more of the
    workflow's fields to write, as ``row_update`` takes them, and ``status`` the status the row
    must still have. Returns the events inserted, and ``returning`` (an expression over an
    inserted event) of the first one, or None."""
    data = concrete_field(Event, "data")
    sets = sets or {}
    params: list[Any] = [*(fence_params or ()), seq_param, *(db_value(Workflow, name, v) for name, v in sets.items()),
                         workflow_id, *(() if status is None else (db_value(Workflow, "status", status),))]
    for n, kind, at, payload in rows:
        params += [n, kind, data.get_db_prep_save(payload, connection), at]
    with connection.cursor() as cursor:
        cursor.execute(_events_with_seq_sql(len(rows), numbered, fenced, returning, tuple(sets), status is not None),
                       params)
        first = cursor.fetchone() if returning else None
        return int(cursor.rowcount), first[0] if first else None


@functools.cache
def _events_with_seq_sql(count: int, numbered: bool, fenced: str = "", returning: str = "",
                         sets: tuple[str, ...] = (), status: bool = False) -> str:
    """``fenced``: CTEs ahead of ``taken``, the last named ``fenced``; the numbers are taken (and
    the events inserted) only when it gave a row. ``sets``: more fields written; ``status``: the
    row's status is a condition too."""
    table, seq, id_ = quoted_table(Workflow), quoted_column(concrete_field(Workflow, "event_seq")), \
        quoted_column(concrete_field(Workflow, "id"))
    only_if = " AND EXISTS (SELECT 1 FROM fenced)" if fenced else ""
    if status:
        only_if += f" AND {quoted_column(concrete_field(Workflow, 'status'))} = %s"
    columns = ", ".join(quoted_column(concrete_field(Event, name))
                        for name in ("workflow", "seq", "kind", "data", "created_at"))
    rows = ", ".join(["(%s::integer, %s::text, %s::jsonb, %s::timestamptz)"] * count)
    update, number = (f"{seq} = %s", "v.n") if numbered else (f"{seq} = {seq} + %s", f"taken.{seq} - {count} + 1 + v.n")
    if sets:
        update += f", {set_sql(Workflow, sets)}"
    return (f"WITH {fenced}taken AS (UPDATE {table} SET {update} WHERE {id_} = %s{only_if} RETURNING {id_}, {seq}) "
            f"INSERT INTO {quoted_table(Event)} ({columns}) "
            f"SELECT taken.{id_}, {number}, v.kind, v.data, v.created_at "
            f"FROM taken, (VALUES {rows}) AS v (n, kind, data, created_at)"
            + (f" RETURNING {returning}" if returning else ""))
