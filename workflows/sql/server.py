"""What the database server itself answers or does: its clock, its locks, its view of other
sessions, a transaction's isolation, a session's end. Each is one statement of the server's own
functions, most of them PostgreSQL's: the advisory lock takes nothing on SQLite, the clock reads
there too, and the callers of the rest ask for them on PostgreSQL only."""
from __future__ import annotations

import time
from datetime import datetime
from typing import Any

from django.db import connection


def advisory_xact_lock(*key: int) -> None:
    """Hold PostgreSQL's transaction-level advisory lock on ``key`` (one bigint, or two ints) until
    the transaction ends. SQLite lets one writer in at a time, so there it takes nothing."""
    if connection.vendor == "postgresql":
        with connection.cursor() as cursor:
            cursor.execute(f"SELECT pg_advisory_xact_lock({', '.join(['%s'] * len(key))})", list(key))


def server_clock() -> tuple[datetime, float]:
    """The server's clock at this statement (``statement_timestamp()``; SQLite's Django backend
    defines the function too), and this process's ``time.monotonic()`` at the middle of the round
    trip."""
    with connection.cursor() as cursor:
        before = time.monotonic()
        cursor.execute("SELECT statement_timestamp()")
        after = time.monotonic()
        row = cursor.fetchone()
    assert row is not None
    return row[0], (before + after) / 2


def repeatable_read() -> None:
    """Make the transaction just begun read one snapshot (PostgreSQL; before its first query)."""
    with connection.cursor() as cursor:
        cursor.execute("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ")


def open_transaction_ids() -> frozenset[str]:
    """The transaction ids held by this database's other sessions, as the server sees them now
    (PostgreSQL; not the view of pg_stat_activity as this transaction first read it)."""
    with connection.cursor() as cursor:
        cursor.execute("SELECT pg_stat_clear_snapshot()")
        cursor.execute("SELECT backend_xid::text FROM pg_stat_activity WHERE datname = current_database() "
                       "AND backend_xid IS NOT NULL AND pid <> pg_backend_pid()")
        return frozenset(xid for (xid,) in cursor.fetchall())


def terminate_own_session() -> None:
    """The server ends this session mid-transaction (PostgreSQL), as when a connection drops: the
    transaction is lost and this statement raises OperationalError. A fault injection's."""
    with connection.cursor() as cursor:
        cursor.execute("SELECT pg_terminate_backend(pg_backend_pid())")


def forget_prepared_statements(raw: Any) -> None:
    """Deallocate every statement a psycopg connection (``raw``, idle) prepared; psycopg forgets
    its own cache of them when it sees this."""
    raw.execute("DEALLOCATE ALL")
