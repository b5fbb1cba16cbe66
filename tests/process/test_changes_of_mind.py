"""Changes of mind while an effect is in flight, on real workers: a cancel and a new goal
arrive while the worker that is about to POST the deployment is paused with SIGSTOP.

The deploy attempt passes its fence, then a fault point holds it for a moment, long enough for
the test to SIGSTOP its pool process right there, between the fence and the POST. The workflow
changes its mind; the other worker compensates; the paused worker is resumed and sends its POST
late. It must deploy nothing (the target keeps the compensated key as a tombstone and answers
410), and no deployment may stay live without an active commitment of a live workflow.
"""
from __future__ import annotations

import os
import signal
import time
from typing import Any

import psutil
import pytest

from tests.process.harness import (
    approve,
    assert_event_seqs_contiguous,
    event_count,
    launch_release,
    record_deploy_requests,
    wait_until_status,
)
from workflows import services
from workflows.models import Activity, ActivityAttempt, Commitment

pytestmark = [pytest.mark.process, pytest.mark.django_db(transaction=True)]

# Every deploy's first attempt stops for 3 s after its fence, just before its POST.
HOLD_BEFORE_POST = [{"point": "activity.before_external_call", "when": {"activity": "deploy", "attempt": 1},
                     "action": "sleep", "seconds": 3}]


def pause_the_first_deploy_before_its_post(cluster: Any, workflow_id: int) -> tuple[psutil.Process, Activity]:
    """Wait until the deploy's attempt 1 reached the hold, then SIGSTOP the pool process there."""
    held = cluster.wait_for(lambda: next((f for f in cluster.faults_fired() if f.get("activity") == "deploy"), None),
                            timeout=60, what="the deploy attempt to pass its fence and reach the hold")
    pool = psutil.Process(held["pid"])
    os.kill(pool.pid, signal.SIGSTOP)
    cluster.wait_for(lambda: pool.status() == psutil.STATUS_STOPPED, timeout=5, what="the pool process to stop")
    deploy = Activity.objects.get(operation_id=held["operation_id"])
    assert (deploy.workflow_id, deploy.status, deploy.attempt) == (workflow_id, "running", 1)
    assert deploy.heartbeat_at is not None and "POST the deployment" in deploy.heartbeat_detail
    return pool, deploy


def approved_and_paused_before_post(cluster: Any, repo: Any, requester: Any,
                                    approver: Any) -> tuple[int, psutil.Process, Activity]:
    """Two workers and beat; a release approved, its deploy paused between its fence and its POST."""
    cluster.start(workers=("wa", "wb"), beats=("beat",), faults=HOLD_BEFORE_POST)
    wf = launch_release(repo, requester, "Ship the release notes")
    wait_until_status(cluster, [wf], "waiting", node="WAIT_FOR_APPROVAL", timeout=60)
    approve(wf, approver)
    pool, deploy = pause_the_first_deploy_before_its_post(cluster, wf)
    return wf, pool, deploy


def late_posts(requests: list[Any], key: str) -> list[str]:
    return [r.status for r in requests if r.method == "POST" and r.key == key]


def test_a_worker_paused_before_its_post_deploys_nothing_after_cancel(
    cluster, git_repo, deploy_target, approver, requester, figures, monkeypatch,
):
    """A cancel does not wait for the paused worker's lease, and its DELETE's 404 leaves a tombstone
    rather than counting as done: the woken worker's late POST gets 410, so nothing is deployed for a
    cancelled workflow."""
    requests = record_deploy_requests(monkeypatch)
    wf, pool, deploy = approved_and_paused_before_post(cluster, git_repo, requester, approver)
    stopped_at = time.monotonic()

    services.workflow_cancel(workflow_id=wf, reason="not this release")
    wait_until_status(cluster, [wf], "cancelled", timeout=40)
    cancel_s = time.monotonic() - stopped_at
    assert deploy_target.store.stats()["tombstones"] == 1
    time.sleep(max(0.0, 4.0 - (time.monotonic() - stopped_at)))  # paused past the hold and the 4 s lease

    os.kill(pool.pid, signal.SIGCONT)
    paused_s = time.monotonic() - stopped_at
    cluster.wait_for(lambda: late_posts(requests, deploy.sent_key), timeout=20,
                     what="the resumed worker to send its late POST")

    assert late_posts(requests, deploy.sent_key) == ["410"]
    stats = deploy_target.store.stats()
    assert (stats["deployments"], stats["active"], stats["effects"]) == (0, 0, {}), stats
    commitment = Commitment.objects.get(activity=deploy)
    assert (commitment.status, commitment.data) == ("compensated", {"uncertain": True})
    compensation = Activity.objects.get(workflow_id=wf, name="undeploy")
    assert compensation.result == {"deleted": False, "idempotency_key": deploy.sent_key}
    cluster.wait_for(lambda: ActivityAttempt.objects.filter(activity=deploy, number=1, status="cancelled").exists(),
                     timeout=5, what="attempt 1 to stay cancelled")
    # The woken worker records its 410 after the POST: on a loaded machine, a moment after the answer.
    cluster.wait_for(lambda: event_count("activity.stale_result_discarded", workflow_id=wf) >= 1, timeout=30,
                     what="the woken worker's late result to be discarded")
    assert event_count("activity.stale_result_discarded", workflow_id=wf) == 1
    assert_event_seqs_contiguous([wf])
    figures("paused before POST, then cancel", sigstop=1, paused_s=f"{paused_s:.1f}",
            cancel_to_cancelled_s=f"{cancel_s:.1f}", late_post_status="410", deployments_live=0,
            tombstones=stats["tombstones"])


def test_a_new_goal_while_the_deploy_runs_leaves_one_deployment(
    cluster, git_repo, deploy_target, approver, requester, figures, monkeypatch,
):
    """After a supersede the old goal's deploy does not go on: its late POST gets 410 and its commitment
    is compensated, so the workflow, rebuilt and approved again, completes with one live deployment,
    not two."""
    requests = record_deploy_requests(monkeypatch)
    wf, pool, old = approved_and_paused_before_post(cluster, git_repo, requester, approver)

    services.workflow_supersede(workflow_id=wf, goal="Ship the release notes, in French", user=requester)
    wait_until_status(cluster, [wf], "waiting", node="WAIT_FOR_APPROVAL", timeout=60)
    approve(wf, approver)
    wait_until_status(cluster, [wf], "completed", timeout=60)
    os.kill(pool.pid, signal.SIGCONT)
    cluster.wait_for(lambda: late_posts(requests, old.sent_key), timeout=20,
                     what="the resumed worker to send the old goal's late POST")

    assert late_posts(requests, old.sent_key) == ["410"]
    new = Activity.objects.filter(workflow_id=wf, name="deploy").exclude(pk=old.pk).get()
    assert "/i2/" in new.operation_id
    stats = deploy_target.store.stats()
    assert (stats["deployments"], stats["active"]) == (1, 1), stats
    assert stats["effects"] == {new.sent_key: {"created": 1, "deleted": 0}}, stats
    assert dict(Commitment.objects.filter(workflow_id=wf).values_list("activity__operation_id", "status")) == {
        old.operation_id: "compensated", new.operation_id: "released",
    }
    assert_event_seqs_contiguous([wf])
    figures("new goal while the deploy is paused", sigstop=1, deployments_live=stats["active"],
            old_goal_post_status="410", commitments="1 compensated, 1 released")
