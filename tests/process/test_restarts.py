"""Whole-stack and broker restarts (reliability.md 6.5, 6.11, 6.13): the database alone carries the work."""
from __future__ import annotations

import logging
import os
import signal
import time
from datetime import timedelta

import pytest
from django.utils import timezone

from agentops.deploytarget.server import Fault
from tests.process.harness import (
    approve,
    assert_event_seqs_contiguous,
    assert_one_effect_per_key,
    event_count,
    launch_release,
    redis_ping,
    redis_shutdown_nosave,
    redis_start,
    wait_until_status,
)
from workflows.models import Activity, Timer, Wait, Workflow

pytestmark = [pytest.mark.process, pytest.mark.django_db(transaction=True)]

WAITING_FIELDS = ("status", "current_node", "updated_at", "node_visit")


def _rows(ids: list[int]) -> dict[int, tuple]:
    return {row[0]: row[1:] for row in Workflow.objects.filter(pk__in=ids).values_list("pk", *WAITING_FIELDS)}


def test_full_stack_restart_while_waiting_for_approval_resumes_each_workflow_once(
    cluster, process_broker, git_repo, deploy_target, approver, requester, figures,
):
    """SIGKILL every worker and beat, flush the broker DB, restart: the waits survive; two approvals
    resume exactly their workflows once each, and the third times out exactly once."""
    cluster.start(workers=("wa", "wb"), beats=("beat",))
    ids = [launch_release(git_repo, requester, f"Ship release notes {n}") for n in range(3)]
    wait_until_status(cluster, ids, "waiting", node="WAIT_FOR_APPROVAL", timeout=60)
    before = _rows(ids)

    killed = {p.name: p.kill_group(signal.SIGKILL) for p in cluster.live()}
    assert killed == {"wa": -signal.SIGKILL, "wb": -signal.SIGKILL, "beat": -signal.SIGKILL}, killed
    # FLUSHALL of the broker: only its own DB, since DB 0 belongs to other test runs.
    process_broker.flushdb()
    assert process_broker.client.dbsize() == 0

    *_, beat = cluster.start(workers=("wa2", "wb2"), beats=("beat2",))
    # A few rounds of every sweep over the waiting workflows change nothing.
    cluster.wait_for(lambda: beat.log().count("Sending due task fire_timers") >= 3, timeout=20,
                     what="three rounds of sweeps after the restart")
    assert _rows(ids) == before

    expiring = ids[2]
    for pk in ids[:2]:
        approve(pk, approver)
    # Advance the clock for the third only: its approval and expiry timer are due now.
    past = timezone.now() - timedelta(seconds=1)
    assert Timer.objects.filter(workflow_id=expiring, purpose="expire", status="pending").update(fire_at=past) == 1
    Wait.objects.filter(workflow_id=expiring, kind="approval", status="open").update(expires_at=past)
    wait_until_status(cluster, ids[:2], "completed", timeout=60)
    wait_until_status(cluster, [expiring], "failed", timeout=30)

    for pk in ids[:2]:
        assert event_count("wait.approved", workflow_id=pk) == 1
        assert event_count("workflow.woken", workflow_id=pk) == 1
        assert event_count("workflow.completed", workflow_id=pk) == 1
    keys = {a.sent_key for a in Activity.objects.filter(workflow_id__in=ids[:2], name="deploy")}
    assert_one_effect_per_key(deploy_target, keys)
    failed = Workflow.objects.get(pk=expiring)
    assert "expired" in failed.reason, failed.reason
    assert event_count("timer.fired", workflow_id=expiring) == 1
    assert event_count("workflow.failed", workflow_id=expiring) == 1
    assert Wait.objects.get(workflow_id=expiring, kind="approval").status == "expired"
    assert not Activity.objects.filter(workflow_id=expiring, name="deploy").exists()
    assert_event_seqs_contiguous(ids)
    figures("6.5 full-stack restart", processes_sigkilled=len(killed), broker_keys_after_flush=0,
            waiting_after_restart=len(ids), approved_completed_once=2, expired_failed_once=1,
            deploy_effects=len(keys), duplicate_effects=0)


def test_redis_restart_with_messages_in_flight_loses_no_workflow(
    cluster, process_broker, process_redis, git_repo, deploy_target, approver, requester, figures, caplog,
):
    """`SHUTDOWN NOSAVE` the broker while approved workflows deploy, restart it empty: every queued,
    unacked and reserved doorbell is gone, and every workflow still completes with one deployment.
    A launch while the broker is down commits, and its lost doorbell is rung again by the sweeps."""
    if process_redis is None and os.environ.get("AGENTOPS_PROCESS_NO_REDIS_RESTART"):
        pytest.skip("AGENTOPS_PROCESS_NO_REDIS_RESTART is set: this Redis is shared and must not be restarted")
    *workers, _ = cluster.start(workers=("wa", "wb"), beats=("beat",))
    ids = [launch_release(git_repo, requester, f"Ship release notes {n}") for n in range(3)]
    wait_until_status(cluster, ids, "waiting", node="WAIT_FOR_APPROVAL", timeout=60)
    # Slow deploy requests keep attempts in flight when the broker goes away.
    deploy_target.store.set_fault(Fault.build("slow", count=3, seconds=1.5))
    for pk in ids:
        approve(pk, approver)
    cluster.wait_for(lambda: Activity.objects.filter(workflow_id__in=ids, name="deploy", status="running").exists(),
                     timeout=30, what="a deploy attempt in flight")

    broker_db = str(process_broker.client.connection_pool.connection_kwargs.get("db", 0))
    other_clients = [c for c in process_broker.client.client_list() if str(c.get("db")) != broker_db]
    run_id = process_broker.server_run_id()
    marks = {w.name: len(w.log()) for w in workers}
    try:
        if process_redis is not None:
            process_redis.shutdown_nosave()  # this run's own server
        else:
            redis_shutdown_nosave()
        cluster.wait_for(lambda: not redis_ping(process_broker.url), timeout=10, what="Redis to stop")
        down_at = time.monotonic()
        with caplog.at_level(logging.WARNING, logger="agentops.doorbells"):
            late = launch_release(git_repo, requester, "Ship while the broker is down")
        assert "doorbell.publish_failed" in caplog.text, "the launch's doorbell must have failed to publish"
        assert Workflow.objects.filter(pk=late, status="running").exists(), "the launch itself committed"
        time.sleep(max(0.0, 3.0 - (time.monotonic() - down_at)))
        in_flight = {status: Activity.objects.filter(workflow_id__in=ids, status=status).count()
                     for status in ("scheduled", "running")}
    finally:
        if not redis_ping(process_broker.url):
            if process_redis is not None:
                process_redis.start()
            else:
                redis_start(process_broker.url)
    up_at = time.monotonic()
    assert process_broker.server_run_id() != run_id, "Redis must really have restarted"

    wait_until_status(cluster, ids, "completed", timeout=90)
    drained_s = time.monotonic() - up_at
    wait_until_status(cluster, [late], "waiting", node="WAIT_FOR_APPROVAL", timeout=60)
    approve(late, approver)
    wait_until_status(cluster, [late], "completed", timeout=60)
    everything = [*ids, late]
    deploys = Activity.objects.filter(workflow_id__in=everything, name="deploy")
    keys = {a.sent_key for a in deploys}
    assert_one_effect_per_key(deploy_target, keys)
    assert_event_seqs_contiguous(everything)

    # celery#7705: a worker that reconnects but stops consuming. Both must take messages again.
    def lost_then_consumed(text: str) -> bool:
        lost_at = text.find("Connection to broker lost")
        return lost_at >= 0 and " received" in text[lost_at:]

    cluster.wait_for(lambda: all(lost_then_consumed(w.log()[marks[w.name]:]) for w in workers), timeout=30,
                     what="both workers to lose the broker and then consume again")
    assert all(w.alive() for w in workers)
    figures("6.11/6.13 Redis restart", workflows=len(everything), redis_restarted=True,
            outage_s=f"{up_at - down_at:.1f}", in_flight_at_outage=in_flight, drain_s=f"{drained_s:.1f}",
            launch_during_outage="committed, doorbell lost, re-rung by sweep",
            leases_expired=event_count("activity.lease_expired", workflow_id__in=everything),
            reconciled_attempts=event_count("activity.succeeded", workflow_id__in=everything, data__reconciled=True),
            doorbells_ignored=event_count("activity.doorbell_ignored", workflow_id__in=everything),
            duplicate_effects=0, other_redis_clients_at_shutdown=len(other_clients))
