"""The bench's own PostgreSQL database and Redis DB, its worker/beat cluster, and server counters.

The workers and beats are the test kit's cluster (``workflows.testing.cluster``, shared with
tests/process), set up for the bench below. Counters are read on fresh connections to the
``postgres`` database, so reading them never counts as work of the bench database.
"""
from __future__ import annotations

import os
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit, urlunsplit

import psutil
import psycopg

from workflows.testing import cluster as shared
from workflows.testing.cluster import Proc, wait_for  # noqa: F401  (re-exported: bench modules import them from here)

REPO_ROOT = Path(__file__).resolve().parents[1]

# Redis commands that put a message somewhere: task messages (LPUSH), fanout events (PUBLISH).
PUBLISH_COMMANDS = ("lpush", "rpush", "publish")


def database_backends(name: str) -> list[psutil.Process]:
    """The PostgreSQL server processes serving database ``name`` (on this host), for their CPU time."""
    return [p for p in psutil.process_iter(["cmdline"]) if f" {name} " in " ".join(p.info["cmdline"] or [])]


class BenchError(RuntimeError):
    """A benchmark could not run as set up; the message says what to do."""


def with_database(url: str, name: str) -> str:
    parts = urlsplit(url)
    return urlunsplit((parts.scheme, parts.netloc, "/" + name, parts.query, parts.fragment))


@dataclass
class Postgres:
    """The server at ``server_url`` and the databases the bench creates on it."""

    server_url: str

    def admin(self) -> psycopg.Connection[Any]:
        return psycopg.connect(with_database(self.server_url, "postgres"), autocommit=True)

    def recreate(self, name: str) -> str:
        with self.admin() as conn:
            conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
            conn.execute(f'CREATE DATABASE "{name}"')
        return with_database(self.server_url, name)

    def drop(self, name: str) -> None:
        with self.admin() as conn:
            conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')

    def xact_commit(self, name: str) -> int:
        """Transactions committed in database ``name`` (read-only ones included, as PostgreSQL counts)."""
        with self.admin() as conn:
            row = conn.execute("SELECT xact_commit FROM pg_stat_database WHERE datname = %s", [name]).fetchone()
        return int(row[0]) if row else 0

    def database_size(self, name: str) -> int:
        with self.admin() as conn:
            row = conn.execute("SELECT pg_database_size(%s)", [name]).fetchone()
        return int(row[0]) if row else 0

    def ping(self) -> bool:
        try:
            with self.admin() as conn:
                conn.execute("SELECT 1")
            return True
        except psycopg.Error:
            return False


class Broker(shared.Broker):
    """The Redis DB the bench uses as its broker; command counters are the whole server's."""

    def __init__(self, url: str) -> None:
        super().__init__(url, socket_timeout=10)

    def commandstats(self) -> dict[str, int]:
        stats = self.client.info("commandstats")
        return {name.removeprefix("cmdstat_"): int(v["calls"]) for name, v in stats.items()}


def command_deltas(before: dict[str, int], after: dict[str, int]) -> dict[str, int]:
    return {k: after.get(k, 0) - before.get(k, 0) for k in after if after.get(k, 0) - before.get(k, 0) > 0}


@dataclass
class Cluster(shared.Cluster):
    """Workers and beats of the bench, all pointed at the bench database and broker DB.

    The workers run ``bench.celery_app`` (agentops plus the bench's kinds and tasks) and log at
    WARNING, so they say they are ready through BENCH_READY_FILE. The processes keep the
    product's clocks and the orchestrator's AGENTOPS_* settings; BENCH_* stays with the orchestrator.
    """

    cwd: Path = REPO_ROOT
    worker_app: str = "bench.celery_app"
    worker_log_level: str = "WARNING"
    clocks: dict[str, str] = field(default_factory=dict)
    drop_env_prefixes: tuple[str, ...] = ("BENCH_",)
    ready_file_env: str | None = "BENCH_READY_FILE"
    tail_lines: int = 30


def pytest_running() -> list[str]:
    """Command lines of pytest runs on this machine (another engineer's timing-sensitive tests)."""
    found = []
    me = os.getpid()
    for p in psutil.process_iter(["pid", "cmdline"]):
        try:
            cmd = " ".join(p.info["cmdline"] or [])
        except psutil.Error:
            continue
        if p.info["pid"] != me and "pytest" in cmd and "python -m bench" not in cmd:
            found.append(f"{p.info['pid']}: {cmd[:120]}")
    return found


def wait_while_pytest_runs(*, max_wait: float, poll: float = 30.0, log: Callable[[str], None] = print) -> None:
    """Heavy runs skew others' timing tests (and theirs skew ours): wait until no pytest runs."""
    deadline = time.monotonic() + max_wait
    while True:
        running = pytest_running()
        if not running:
            return
        if time.monotonic() >= deadline:
            log(f"pytest still running after {max_wait:.0f} s; going ahead anyway: {running[0]}")
            return
        log(f"waiting for pytest to finish before the benchmark ({len(running)} process(es), e.g. {running[0]})")
        time.sleep(poll)


def percentile(values: list[float], p: float) -> float:
    """Nearest-rank percentile (p in 0..100) of a non-empty list."""
    ordered = sorted(values)
    k = max(0, min(len(ordered) - 1, int(round(p / 100 * len(ordered) + 0.5)) - 1))
    return ordered[k]
