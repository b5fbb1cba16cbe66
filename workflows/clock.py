"""The one source of time for the durable plane: on PostgreSQL, the database server's clock.

Leases, timers, retry windows, expiries and deadlines are written by one host and compared by
another (a worker writes ``lease_expires_at``, beat's sweep compares it with its own ``now``),
so every durable time must come from one clock. On PostgreSQL that is the server's: a process
reads ``statement_timestamp()`` once, then advances that reading with its own monotonic clock,
and reads it again every AGENTOPS_CLOCK_RESYNC_SECONDS. So ``now()`` costs no round trip, and a
host whose wall clock is minutes off writes and compares the same times as every other host.
On SQLite (the single-host embedded default) the database and every process share one host's
clock: ``now()`` is the Python clock there.

Tests move the clock with time-machine: while it travels, ``now()`` is the Python clock it
moves. AGENTOPS_CLOCK=python uses the Python clock on PostgreSQL too. See docs/architecture.md, "Time".
"""
from __future__ import annotations

import sys
import threading
import time
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta

from django.conf import settings
from django.db import connection
from django.utils import timezone

from workflows.sql.server import server_clock


@dataclass(frozen=True)
class _Reading:
    """The database server's clock, read at ``monotonic`` (``time.monotonic()``) of this process."""

    at: datetime
    monotonic: float


# One reading per process, shared by its threads. A forked pool process inherits it and may go on
# using it: CLOCK_MONOTONIC is the same clock in every process of the host.
_reading: _Reading | None = None
# The latest time now() gave in this process. A new reading may land up to half a round trip
# behind the one before it (the server stamps the statement when it starts it, we pin the reading
# at the round trip's middle): now() holds at the latest time given until the clock passes it,
# so no caller sees time go back. A step back of more than STEP_BACK is the server's clock
# really set back, and is followed.
_latest: datetime | None = None
_latest_lock = threading.Lock()
STEP_BACK = timedelta(seconds=1)


def now() -> datetime:
    """The current time of the database server (on SQLite, or while time-machine travels, of this process)."""
    if _python_clock():
        return timezone.now()
    reading, mono = _reading, time.monotonic()
    if reading is None or mono - reading.monotonic >= settings.AGENTOPS_CLOCK_RESYNC_SECONDS:
        reading = _read_database_clock(reading)
    return _not_before_latest(reading.at + timedelta(seconds=mono - reading.monotonic))


def _not_before_latest(value: datetime) -> datetime:
    global _latest
    with _latest_lock:
        if _latest is not None and _latest - STEP_BACK < value < _latest:
            return _latest
        _latest = value
        return value


def _python_clock() -> bool:
    if settings.AGENTOPS_CLOCK == "python" or connection.vendor != "postgresql":
        return True
    # time-machine is a test dependency: look for it, never import it.
    machine = sys.modules.get("time_machine")
    return machine is not None and bool(machine.escape_hatch.is_travelling())


def _read_database_clock(previous: _Reading | None) -> _Reading:
    """Read the server's clock, at the middle of the round trip; keep ``previous`` while the
    current transaction is broken (no query may run until its atomic block ends)."""
    global _reading
    if previous is not None and connection.needs_rollback:
        return previous
    at, monotonic = server_clock()
    _reading = _Reading(at=at.astimezone(UTC), monotonic=monotonic)
    return _reading


def resync() -> None:
    """Forget the last reading: the next ``now()`` reads the server's clock again."""
    global _reading, _latest
    _reading = _latest = None
