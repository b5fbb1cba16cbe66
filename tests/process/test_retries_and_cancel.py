"""A retry on another worker, and a cancel whose compensation is killed mid-flight (reliability.md 6.4, 6.10)."""
from __future__ import annotations

import time

import pytest

from agentops.deploytarget.server import Fault
from tests.process.harness import (
    BEAT_INTERVAL_SECONDS,
    LEASE_SECONDS,
    REDISPATCH_AFTER_SECONDS,
    approve,
    assert_event_seqs_contiguous,
    assert_one_effect_per_key,
    event_count,
    launch_release,
    pool_kills_reported,
    record_deploy_requests,
    wait_until_status,
)
from workflows import services
from workflows.models import Activity, Commitment, Event

pytestmark = [pytest.mark.process, pytest.mark.django_db(transaction=True)]


def test_retry_after_a_503_runs_on_another_worker_with_the_same_key_and_inputs(
    cluster, git_repo, deploy_target, approver, requester, figures, monkeypatch,
):
    """6.4: the deploy target answers 503 to the first deploy POST on worker A; A stops (warm
    shutdown) while the retry window is open; worker B runs attempt 2 from the database rows alone,
    with the same idempotency key and a byte-identical body, and deploys once."""
    requests = record_deploy_requests(monkeypatch)
    # No beat yet: only its redrive sweep rings an opened retry window, so attempt 2 cannot start
    # until worker B and the beat are up, and A is gone by then.
    worker_a = cluster.start_worker("wa")
    wf = launch_release(git_repo, requester, "Ship release notes")
    wait_until_status(cluster, [wf], "waiting", node="WAIT_FOR_APPROVAL", timeout=60)
    deploy_target.store.set_fault(Fault.build("fail", count=1))
    approve(wf, approver)

    def retry_window_open() -> Activity | None:
        return Activity.objects.filter(workflow_id=wf, name="deploy", status="scheduled", attempt=1).first()

    deploy = cluster.wait_for(retry_window_open, timeout=30, what="deploy attempt 1 to fail and open a retry window")
    first = deploy.attempts.get(number=1)
    assert first.status == "failed" and first.worker.startswith("wa@"), (first.status, first.worker)
    assert "503" in first.error and "after 1s" in first.error, first.error
    assert deploy_target.store.stats()["fault"]["mode"] == "none", "the 503 fault must have been used up"
    # Warm shutdown of A (it stops consuming at once) while B and the beat boot, which takes seconds.
    worker_a.terminate()
    booting = cluster.start_worker("wb", ready=False), cluster.start_beat("beat", ready=False)
    worker_a.stop()
    assert worker_a.popen.returncode == 0, f"worker wa should stop cleanly, got {worker_a.popen.returncode}"
    a_stopped_at = time.time()
    for proc in booting:
        cluster.wait_ready(proc)
    wait_until_status(cluster, [wf], "completed", timeout=60)

    deploy.refresh_from_db()
    attempts = list(deploy.attempts.order_by("number"))
    assert [(a.number, a.status) for a in attempts] == [(1, "failed"), (2, "succeeded")]
    second = attempts[1]
    assert second.worker.startswith("wb@") and second.worker.split("@")[0] != first.worker.split("@")[0]
    assert second.started_at.timestamp() > a_stopped_at, "attempt 2 must start after worker A stopped"
    key, sent = deploy.operation_id, deploy.sent_key
    posts = [r for r in requests if r.method == "POST" and r.path == "/deployments"]
    assert [(r.key, r.status) for r in posts] == [(sent, "503"), (sent, "201")], posts
    assert posts[0].body_sha256 == posts[1].body_sha256, "attempt 2 must send the same inputs"
    assert deploy.result["idempotency_key"] == sent
    assert_one_effect_per_key(deploy_target, {sent})
    retries = Event.objects.filter(workflow_id=wf, kind="activity.retry_scheduled", data__operation_id=key)
    assert list(retries.values_list("data__attempt", flat=True)) == [1]
    assert event_count("activity.succeeded", workflow_id=wf, data__operation_id=key, data__attempt=2) == 1
    assert_event_seqs_contiguous([wf])
    figures("6.4 retry on another worker", faults_injected=1, target_503s=1,
            attempt1_worker=first.worker.split("@")[0], attempt2_worker=second.worker.split("@")[0],
            same_key=True, same_body_sha256=True, post_requests=len(posts), deploy_effects=1,
            retry_window_to_attempt2_s=f"{second.started_at.timestamp() - first.finished_at.timestamp():.2f}",
            worker_a_exit=worker_a.popen.returncode)


CANCEL_FAULTS = [
    # Hold the post-deploy check so that the cancel lands while the deployment commitment is live
    # (the cancel voids the held check; when it finishes, its result is discarded as stale).
    {"point": "activity.after_claim", "when": {"activity": "verify_deployment", "attempt": 1},
     "action": "sleep", "seconds": 2.5},
    # The compensation dies right after the deploy target accepted the DELETE.
    {"point": "activity.after_external_call", "when": {"activity": "undeploy", "attempt": 1},
     "action": "sigkill_self"},
]


def test_cancel_releases_the_deployment_although_the_compensating_worker_is_killed(
    cluster, process_broker, git_repo, deploy_target, approver, requester, figures, monkeypatch,
):
    """6.10: cancel while the deployment commitment is active; the pool process running `undeploy`
    is SIGKILLed after the DELETE was accepted and the broker is flushed. The lease runs out, the
    compensation is re-driven with the same key, and the workflow ends cancelled with the
    commitment compensated: the target counts one create and one delete."""
    requests = record_deploy_requests(monkeypatch)
    cluster.start(workers=("wa", "wb"), beats=("beat",), faults=CANCEL_FAULTS)
    wf = launch_release(git_repo, requester, "Ship release notes, then change our minds")
    wait_until_status(cluster, [wf], "waiting", node="WAIT_FOR_APPROVAL", timeout=60)
    approve(wf, approver)

    def verifying() -> bool:
        return Activity.objects.filter(workflow_id=wf, name="verify_deployment", status="running").exists()

    cluster.wait_for(verifying, timeout=30, what="verify_deployment to run after the deploy succeeded")
    deploy = Activity.objects.get(workflow_id=wf, name="deploy")
    commitment = Commitment.objects.get(activity=deploy)
    assert (deploy.status, commitment.status) == ("succeeded", "active")
    # Suspended: the in-flight check is voided and the compensation scheduled, not yet run.
    assert services.workflow_cancel(workflow_id=wf, reason="the release is no longer wanted").outcome == "suspended"
    cancelled_at = time.time()

    def undeploy_killed() -> dict | None:
        return next((f for f in cluster.faults_fired() if f.get("activity") == "undeploy"), None)

    killed = cluster.wait_for(undeploy_killed, timeout=30, what="the undeploy attempt to be SIGKILLed")
    cluster.wait_for(lambda: killed["pid"] in pool_kills_reported(cluster), timeout=15,
                     what=f"a worker to report its pool process {killed['pid']} killed")
    # Recovery must come from the database: drop the requeued message and anything else queued.
    process_broker.flushdb()
    wait_until_status(cluster, [wf], "cancelled", timeout=40)
    done_at = time.time()

    compensation = Activity.objects.get(workflow_id=wf, name="undeploy")
    assert compensation.operation_id == f"{deploy.operation_id}/compensate"
    assert killed["operation_id"] == compensation.operation_id and killed["attempt"] == 1
    attempts = list(compensation.attempts.order_by("number"))
    assert [(a.number, a.status) for a in attempts] == [(1, "lost"), (2, "succeeded")]
    assert compensation.result == {"deleted": True, "idempotency_key": deploy.sent_key}
    commitment.refresh_from_db()
    assert commitment.status == "compensated"
    assert not Commitment.objects.filter(workflow_id=wf, status="active").exists()  # I6
    # The target saw the DELETE twice under the same key and counted one effect.
    deletes = [r for r in requests if r.method == "DELETE"]
    assert [(r.key, r.status) for r in deletes] == [(deploy.sent_key, "200")] * 2, deletes
    stats = deploy_target.store.stats()
    assert stats["effects"] == {deploy.sent_key: {"created": 1, "deleted": 1}}, stats
    assert (stats["deployments"], stats["active"]) == (1, 0), stats
    verify_held = [f for f in cluster.faults_fired() if f.get("activity") == "verify_deployment"]
    assert len(verify_held) == 1 and verify_held[0]["action"] == "sleep"
    for kind in ("workflow.cancelling", "commitment.compensated", "workflow.cancelled"):
        assert event_count(kind, workflow_id=wf) == 1, kind
    assert event_count("activity.lease_expired", workflow_id=wf, data__operation_id=compensation.operation_id) == 1
    assert_event_seqs_contiguous([wf])
    recover = attempts[1].started_at.timestamp() - killed["at"]
    assert recover <= LEASE_SECONDS + BEAT_INTERVAL_SECONDS + REDISPATCH_AFTER_SECONDS + 5.0, recover
    figures("6.10 cancel with a killed compensation", faults_injected=2, broker_flushed=True,
            delete_requests=len(deletes), deploy_created=1, deploy_deleted=1,
            compensation_attempts=len(attempts), recover_s=f"{recover:.2f}", lease_s=LEASE_SECONDS,
            cancel_to_cancelled_s=f"{done_at - cancelled_at:.1f}")
