"""Workers killed or paused mid-activity (reliability.md 6.1, 6.2, 6.3): leases, reconciliation, fencing."""
from __future__ import annotations

import os
import re
import signal
import statistics
import time
from datetime import timedelta

import psutil
import pytest
from django.utils import timezone

from tests.conftest import make_git_repo
from tests.process.harness import (
    BEAT_INTERVAL_SECONDS,
    LEASE_SECONDS,
    approve,
    assert_event_seqs_contiguous,
    assert_one_effect_per_key,
    event_count,
    launch_release,
    wait_until_status,
)
from workflows import registry
from workflows.models import Activity, ActivityAttempt, Commitment, Event, Workflow

pytestmark = [pytest.mark.process, pytest.mark.django_db(transaction=True)]

KILL_AFTER_DEPLOY_ACCEPTED = [{
    "point": "activity.after_external_call", "when": {"activity": "deploy", "attempt": 1}, "action": "sigkill_self",
}]
LOST_POOL_PROCESS = re.compile(r"pid:(\d+) exited with 'signal 9 \(SIGKILL\)'")


def slow_once_repo(tmp_path, *, retry_seconds: float = 0):
    """A repository whose test command sleeps 6 s on its first run (run_tests heartbeats every 5 s),
    long enough to kill or pause the worker mid-run. Later runs sleep ``retry_seconds`` and then
    read a file of their workspace, so they fail if anything removed it meanwhile."""
    marker = str(tmp_path / "first-test-run.marker")
    script = (
        "import os, time\n"
        f"if not os.path.exists({marker!r}):\n"
        f"    open({marker!r}, 'w').close()\n"
        "    time.sleep(6)\n"
        "else:\n"
        f"    time.sleep({retry_seconds})\n"
        "    open('check.py').read()\n"
        "print('tests pass')\n"
    )
    return make_git_repo(tmp_path / "slow-repo", test_script=script)


def test_kill_after_the_deploy_target_accepted_reconciles_one_deployment_per_workflow(
    cluster, git_repo, deploy_target, approver, requester, figures,
):
    """A pool process killed right after the deploy target accepted: the lease expires, attempt 2
    finds the deployment by its idempotency key instead of deploying again, and every workflow completes."""
    cluster.start(workers=("wa", "wb"), beats=("beat",), faults=KILL_AFTER_DEPLOY_ACCEPTED)
    ids = [launch_release(git_repo, requester, f"Ship release notes {n}") for n in range(3)]
    wait_until_status(cluster, ids, "waiting", node="WAIT_FOR_APPROVAL", timeout=60)
    for pk in ids:
        approve(pk, approver)
    wait_until_status(cluster, ids, "completed", timeout=90)

    deploys = {a.operation_id: a for a in Activity.objects.filter(workflow_id__in=ids, name="deploy")}
    fired = cluster.faults_fired()
    assert len(fired) == 3 and {f["operation_id"] for f in fired} == set(deploys), fired
    assert all(f["point"] == "activity.after_external_call" and f["attempt"] == 1 for f in fired)
    # Each fault-log pid is a pool process whose death its worker reported (WorkerLostError);
    # the worker notices a dead pool process lazily, up to a few seconds later.
    def lost_pids() -> set[int]:
        return {int(pid) for w in cluster.procs if w.role == "worker" for pid in LOST_POOL_PROCESS.findall(w.log())}

    cluster.wait_for(lambda: lost_pids() == {f["pid"] for f in fired}, timeout=15,
                     what=f"the workers to report the killed pool processes {[f['pid'] for f in fired]}")
    kills_seen = len(lost_pids())

    assert_one_effect_per_key(deploy_target, {a.sent_key for a in deploys.values()})
    recover = []
    for fault in fired:
        activity = deploys[fault["operation_id"]]
        attempts = list(activity.attempts.order_by("number").values_list("number", "status"))
        assert attempts == [(1, ActivityAttempt.Status.LOST), (2, ActivityAttempt.Status.SUCCEEDED)]
        succeeded = Event.objects.get(kind="activity.succeeded", data__operation_id=activity.operation_id)
        assert succeeded.data["attempt"] == 2 and succeeded.data["reconciled"] is True
        second = activity.attempts.get(number=2)
        recover.append(second.started_at.timestamp() - fault["at"])
    assert Commitment.objects.filter(workflow_id__in=ids, status="released").count() == 3
    assert_event_seqs_contiguous(ids)
    # The kill lands just after the claim, so the lease runs out LEASE_SECONDS later; the reaper
    # runs every beat interval and rings attempt 2 at once (5 s of slack for a loaded machine).
    assert max(recover) <= LEASE_SECONDS + BEAT_INTERVAL_SECONDS + 5.0, recover
    duplicates = event_count("activity.doorbell_ignored", data__operation_id__in=list(deploys))
    figures("6.1 kill after accept", workflows=len(ids), faults_injected=len(fired), pool_kills_seen=kills_seen,
            duplicate_effects=0, reconciled_attempts=len(deploys), redelivered_doorbells_ignored=duplicates,
            recover_s_min=f"{min(recover):.2f}", recover_s_p50=f"{statistics.median(recover):.2f}",
            recover_s_max=f"{max(recover):.2f}", lease_s=LEASE_SECONDS)


def _run_tests_attempt(workflow_id: int, number: int) -> ActivityAttempt | None:
    return ActivityAttempt.objects.filter(
        activity__workflow_id=workflow_id, activity__name="run_tests", number=number
    ).first()


def test_worker_killed_during_a_long_activity_is_taken_over_by_another_worker(
    cluster, process_broker, tmp_path, deploy_target, requester, figures,
):
    """SIGKILL to worker A's whole process group mid-run_tests, then the broker is purged: the lease
    runs out, the reaper re-drives from the database alone, and worker B runs attempt 2."""
    repo = slow_once_repo(tmp_path)
    worker_a, _ = cluster.start(workers=("wa",), beats=("beat",))
    wf = launch_release(repo, requester, "Ship with a slow test suite")
    first = cluster.wait_for(lambda: _run_tests_attempt(wf, 1), timeout=40, what="run_tests attempt 1 to start")
    assert first.worker.startswith("wa@"), first.worker
    cluster.wait_for(lambda: worker_a.descendant_running("check.py"), timeout=15,
                     what="the test command to run under worker wa")
    worker_b = cluster.start_worker("wb", ready=False)  # boots while A's lease runs out

    killed_at = time.time()
    exit_code = worker_a.kill_group(signal.SIGKILL)
    assert exit_code == -signal.SIGKILL and not worker_a.group_members(), "the whole group must be gone"
    # Recovery must not depend on the broker: drop the unacked message and everything queued.
    process_broker.flushdb()
    cluster.wait_ready(worker_b)
    wait_until_status(cluster, [wf], "waiting", node="WAIT_FOR_APPROVAL", timeout=70)

    run_tests = Activity.objects.get(workflow_id=wf, name="run_tests")
    attempts = list(run_tests.attempts.order_by("number"))
    assert [(a.number, a.status) for a in attempts] == [(1, "lost"), (2, "succeeded")]
    assert attempts[1].worker.startswith("wb@"), attempts[1].worker
    assert run_tests.result["passed"] is True
    assert event_count("activity.lease_expired", workflow_id=wf, data__operation_id=run_tests.operation_id) == 1
    assert_event_seqs_contiguous([wf])
    lease = registry.activity_type("run_tests").lease_seconds
    recover = attempts[1].started_at.timestamp() - killed_at
    assert recover <= lease + BEAT_INTERVAL_SECONDS + 5.0, recover
    figures("6.2 worker group SIGKILL mid-activity", faults_injected=1, worker_exit_code=exit_code,
            attempt1_worker=attempts[0].worker.split("@")[0], attempt2_worker=attempts[1].worker.split("@")[0],
            recover_s=f"{recover:.2f}", run_tests_lease_s=lease, broker_flushed=True)


def test_paused_worker_cannot_write_back_after_its_lease_was_taken_over(
    cluster, tmp_path, deploy_target, approver, requester, figures,
):
    """SIGSTOP worker A's pool process mid-run_tests; B takes the attempt over. A resumed while B
    runs is fenced off: attempt 1 ends stale, the workflow row is untouched, B's run is unharmed."""
    repo = slow_once_repo(tmp_path, retry_seconds=6)
    worker_a, _ = cluster.start(workers=("wa",), beats=("beat",))
    wf = launch_release(repo, requester, "Ship with a slow test suite")
    first = cluster.wait_for(lambda: _run_tests_attempt(wf, 1), timeout=40, what="run_tests attempt 1 to start")
    assert first.worker.startswith("wa@"), first.worker
    command = cluster.wait_for(lambda: worker_a.descendant_running("check.py"), timeout=15,
                               what="the test command to run under worker wa")
    pool = psutil.Process(command.ppid())
    assert pool.pid in {p.pid for p in worker_a.pool_children()}
    worker_b = cluster.start_worker("wb", ready=False)

    os.kill(pool.pid, signal.SIGSTOP)
    stopped_at = time.monotonic()
    cluster.wait_for(lambda: pool.status() == psutil.STATUS_STOPPED, timeout=5, what="the pool process to stop")
    cluster.wait_ready(worker_b)
    # A stopped process cannot heartbeat, so its lease would run out 30 s after the claim; the
    # previous test waits that out, this one moves lease_expires_at into the past instead.
    assert Activity.objects.filter(pk=first.activity_id, status="running", attempt=1).update(
        lease_expires_at=timezone.now() - timedelta(seconds=1)) == 1
    cluster.wait_for(lambda: worker_b.descendant_running("check.py"), timeout=30,
                     what="attempt 2's test command to run under worker wb")
    second = _run_tests_attempt(wf, 2)
    assert second.worker.startswith("wb@"), second.worker
    # Paused longer than a heartbeat period: on SIGCONT the zombie heartbeats (or writes back) at once.
    time.sleep(max(0.0, 5.5 - (time.monotonic() - stopped_at)))
    before = Workflow.objects.values("status", "current_node", "node_visit", "updated_at", "state").get(pk=wf)

    os.kill(pool.pid, signal.SIGCONT)
    paused = time.monotonic() - stopped_at
    finished = re.compile(rf"Task agentops\.activity\.run\[{first.task_id}\] succeeded in [\d.]+s: '(\w+)'")
    outcome = cluster.wait_for(lambda: finished.search(worker_a.log()), timeout=20,
                               what="the resumed attempt 1 to finish on worker wa").group(1)
    zombie = _run_tests_attempt(wf, 1)
    assert outcome == "stale" and zombie.status == "stale", (outcome, zombie.status, zombie.error)
    # Attempt 2 still runs (its test sleeps 6 s), so nothing but the zombie could have written.
    assert Activity.objects.filter(pk=first.activity_id, status="running", attempt=2).exists(), \
        "attempt 2 finished before the zombie: the timing this test relies on did not hold"
    assert Workflow.objects.values("status", "current_node", "node_visit", "updated_at", "state").get(pk=wf) == before
    assert event_count("activity.stale_result_discarded", workflow_id=wf, data__attempt=1) == 1

    # B's run needs its workspace after the zombie cleaned up its own.
    wait_until_status(cluster, [wf], "waiting", node="WAIT_FOR_APPROVAL", timeout=40)
    run_tests = Activity.objects.get(pk=first.activity_id)
    assert run_tests.result["passed"] is True and run_tests.attempt == 2
    succeeded = Event.objects.filter(kind="activity.succeeded", data__operation_id=run_tests.operation_id)
    assert list(succeeded.values_list("data__attempt", flat=True)) == [2]
    approve(wf, approver)
    wait_until_status(cluster, [wf], "completed", timeout=40)
    deploy_key = Activity.objects.get(workflow_id=wf, name="deploy").sent_key
    assert_one_effect_per_key(deploy_target, {deploy_key})
    assert_event_seqs_contiguous([wf])
    figures("6.3 zombie pool process", faults_injected=1, paused_s=f"{paused:.1f}",
            attempt2_worker=second.worker.split("@")[0], zombie_outcome=outcome, stale_writer_rejected=1,
            zombie_error=repr(zombie.error[:70]), workflow_version_changed_by_zombie=0, deploy_effects=1)
