"""The pool of a threads worker (AGENTOPS_DB_POOL_SIZE) checks a connection before handing it out
only when it sat idle for POOL_CHECK_IDLE_SECONDS or more (``agentops.db.postgresql``): one
given back a moment ago is handed out without the empty query Django's pool runs every time; one
that sat longer is checked, and a broken one (its server process gone, as after a PostgreSQL
restart) is replaced before any query of the thread's."""
from __future__ import annotations

import copy
import time
from collections.abc import Iterator
from typing import Any

import psycopg
import pytest
from django.db import OperationalError, connection
from psycopg_pool import ConnectionPool

from agentops.db.postgresql.base import DatabaseWrapper
from workflows import connections

pytestmark = [pytest.mark.django_db(transaction=True),
              pytest.mark.skipif(connection.vendor != "postgresql", reason="the pool is PostgreSQL's")]

ALIAS = "pool-check"


@pytest.fixture
def pooled() -> Iterator[DatabaseWrapper]:
    """A connection of the test database through the pooled backend, as a worker with
    AGENTOPS_DB_POOL_SIZE=1 has (the settings give it that ENGINE and those OPTIONS)."""
    settings_dict = copy.deepcopy(connection.settings_dict)
    settings_dict.update(ENGINE="agentops.db.postgresql", CONN_MAX_AGE=0, CONN_HEALTH_CHECKS=True)
    settings_dict["OPTIONS"]["pool"] = {"min_size": 1, "max_size": 1, "timeout": 5}
    wrapper = DatabaseWrapper(settings_dict, alias=ALIAS)
    yield wrapper
    wrapper.close()
    wrapper.close_pool()


@pytest.fixture
def checks(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """The backend pids of the connections the pool checked, in order."""
    seen: list[int] = []
    real = ConnectionPool.check_connection

    def counted(conn: Any) -> None:
        seen.append(conn.info.backend_pid)
        real(conn)

    monkeypatch.setattr(ConnectionPool, "check_connection", staticmethod(counted))
    return seen


def backend_pid(wrapper: DatabaseWrapper) -> int:
    """Take a connection from the pool, ask it its server process, give it back."""
    try:
        with wrapper.cursor() as cursor:
            cursor.execute("SELECT pg_backend_pid()")
            return int(cursor.fetchone()[0])
    finally:
        wrapper.close()


def terminate(pid: int) -> None:
    db = connection.settings_dict
    with psycopg.connect(host=db["HOST"], port=db["PORT"], user=db["USER"], dbname=db["NAME"],
                         autocommit=True) as other:
        other.execute("SELECT pg_terminate_backend(%s)", (pid,))


def test_the_backend_builds_the_pool_its_options_ask_for(pooled: DatabaseWrapper) -> None:
    pool = pooled.pool
    assert isinstance(pool, ConnectionPool) and pool.max_size == 1
    assert backend_pid(pooled) > 0


def test_a_connection_given_back_a_moment_ago_is_handed_out_unchecked(pooled: DatabaseWrapper,
                                                                       checks: list[int]) -> None:
    first = backend_pid(pooled)  # new: checked
    assert checks == [first]
    for _ in range(5):
        assert backend_pid(pooled) == first
    assert checks == [first]  # five checkouts, no empty query


def test_a_connection_that_sat_idle_is_checked_and_a_broken_one_replaced(
        pooled: DatabaseWrapper, checks: list[int], monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(connections, "POOL_CHECK_IDLE_SECONDS", 0.0)  # every connection has sat long enough
    first = backend_pid(pooled)
    assert backend_pid(pooled) == first and checks == [first, first]
    terminate(first)  # as a PostgreSQL restart does to every pooled connection
    second = backend_pid(pooled)  # no error: the check found it broken and the pool gave another
    assert second != first
    assert checks[:3] == [first, first, first] and checks[-1] == second


def test_one_broken_within_the_window_fails_its_first_query_and_the_next_gets_a_working_one(
        pooled: DatabaseWrapper, checks: list[int]) -> None:
    """What the window costs (docs/architecture.md): a server process killed less than
    POOL_CHECK_IDLE_SECONDS after its connection was given back fails the query of the thread that
    takes it, as a connection killed during a task does; the pool then drops it."""
    first = backend_pid(pooled)
    terminate(first)
    with pytest.raises(OperationalError):
        backend_pid(pooled)
    assert backend_pid(pooled) != first


def test_a_connection_is_given_back_in_the_thread_that_used_it(pooled: DatabaseWrapper,
                                                                monkeypatch: pytest.MonkeyPatch) -> None:
    """The return is noted and the connection is back in the pool before ``close`` returns: no
    task for the pool's worker thread (psycopg_pool's ``reset`` would make one of every return, a
    thread to wake for each of the several returns of a model call)."""
    tasks: list[str] = []
    real = ConnectionPool.run_task

    def run_task(pool: ConnectionPool, task: Any) -> None:
        tasks.append(type(task).__name__)
        real(pool, task)

    monkeypatch.setattr(ConnectionPool, "run_task", run_task)
    backend_pid(pooled)  # the first: the pool opens (its connection is a task)
    tasks.clear()
    before = time.monotonic()
    for _ in range(3):
        backend_pid(pooled)
        assert pooled.pool.get_stats()["pool_available"] == 1  # back already
    assert tasks == []
    with pooled.pool.connection() as conn:
        assert conn._agentops_returned_at >= before  # noted for pool_check_if_idle
