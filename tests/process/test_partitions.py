"""Workers and beat on other hosts (network namespaces), and one host partitioned mid-activity
(DESIGN.md: "one host partitioned from the database or the broker"; reliability.md 6.2, 6.3).

Worker ``wa``, worker ``wb`` and the beat each run in a namespace of their own and reach
PostgreSQL, Redis and the deploy target only over veth links this test makes (``netns.py``).
Release agents complete over that network. Then, three times, the worker that is deploying is
cut off right after the deploy target accepted its POST (a fault point holds it there for 3 s):
from PostgreSQL, from Redis, from both; the workflow must complete with one deployment, and
once the link is back, a write of the cut-off attempt is fenced. Times to recovery are reported.

The beat's host cut off (the second test), from PostgreSQL, then from Redis, while a lease and a
timer are due that only its sweeps handle: the deploying worker is paused (SIGSTOP) past its 4 s
lease, and a parked release's approval-expiry timer is made due. While the only beat is cut off
neither happens (its DatabaseScheduler hangs on the dropped link; cut from Redis, its sweeps never
reach the workers). Cut from PostgreSQL, a standby beat on a fourth host carries on; cut from Redis,
the healed beat does. Either way the lease is reaped once, another worker's attempt reconciles the
deployment (one effect), the timer fires once (the parked release fails as expired), and, once
resumed, the paused worker's late write is fenced; with both beats sweeping after the heal nothing
is done twice. Times to recovery are reported.
"""
from __future__ import annotations

import re
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import redis
from django.conf import settings
from django.db import connection

from agentops.deploytarget.server import DeployTargetServer
from tests.process.harness import (
    REPO_ROOT,
    Cluster,
    Proc,
    approve,
    assert_event_seqs_contiguous,
    assert_one_effect_per_key,
    launch_release,
    wait_until_status,
)
from tests.process.netns import Host, Network, netns_refusal
from tests.workflows.test_clock import server_now
from workflows.models import Activity, ActivityAttempt, Event, Timer, Workflow
from workflows.testing.cluster import LEASE_SECONDS, RedisServer, free_port, publishing_to, subprocess_database_url
from workflows.testing.forwarder import Forwarder

pytestmark = [pytest.mark.process, pytest.mark.django_db(transaction=True)]

# Every deploy's first attempt waits 3 s between the deploy target's answer and recording it.
HOLD_AFTER_POST = [{"point": "activity.after_external_call", "when": {"activity": "deploy", "attempt": 1},
                    "action": "sleep", "seconds": 3}]
CUTS: list[tuple[str, ...]] = [("db",), ("broker",), ("db", "broker")]
RECEIVED = re.compile(r"Task agentops\.[\w.]+\[[\w-]+\] received")


@pytest.fixture
def network() -> Iterator[Network]:
    refusal = netns_refusal()
    if refusal:
        pytest.skip(refusal)
    with Network(("a", "b", "c", "d")) as net:  # workers on a and b, the beat on c, a standby beat on d
        yield net


@pytest.fixture
def reachable(network: Network, deploy_target: DeployTargetServer, tmp_path: Path) -> Iterator[RedisServer]:
    """PostgreSQL and the deploy target forwarded onto each host's link; a Redis of this test bound to them."""
    db = connection.settings_dict
    pg = Forwarder(network.addresses("db"), 5432, (db.get("HOST") or "127.0.0.1", int(db.get("PORT") or 5432)))
    app = Forwarder(network.addresses("app"), deploy_target.port, ("127.0.0.1", deploy_target.port))
    redis = RedisServer(free_port(), tmp_path, bind=("127.0.0.1", *network.addresses("broker")))
    try:
        redis.start()
        with publishing_to(redis.url):
            yield redis
    finally:
        redis.shutdown_nosave()
        app.close()
        pg.close()


def host_env(host: Host, redis: RedisServer, deploy_target: DeployTargetServer) -> dict[str, str]:
    """A process on ``host`` reaches every service at the root end of its own links."""
    database = subprocess_database_url().replace("@127.0.0.1:", f"@{host.address_of('db')}:", 1)
    return {"DATABASE_URL": database, "CELERY_BROKER_URL": f"redis://{host.address_of('broker')}:{redis.port}/0",
            "AGENTOPS_DEPLOY_TARGET_URL": f"http://{host.address_of('app')}:{deploy_target.port}"}


def assert_each_deploy_once_and_histories_whole(deploy_target: DeployTargetServer, ids: list[int]) -> int:
    """One deployment per deploy operation of ``ids`` and gapless histories; returns how many deploys."""
    deploys = {a.sent_key for a in Activity.objects.filter(workflow_id__in=ids, name="deploy")}
    assert_one_effect_per_key(deploy_target, deploys)
    assert_event_seqs_contiguous(ids)
    return len(deploys)


def start_on_hosts(cluster: Cluster, hosts: dict[str, Host], reachable: RedisServer,
                   deploy_target: DeployTargetServer) -> tuple[dict[str, Proc], Proc]:
    """Workers ``wa`` and ``wb`` on hosts a and b, the beat on host c, each reaching the services
    over its own link; returns once all three are ready."""
    workers = {name: cluster.start_worker(f"w{name}", faults=HOLD_AFTER_POST, ready=False,
                                          prefix=hosts[name].prefix,
                                          extra_env=host_env(hosts[name], reachable, deploy_target))
               for name in ("a", "b")}
    beat = cluster.start_beat("beat", ready=False, prefix=hosts["c"].prefix,
                              extra_env=host_env(hosts["c"], reachable, deploy_target))
    cluster.wait_ready(*workers.values(), beat)
    return workers, beat


def worker_of_pid(workers: dict[str, Proc], pid: int) -> str:
    return next(name for name, w in workers.items() if pid in {c.pid for c in w.pool_children()})


def test_a_host_cut_off_mid_deploy_is_taken_over_and_its_late_write_fenced(
    network: Network, reachable: RedisServer, deploy_target: DeployTargetServer, git_repo: Path,
    approver: Any, requester: Any, tmp_path: Path, figures: Any,
) -> None:
    """Releases complete with every process on a host of its own; a deploying host cut off from
    PostgreSQL, from Redis, or from both, deploys once and its late write is refused."""
    hosts = network.hosts
    cluster = Cluster(run_dir=tmp_path, database_url=subprocess_database_url(), broker_url=reachable.url,
                      cwd=REPO_ROOT)
    try:
        started = time.monotonic()
        workers, beat = start_on_hosts(cluster, hosts, reachable, deploy_target)

        ids = [launch_release(git_repo, requester, f"Ship across hosts {n}") for n in range(2 + len(CUTS))]
        wait_until_status(cluster, ids, "waiting", node="WAIT_FOR_APPROVAL", timeout=90)
        for pk in ids[:2]:
            approve(pk, approver)
        wait_until_status(cluster, ids[:2], "completed", timeout=60)
        baseline_s = time.monotonic() - started
        ran_on = set(ActivityAttempt.objects.filter(activity__workflow_id__in=ids[:2])
                     .values_list("worker", flat=True))
        assert {w.split("@")[0] for w in ran_on} == {"wa", "wb"}, ran_on

        recovery = {}
        for wf, cut in zip(ids[2:], CUTS, strict=True):
            recovery["+".join(cut)] = partition_during_deploy(cluster, workers, hosts, wf, cut, approver)

        deploys = assert_each_deploy_once_and_histories_whole(deploy_target, ids)
    except BaseException:
        print(cluster.dump())
        raise
    finally:
        cluster.stop_all()
    figures("partitions (network namespaces)", baseline_two_releases_s=f"{baseline_s:.1f}",
            deploy_effects=deploys, duplicate_effects=0,
            **{f"{cut}_{k}": v for cut, r in recovery.items() for k, v in r.items()})


def partition_during_deploy(cluster: Cluster, workers: dict[str, Proc], hosts: dict[str, Host], wf: int,
                            cut: tuple[str, ...], approver: Any) -> dict[str, Any]:
    """Approve ``wf``, cut the deploying worker's host from ``cut`` once the target accepted its
    POST, wait for the workflow to complete, heal, and see what the cut-off attempt did."""
    approve(wf, approver)
    held = cluster.wait_for(
        lambda: next((f for f in cluster.faults_fired() if f["operation_id"].startswith(f"wf-{wf}/")), None),
        timeout=60, what=f"workflow {wf}'s deploy to be accepted and held")
    name = worker_of_pid(workers, held["pid"])
    host, cut_off = hosts[name], workers[name]
    host.cut(*cut)
    cut_at, cut_mono = server_now(), time.monotonic()
    wait_until_status(cluster, [wf], "completed", timeout=90)
    completed_s = time.monotonic() - cut_mono
    deploy = Activity.objects.get(workflow_id=wf, name="deploy")
    attempts = list(deploy.attempts.order_by("number"))

    mark = len(cut_off.log())
    host.heal(*cut)
    healed = time.monotonic()
    result: dict[str, Any] = {"worker": f"w{name}", "completed_after_cut_s": f"{completed_s:.1f}",
                              "attempts": "/".join(f"{a.number}:{a.status}@{a.worker.split('@')[0]}" for a in attempts)}
    if "db" in cut:
        # Cut from the database, attempt 1 could not record: its lease ran out, the other worker's
        # attempt 2 found the deployment by its key. After the heal, attempt 1's write is refused.
        assert [(a.number, a.status) for a in attempts] == [(1, "lost"), (2, "succeeded")], attempts
        assert not attempts[1].worker.startswith(f"w{name}@"), attempts[1].worker
        assert Event.objects.filter(kind="activity.succeeded", data__operation_id=deploy.operation_id,
                                    data__reconciled=True).count() == 1
        result["takeover_s"] = f"{(attempts[1].started_at - cut_at).total_seconds():.1f}"
        cluster.wait_for(lambda: Event.objects.filter(kind="activity.stale_result_discarded",
                                                      data__operation_id=deploy.operation_id, data__attempt=1).exists(),
                         timeout=90, what="the cut-off attempt's late write to be refused after the heal")
        result["late_write_fenced_after_heal_s"] = f"{time.monotonic() - healed:.1f}"
    else:
        # Cut from the broker only, the worker still reached PostgreSQL: nothing was lost to fence.
        assert attempts[0].status == "succeeded" and attempts[0].worker.startswith(f"w{name}@"), attempts
    # The host consumes again once its link is back (celery#7705 would leave it idle).
    cluster.wait_for(lambda: RECEIVED.search(cut_off.log()[mark:]), timeout=60,
                     what=f"worker w{name} to receive a task after the heal")
    result["consuming_after_heal_s"] = f"{time.monotonic() - healed:.1f}"
    assert cut_off.alive()
    return result


BEAT_CUTS: list[tuple[str, ...]] = [("db",), ("broker",)]
SENT = re.compile(r"Sending due task")


def test_the_beat_host_cut_off_delays_its_sweeps_and_a_standby_or_healed_beat_does_each_once(
    network: Network, reachable: RedisServer, deploy_target: DeployTargetServer, git_repo: Path,
    approver: Any, requester: Any, tmp_path: Path, figures: Any,
) -> None:
    """With the beat's host cut from PostgreSQL, then from Redis, a paused worker's expired lease is
    not reaped and a due timer does not fire; a standby beat (cut from PostgreSQL) or the healed beat
    (cut from Redis) then reaps the lease once and fires the timer once, and the paused worker's late
    write is refused."""
    hosts = network.hosts
    cluster = Cluster(run_dir=tmp_path, database_url=subprocess_database_url(), broker_url=reachable.url,
                      cwd=REPO_ROOT)
    recovery: dict[str, dict[str, Any]] = {}
    try:
        workers, beat = start_on_hosts(cluster, hosts, reachable, deploy_target)
        # Per cut: a release to deploy (its lease to reap) and one parked at its approval (its timer to fire).
        ids = [launch_release(git_repo, requester, f"Ship past a cut-off beat {n}") for n in range(2 * len(BEAT_CUTS))]
        wait_until_status(cluster, ids, "waiting", node="WAIT_FOR_APPROVAL", timeout=90)
        standby = {"host": hosts["d"], "env": host_env(hosts["d"], reachable, deploy_target)}
        for n, cut in enumerate(BEAT_CUTS):
            recovery["+".join(cut)] = beat_cut_while_due(cluster, workers, hosts["c"], beat, ids[2 * n],
                                                         ids[2 * n + 1], cut, approver, standby, reachable.url)

        deploys = assert_each_deploy_once_and_histories_whole(deploy_target, ids)
    except BaseException:
        print(cluster.dump())
        raise
    finally:
        cluster.stop_all()
    figures("the beat's host partitioned", lease_s=LEASE_SECONDS, deploy_effects=deploys,
            duplicate_effects=0, **{f"{cut}_{k}": v for cut, r in recovery.items() for k, v in r.items()})


def beat_cut_while_due(cluster: Cluster, workers: dict[str, Proc], beat_host: Host, beat: Proc, deploying: int,
                       parked: int, cut: tuple[str, ...], approver: Any, standby: dict[str, Any],
                       broker_url: str) -> dict[str, Any]:
    """Pause the worker deploying ``deploying`` once its POST was accepted, cut the beat's host from
    ``cut``, make ``parked``'s expiry timer due; see that nothing sweeps them while the beat is cut
    off, then that a standby beat (a cut from the database) or the healed beat (from the broker)
    reaps the lease and fires the timer, each once."""
    approve(deploying, approver)
    held = cluster.wait_for(
        lambda: next((f for f in cluster.faults_fired() if f["operation_id"].startswith(f"wf-{deploying}/")), None),
        timeout=60, what=f"workflow {deploying}'s deploy to be accepted and held")
    holder = workers[worker_of_pid(workers, held["pid"])]
    holder.pause()
    beat_host.cut(*cut)
    cut_mono = time.monotonic()
    # Sweeps the beat sent before the cut may still wait in the queue (a loaded machine): let them
    # run before the lease runs out and the timer falls due, so that only a sweep sent after the
    # cut could move either.
    queue = redis.Redis.from_url(broker_url)
    cluster.wait_for(lambda: queue.llen(settings.CELERY_TASK_DEFAULT_QUEUE) == 0, timeout=30,
                     what="the sweeps sent before the cut to be taken")
    time.sleep(1.5)
    cut_at = server_now()
    timer = Timer.objects.get(workflow_id=parked, purpose=Timer.Purpose.EXPIRE, status=Timer.Status.PENDING)
    Timer.objects.filter(pk=timer.pk).update(fire_at=cut_at)
    deploy = Activity.objects.get(workflow_id=deploying, name="deploy")
    Activity.objects.filter(pk=deploy.pk).update(lease_expires_at=cut_at)

    # The beat is the only sweeper: with it cut off, the expired lease stays and the timer waits.
    time.sleep(LEASE_SECONDS + 4)
    assert list(deploy.attempts.values_list("number", "status")) == [(1, "running")], list(deploy.attempts.values())
    assert Timer.objects.get(pk=timer.pk).status == Timer.Status.PENDING
    assert not Event.objects.filter(kind="activity.lease_expired", data__operation_id=deploy.operation_id).exists()

    result: dict[str, Any] = {}
    second: Proc | None = None
    if "db" in cut:
        # A standby beat on another host carries on while the first one hangs on its dropped link.
        host: Host = standby["host"]
        second = cluster.start_beat("beat2", ready=False, prefix=host.prefix, extra_env=standby["env"])
        started = time.monotonic()
        swept_from, what = started, "standby beat started"
    else:
        beat_host.heal(*cut)
        swept_from, what = time.monotonic(), "heal"
    takeover = cluster.wait_for(lambda: deploy.attempts.filter(number=2).first(), timeout=60,
                                what=f"another attempt of {deploy.operation_id} after the {what}")
    cluster.wait_for(lambda: Timer.objects.filter(pk=timer.pk, status=Timer.Status.FIRED).exists(), timeout=60,
                     what=f"the parked workflow {parked}'s timer to fire after the {what}")
    result["swept_by"] = "standby beat" if second else "healed beat"
    result["swept_after_s"] = f"{time.monotonic() - swept_from:.1f}"  # the lease reaped and the timer fired
    result["takeover_after_cut_s"] = f"{(takeover.started_at - cut_at).total_seconds():.1f}"
    wait_until_status(cluster, [deploying], "completed", timeout=60)
    wait_until_status(cluster, [parked], "failed", timeout=30)
    result["recovered_after_cut_s"] = f"{time.monotonic() - cut_mono:.1f}"

    if second is not None:
        mark = len(beat.log())
        beat_host.heal(*cut)
        healed = time.monotonic()
        cluster.wait_for(lambda: SENT.search(beat.log()[mark:]), timeout=90,
                         what="the healed beat to send its sweeps again")
        result["healed_beat_sending_after_s"] = f"{time.monotonic() - healed:.1f}"
        time.sleep(3)  # both beats sweeping: the lease and the timer are claimed already, nothing is done again
        second.stop()
    assert beat.alive()
    holder.resume()
    cluster.wait_for(lambda: Event.objects.filter(kind="activity.stale_result_discarded",
                                                  data__operation_id=deploy.operation_id, data__attempt=1).exists(),
                     timeout=60, what="the paused worker's late write to be refused")

    # The paused attempt was reaped (lost), then its late write refused (stale).
    assert [(a.number, a.status) for a in deploy.attempts.order_by("number")] == [(1, "stale"), (2, "succeeded")]
    assert Event.objects.filter(kind="activity.lease_expired", data__operation_id=deploy.operation_id).count() == 1
    assert Event.objects.filter(kind="activity.succeeded", data__operation_id=deploy.operation_id,
                                data__reconciled=True).count() == 1
    assert Event.objects.filter(workflow_id=parked, kind="timer.fired", data__timer_id=timer.pk).count() == 1
    assert "expired" in (Workflow.objects.get(pk=parked).reason or "")
    return result
