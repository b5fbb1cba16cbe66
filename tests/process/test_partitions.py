"""Workers and beat on other hosts (network namespaces), and one host partitioned mid-activity
(DESIGN.md: "one host partitioned from the database or the broker"; reliability.md 6.2, 6.3).

Worker ``wa``, worker ``wb`` and the beat each run in a namespace of their own and reach
PostgreSQL, Redis and the deploy target only over veth links this test makes (``netns.py``).
Release agents complete over that network. Then, three times, the worker that is deploying is
cut off right after the deploy target accepted its POST (a fault point holds it there for 3 s):
from PostgreSQL, from Redis, from both; the workflow must complete with one deployment, and
once the link is back, a write of the cut-off attempt is fenced. Times to recovery are reported.
"""
from __future__ import annotations

import re
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
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
from tests.process.netns import Forwarder, Host, Network, netns_refusal
from tests.workflows.test_clock import server_now
from workflows.models import Activity, ActivityAttempt, Event
from workflows.testing.cluster import RedisServer, free_port, publishing_to, subprocess_database_url

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
    with Network(("a", "b", "c")) as net:
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
        workers = {name: cluster.start_worker(f"w{name}", faults=HOLD_AFTER_POST, ready=False,
                                              prefix=hosts[name].prefix,
                                              extra_env=host_env(hosts[name], reachable, deploy_target))
                   for name in ("a", "b")}
        beat = cluster.start_beat("beat", ready=False, prefix=hosts["c"].prefix,
                                  extra_env=host_env(hosts["c"], reachable, deploy_target))
        cluster.wait_ready(*workers.values(), beat)

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

        keys = set(Activity.objects.filter(workflow_id__in=ids, name="deploy").values_list("operation_id", flat=True))
        assert_one_effect_per_key(deploy_target, keys)
        assert_event_seqs_contiguous(ids)
    except BaseException:
        print(cluster.dump())
        raise
    finally:
        cluster.stop_all()
    figures("issue 12 partitions (network namespaces)", baseline_two_releases_s=f"{baseline_s:.1f}",
            deploy_effects=len(keys), duplicate_effects=0,
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
