"""Cancelling a workflow: waits close, scheduled work is voided, commitments are compensated newest first."""
from __future__ import annotations

import socket
from datetime import timedelta
from typing import Any

import pytest

from agentops.agents.release.activities import deploy
from agentops.deploytarget import client
from agentops.deploytarget.server import Fault
from tests.conftest import drive, open_approval, release_params, run_claimed, worker_context
from workflows import clock, codec, services
from workflows.activity_context import LeaseLost
from workflows.errors import NotFound, Permanent, TransitionRefused, WaitRefused
from workflows.models import Activity, ActivityAttempt, Commitment, Event, Timer, Workflow
from workflows.registry import CompensationInput
from workflows.services import Outcome, RunOutcome

pytestmark = [pytest.mark.django_db, pytest.mark.usefixtures("rung")]


def approved(repo: Any, requester: Any, approver: Any) -> Workflow:
    """A release workflow whose candidate alice approved; nothing run since the approval."""
    workflow = drive(services.workflow_launch(kind="release", goal="Ship the release notes",
                                              params=release_params(repo), user=requester).pk)
    wait = open_approval(workflow.pk)
    services.wait_approve(wait_id=wait.pk, user=approver, candidate_hash=wait.candidate_hash)
    return workflow


def run_until_scheduled(workflow_id: int, name: str) -> Activity:
    """Run activities one at a time, as a worker would, until ``name`` is scheduled; do not run it."""
    for _ in range(20):
        services.workflow_advance_if_runnable(workflow_id=workflow_id)
        scheduled = Activity.objects.filter(workflow_id=workflow_id, status=Activity.Status.SCHEDULED).order_by("pk")
        found = scheduled.filter(name=name).first()
        if found is not None:
            return found
        assert scheduled.exists(), f"{name} was never scheduled"
        services.activity_run_if_runnable(activity_id=scheduled.first().pk, worker="in-process")
    raise AssertionError(f"{name} was never scheduled")


def deployed(repo: Any, requester: Any, approver: Any) -> tuple[Workflow, Activity]:
    """A workflow just after COMMIT_OPERATION: the deploy succeeded, verification not yet run."""
    workflow = approved(repo, requester, approver)
    activity = run_until_scheduled(workflow.pk, "deploy")
    assert services.activity_run_if_runnable(activity_id=activity.pk) == RunOutcome.RECORDED
    activity.refresh_from_db()
    workflow.refresh_from_db()
    assert (activity.status, workflow.current_node) == ("succeeded", "VERIFY_POSTCONDITION")
    return workflow, activity


def effects(deploy_target: Any, activity: Activity) -> dict[str, int]:
    return deploy_target.store.stats()["effects"].get(activity.sent_key, {"created": 0, "deleted": 0})


def compensations(workflow: Workflow) -> list[Activity]:
    return list(Activity.objects.filter(workflow=workflow, node="CANCEL").order_by("pk"))


def event_kinds(workflow: Workflow) -> list[str]:
    return list(Event.objects.filter(workflow=workflow).values_list("kind", flat=True))


def unused_port_url() -> str:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return f"http://127.0.0.1:{sock.getsockname()[1]}"


def test_cancel_while_waiting_for_approval_needs_no_compensation(git_repo, deploy_target, requester, approver):
    """Cancel during the approval wait: wait cancelled, timer ignored, no undo needed, workflow cancelled."""
    workflow = drive(services.workflow_launch(kind="release", goal="Ship the release notes",
                                              params=release_params(git_repo), user=requester).pk)
    wait = open_approval(workflow.pk)

    result = services.workflow_cancel(workflow_id=workflow.pk, reason="not this week", user=requester)
    assert (result.outcome, result.message) == (Outcome.APPLIED, f"Workflow {workflow.pk} is cancelled.")

    workflow.refresh_from_db()
    wait.refresh_from_db()
    assert (workflow.status, workflow.reason) == ("cancelled", "not this week")
    assert wait.status == "cancelled"
    timer = Timer.objects.get(wait=wait)
    assert (timer.status, timer.note) == ("ignored", "workflow cancelled")
    assert not compensations(workflow)
    assert not Commitment.objects.filter(workflow=workflow).exists()
    assert event_kinds(workflow)[-2:] == ["workflow.cancelling", "workflow.cancelled"]
    assert deploy_target.store.stats()["requests"] == 0
    # A late approval is refused, and the expiry timer no longer fires.
    with pytest.raises(WaitRefused, match=f"Wait {wait.pk} is cancelled"):
        services.wait_approve(wait_id=wait.pk, user=approver, candidate_hash=wait.candidate_hash)
    Timer.objects.filter(pk=timer.pk).update(fire_at=clock.now() - timedelta(seconds=1))
    assert services.timers_fire_due() == 0


def test_cancel_after_deploy_undeploys_once(git_repo, deploy_target, requester, approver):
    """The deployment commitment is compensated by one undeploy with its own operation id."""
    workflow, deploy_activity = deployed(git_repo, requester, approver)
    commitment = Commitment.objects.get(workflow=workflow)
    assert commitment.status == "active"

    assert services.workflow_cancel(workflow_id=workflow.pk, reason="rollback").outcome == Outcome.SUSPENDED

    workflow.refresh_from_db()
    assert workflow.status == "cancelling"
    verify = Activity.objects.get(workflow=workflow, name="verify_deployment")
    assert (verify.status, verify.error) == ("cancelled", "workflow cancelled")
    [undeploy] = compensations(workflow)
    assert (undeploy.name, undeploy.operation_id) == ("undeploy", f"{deploy_activity.operation_id}/compensate")
    assert undeploy.input["operation_id"] == deploy_activity.operation_id

    workflow = drive(workflow.pk)

    assert workflow.status == "cancelled"
    commitment.refresh_from_db()
    assert commitment.status == "compensated"
    assert effects(deploy_target, deploy_activity) == {"created": 1, "deleted": 1}
    assert deploy_target.store.stats()["active"] == 0
    assert len(compensations(workflow)) == 1
    assert compensations(workflow)[0].attempt == 1
    assert event_kinds(workflow)[-2:] == ["commitment.compensated", "workflow.cancelled"]


def test_cancelling_twice_changes_nothing(git_repo, deploy_target, requester, approver):
    """A second cancel, while compensating or after, returns ALREADY_APPLIED and writes nothing."""
    workflow, deploy_activity = deployed(git_repo, requester, approver)
    services.workflow_cancel(workflow_id=workflow.pk)
    for _ in range(2):
        workflow.refresh_from_db()
        before = (workflow.status, workflow.updated_at, workflow.event_seq, len(compensations(workflow)))
        assert services.workflow_cancel(workflow_id=workflow.pk, reason="again").outcome == Outcome.ALREADY_APPLIED
        workflow.refresh_from_db()
        assert (workflow.status, workflow.updated_at, workflow.event_seq, len(compensations(workflow))) == before
        assert workflow.reason != "again"
        drive(workflow.pk)
    assert workflow.status == "cancelled"
    assert effects(deploy_target, deploy_activity) == {"created": 1, "deleted": 1}


def test_cancel_during_a_running_deploy_compensates_at_once_and_a_late_post_is_refused(
    git_repo, deploy_target, requester, approver
):
    """The deploy attempt passed its fence, then its worker paused before the POST.

    Cancel voids the attempt and compensates the uncertain effect at once, without waiting for the
    lease: the DELETE finds nothing (404), and rather than taking that as done the target keeps the
    key as a tombstone. When the worker wakes and POSTs, the target refuses (410): no deployment
    exists for the cancelled workflow, where the late POST would otherwise deploy for good.
    """
    workflow = approved(git_repo, requester, approver)
    activity = run_until_scheduled(workflow.pk, "deploy")
    claim = services.activity_claim_if_runnable(activity_id=activity.pk, worker="paused", task_id="t1")
    worker_context(claim).fence("POST the deployment")  # the worker stops here, its POST not yet sent

    assert services.workflow_cancel(workflow_id=workflow.pk).outcome == Outcome.SUSPENDED
    activity.refresh_from_db()
    assert (activity.status, activity.error) == ("cancelled", "workflow cancelled")
    assert ActivityAttempt.objects.get(activity=activity, number=1).status == "cancelled"
    assert Commitment.objects.get(workflow=workflow).data == {"uncertain": True}
    workflow = drive(workflow.pk)
    assert workflow.status == "cancelled"
    assert [(a.name, a.result["deleted"]) for a in compensations(workflow)] == [("undeploy", False)]
    assert deploy_target.store.stats()["tombstones"] == 1
    # The compensation of the uncertain attempt is given what that attempt was asked to do.
    [undo] = compensations(workflow)
    given = codec.from_json(CompensationInput, undo.input, what="the compensation's input")
    assert (given.input, given.result, given.uncertain) == (activity.input, None, True)
    assert given.input["candidate_hash"] and given.sent_key == claim.idempotency_key

    with pytest.raises(Permanent, match="410"):  # the paused worker wakes and sends its POST
        client.create_deployment(base_url=deploy_target.url, idempotency_key=claim.idempotency_key,
                                 body={"workflow_id": workflow.pk}, timeout=5)
    assert effects(deploy_target, activity) == {"created": 0, "deleted": 0}
    assert deploy_target.store.stats()["active"] == 0
    assert services.activity_failure_record_if_current(claim=claim, error=Permanent("410")) == RunOutcome.STALE
    assert Commitment.objects.get(workflow=workflow).status == "compensated"


def test_a_fence_after_cancel_stops_the_effect_before_it_is_made(git_repo, deploy_target, requester, approver):
    """The worker paused before its fence: on waking, the fence refuses and nothing is sent."""
    workflow = approved(git_repo, requester, approver)
    activity = run_until_scheduled(workflow.pk, "deploy")
    claim = services.activity_claim_if_runnable(activity_id=activity.pk, worker="paused", task_id="t1")
    services.workflow_cancel(workflow_id=workflow.pk)

    with pytest.raises(LeaseLost, match="POST the deployment was not made"):
        run_claimed(deploy, claim)
    assert deploy_target.store.stats()["requests"] == 0


def test_attempt_stopped_by_its_heartbeat_is_compensated_at_once(git_repo, deploy_target, requester, approver):
    """The in-flight deploy sees the cancel at its heartbeat and stops; its failure report changes
    nothing (the cancel voided it), and its effect is compensated without waiting for its lease."""
    workflow = approved(git_repo, requester, approver)
    activity = run_until_scheduled(workflow.pk, "deploy")
    claim = services.activity_claim_if_runnable(activity_id=activity.pk, worker="polite", task_id="t1")
    ctx = worker_context(claim)
    deploy.execute(ctx, claim.input)
    services.workflow_cancel(workflow_id=workflow.pk)
    with pytest.raises(LeaseLost, match="its work is no longer wanted") as stopped:
        ctx.heartbeat("still deploying")

    assert services.activity_failure_record_if_current(claim=claim, error=stopped.value) == RunOutcome.STALE

    activity.refresh_from_db()
    assert activity.status == "cancelled"
    assert [a.name for a in compensations(workflow)] == ["undeploy"]
    workflow = drive(workflow.pk)
    assert workflow.status == "cancelled"
    assert effects(deploy_target, activity) == {"created": 1, "deleted": 1}


def test_late_deploy_result_after_cancel_is_compensated_not_continued(git_repo, deploy_target, requester, approver):
    """The in-flight deploy took effect and reports after cancel: its result is refused as stale,
    no verification runs, and the deployment is undone as an uncertain effect."""
    workflow = approved(git_repo, requester, approver)
    activity = run_until_scheduled(workflow.pk, "deploy")
    claim = services.activity_claim_if_runnable(activity_id=activity.pk, worker="slow", task_id="t1")
    result = run_claimed(deploy, claim)
    assert services.workflow_cancel(workflow_id=workflow.pk).outcome == Outcome.SUSPENDED

    assert services.activity_result_record_if_current(claim=claim, result=result) == RunOutcome.STALE

    workflow = drive(workflow.pk)
    assert (workflow.status, workflow.current_node) == ("cancelled", "COMMIT_OPERATION")
    assert not Activity.objects.filter(workflow=workflow, name="verify_deployment").exists()
    assert Commitment.objects.get(workflow=workflow).status == "compensated"
    assert effects(deploy_target, activity) == {"created": 1, "deleted": 1}


def test_cancel_voids_a_pending_retry(git_repo, deploy_target, requester, approver, rung, time_machine):
    """A deploy waiting in its retry window is voided by cancel and never dispatched again."""
    workflow = approved(git_repo, requester, approver)
    activity = run_until_scheduled(workflow.pk, "deploy")
    deploy_target.store.set_fault(Fault.build("fail", 1))
    assert services.activity_run_if_runnable(activity_id=activity.pk) == RunOutcome.RETRY_SCHEDULED
    activity.refresh_from_db()
    assert (activity.status, activity.dispatched_at) == ("scheduled", None)

    services.workflow_cancel(workflow_id=workflow.pk)
    activity.refresh_from_db()
    assert activity.status == "cancelled"
    rung.clear()
    time_machine.move_to(activity.next_attempt_at + timedelta(minutes=5))  # the retry window has opened
    services.activities_redrive_due()
    assert ("activity", activity.pk) not in rung

    workflow = drive(workflow.pk)
    activity.refresh_from_db()
    assert (workflow.status, activity.status, activity.attempt) == ("cancelled", "cancelled", 1)
    assert deploy_target.store.stats()["deployments"] == 0
    [undeploy] = compensations(workflow)
    assert undeploy.result == {"deleted": False, "idempotency_key": activity.sent_key}


def test_commitments_are_compensated_newest_first(git_repo, deploy_target, requester, approver, settings):
    """With two commitments, the newer one is undone first, then the older one, one at a time."""
    workflow, deploy_activity = deployed(git_repo, requester, approver)
    newer = Commitment.objects.get(workflow=workflow)
    # An older commitment with a higher primary key: the order must follow created_at, not pk.
    older_activity = Activity.objects.create(
        workflow=workflow, operation_id=f"wf-{workflow.pk}/EARLIER.1/i1/0", name="deploy", node="EARLIER",
        node_visit=1, intent_version=1, status=Activity.Status.SUCCEEDED, attempt=1, next_attempt_at=clock.now(),
        created_at=clock.now(), result={},
    )
    client.create_deployment(base_url=settings.AGENTOPS_DEPLOY_TARGET_URL, idempotency_key=older_activity.operation_id,
                             body={"earlier": True}, timeout=5)
    older = Commitment.objects.create(workflow=workflow, activity=older_activity, kind="deployment",
                                      compensation="undeploy", created_at=newer.created_at - timedelta(minutes=1))
    assert older.pk > newer.pk

    services.workflow_cancel(workflow_id=workflow.pk)
    assert [a.input["operation_id"] for a in compensations(workflow)] == [deploy_activity.operation_id]
    services.activity_run_if_runnable(activity_id=compensations(workflow)[0].pk)
    newer.refresh_from_db()
    older.refresh_from_db()
    assert (newer.status, older.status) == ("compensated", "active")
    workflow = drive(workflow.pk)

    assert workflow.status == "cancelled"
    assert [a.input["operation_id"] for a in compensations(workflow)] == [
        deploy_activity.operation_id, older_activity.operation_id,
    ]
    older.refresh_from_db()
    assert older.status == "compensated"
    assert older.closed_at >= newer.closed_at
    assert effects(deploy_target, deploy_activity) == {"created": 1, "deleted": 1}
    assert effects(deploy_target, older_activity) == {"created": 1, "deleted": 1}


def test_failed_compensation_is_retried_until_it_succeeds(git_repo, deploy_target, requester, approver, settings):
    """A transient undeploy failure while cancelling opens a retry window; it is not given up."""
    workflow, deploy_activity = deployed(git_repo, requester, approver)
    services.workflow_cancel(workflow_id=workflow.pk)
    [undeploy] = compensations(workflow)
    real_url = settings.AGENTOPS_DEPLOY_TARGET_URL
    settings.AGENTOPS_DEPLOY_TARGET_URL = unused_port_url()  # the deploy target is unreachable

    assert services.activity_run_if_runnable(activity_id=undeploy.pk) == RunOutcome.RETRY_SCHEDULED

    undeploy.refresh_from_db()
    assert undeploy.status == "scheduled"
    assert "connection was refused" in undeploy.error
    settings.AGENTOPS_DEPLOY_TARGET_URL = real_url
    Activity.objects.filter(pk=undeploy.pk).update(next_attempt_at=clock.now() - timedelta(seconds=1))
    assert services.activities_redrive_due() == 1
    workflow = drive(workflow.pk)
    assert workflow.status == "cancelled"
    assert Commitment.objects.get(workflow=workflow).status == "compensated"
    assert effects(deploy_target, deploy_activity) == {"created": 1, "deleted": 1}


def test_lost_compensation_attempt_is_run_again(git_repo, deploy_target, requester, approver):
    """The worker running undeploy dies while cancelling: the compensation is re-driven, not dropped."""
    workflow, deploy_activity = deployed(git_repo, requester, approver)
    services.workflow_cancel(workflow_id=workflow.pk)
    [undeploy] = compensations(workflow)
    claim = services.activity_claim_if_runnable(activity_id=undeploy.pk, worker="doomed", task_id="t1")
    assert services.activity_heartbeat_if_current(claim=claim) is True, "compensation must keep its lease"
    Activity.objects.filter(pk=undeploy.pk).update(lease_expires_at=clock.now() - timedelta(seconds=1))

    assert services.leases_reap_expired() == 1

    undeploy.refresh_from_db()
    assert (undeploy.status, undeploy.attempt) == ("scheduled", 1)
    workflow = drive(workflow.pk)
    undeploy.refresh_from_db()
    assert (workflow.status, undeploy.status, undeploy.attempt) == ("cancelled", "succeeded", 2)
    assert effects(deploy_target, deploy_activity) == {"created": 1, "deleted": 1}


def test_cancel_of_a_completed_workflow_is_refused(git_repo, deploy_target, requester, approver):
    """A completed release keeps its deployment: cancel is refused and nothing is undone."""
    workflow = drive(approved(git_repo, requester, approver).pk)
    assert workflow.status == "completed", workflow.reason
    before = (workflow.updated_at, workflow.event_seq)

    with pytest.raises(TransitionRefused, match=f"Workflow {workflow.pk} is already completed; there is nothing"):
        services.workflow_cancel(workflow_id=workflow.pk)

    workflow.refresh_from_db()
    assert (workflow.status, workflow.updated_at, workflow.event_seq) == ("completed", *before)
    assert Commitment.objects.get(workflow=workflow).status == "released"
    assert not compensations(workflow)
    assert deploy_target.store.stats()["active"] == 1


def test_cancel_of_an_unknown_workflow_is_not_found(db):
    """Cancelling a workflow that does not exist names it."""
    with pytest.raises(NotFound, match="Workflow 987654 does not exist"):
        services.workflow_cancel(workflow_id=987654)


def test_exhausted_compensation_asks_a_person_and_resume_tries_again(
    git_repo, deploy_target, requester, approver, settings
):
    """An undeploy out of attempts leaves the workflow cancelling with a reason naming the fix;
    `resume` gives the compensation new attempts and the cancellation finishes."""
    workflow, deploy_activity = deployed(git_repo, requester, approver)
    services.workflow_cancel(workflow_id=workflow.pk)
    [undeploy] = compensations(workflow)
    Activity.objects.filter(pk=undeploy.pk).update(max_attempts=1)
    real_url = settings.AGENTOPS_DEPLOY_TARGET_URL
    settings.AGENTOPS_DEPLOY_TARGET_URL = unused_port_url()

    assert services.activity_run_if_runnable(activity_id=undeploy.pk) == RunOutcome.FAILED

    workflow.refresh_from_db()
    assert workflow.status == "cancelling"
    assert "failed after 1 attempts" in workflow.reason
    assert f"manage.py agent resume {workflow.pk}" in workflow.reason
    assert event_kinds(workflow).count("compensation.failed") == 1
    services.workflow_advance_if_runnable(workflow_id=workflow.pk)
    assert event_kinds(workflow).count("compensation.failed") == 1

    settings.AGENTOPS_DEPLOY_TARGET_URL = real_url
    assert services.workflow_resume(workflow_id=workflow.pk).outcome == Outcome.APPLIED
    assert services.workflow_resume(workflow_id=workflow.pk).outcome == Outcome.ALREADY_APPLIED
    workflow = drive(workflow.pk)
    assert workflow.status == "cancelled"
    assert effects(deploy_target, deploy_activity) == {"created": 1, "deleted": 1}
