"""The budget ledger's two statements of its own: a reservation for a workflow without limits in
one round trip, and the locked read every other reservation decides on."""
from __future__ import annotations

import functools
from collections.abc import Mapping
from typing import Any

from django.db import connection

from workflows.models import Activity, UsageEntry, Workflow
from workflows.sql import (
    Where,
    WhereShape,
    concrete_field,
    db_value,
    insert_params,
    insert_select_sql,
    quoted_column,
    quoted_table,
    row_lock_clause,
    set_sql,
    where_params,
    where_shape,
    where_sql,
)


def reserve_without_limits(workflow_id: int, values: Mapping[str, Any], where: Where,
                           row: Mapping[str, Any]) -> tuple[bool, bool, bool]:
    """Insert ``row`` into the ledger (PostgreSQL) while the workflow has no budget limit and an
    activity row matches ``where`` (its lease), which gets ``values``: whether the activity
    matched, whether the workflow had no limit, and whether the row was inserted (not there yet)."""
    params = [workflow_id, *(db_value(Activity, name, v) for name, v in values.items()),
              *where_params(Activity, where), *insert_params(UsageEntry, row)]
    with connection.cursor() as cursor:
        cursor.execute(_reserve_without_limits_sql(tuple(values), where_shape(where), tuple(row)), params)
        fenced, unlimited, reserved = cursor.fetchone()
    return bool(fenced), bool(unlimited), bool(reserved)


@functools.cache
def _reserve_without_limits_sql(names: tuple[str, ...], shape: WhereShape, columns: tuple[str, ...]) -> str:
    """The workflow's row first (``FOR SHARE``: it waits for a writer holding the row's lock, ``FOR
    NO KEY UPDATE``, which the new row's foreign key alone would not), then the activity's, the
    order every writer takes them in: a cancel holding the workflow's row and waiting for the activity's never waits on
    this statement in turn."""
    id_, total, hourly = (quoted_column(concrete_field(Workflow, name))
                          for name in ("id", "budget_total_usd", "budget_hourly_usd"))
    return (f"WITH unlimited AS (SELECT 1 FROM {quoted_table(Workflow)} WHERE {id_} = %s AND {total} IS NULL "
            f"AND {hourly} IS NULL FOR SHARE), "
            f"fenced AS (UPDATE {quoted_table(Activity)} SET {set_sql(Activity, names)} "
            f"WHERE {where_sql(Activity, shape)} AND EXISTS (SELECT 1 FROM unlimited) RETURNING 1), "
            f"reserved AS ({insert_select_sql(UsageEntry, columns)} FROM fenced "
            f"ON CONFLICT ({quoted_column(concrete_field(UsageEntry, 'key'))}) DO NOTHING RETURNING 1) "
            "SELECT EXISTS (SELECT 1 FROM fenced), EXISTS (SELECT 1 FROM unlimited), EXISTS (SELECT 1 FROM reserved)")


def budget_row_lock(workflow_id: int, key: str) -> tuple[Any, ...] | None:
    """Lock the workflow's row and read its budget: (total, hourly, priority, whether ``key`` is
    in the ledger, parent id, whether it has children) as the driver gives them; None when there
    is no such workflow."""
    with connection.cursor() as cursor:
        cursor.execute(_budget_lock_sql(), [key, workflow_id])
        row = cursor.fetchone()
    return None if row is None else tuple(row)


@functools.cache
def _budget_lock_sql() -> str:
    total, hourly, priority, id_, parent = (quoted_column(concrete_field(Workflow, name)) for name in (
        "budget_total_usd", "budget_hourly_usd", "priority", "id", "parent"))
    table = quoted_table(Workflow)
    lock = f" {row_lock_clause()}" if connection.features.has_select_for_update else ""
    return (f"SELECT {total}, {hourly}, {priority}, EXISTS (SELECT 1 FROM {quoted_table(UsageEntry)} WHERE "
            f"{quoted_column(concrete_field(UsageEntry, 'key'))} = %s), {parent}, "
            f"EXISTS (SELECT 1 FROM {table} AS child WHERE child.{parent} = {table}.{id_}) FROM {table} "
            f"WHERE {id_} = %s{lock}")
