"""The database connection of a thread that is about to wait for something else; when the pool
checks a connection; prepared statements that a migration made stale."""
from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import psycopg
from django.conf import settings
from django.db import NotSupportedError, connection
from psycopg_pool import ConnectionPool

from workflows.sql.server import forget_prepared_statements


def connection_release_while_waiting() -> None:
    """Give this thread's database connection back to the pool before it waits (for a model's
    answer, a tool, the next heartbeat), so that a pool of AGENTOPS_DB_POOL_SIZE connections
    serves hundreds of waiting threads; the next query takes one again (checked first if it sat idle:
    ``pool_check_if_idle``).

    A no-op without the pool, where the kept connection is cheaper than a new one, and inside a
    transaction, which must keep its connection.
    """
    if settings.AGENTOPS_DB_POOL_SIZE and not connection.in_atomic_block:
        connection.close()


# A pooled connection given back less than this long ago is handed out unchecked: it worked then,
# and under load each is given back every few milliseconds. One that sat longer (an idle
# worker's, one a PostgreSQL restart may have broken: a restart takes longer than this) is
# checked with an empty query first, and replaced if that fails.
POOL_CHECK_IDLE_SECONDS = 1.0


class ReturnStampedPool(ConnectionPool):
    """psycopg_pool's pool, noting on each connection when it came back (for ``pool_check_if_idle``).

    The note is made in ``putconn``, in the thread that gives the connection back. psycopg_pool's
    ``reset`` callback could make it too, but a pool with one hands every return to its worker
    thread as a task: one more thread to wake for each of the several returns of a model call,
    an interpreter hand-off each under load."""

    def putconn(self, conn: psycopg.Connection[Any]) -> None:
        conn._agentops_returned_at = time.monotonic()  # type: ignore[attr-defined]
        super().putconn(conn)


def pool_check_if_idle(conn: psycopg.Connection[Any]) -> None:
    """psycopg_pool's ``check`` (``agentops.db.postgresql``): raise if a connection that sat in
    the pool ``POOL_CHECK_IDLE_SECONDS`` or more (or was never given back: a new one) no longer
    works; the pool then discards it and hands out another."""
    returned_at = getattr(conn, "_agentops_returned_at", None)
    if returned_at is None or time.monotonic() - returned_at >= POOL_CHECK_IDLE_SECONDS:
        ConnectionPool.check_connection(conn)


# PostgreSQL's refusal to run a statement prepared before a migration changed the type of a column
# it returns (``AGENTOPS_DB_PREPARE_THRESHOLD`` prepares statements per connection).
STALE_PLAN_SQLSTATE = "0A000"
STALE_PLAN_MESSAGE = "cached plan must not change result type"


def forget_stale_plans(execute: Callable[..., Any], sql: str, params: Any, many: bool,
                       context: dict[str, Any]) -> Any:
    """A Django execute wrapper (every connection gets it, ``watch_for_stale_plans``): when a
    statement prepared before a migration changed a column it returns is refused, forget this
    connection's prepared statements. Outside a transaction the statement, which did not run, is
    run again at once; inside one the transaction has failed anyway, its ROLLBACK makes psycopg
    forget them, and the task is retried as for any database error. Without it, a connection kept
    for minutes (a web thread's, a pooled worker's) would refuse that statement until it closed."""
    try:
        return execute(sql, params, many, context)
    except NotSupportedError as exc:
        cause = exc.__cause__
        if getattr(cause, "sqlstate", None) != STALE_PLAN_SQLSTATE or STALE_PLAN_MESSAGE not in str(cause):
            raise
        raw = context["connection"].connection
        if raw is None or raw.info.transaction_status != psycopg.pq.TransactionStatus.IDLE:
            raise
        forget_prepared_statements(raw)
        return execute(sql, params, many, context)


def watch_for_stale_plans(sender: Any, connection: Any, **kwargs: Any) -> None:
    """``connection_created``: a PostgreSQL connection that prepares statements gets ``forget_stale_plans``."""
    if connection.vendor == "postgresql" and forget_stale_plans not in connection.execute_wrappers:
        connection.execute_wrappers.append(forget_stale_plans)
