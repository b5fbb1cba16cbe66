"""The database connection of a thread that is about to wait for something else."""
from __future__ import annotations

from django.conf import settings
from django.db import connection


def connection_release_while_waiting() -> None:
    """Give this thread's database connection back to the pool before it waits (for a model's
    answer, a tool, the next heartbeat), so that a pool of AGENTOPS_DB_POOL_SIZE connections
    serves hundreds of waiting threads; the next query takes one again (the pool checks it first).

    A no-op without the pool, where the kept connection is cheaper than a new one, and inside a
    transaction, which must keep its connection.
    """
    if settings.AGENTOPS_DB_POOL_SIZE and not connection.in_atomic_block:
        connection.close()
