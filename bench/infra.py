"""The bench's own PostgreSQL database and Redis DB, real worker/beat subprocesses, and server counters.

Every process runs in its own session (``start_new_session=True``) so that a SIGKILL to its
process group reaches the pool children too. Counters are read on fresh connections to the
``postgres`` database, so reading them never counts as work of the bench database.
"""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any, TypeVar
from urllib.parse import urlsplit, urlunsplit

import psutil
import psycopg
import redis

REPO_ROOT = Path(__file__).resolve().parents[1]
T = TypeVar("T")

# Redis commands that put a message somewhere: task messages (LPUSH), fanout events (PUBLISH).
PUBLISH_COMMANDS = ("lpush", "rpush", "publish")


class BenchError(RuntimeError):
    """A benchmark could not run as set up; the message says what to do."""


def wait_for(predicate: Callable[[], T], *, timeout: float, what: str, interval: float = 0.1,
             dump: Callable[[], str] | None = None) -> T:
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() >= deadline:
            raise BenchError(f"timed out after {timeout:.0f} s waiting for {what}\n{dump() if dump else ''}")
        time.sleep(interval)


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


class Broker:
    """The Redis DB the bench uses as its broker; command counters are the whole server's."""

    def __init__(self, url: str) -> None:
        self.url = url
        self.client = redis.Redis.from_url(url, socket_timeout=10, socket_connect_timeout=5)

    def ping(self) -> bool:
        try:
            return bool(self.client.ping())
        except redis.RedisError:
            return False

    def flushdb(self) -> None:
        self.client.flushdb()

    def commandstats(self) -> dict[str, int]:
        stats = self.client.info("commandstats")
        return {name.removeprefix("cmdstat_"): int(v["calls"]) for name, v in stats.items()}


def command_deltas(before: dict[str, int], after: dict[str, int]) -> dict[str, int]:
    return {k: after.get(k, 0) - before.get(k, 0) for k in after if after.get(k, 0) - before.get(k, 0) > 0}


@dataclass
class Proc:
    """A celery worker or beat, leader of its own process group."""

    name: str
    role: str
    popen: subprocess.Popen[bytes]
    log_path: Path
    log_file: IO[bytes]
    ready_file: Path

    @property
    def pid(self) -> int:
        return self.popen.pid

    def alive(self) -> bool:
        return self.popen.poll() is None

    def log_tail(self, lines: int = 60) -> str:
        text = self.log_path.read_text(encoding="utf-8", errors="replace") if self.log_path.exists() else ""
        return "\n".join(text.splitlines()[-lines:])

    def pool_children(self) -> list[psutil.Process]:
        try:
            return [c for c in psutil.Process(self.pid).children() if c.status() != psutil.STATUS_ZOMBIE]
        except psutil.Error:
            return []

    def rss_bytes(self) -> dict[str, int]:
        """Resident memory of the main process and of its (single) pool process."""
        out = {}
        try:
            out["main"] = psutil.Process(self.pid).memory_info().rss
        except psutil.Error:
            pass
        children = self.pool_children()
        if children:
            out["pool"] = children[0].memory_info().rss
        return out

    def kill_group(self) -> None:
        os.killpg(self.pid, signal.SIGKILL)
        self.popen.wait(15)
        self.log_file.close()

    def stop(self, grace: float = 10.0) -> None:
        if self.alive():
            for sig in (signal.SIGCONT, signal.SIGTERM):
                try:
                    os.killpg(self.pid, sig)
                except ProcessLookupError:
                    break
            try:
                self.popen.wait(grace)
            except subprocess.TimeoutExpired:
                try:
                    os.killpg(self.pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
                self.popen.wait(10)
        if not self.log_file.closed:
            self.log_file.close()


@dataclass
class Cluster:
    """Workers and beats of the bench, all pointed at the bench database and broker DB."""

    run_dir: Path
    database_url: str
    broker_url: str
    env_overrides: dict[str, str] = field(default_factory=dict)
    procs: list[Proc] = field(default_factory=list)
    _serial: int = 0

    def env(self, extra: dict[str, str] | None = None) -> dict[str, str]:
        # AGENTOPS_* settings pass through: the workers run with the orchestrator's settings.
        env = {k: v for k, v in os.environ.items()
               if not k.startswith(("DATABASE_URL", "CELERY_", "DJANGO_", "BENCH_"))}
        env.update({
            "DJANGO_SETTINGS_MODULE": "agentops.settings",
            "DATABASE_URL": self.database_url,
            "CELERY_BROKER_URL": self.broker_url,
            "PYTHONUNBUFFERED": "1",
            **self.env_overrides,
            **(extra or {}),
        })
        return env

    def _spawn(self, name: str, role: str, args: list[str], extra: dict[str, str] | None) -> Proc:
        self._serial += 1
        log_dir = self.run_dir / "logs"
        log_dir.mkdir(parents=True, exist_ok=True)
        log_path = log_dir / f"{role}-{name}-{self._serial}.log"
        ready_file = self.run_dir / f"ready-{role}-{name}-{self._serial}"
        ready_file.unlink(missing_ok=True)
        log_file = open(log_path, "ab")  # noqa: SIM115 - closed by Proc.stop()
        env = self.env({"BENCH_READY_FILE": str(ready_file), **(extra or {})})
        popen = subprocess.Popen([sys.executable, "-m", "celery", *args], cwd=REPO_ROOT, env=env,
                                 stdin=subprocess.DEVNULL, stdout=log_file, stderr=subprocess.STDOUT,
                                 start_new_session=True)
        proc = Proc(name=name, role=role, popen=popen, log_path=log_path, log_file=log_file, ready_file=ready_file)
        self.procs.append(proc)
        return proc

    def start_worker(self, name: str, *, extra: dict[str, str] | None = None) -> Proc:
        """A prefork worker with one pool process, logging at WARNING (readiness through a file)."""
        return self._spawn(name, "worker", [
            "-A", "bench.celery_app", "worker", "-P", "prefork", "-c", "1", "--without-gossip",
            "--without-mingle", "-n", f"{name}@%h", "-l", "WARNING",
        ], extra)

    def start_beat(self, name: str = "beat") -> Proc:
        return self._spawn(name, "beat", [
            "-A", "agentops", "beat", "-l", "INFO", "-s", str(self.run_dir / f"beat-{name}-schedule"), "--pidfile=",
        ], None)

    def wait_ready(self, *procs: Proc, timeout: float = 90.0) -> None:
        for proc in procs:
            def ready(proc: Proc = proc) -> bool:
                if not proc.alive():
                    raise BenchError(f"{proc.role} {proc.name} exited with {proc.popen.returncode}:\n"
                                     f"{proc.log_tail()}")
                if proc.role == "worker":
                    return proc.ready_file.exists()
                return "Sending due task" in proc.log_path.read_text(encoding="utf-8", errors="replace")

            wait_for(ready, timeout=timeout, what=f"{proc.role} {proc.name} to be ready", interval=0.1,
                     dump=proc.log_tail)

    def workers(self) -> list[Proc]:
        return [p for p in self.procs if p.role == "worker" and p.alive()]

    def beats(self) -> list[Proc]:
        return [p for p in self.procs if p.role == "beat" and p.alive()]

    def stop(self, procs: list[Proc]) -> None:
        for proc in procs:
            if proc.alive():
                try:
                    os.killpg(proc.pid, signal.SIGTERM)
                except ProcessLookupError:
                    pass
        for proc in procs:
            proc.stop()

    def stop_all(self) -> None:
        self.stop(list(self.procs))

    def logs(self) -> str:
        return "\n".join(f"--- {p.role} {p.name} ({'alive' if p.alive() else p.popen.returncode}) ---\n"
                         f"{p.log_tail(30)}" for p in self.procs)


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
