"""An operator pause with real workers and beat: nothing new starts, the running deploy finishes,
resume goes on to completion, and the deploy target counts one effect."""
from __future__ import annotations

import time

import pytest

from tests.process.harness import (
    BEAT_INTERVAL_SECONDS,
    LEASE_SECONDS,
    REDISPATCH_AFTER_SECONDS,
    approve,
    assert_event_seqs_contiguous,
    assert_one_effect_per_key,
    event_count,
    launch_release,
    wait_until_status,
)
from workflows import services
from workflows.models import Activity, ActivityAttempt, Workflow

pytestmark = [pytest.mark.process, pytest.mark.django_db(transaction=True)]

HOLD_SECONDS = 3.0
# Hold the deploy just after its claim, so that the pause lands while it runs (within its lease).
HOLD_DEPLOY = [{"point": "activity.after_claim", "when": {"activity": "deploy", "attempt": 1},
                "action": "sleep", "seconds": HOLD_SECONDS}]
# Long enough for beat to run every sweep several times and for a lost doorbell to be re-rung.
QUIET_SECONDS = LEASE_SECONDS + REDISPATCH_AFTER_SECONDS + 3 * BEAT_INTERVAL_SECONDS


def attempts_started_after(workflow_id: int, at: float) -> list[str]:
    return [f"{a.activity.name}#{a.number}" for a in ActivityAttempt.objects.filter(
        activity__workflow_id=workflow_id).select_related("activity") if a.started_at.timestamp() > at]


def test_an_operator_pause_stops_new_work_and_resume_completes_without_repeating_an_effect(
    cluster, git_repo, deploy_target, approver, requester, figures,
):
    """Paused while waiting, an approval is held (no deploy starts through several beat sweeps); resumed, the
    deploy starts and is paused mid-run: it finishes (its result recorded), and no further activity starts
    while paused; resumed again, the workflow completes with one deployment."""
    cluster.start(workers=("wa", "wb"), beats=("beat",), faults=HOLD_DEPLOY)
    wf = launch_release(git_repo, requester, "Ship release notes, with two pauses")
    wait_until_status(cluster, [wf], "waiting", node="WAIT_FOR_APPROVAL", timeout=60)

    # 1. Paused while waiting: the approval is recorded, the workflow stays paused, nothing deploys.
    assert services.workflow_pause(workflow_id=wf, reason="hold the release", by="process test").status == "paused"
    first_pause_at = time.time()
    approve(wf, approver)
    time.sleep(QUIET_SECONDS)
    assert Workflow.objects.get(pk=wf).status == "paused"
    assert not Activity.objects.filter(workflow_id=wf, name="deploy").exists()
    assert attempts_started_after(wf, first_pause_at) == []
    assert event_count("workflow.wake_held", workflow_id=wf) == 1

    # 2. Resumed: the deploy starts; paused while it runs, it finishes and nothing after it starts.
    assert services.workflow_resume(workflow_id=wf, by="process test").status == "running"
    cluster.wait_for(lambda: Activity.objects.filter(workflow_id=wf, name="deploy", status="running").exists(),
                     timeout=30, what="the deploy to start after the resume")
    paused = services.workflow_pause(workflow_id=wf, reason="look at the target", by="process test")
    second_pause_at = time.time()
    assert "1 running activity finishes" in paused.message, paused.message
    deploy = cluster.wait_for(
        lambda: Activity.objects.filter(workflow_id=wf, name="deploy", status="succeeded").first(),
        timeout=HOLD_SECONDS + LEASE_SECONDS + 10, what="the running deploy to finish while paused")
    finished_after_pause = deploy.attempts.get().finished_at.timestamp() - second_pause_at
    time.sleep(QUIET_SECONDS)
    workflow = Workflow.objects.get(pk=wf)
    assert (workflow.status, workflow.pause_cause) == ("paused", "operator")
    assert attempts_started_after(wf, second_pause_at) == [], "nothing new starts while paused"
    assert not Activity.objects.filter(workflow_id=wf, name="verify_deployment").exists()
    assert deploy_target.store.stats()["effects"] == {deploy.sent_key: {"created": 1, "deleted": 0}}

    # 3. Resumed again: it goes on from the recorded deploy to completion.
    resumed_at = time.time()
    services.workflow_resume(workflow_id=wf, by="process test")
    wait_until_status(cluster, [wf], "completed", timeout=60)
    completed_in = time.time() - resumed_at

    assert Activity.objects.filter(workflow_id=wf, name="deploy").count() == 1
    assert deploy.attempts.count() == 1
    assert_one_effect_per_key(deploy_target, {deploy.sent_key})
    assert event_count("workflow.paused", workflow_id=wf, data__cause="operator") == 2
    assert event_count("workflow.resumed", workflow_id=wf, data__by="process test") == 2
    assert event_count("activity.succeeded", workflow_id=wf, data__operation_id=deploy.operation_id) == 1
    assert_event_seqs_contiguous([wf])
    figures("operator pause", workers=2, pauses=2, held_decisions=1,
            new_attempts_while_paused=0, quiet_window_s=QUIET_SECONDS, lease_s=LEASE_SECONDS,
            running_deploy_finished_after_pause_s=f"{finished_after_pause:.2f}",
            resume_to_completed_s=f"{completed_in:.2f}", deploy_effects=1, deploy_attempts=1)
