"""Real `celery worker` and `celery beat` subprocesses for failure tests: start, kill, pause, wait, dump.

Every process runs in its own session (``start_new_session=True``), so its pid is its process
group id and ``os.killpg`` reaches the pool children and the commands they run. Every wait is
bounded by a deadline; a timeout dumps the durable rows and the process logs.
"""
from __future__ import annotations

import hashlib
import json
import os
import re
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import IO, Any, TypeVar
from urllib.parse import quote

import psutil
import redis

REPO_ROOT = Path(__file__).resolve().parents[2]

# Short clocks so that a lost lease is noticed within seconds.
LEASE_SECONDS = 4
REDISPATCH_AFTER_SECONDS = 2
CHECKPOINT_SECONDS = 0  # long activities that checkpoint do so after every step
# Whole seconds: django-celery-beat's DatabaseScheduler stores intervals in an integer column,
# and 0.5 became 0, which made beat send its sweeps in a busy loop (see agentops/settings.py).
BEAT_INTERVAL_SECONDS = 1
READY_TIMEOUT_SECONDS = 60.0
STOP_GRACE_SECONDS = 5.0
LOG_TAIL_LINES = 150

# The command the shared CI Redis is started with (no persistence: a restart loses every message).
REDIS_SERVER_COMMAND = [
    "redis-server", "--daemonize", "yes", "--bind", "127.0.0.1", "-::1", "--port", "6379", "--save", "",
    "--appendonly", "no", "--dir", "/var/lib/redis", "--logfile", "/var/log/redis/ci.log",
]

T = TypeVar("T")


class WaitTimeout(AssertionError):
    """A bounded wait ran out; the message carries the dump of rows and logs."""


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


def subprocess_database_url() -> str:
    """The URL of the database pytest-django created (test_<name>), for the subprocesses."""
    from django.db import connection

    s = connection.settings_dict
    auth = quote(s.get("USER") or "", safe="")
    if s.get("PASSWORD"):
        auth += ":" + quote(s["PASSWORD"], safe="")
    return f"postgres://{auth}@{s.get('HOST') or '127.0.0.1'}:{s.get('PORT') or 5432}/{s['NAME']}"


def point_celery_app_at(url: str) -> None:
    """Make this process publish doorbells to ``url``.

    The caller sets CELERY_BROKER_URL in the environment too: Celery reads it before its configuration.
    """
    from agentops.celery import app

    app.conf.broker_url = url
    assert app.conf.broker_write_url == url, f"Celery would still publish to {app.conf.broker_write_url}"
    if "data_folder_in" in (app.conf.broker_transport_options or {}):
        app.conf.broker_transport_options = {"visibility_timeout": 3600}
    # Drop the references only: kombu's global pool registry hands the same pool out again for
    # the same URL, so closing it here would break the next test's publishes.
    app._pool = None
    amqp = app.__dict__.get("amqp")
    if amqp is not None:
        amqp._producer_pool = None


def db_report(*, events_per_workflow: int = 60) -> str:
    """Workflows with their activities, attempts, waits, timers and latest events, as text."""
    from workflows.models import Activity, Event, Timer, Wait, Workflow

    lines = ["--- durable state ---"]
    for wf in Workflow.objects.order_by("pk"):
        lines.append(f"workflow {wf.pk}: {wf.status} at {wf.current_node} updated={_t(wf.updated_at)} "
                     f"event_seq={wf.event_seq} reason={wf.reason[:200]!r}")
        for a in Activity.objects.filter(workflow=wf).order_by("pk"):
            lines.append(f"  activity {a.pk} {a.name} {a.operation_id} {a.status} attempt={a.attempt} "
                         f"lease_expires={_t(a.lease_expires_at)} next={_t(a.next_attempt_at)} "
                         f"dispatched={_t(a.dispatched_at)} error={a.error[:160]!r}")
            for at in a.attempts.order_by("number"):
                lines.append(f"    attempt {at.number} {at.status} worker={at.worker} started={_t(at.started_at)} "
                             f"finished={_t(at.finished_at)} error={at.error[:160]!r}")
        for w in Wait.objects.filter(workflow=wf).order_by("pk"):
            lines.append(f"  wait {w.pk} {w.kind} {w.status} expires={_t(w.expires_at)} decision={w.decision}")
        for t in Timer.objects.filter(workflow=wf).order_by("pk"):
            lines.append(f"  timer {t.pk} {t.purpose} {t.status} fire_at={_t(t.fire_at)} fired={_t(t.fired_at)}")
        events = list(Event.objects.filter(workflow=wf).order_by("-seq")[:events_per_workflow])[::-1]
        for e in events:
            lines.append(f"  #{e.seq} {_t(e.created_at)} {e.kind} {json.dumps(e.data, default=str)[:220]}")
    return "\n".join(lines)


def _t(value: datetime | None) -> str:
    return value.strftime("%H:%M:%S.%f")[:-3] if value else "-"


@dataclass
class Proc:
    """One celery worker or beat, leader of its own process group."""

    name: str
    role: str
    popen: subprocess.Popen[bytes]
    log_path: Path
    launched_at: float
    log_file: IO[bytes]

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
        return self.log_path.read_text(encoding="utf-8", errors="replace")

    def log_tail(self, lines: int = LOG_TAIL_LINES) -> str:
        return "\n".join(self.log().splitlines()[-lines:])

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
        except psutil.NoSuchProcess:
            return []

    def descendant_running(self, fragment: str) -> psutil.Process | None:
        """A live descendant whose command line contains ``fragment`` (e.g. the test command)."""
        try:
            for p in psutil.Process(self.pid).children(recursive=True):
                if fragment in " ".join(p.cmdline()) and p.status() != psutil.STATUS_ZOMBIE:
                    return p
        except psutil.Error:
            return None
        return None

    def kill_group(self, sig: int = signal.SIGKILL, *, timeout: float = 15.0) -> int:
        """Signal the whole group and wait for the leader; returns its exit code (-9 for SIGKILL)."""
        if not self.alive():
            raise AssertionError(f"{self.name} (pid {self.pid}) already exited with {self.popen.returncode}")
        os.killpg(self.pgid, sig)
        code = self.popen.wait(timeout)
        # Pool children may outlive a leader killed with SIGTERM; SIGKILL reaches them directly.
        for p in self.group_members():
            _kill_quietly(p)
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
        """Teardown: SIGTERM to the group, SIGKILL after ``grace``; idempotent."""
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


@dataclass
class Cluster:
    """Workers and beats of one test, sharing its database, broker DB, deploy target and fault log."""

    tmp_path: Path
    broker_url: str
    database_url: str
    deploy_target_url: str
    procs: list[Proc] = field(default_factory=list)
    # Settings every process of the cluster gets on top of the test ones (e.g. AGENTOPS_AGENT_MODULES).
    extra_env: dict[str, str] = field(default_factory=dict)

    def __post_init__(self) -> None:
        self.log_dir = self.tmp_path / "logs"
        self.log_dir.mkdir(parents=True, exist_ok=True)
        self.fault_log = self.tmp_path / "faults.log"
        self.fault_log.touch()

    def env(self, *, faults: list[dict[str, Any]] | None = None) -> dict[str, str]:
        """The subprocess environment: the test database, the broker DB, short clocks, per-test paths."""
        env = {k: v for k, v in os.environ.items()
               if not k.startswith(("AGENTOPS_", "DATABASE_URL", "CELERY_", "DJANGO_"))}
        env.update({
            "DJANGO_SETTINGS_MODULE": "agentops.settings",
            "DATABASE_URL": self.database_url,
            "CELERY_BROKER_URL": self.broker_url,
            "AGENTOPS_BEAT_INTERVAL_SECONDS": str(BEAT_INTERVAL_SECONDS),
            "AGENTOPS_LEASE_SECONDS": str(LEASE_SECONDS),
            "AGENTOPS_REDISPATCH_AFTER_SECONDS": str(REDISPATCH_AFTER_SECONDS),
            "AGENTOPS_CHECKPOINT_SECONDS": str(CHECKPOINT_SECONDS),
            "AGENTOPS_VAR_DIR": str(self.tmp_path / "var"),
            "AGENTOPS_FAULT_LOG": str(self.fault_log),
            "AGENTOPS_WORKSPACE_DIR": str(self.tmp_path / "workspaces"),
            "AGENTOPS_DEPLOY_TARGET_URL": self.deploy_target_url,
            "AGENTOPS_TESTING_FAULTS": json.dumps(faults) if faults else "",
            "AGENTOPS_LOG_LEVEL": "INFO",
            "PYTHONUNBUFFERED": "1",
        })
        env.update(self.extra_env)
        return env

    def _spawn(self, name: str, role: str, args: list[str], env: dict[str, str]) -> Proc:
        log_path = self.log_dir / f"{role}-{name}.log"
        log_file = open(log_path, "ab")  # noqa: SIM115 - closed by Proc.stop()
        launched_at = time.time()
        popen = subprocess.Popen(
            [sys.executable, "-m", "celery", "-A", "agentops", *args], cwd=REPO_ROOT, env=env,
            stdin=subprocess.DEVNULL, stdout=log_file, stderr=subprocess.STDOUT, start_new_session=True,
        )
        proc = Proc(name=name, role=role, popen=popen, log_path=log_path, launched_at=launched_at,
                    log_file=log_file)
        self.procs.append(proc)
        return proc

    def start_worker(self, name: str, *, faults: list[dict[str, Any]] | None = None, ready: bool = True) -> Proc:
        """A prefork worker with one pool process, named ``<name>@<host>``."""
        proc = self._spawn(name, "worker", [
            "worker", "-P", "prefork", "-c", "1", "--without-gossip", "--without-mingle",
            "-n", f"{name}@%h", "-l", "INFO",
        ], self.env(faults=faults))
        if ready:
            self.wait_ready(proc)
        return proc

    def start_beat(self, name: str, *, ready: bool = True) -> Proc:
        """A beat on the DatabaseScheduler; ``-s`` is passed though that scheduler keeps its state in the DB."""
        proc = self._spawn(name, "beat", [
            "beat", "-l", "INFO", "-s", str(self.tmp_path / f"beat-{name}-schedule"), "--pidfile=",
        ], self.env())
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
        for proc in procs:
            self.wait_ready(proc)
        return procs

    def wait_ready(self, proc: Proc, timeout: float = READY_TIMEOUT_SECONDS) -> None:
        marker = " ready." if proc.role == "worker" else "Sending due task"

        def ready() -> bool:
            if not proc.alive():
                raise AssertionError(f"{proc.role} {proc.name} exited with {proc.popen.returncode}:\n"
                                     f"{proc.log_tail()}")
            return marker in proc.log()

        wait_for(ready, timeout=timeout, what=f"{proc.role} {proc.name} to be ready", interval=0.2,
                 dump=lambda: proc.log_tail())

    def live(self) -> list[Proc]:
        return [p for p in self.procs if p.alive()]

    def stop_all(self) -> None:
        """Terminate every process at once, then reap each (SIGKILL after the shared grace period)."""
        for proc in self.procs:
            proc.terminate()
        deadline = time.monotonic() + STOP_GRACE_SECONDS
        for proc in self.procs:
            proc.stop(grace=max(0.1, deadline - time.monotonic()))

    def faults_fired(self) -> list[dict[str, Any]]:
        """Lines of the fault log: each is written (and fsynced) before the fault acts."""
        text = self.fault_log.read_text(encoding="utf-8") if self.fault_log.exists() else ""
        return [json.loads(line) for line in text.splitlines() if line.strip()]

    def logs(self, lines: int = LOG_TAIL_LINES) -> str:
        parts = []
        for proc in self.procs:
            state = "alive" if proc.alive() else f"exited {proc.popen.returncode}"
            parts.append(f"--- {proc.role} {proc.name} (pid {proc.pid}, {state}) {proc.log_path} ---\n"
                         f"{proc.log_tail(lines)}")
        return "\n".join(parts)

    def dump(self) -> str:
        return f"{db_report()}\n{self.logs()}"

    def wait_for(self, predicate: Callable[[], T], *, timeout: float, what: str, interval: float = 0.1) -> T:
        return wait_for(predicate, timeout=timeout, what=what, interval=interval, dump=self.dump)


class Broker:
    """The dedicated Redis DB the processes of one test use as their broker."""

    def __init__(self, url: str) -> None:
        self.url = url
        self.client = redis.Redis.from_url(url, socket_timeout=5, socket_connect_timeout=5)

    def flushdb(self) -> None:
        self.client.flushdb()

    def server_run_id(self) -> str:
        return str(self.client.info("server")["run_id"])


def redis_ping(url: str) -> bool:
    try:
        return bool(redis.Redis.from_url(url, socket_timeout=1, socket_connect_timeout=1).ping())
    except redis.RedisError:
        return False


def redis_shutdown_nosave(host: str = "127.0.0.1", port: int = 6379) -> None:
    """``redis-cli SHUTDOWN NOSAVE``: the server exits and, without persistence, forgets every message."""
    subprocess.run(["redis-cli", "-h", host, "-p", str(port), "SHUTDOWN", "NOSAVE"], capture_output=True,
                   timeout=10, check=False)


def redis_start(url: str, timeout: float = 15.0) -> None:
    """Start the shared Redis with the CI command and wait until it answers."""
    subprocess.run(REDIS_SERVER_COMMAND, capture_output=True, timeout=15, check=True)
    wait_for(lambda: redis_ping(url), timeout=timeout, what="Redis to answer PING after the restart",
             interval=0.1)


# --- Driving release workflows from the test process (the "web" side) ---

def launch_release(repo: Path, user: Any, goal: str, **params: Any) -> int:
    """Launch a release workflow; its first doorbell goes to the broker after COMMIT."""
    from tests.conftest import release_params
    from workflows import services

    return services.workflow_launch(kind="release", goal=goal, params=release_params(repo, **params), user=user).pk


def approve(workflow_id: int, user: Any) -> None:
    """Approve the open approval wait for its exact candidate, as an approver would in the admin."""
    from tests.conftest import open_approval
    from workflows import services

    wait = open_approval(workflow_id)
    services.wait_approve(wait_id=wait.pk, user=user, candidate_hash=wait.candidate_hash)


def wait_until_status(
    cluster: Cluster, ids: list[int], status: str, *, node: str | None = None, timeout: float,
) -> None:
    """Wait until every workflow has ``status`` (and ``node``); fail at once if one ends otherwise."""
    from workflows.models import Workflow

    def reached() -> bool:
        rows = list(Workflow.objects.filter(pk__in=ids).values_list("pk", "status", "current_node", "reason"))
        wrong = [r for r in rows if r[1] in Workflow.TERMINAL and r[1] != status]
        if wrong:
            raise AssertionError(f"workflows ended in an unexpected state {wrong}\n{cluster.dump()}")
        return all(r[1] == status and (node is None or r[2] == node) for r in rows) and len(rows) == len(ids)

    where = f" at {node}" if node else ""
    cluster.wait_for(reached, timeout=timeout, what=f"workflows {ids} to be {status}{where}", interval=0.2)


def event_count(kind: str, **filters: Any) -> int:
    from workflows.models import Event

    return Event.objects.filter(kind=kind, **filters).count()


def assert_event_seqs_contiguous(ids: list[int]) -> None:
    """I4: every workflow's history is 1, 2, 3, … without gaps or repeats."""
    from workflows.models import Event

    for pk in ids:
        seqs = list(Event.objects.filter(workflow_id=pk).order_by("seq").values_list("seq", flat=True))
        assert seqs == list(range(1, len(seqs) + 1)), f"workflow {pk} has a gap in its history: {seqs}"


def assert_one_effect_per_key(server: Any, keys: set[str]) -> dict[str, Any]:
    """I3: the deploy target saw exactly one created effect per expected idempotency key, and no other."""
    stats = server.store.stats()
    assert set(stats["effects"]) == keys, f"deploy target effects {stats['effects']} for expected keys {keys}"
    assert all(v == {"created": 1, "deleted": 0} for v in stats["effects"].values()), stats["effects"]
    assert stats["deployments"] == len(keys), stats
    return stats


@dataclass(frozen=True)
class DeployRequest:
    """One request the in-process deploy target answered: what came in and the status it sent."""

    method: str
    path: str
    key: str
    status: str
    body_sha256: str | None
    at: float


def record_deploy_requests(monkeypatch: Any) -> list[DeployRequest]:
    """Record every request the deploy target answers (method, key, status, SHA-256 of a POST body).

    The store's stats count effects per key; this is the per-request view (a 503 or a repeated
    DELETE leaves no effect but is still a request). Patched on the handler class for this test only.
    """
    from agentops.deploytarget import server as target

    seen: list[DeployRequest] = []
    read_body, log = target._Handler._read_body, target._Handler._log

    def recording_read_body(self: Any) -> bytes:
        raw: bytes = read_body(self)
        self._recorded_body_sha256 = hashlib.sha256(raw).hexdigest()
        return raw

    def recording_log(self: Any, status: int | str) -> None:
        seen.append(DeployRequest(method=self.command, path=self.path, key=self._key, status=str(status),
                                  body_sha256=self.__dict__.pop("_recorded_body_sha256", None), at=time.time()))
        log(self, status)

    monkeypatch.setattr(target._Handler, "_read_body", recording_read_body)
    monkeypatch.setattr(target._Handler, "_log", recording_log)
    return seen


def pool_kills_reported(cluster: Cluster) -> set[int]:
    """Pool-process pids whose SIGKILL a worker of ``cluster`` reported (WorkerLostError)."""
    pattern = re.compile(r"pid:(\d+) exited with 'signal 9 \(SIGKILL\)'")
    return {int(pid) for p in cluster.procs if p.role == "worker" for pid in pattern.findall(p.log())}
