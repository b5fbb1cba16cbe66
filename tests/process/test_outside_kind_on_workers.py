"""tests/outside_kind on real workers and beat: its test that takes the kit plugin's ``workers``
fixture, in the package's own pytest session, with this run's Redis as its broker."""
from __future__ import annotations

import os

import pytest

from tests.test_outside_kind import outside_env, outside_session
from workflows.testing.cluster import RedisServer

pytestmark = pytest.mark.process


def test_the_outside_kind_runs_on_the_plugin_s_workers(process_redis: RedisServer | None, tmp_path) -> None:
    if process_redis is None or not os.environ.get("DATABASE_URL", "").startswith("postgres"):
        pytest.skip("needs this run's own Redis server and DATABASE_URL=postgres://…")
    env = {**outside_env("postgresql", tmp_path), "CELERY_BROKER_URL": f"{process_redis.url.rsplit('/', 1)[0]}/3"}
    done = outside_session(env, "test_on_workers.py")
    assert done.returncode == 0 and "1 passed" in done.stdout, done.stdout[-6000:] + done.stderr[-2000:]
