"""The statements that hand out concurrency slots: who waits at the head of each tenant's line,
how many slots each tenant and kind holds, and the hand-out itself. Each reads or writes the
activity rows directly, as the pass runs under its advisory lock on every freed slot."""
from __future__ import annotations

import functools
from collections.abc import Iterable
from datetime import datetime
from typing import Any

from django.db import connection

from workflows.models import Activity, Workflow
from workflows.sql import concrete_field, db_value, quoted_column, quoted_table

# The columns ``waiting_heads`` returns, in order.
WAITING_FIELDS = ("id", "workflow", "name", "tenant", "kind", "slot_priority", "slot_waiting_since")


def waiting_heads(*, tenant: str, kind: str, hold: datetime, per_tenant: int, limit: int) -> list[tuple[Any, ...]]:
    """The first ``per_tenant`` activities of each tenant waiting for a slot near a trigger (its
    ``tenant``'s, or its ``kind``'s), by priority then age, of workflows not paused, and not handed
    a slot after ``hold``: at most ``limit`` rows of WAITING_FIELDS."""
    with connection.cursor() as cursor:
        cursor.execute(_heads_sql(), [
            db_value(Activity, "status", Activity.Status.SCHEDULED), tenant, kind,
            db_value(Activity, "slot_granted_at", hold), db_value(Workflow, "status", Workflow.Status.PAUSED),
            per_tenant, limit])
        return [tuple(row) for row in cursor.fetchall()]


def _columns(*names: str) -> dict[str, str]:
    return {name: quoted_column(concrete_field(Activity, name)) for name in names}


@functools.cache
def _heads_sql() -> str:
    c = _columns(*WAITING_FIELDS, "status", "slot_granted_at")
    fields = ", ".join(c[name] for name in WAITING_FIELDS)
    order = f"{c['slot_priority']} DESC, {c['slot_waiting_since']}, {c['id']}"
    workflow_pk, workflow_status = (quoted_column(concrete_field(Workflow, name)) for name in ("id", "status"))
    return (f"SELECT {', '.join(f'heads.{c[name]}' for name in WAITING_FIELDS)} FROM (SELECT {fields}, ROW_NUMBER() "
            f"OVER (PARTITION BY {c['tenant']} ORDER BY {order}) AS place FROM {quoted_table(Activity)} "
            f"WHERE {c['status']} = %s AND {c['slot_waiting_since']} IS NOT NULL "
            f"AND ({c['tenant']} = %s OR {c['kind']} = %s) "
            f"AND ({c['slot_granted_at']} IS NULL OR {c['slot_granted_at']} <= %s)) heads "
            f"JOIN {quoted_table(Workflow)} w ON w.{workflow_pk} = heads.{c['workflow']} AND w.{workflow_status} <> %s "
            f"WHERE place <= %s ORDER BY place, {', '.join(f'heads.{part}' for part in order.split(', '))} LIMIT %s")


def held_counts(tenants: Iterable[str], kinds: Iterable[str], *, hold: datetime) -> list[tuple[str, str, int]]:
    """(tenant, kind, slots held) for every pair of which the tenant is one of ``tenants`` or the
    kind one of ``kinds``: running attempts, and slots handed out after ``hold``."""
    tenants, kinds = sorted(set(tenants)), sorted(set(kinds))
    if not tenants and not kinds:
        return []
    c = _columns("status", "slot_granted_at", "tenant", "kind")
    near = " OR ".join(f"{c[column]} IN ({', '.join(['%s'] * len(values))})"
                       for column, values in (("tenant", tenants), ("kind", kinds)) if values)
    sql = (f"SELECT {c['tenant']}, {c['kind']}, COUNT(*) FROM {quoted_table(Activity)} WHERE ({c['status']} = %s OR "
           f"({c['status']} = %s AND {c['slot_granted_at']} > %s)) AND ({near}) GROUP BY {c['tenant']}, {c['kind']}")
    with connection.cursor() as cursor:
        cursor.execute(sql, [db_value(Activity, "status", Activity.Status.RUNNING),
                             db_value(Activity, "status", Activity.Status.SCHEDULED),
                             db_value(Activity, "slot_granted_at", hold), *tenants, *kinds])
        return [(tenant, kind, int(n)) for tenant, kind, n in cursor.fetchall()]


def grant(ids: Iterable[int], *, now: datetime) -> list[int]:
    """Keep a slot for each of the activities ``ids`` still waiting for one, due at once: those
    granted. A row another transaction holds locked (being voided, say) is skipped on PostgreSQL;
    SQLite has one writer at a time, so no row is locked by another."""
    ids = list(ids)
    c = _columns("id", "status", "slot_waiting_since", "slot_granted_at", "next_attempt_at", "dispatched_at")
    table, some = quoted_table(Activity), ", ".join(["%s"] * len(ids))
    waiting = f"{c['id']} IN ({some}) AND {c['status']} = %s AND {c['slot_waiting_since']} IS NOT NULL"
    skip_locked = " FOR UPDATE SKIP LOCKED" if connection.vendor == "postgresql" else ""
    at = db_value(Activity, "slot_granted_at", now)
    with connection.cursor() as cursor:
        cursor.execute(f"UPDATE {table} SET {c['slot_granted_at']} = %s, {c['next_attempt_at']} = %s, "
                       f"{c['dispatched_at']} = %s WHERE {c['id']} IN (SELECT {c['id']} FROM {table} WHERE "
                       f"{waiting}{skip_locked}) RETURNING {c['id']}",
                       [at, at, at, *ids, db_value(Activity, "status", Activity.Status.SCHEDULED)])
        return [pk for (pk,) in cursor.fetchall()]
