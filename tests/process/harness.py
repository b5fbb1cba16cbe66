"""Process-test helpers on top of the shared cluster (``workflows.testing.cluster``).

The cluster itself (workers, beats, waits, logs, the broker DB) lives in the test kit, where the
benchmark and users' own process tests use it too; its names are re-exported here. What stays
here is only for this repository's tests: the dump of durable rows on a timeout, restarting the
shared CI Redis (when AGENTOPS_PROCESS_BROKER_URL names it; by default each run has its own),
driving release workflows and the assertions about their deploy effects.
"""
from __future__ import annotations

import hashlib
import json
import re
import subprocess
import time
from dataclasses import dataclass
from datetime import datetime
from decimal import Decimal
from pathlib import Path
from typing import Any

from workflows.testing import cluster as shared
from workflows.testing.cluster import (  # noqa: F401  (re-exported: the process tests import them from here)
    BEAT_INTERVAL_SECONDS,
    CHECKPOINT_SECONDS,
    LEASE_SECONDS,
    LOG_TAIL_LINES,
    READY_TIMEOUT_SECONDS,
    REDISPATCH_AFTER_SECONDS,
    STOP_GRACE_SECONDS,
    Broker,
    Proc,
    WaitTimeout,
    point_celery_app_at,
    redis_ping,
    subprocess_database_url,
    wait_for,
)

REPO_ROOT = Path(__file__).resolve().parents[2]

# The command the shared CI Redis is started with (no persistence: a restart loses every message); used
# only when AGENTOPS_PROCESS_BROKER_URL points the process tests at it.
REDIS_SERVER_COMMAND = [
    "redis-server", "--daemonize", "yes", "--bind", "127.0.0.1", "-::1", "--port", "6379", "--save", "",
    "--appendonly", "no", "--dir", "/var/lib/redis", "--logfile", "/var/log/redis/ci.log",
]


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


class Cluster(shared.Cluster):
    """The shared cluster in a test's ``tmp_path``; a timeout's dump adds the durable rows."""

    @property
    def tmp_path(self) -> Path:
        return self.run_dir

    def dump(self) -> str:
        return f"{db_report()}\n{self.logs()}"


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


def billed_usd(model: str, recorded: Any) -> Decimal:
    """What the fake API's usage says one of its requests (``Recorded``) costs: nothing for a
    request it answered with an error or did not answer."""
    from workflows.prices import cost_usd
    from workflows.provider import Usage

    usage = recorded.usage or {}
    return cost_usd(model, Usage(**{k: usage.get(k, 0) for k in Usage.__dataclass_fields__}))
