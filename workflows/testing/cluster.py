"""Real `celery worker` and `celery beat` processes for process tests and benchmarks.

A ``Cluster`` starts workers (prefork, one pool process, named ``<name>@<host>``) and beats,
each in its own session (``start_new_session=True``): its pid is its process group id, so
``os.killpg`` reaches the pool children and the commands they run. It waits until each is
ready, stops, kills and pauses them, reads their logs and reports their pool processes and
memory. Every wait is bounded and a timeout carries the process logs (``Cluster.dump``).

The processes get the caller's environment, minus settings the cluster sets itself: the
database and broker URLs, short clocks (``SHORT_CLOCKS``), fault rules (``workflows/faults.py``)
and a directory of their own under ``run_dir``. Needs ``psutil`` (the ``test`` extra).
``tests/process/test_plugin_kind.py`` shows a test with a user's kind on real workers.
"""
from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from types import TracebackType
from typing import IO, Any, TypeVar
from urllib.parse import quote

import psutil  # type: ignore[import-untyped]
import redis

from workflows import doorbells

# Short clocks so that a lost lease is noticed within seconds.
LEASE_SECONDS = 4
REDISPATCH_AFTER_SECONDS = 2
CHECKPOINT_SECONDS = 0  # long activities that checkpoint do so after every step
# Whole seconds: django-celery-beat's DatabaseScheduler stores intervals in an integer column,
# and 0.5 became 0, which made beat send its sweeps in a busy loop (see agentops/settings.py).
BEAT_INTERVAL_SECONDS = 1
SHORT_CLOCKS = {
    "AGENTOPS_LEASE_SECONDS": str(LEASE_SECONDS),
    "AGENTOPS_REDISPATCH_AFTER_SECONDS": str(REDISPATCH_AFTER_SECONDS),
    "AGENTOPS_CHECKPOINT_SECONDS": str(CHECKPOINT_SECONDS),
    "AGENTOPS_BEAT_INTERVAL_SECONDS": str(BEAT_INTERVAL_SECONDS),
}
READY_TIMEOUT_SECONDS = 90.0
STOP_GRACE_SECONDS = 5.0
LOG_TAIL_LINES = 150
# Celery's own line once a worker consumes (logged at INFO), and beat's first send.
WORKER_READY_MARKER = " ready."
BEAT_READY_MARKER = "Sending due task"

T = TypeVar("T")


class WaitTimeout(AssertionError):
    """A bounded wait ran out, or a process it waited for exited; the message carries the dump."""


def wait_for(
    predicate: Callable[[], T], *, timeout: float, what: str, interval: float = 0.1,
    dump: Callable[[], str] | None = None,
) -> T:
    """Poll ``predicate`` until it returns something truthy, for at most ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() >= deadline:
            detail = dump() if dump is not None else ""
            raise WaitTimeout(f"timed out after {timeout:.0f} s waiting for {what}\n{detail}")
        time.sleep(interval)


# --- The broker and the database the processes share with the caller ---

def redis_ping(url: str, *, timeout: float = 1.0) -> bool:
    try:
        return bool(redis.Redis.from_url(url, socket_timeout=timeout, socket_connect_timeout=timeout).ping())
    except redis.RedisError:
        return False


class Broker:
    """A Redis DB used as the broker of one cluster (flushed by its owner before and after)."""

    def __init__(self, url: str, *, socket_timeout: float = 5.0) -> None:
        self.url = url
        self.client = redis.Redis.from_url(url, socket_timeout=socket_timeout, socket_connect_timeout=5)

    def ping(self) -> bool:
        try:
            return bool(self.client.ping())
        except redis.RedisError:
            return False

    def flushdb(self) -> None:
        self.client.flushdb()

    def server_run_id(self) -> str:
        """Changes when the Redis server restarts."""
        return str(self.client.info("server")["run_id"])


class RedisServer:
    """A ``redis-server`` child of this process, on its own port, without persistence: restarting
    it forgets every message and disturbs no other user of the machine's Redis. ``bind`` lists the
    addresses it listens on (127.0.0.1 first: ``url`` uses it)."""

    def __init__(self, port: int, run_dir: Path, *, bind: tuple[str, ...] = ("127.0.0.1",)) -> None:
        self.port, self.bind, self.dir = port, bind, run_dir / f"redis-{port}"
        self.dir.mkdir(parents=True, exist_ok=True)
        self.url = f"redis://{bind[0]}:{port}/0"
        self.popen: subprocess.Popen[bytes] | None = None
        self.starts = 0

    def start(self, timeout: float = 15.0) -> None:
        self.popen = subprocess.Popen(
            ["redis-server", "--port", str(self.port), "--bind", *self.bind, "--protected-mode", "no", "--save", "",
             "--appendonly", "no", "--dir", str(self.dir), "--logfile", str(self.dir / "redis.log")],
            stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
        self.starts += 1
        wait_for(lambda: redis_ping(self.url), timeout=timeout, what=f"redis-server on port {self.port} to answer",
                 dump=lambda: (self.dir / "redis.log").read_text(errors="replace")[-2000:])

    def client(self) -> redis.Redis:
        return redis.Redis.from_url(self.url, socket_timeout=5, socket_connect_timeout=5)

    def up(self) -> bool:
        return self.popen is not None and self.popen.poll() is None

    def shutdown_nosave(self) -> None:
        """``SHUTDOWN NOSAVE`` and wait for the process; a no-op when it is not running."""
        if self.popen is None or not self.up():
            return
        try:
            self.client().shutdown(nosave=True)
        except redis.RedisError:
            pass
        try:
            self.popen.wait(10)
        except subprocess.TimeoutExpired:
            self.popen.kill()
            self.popen.wait(5)


def free_port(host: str = "127.0.0.1") -> int:
    """A TCP port nothing listens on right now (the OS's pick)."""
    with socket.socket() as s:
        s.bind((host, 0))
        return int(s.getsockname()[1])


def subprocess_database_url() -> str:
    """The URL of the database this process uses (under pytest-django: test_<name>), for the subprocesses."""
    from django.db import connection

    s = connection.settings_dict
    auth = quote(s.get("USER") or "", safe="")
    if s.get("PASSWORD"):
        auth += ":" + quote(s["PASSWORD"], safe="")
    return f"postgres://{auth}@{s.get('HOST') or '127.0.0.1'}:{s.get('PORT') or 5432}/{s['NAME']}"


def point_celery_app_at(url: str) -> None:
    """Make this process publish doorbells to ``url``.

    The caller sets CELERY_BROKER_URL in the environment too: Celery reads it before its
    configuration (``publishing_to`` does both).
    """
    app = doorbells.publisher()
    app.conf["broker_url"] = url  # what `app.conf.broker_url = url` does (the stubs call it read-only)
    assert app.conf.broker_write_url == url, f"Celery would still publish to {app.conf.broker_write_url}"
    if not url.startswith("filesystem://"):
        # A shell without CELERY_BROKER_URL configured the filesystem broker: its transport class
        # and folders would stay in force for the new URL (every publish then fails, "data_in").
        app.conf["broker_transport"] = None
        if "data_folder_in" in (app.conf.broker_transport_options or {}):
            app.conf.broker_transport_options = {"visibility_timeout": 3600}
    # Drop the references only: kombu's global pool registry hands the same pool out again for
    # the same URL, so closing it here would break the next test's publishes.
    app._pool = None  # type: ignore[attr-defined]
    amqp = app.__dict__.get("amqp")
    if amqp is not None:
        amqp._producer_pool = None


@contextmanager
def publishing_to(url: str) -> Iterator[None]:
    """This process publishes its doorbells to ``url`` for the block, then to the broker it had."""
    from django.conf import settings

    app = doorbells.publisher()
    names = ("CELERY_BROKER_URL", "CELERY_BROKER_WRITE_URL")
    saved = {name: os.environ.pop(name, None) for name in names}
    transport = (app.conf.broker_transport, app.conf.broker_transport_options)
    os.environ["CELERY_BROKER_URL"] = url
    point_celery_app_at(url)
    try:
        yield
    finally:
        os.environ.pop("CELERY_BROKER_URL", None)
        os.environ.update({name: value for name, value in saved.items() if value is not None})
        point_celery_app_at(saved["CELERY_BROKER_URL"] or settings.CELERY_BROKER_URL)
        app.conf["broker_transport"], app.conf.broker_transport_options = transport


# --- One process ---

@dataclass
class Proc:
    """One celery worker or beat, leader of its own process group."""

    name: str
    role: str
    popen: subprocess.Popen[bytes]
    log_path: Path
    log_file: IO[bytes]
    launched_at: float
    # Touched by the worker app when it is ready, if the app does that (see Cluster.ready_file_env).
    ready_file: Path | None = None

    @property
    def pid(self) -> int:
        return self.popen.pid

    @property
    def pgid(self) -> int:
        # start_new_session=True: the leader's pid is the session and process group id.
        return self.popen.pid

    def alive(self) -> bool:
        return self.popen.poll() is None

    def log(self) -> str:
        return self.log_path.read_text(encoding="utf-8", errors="replace") if self.log_path.exists() else ""

    def log_tail(self, lines: int = LOG_TAIL_LINES) -> str:
        return "\n".join(self.log().splitlines()[-lines:])

    def ready(self) -> bool:
        """The ready file exists, or the log has Celery's ready line (a worker) or a first send (a beat)."""
        if self.ready_file is not None and self.ready_file.exists():
            return True
        return (WORKER_READY_MARKER if self.role == "worker" else BEAT_READY_MARKER) in self.log()

    def group_members(self) -> list[psutil.Process]:
        """Live processes of this group started since this leader (pool children, their commands)."""
        if not self.alive() and psutil.pid_exists(self.pgid):
            return []  # our leader is reaped and its pid reused: that group is somebody else's
        members = []
        for p in psutil.process_iter(["create_time", "status"]):
            try:
                if (os.getpgid(p.pid) == self.pgid and p.info["create_time"] >= self.launched_at - 1.0
                        and p.info["status"] != psutil.STATUS_ZOMBIE):
                    members.append(p)
            except (ProcessLookupError, psutil.Error):
                continue
        return members

    def pool_children(self) -> list[psutil.Process]:
        """The prefork pool processes (direct children of the worker's main process)."""
        try:
            return [c for c in psutil.Process(self.pid).children() if c.status() != psutil.STATUS_ZOMBIE]
        except psutil.Error:
            return []

    def descendant_running(self, fragment: str) -> psutil.Process | None:
        """A live descendant whose command line contains ``fragment`` (e.g. a command an activity runs)."""
        try:
            for p in psutil.Process(self.pid).children(recursive=True):
                if fragment in " ".join(p.cmdline()) and p.status() != psutil.STATUS_ZOMBIE:
                    return p
        except psutil.Error:
            return None
        return None

    def rss_bytes(self) -> dict[str, int]:
        """Resident memory of the main process (``main``) and of its first pool process (``pool``)."""
        out = {}
        try:
            out["main"] = psutil.Process(self.pid).memory_info().rss
        except psutil.Error:
            pass
        try:
            children = self.pool_children()
            if children:
                out["pool"] = children[0].memory_info().rss
        except psutil.Error:
            pass
        return out

    def total_rss_bytes(self) -> int:
        """Resident memory of the main process and all its descendants (pool processes, commands)."""
        total = 0
        try:
            leader = psutil.Process(self.pid)
            for p in [leader, *leader.children(recursive=True)]:
                try:
                    total += p.memory_info().rss
                except psutil.Error:
                    continue
        except psutil.Error:
            return 0
        return total

    def pause(self, *, pool_only: bool = False) -> None:
        """SIGSTOP the whole group, or only the pool processes (the main process keeps its broker link)."""
        if pool_only:
            for child in self.pool_children():
                os.kill(child.pid, signal.SIGSTOP)
        else:
            os.killpg(self.pgid, signal.SIGSTOP)

    def resume(self) -> None:
        """SIGCONT to the whole group (whatever ``pause`` stopped)."""
        os.killpg(self.pgid, signal.SIGCONT)

    def kill_group(self, sig: int = signal.SIGKILL, *, timeout: float = 15.0) -> int:
        """Signal the whole group and wait for the leader; returns its exit code (-9 for SIGKILL)."""
        if not self.alive():
            raise AssertionError(f"{self.name} (pid {self.pid}) already exited with {self.popen.returncode}")
        os.killpg(self.pgid, sig)
        code = self.popen.wait(timeout)
        # Pool children may outlive a leader killed with SIGTERM; SIGKILL reaches them directly.
        for p in self.group_members():
            _kill_quietly(p)
        self.log_file.close()
        return code

    def terminate(self) -> None:
        """SIGCONT (a stopped process ignores SIGTERM until continued), then SIGTERM, to the group."""
        if self.alive():
            for sig in (signal.SIGCONT, signal.SIGTERM):
                try:
                    os.killpg(self.pgid, sig)
                except ProcessLookupError:
                    break

    def stop(self, grace: float = STOP_GRACE_SECONDS) -> None:
        """SIGTERM to the group, SIGKILL after ``grace``; idempotent."""
        self.terminate()
        if self.alive():
            try:
                self.popen.wait(grace)
            except subprocess.TimeoutExpired:
                try:
                    os.killpg(self.pgid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
                self.popen.wait(10)
        for p in self.group_members():
            _kill_quietly(p)
        if not self.log_file.closed:
            self.log_file.close()


def _kill_quietly(p: psutil.Process) -> None:
    try:
        p.kill()
        p.wait(5)
    except psutil.Error:
        pass


# --- The cluster ---

@dataclass
class Cluster:
    """Workers and beats sharing one database, one broker DB and one directory (``run_dir``).

    ``run_dir`` holds ``logs/``, ``faults.log`` and, unless the caller's environment sets them,
    the processes' ``var/`` and ``workspaces/``. Use it as a context manager, or call
    ``stop_all()``, so that no process outlives the test.
    """

    run_dir: Path
    database_url: str
    broker_url: str
    # The directory the processes run in: it must be where the modules of AGENTOPS_AGENT_MODULES import from.
    cwd: Path = field(default_factory=Path.cwd)
    # The Celery app of the workers (``-A``); beats always run agentops's own.
    worker_app: str = "agentops"
    worker_log_level: str = "INFO"
    # Settings on top of the caller's environment; {} keeps the product's clocks.
    clocks: dict[str, str] = field(default_factory=lambda: dict(SHORT_CLOCKS))
    # Prefixes of the caller's environment the processes do not inherit (DATABASE_URL, CELERY_* and
    # DJANGO_* never pass). Dropping AGENTOPS_* keeps a test independent of the shell it runs in.
    drop_env_prefixes: tuple[str, ...] = ("AGENTOPS_",)
    # An environment variable through which the worker app touches a file once it is ready; None:
    # wait for Celery's ready line in the log instead (which needs worker_log_level INFO).
    ready_file_env: str | None = None
    # Settings every process of the cluster gets last (e.g. AGENTOPS_AGENT_MODULES).
    extra_env: dict[str, str] = field(default_factory=dict)
    tail_lines: int = LOG_TAIL_LINES
    procs: list[Proc] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.log_dir = self.run_dir / "logs"
        self.log_dir.mkdir(parents=True, exist_ok=True)
        self.fault_log = self.run_dir / "faults.log"
        self.fault_log.touch()

    def __enter__(self) -> Cluster:
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.stop_all()

    def env(self, *, faults: list[dict[str, Any]] | None = None,
            extra_env: dict[str, str] | None = None) -> dict[str, str]:
        """The environment of one process: inherited, then the cluster's settings, then ``extra_env``."""
        drop = ("DATABASE_URL", "CELERY_", "DJANGO_", *self.drop_env_prefixes)
        env = {k: v for k, v in os.environ.items() if not k.startswith(drop)}
        for name, value in (("AGENTOPS_VAR_DIR", self.run_dir / "var"),
                            ("AGENTOPS_WORKSPACE_DIR", self.run_dir / "workspaces"),
                            ("AGENTOPS_LOG_LEVEL", "INFO")):
            env.setdefault(name, str(value))
        env.update({
            "DJANGO_SETTINGS_MODULE": "agentops.settings",
            "DATABASE_URL": self.database_url,
            "CELERY_BROKER_URL": self.broker_url,
            "PYTHONUNBUFFERED": "1",
            **self.clocks,
            "AGENTOPS_FAULT_LOG": str(self.fault_log),
            "AGENTOPS_TESTING_FAULTS": json.dumps(faults) if faults else "",
            **self.extra_env,
            **(extra_env or {}),
        })
        return env

    def _spawn(self, name: str, role: str, args: list[str], env: dict[str, str],
               prefix: tuple[str, ...] = ()) -> Proc:
        # A name started again gets a log of its own, so its readiness is not read from the old one.
        starts = sum(1 for p in self.procs if (p.role, p.name) == (role, name))
        stem = f"{role}-{name}" + (f"-{starts + 1}" if starts else "")
        log_path = self.log_dir / f"{stem}.log"
        ready_file = None
        if self.ready_file_env:
            ready_file = self.run_dir / f"ready-{stem}"
            ready_file.unlink(missing_ok=True)
            env = {**env, self.ready_file_env: str(ready_file)}
        log_file = open(log_path, "ab")  # noqa: SIM115 - closed by Proc.stop()
        launched_at = time.time()
        popen = subprocess.Popen(
            [*prefix, sys.executable, "-m", "celery", *args], cwd=self.cwd, env=env,
            stdin=subprocess.DEVNULL, stdout=log_file, stderr=subprocess.STDOUT, start_new_session=True,
        )
        proc = Proc(name=name, role=role, popen=popen, log_path=log_path, log_file=log_file,
                    launched_at=launched_at, ready_file=ready_file)
        self.procs.append(proc)
        return proc

    def start_worker(
        self, name: str, *, faults: list[dict[str, Any]] | None = None,
        extra_env: dict[str, str] | None = None, ready: bool = True, prefix: tuple[str, ...] = (),
        pool: str = "prefork", concurrency: int = 1, queues: tuple[str, ...] = (),
    ) -> Proc:
        """A worker named ``<name>@<host>``: prefork with one pool process unless ``pool`` and
        ``concurrency`` say otherwise, consuming ``queues`` (all of them when empty); ``faults``
        are its fault rules. A threads worker needs ``AGENTOPS_DB_POOL_SIZE`` in ``extra_env``.

        ``prefix`` runs it through a command that then execs Python in the same process, such as
        ``("ip", "netns", "exec", "<namespace>")``, so that its pid still leads its group.
        """
        proc = self._spawn(name, "worker", [
            "-A", self.worker_app, "worker", "-P", pool, "-c", str(concurrency), "--without-gossip",
            "--without-mingle", "-n", f"{name}@%h", "-l", self.worker_log_level,
            *(["-Q", ",".join(queues)] if queues else []),
        ], self.env(faults=faults, extra_env=extra_env), prefix)
        if ready:
            self.wait_ready(proc)
        return proc

    def start_beat(
        self, name: str = "beat", *, ready: bool = True, extra_env: dict[str, str] | None = None,
        prefix: tuple[str, ...] = (),
    ) -> Proc:
        """A beat on the DatabaseScheduler; ``-s`` is passed though that scheduler keeps its state in the DB.
        ``extra_env`` and ``prefix`` as for ``start_worker``."""
        proc = self._spawn(name, "beat", [
            "-A", "agentops", "beat", "-l", "INFO", "-s", str(self.run_dir / f"beat-{name}-schedule"), "--pidfile=",
        ], self.env(extra_env=extra_env), prefix)
        if ready:
            self.wait_ready(proc)
        return proc

    def start(
        self, *, workers: tuple[str, ...] = (), beats: tuple[str, ...] = (),
        faults: list[dict[str, Any]] | None = None,
    ) -> list[Proc]:
        """Boot workers and beats side by side (each takes seconds to import Django), then wait for all."""
        procs = [self.start_worker(name, faults=faults, ready=False) for name in workers]
        procs += [self.start_beat(name, ready=False) for name in beats]
        self.wait_ready(*procs)
        return procs

    def wait_ready(self, *procs: Proc, timeout: float = READY_TIMEOUT_SECONDS) -> None:
        """Wait until each is ready; fail at once, with its log, if one exits."""
        for proc in procs:
            def ready(proc: Proc = proc) -> bool:
                if not proc.alive():
                    raise WaitTimeout(f"{proc.role} {proc.name} exited with {proc.popen.returncode}:\n"
                                      f"{proc.log_tail()}")
                return proc.ready()

            wait_for(ready, timeout=timeout, what=f"{proc.role} {proc.name} to be ready", interval=0.1,
                     dump=proc.log_tail)

    def live(self) -> list[Proc]:
        return [p for p in self.procs if p.alive()]

    def workers(self) -> list[Proc]:
        return [p for p in self.live() if p.role == "worker"]

    def beats(self) -> list[Proc]:
        return [p for p in self.live() if p.role == "beat"]

    def stop(self, procs: list[Proc], *, grace: float = STOP_GRACE_SECONDS) -> None:
        """Terminate these at once, then reap each (SIGKILL after the shared grace period)."""
        for proc in procs:
            proc.terminate()
        deadline = time.monotonic() + grace
        for proc in procs:
            proc.stop(grace=max(0.1, deadline - time.monotonic()))

    def stop_all(self) -> None:
        self.stop(list(self.procs))

    def faults_fired(self) -> list[dict[str, Any]]:
        """Lines of the fault log: each is written (and fsynced) before the fault acts."""
        text = self.fault_log.read_text(encoding="utf-8") if self.fault_log.exists() else ""
        return [json.loads(line) for line in text.splitlines() if line.strip()]

    def logs(self, lines: int | None = None) -> str:
        """The tail of every process's log, with its pid and state."""
        parts = []
        for proc in self.procs:
            state = "alive" if proc.alive() else f"exited {proc.popen.returncode}"
            parts.append(f"--- {proc.role} {proc.name} (pid {proc.pid}, {state}) {proc.log_path} ---\n"
                         f"{proc.log_tail(lines or self.tail_lines)}")
        return "\n".join(parts)

    def dump(self) -> str:
        """What a timeout shows; override to add the durable state (tests/process/harness.py does)."""
        return self.logs()

    def wait_for(self, predicate: Callable[[], T], *, timeout: float, what: str, interval: float = 0.1) -> T:
        return wait_for(predicate, timeout=timeout, what=what, interval=interval, dump=self.dump)
