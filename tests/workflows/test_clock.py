"""clock.now(): the database server's clock on PostgreSQL, read once and advanced locally; time-machine moves it."""
from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from datetime import UTC, datetime, timedelta

import pytest
from django.db import connection

from tests.process.faketime import faketime_env
from tests.process.harness import REPO_ROOT, subprocess_database_url
from workflows import clock

pytestmark = pytest.mark.django_db

SKEW_SECONDS = 300
# What this host's clock and the database's may disagree by here (both run on this machine),
# plus the time the statement takes: far below the skew the tests put between them.
SAME_HOST_TOLERANCE = timedelta(milliseconds=250)


@pytest.fixture(autouse=True)
def postgres_only() -> None:
    if connection.vendor != "postgresql":
        pytest.skip("the database clock is PostgreSQL's; on SQLite clock.now() is the Python clock by design")
    clock.resync()


def server_now() -> datetime:
    with connection.cursor() as cursor:
        cursor.execute("SELECT statement_timestamp()")
        row = cursor.fetchone()
    assert row is not None
    return row[0].astimezone(UTC)


CHILD = """
import json, django
django.setup()
from django.utils import timezone
from workflows import clock
print(json.dumps({"clock": clock.now().isoformat(), "python": timezone.now().isoformat()}))
"""


def test_now_is_the_database_servers_time_on_a_host_whose_clock_is_five_minutes_behind():
    """A process whose wall clock is 300 s behind gets the server's time from clock.now()."""
    env = {**{k: v for k, v in os.environ.items() if not k.startswith(("DATABASE_URL", "AGENTOPS_CLOCK"))},
           **faketime_env(-SKEW_SECONDS), "DATABASE_URL": subprocess_database_url(),
           "DJANGO_SETTINGS_MODULE": "agentops.settings"}
    before = server_now()
    done = subprocess.run([sys.executable, "-c", CHILD], cwd=REPO_ROOT, env=env, capture_output=True, text=True,
                          timeout=60, check=False)
    after = server_now()
    assert done.returncode == 0, done.stderr
    seen = json.loads(done.stdout.strip().splitlines()[-1])
    child_clock, child_python = datetime.fromisoformat(seen["clock"]), datetime.fromisoformat(seen["python"])
    # The child's own clock is really off: its Python clock read the same moment 300 s behind.
    assert before - timedelta(seconds=SKEW_SECONDS + 5) < child_python < after - timedelta(seconds=SKEW_SECONDS - 5)
    assert before - SAME_HOST_TOLERANCE <= child_clock <= after + SAME_HOST_TOLERANCE, (before, child_clock, after)


def test_the_server_is_asked_once_then_the_reading_advances_with_the_monotonic_clock(django_assert_num_queries):
    """After one reading, calls cost no query and still agree with the server's clock."""
    with django_assert_num_queries(1):
        first = clock.now()
    with django_assert_num_queries(0):
        readings = [clock.now() for _ in range(1000)]
        time.sleep(0.05)
        later = clock.now()
    assert readings == sorted(readings) and first <= readings[0]
    assert later - first >= timedelta(milliseconds=50)
    assert abs(clock.now() - server_now()) < SAME_HOST_TOLERANCE


def test_the_server_is_asked_again_after_the_resync_interval(settings, django_assert_num_queries):
    """AGENTOPS_CLOCK_RESYNC_SECONDS bounds how long a reading is advanced locally (0: every call asks)."""
    settings.AGENTOPS_CLOCK_RESYNC_SECONDS = 0
    with django_assert_num_queries(3):
        values = [clock.now() for _ in range(3)]
    assert values == sorted(values)


@pytest.mark.parametrize(("behind", "followed"), [(timedelta(milliseconds=200), False), (timedelta(hours=1), True)])
def test_a_reading_behind_the_last_time_given_holds_time_unless_the_server_was_set_back(behind, followed):
    """A new reading half a round trip behind the last one does not take time back; a server clock
    set back an hour is followed."""
    given = clock.now()
    clock._reading = clock._Reading(at=given - behind, monotonic=time.monotonic())
    later = clock.now()
    assert (later < given) is followed
    if not followed:
        assert later == given
        time.sleep(0.25)
        assert clock.now() > given  # the held time moves on once the clock passes it


def test_time_machine_moves_the_clock_without_asking_the_server(time_machine, django_assert_num_queries):
    """While time-machine travels, clock.now() is the Python clock it moves (tests move time this way)."""
    destination = datetime(2031, 5, 4, 3, 2, 1, tzinfo=UTC)
    time_machine.move_to(destination, tick=False)
    with django_assert_num_queries(0):
        assert clock.now() == destination
    time_machine.shift(timedelta(hours=2))
    assert clock.now() == destination + timedelta(hours=2)


def test_the_python_clock_setting_never_asks_the_server(settings, django_assert_num_queries):
    """AGENTOPS_CLOCK=python reads this process's clock on PostgreSQL too."""
    settings.AGENTOPS_CLOCK = "python"
    settings.AGENTOPS_CLOCK_RESYNC_SECONDS = 0
    with django_assert_num_queries(0):
        value = clock.now()
    assert abs(value - datetime.now(UTC)) < SAME_HOST_TOLERANCE
