"""Fixtures for process tests: a broker of their own, a cluster of real workers and beats, and figures."""
from __future__ import annotations

import os
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from django.db import connection

from agentops.deploytarget.server import DeployTargetServer
from tests.fakes.anthropic_api import FakeAnthropicAPI
from tests.process.harness import REPO_ROOT, Broker, Cluster, db_report, redis_ping, subprocess_database_url
from workflows.testing.cluster import RedisServer, free_port, publishing_to

# Unset (the default): each pytest run starts a redis-server of its own on a free port, so that no
# other run's workers take its doorbells or flush its broker, and test_restarts.py restarts that
# server, not the machine's. Set: the process tests use this Redis DB (flushed before every test).
SHARED_BROKER_URL = os.environ.get("AGENTOPS_PROCESS_BROKER_URL", "")

_REPORTS = pytest.StashKey[dict[str, pytest.TestReport]]()
FIGURES: list[tuple[str, dict[str, Any]]] = []


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]) -> pytest.TestReport:
    report: pytest.TestReport = yield
    item.stash.setdefault(_REPORTS, {})[report.when] = report
    return report


def pytest_terminal_summary(terminalreporter: Any) -> None:
    if not FIGURES:
        return
    terminalreporter.section("process test figures")
    for scenario, values in FIGURES:
        terminalreporter.write_line(f"{scenario}: " + ", ".join(f"{k}={v}" for k, v in values.items()))


@pytest.fixture
def figures() -> Callable[..., None]:
    """Record the measured figures of a scenario; printed at once and in the terminal summary."""

    def record(scenario: str, **values: Any) -> None:
        FIGURES.append((scenario, values))
        print(f"\n[figures] {scenario}: " + ", ".join(f"{k}={v}" for k, v in values.items()))

    return record


@pytest.fixture
def claude_api() -> Iterator[FakeAnthropicAPI]:
    """The fake Messages API on loopback, for workers pointed at it with ANTHROPIC_BASE_URL."""
    api = FakeAnthropicAPI().start()
    yield api
    api.stop()
    assert not api.unexpected, api.unexpected


@pytest.fixture(scope="session")
def process_redis(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RedisServer | None]:
    """This run's own Redis server (None when AGENTOPS_PROCESS_BROKER_URL names a shared one)."""
    if SHARED_BROKER_URL:
        yield None
        return
    server = RedisServer(free_port(), tmp_path_factory.mktemp("process-redis"))
    server.start()
    try:
        yield server
    finally:
        server.shutdown_nosave()


@pytest.fixture
def process_broker(process_redis: RedisServer | None) -> Iterator[Broker]:
    """Flush the process tests' broker and make this process publish its doorbells there."""
    if connection.vendor != "postgresql":
        pytest.skip("process tests need PostgreSQL: run with DATABASE_URL=postgres://…")
    url = process_redis.url if process_redis is not None else SHARED_BROKER_URL
    if process_redis is not None and not process_redis.up():
        process_redis.start()  # a test that restarted it failed before bringing it back
    if not redis_ping(url):
        pytest.fail(f"Redis at {url} does not answer; start it (see tests/process/harness.py REDIS_SERVER_COMMAND).")
    broker = Broker(url)
    broker.flushdb()
    with publishing_to(url):
        yield broker
    if redis_ping(url):
        broker.flushdb()


@pytest.fixture
def cluster(
    request: pytest.FixtureRequest, transactional_db: None, deploy_target: DeployTargetServer,
    process_broker: Broker, tmp_path: Path,
) -> Iterator[Cluster]:
    """Workers and beats started by the test; all stopped (SIGTERM, then SIGKILL) before the DB is flushed."""
    procs = Cluster(run_dir=tmp_path, database_url=subprocess_database_url(), broker_url=process_broker.url,
                    cwd=REPO_ROOT, extra_env={"AGENTOPS_DEPLOY_TARGET_URL": deploy_target.url})
    try:
        yield procs
    finally:
        procs.stop_all()
        reports = request.node.stash.get(_REPORTS, {})
        if any(r.failed for r in reports.values()):
            print(f"\n===== process logs of {request.node.name} (in {procs.log_dir}) =====")
            print(procs.logs(lines=400))
            try:
                print(db_report())
            except Exception as exc:  # the dump must not hide the test's own failure
                print(f"(durable state unavailable: {exc!r})")
