"""No effect outlives its intent: a new goal, a failure or a replan while work is in flight.

Each test plays the race by hand against a real deploy target: an attempt is claimed (and
may pass its fence), then the workflow's goal or fate changes, then the attempt goes on as a
worker that was slow or paused would. Across them, no deployment stays live without an
active commitment of a live workflow, and no tool or model call runs for unwanted work.
"""
from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from agentops.agents.autonomous.activities import execute_task, run_tool
from agentops.agents.release.activities import deploy
from agentops.deploytarget import client
from agentops.deploytarget.server import Fault
from tests.conftest import drive, open_approval, run_claimed, worker_context
from tests.workflows.test_cancel_and_commitments import approved, compensations, effects, run_until_scheduled
from workflows import services
from workflows.activity_context import ActivityContext, Claim, LeaseLost
from workflows.errors import Retryable
from workflows.models import Activity, ActivityAttempt, Commitment, Event, UsageEntry, Workflow
from workflows.services import RunOutcome
from workflows.services.activities import DatabaseLease
from workflows.sql import RowWrite

pytestmark = [pytest.mark.django_db, pytest.mark.usefixtures("rung")]


@pytest.fixture(autouse=True)
def workspaces(settings: Any, tmp_path: Path) -> Path:
    settings.AGENTOPS_WORKSPACE_DIR = tmp_path / "workspaces"
    return settings.AGENTOPS_WORKSPACE_DIR


def live_deployments(deploy_target: Any) -> int:
    return deploy_target.store.stats()["active"]


def approve_current(workflow_id: int, approver: Any) -> Workflow:
    wait = open_approval(workflow_id)
    services.wait_approve(wait_id=wait.pk, user=approver, candidate_hash=wait.candidate_hash)
    return drive(workflow_id)


def test_a_deploy_in_flight_when_the_goal_changes_is_not_retried_for_the_old_goal(
    git_repo, deploy_target, requester, approver
):
    """The deploy passed its fence, the goal is superseded, its POST gets a 503.

    The old attempt's failure is stale: no retry is scheduled (one would POST the old candidate
    after the supersede, and the rebuilt workflow would complete with two live deployments), its
    possible effect is compensated, and one deployment stays live.
    """
    workflow = approved(git_repo, requester, approver)
    old = run_until_scheduled(workflow.pk, "deploy")
    claim = services.activity_claim_if_runnable(activity_id=old.pk, worker="w1", task_id="t1")
    worker_context(claim).fence("POST the deployment")

    services.workflow_supersede(workflow_id=workflow.pk, goal="Ship the release notes, in French", user=requester)
    deploy_target.store.set_fault(Fault.build("fail", 1))
    with pytest.raises(Retryable):
        client.create_deployment(base_url=deploy_target.url, idempotency_key=claim.idempotency_key,
                                 body={"workflow_id": workflow.pk}, timeout=5)
    assert services.activity_failure_record_if_current(claim=claim, error=Retryable("503")) == RunOutcome.STALE
    old.refresh_from_db()
    assert (old.status, old.error, old.attempt) == ("cancelled", "intent v1 superseded", 1)

    workflow = approve_current(drive(workflow.pk).pk, approver)

    assert workflow.status == "completed", workflow.reason
    assert live_deployments(deploy_target) == 1
    assert effects(deploy_target, old) == {"created": 0, "deleted": 0}
    assert sorted(Commitment.objects.filter(workflow=workflow).values_list("status", flat=True)) == [
        "compensated", "released",
    ]


def test_an_accepted_deploy_whose_answer_was_lost_is_compensated_when_the_goal_changes(
    git_repo, deploy_target, requester, approver
):
    """A superseded deploy, variant: the first POST took effect but its answer was lost; the retry
    waits in its window when the goal changes. The old deploy's live deployment is compensated as an
    uncertain effect, not left cancelled and never reconciled or undone."""
    workflow = approved(git_repo, requester, approver)
    old = run_until_scheduled(workflow.pk, "deploy")
    deploy_target.store.set_fault(Fault.build("accept_then_drop", 1))
    assert services.activity_run_if_runnable(activity_id=old.pk, worker="w1") == RunOutcome.RETRY_SCHEDULED
    assert live_deployments(deploy_target) == 1

    services.workflow_supersede(workflow_id=workflow.pk, goal="Ship nothing after all", user=requester)

    workflow = drive(workflow.pk)
    old.refresh_from_db()
    assert old.status == "cancelled"
    [compensation] = compensations(workflow)
    assert (compensation.status, compensation.result["deleted"]) == ("succeeded", True)
    assert Commitment.objects.get(activity=old).status == "compensated"
    assert effects(deploy_target, old) == {"created": 1, "deleted": 1}
    assert live_deployments(deploy_target) == 0
    assert workflow.status == "waiting", "the workflow goes on for the new goal: a new approval"


def test_the_old_goals_deploy_cannot_run_after_the_new_goal_was_rejected(
    git_repo, deploy_target, requester, approver
):
    """A superseded deploy, variant: the old deploy is claimed, the goal changes, the new candidate
    is rejected (the workflow fails), then the old attempt wakes. Its fence stops it: no live
    deployment and no active commitment on a failed workflow."""
    workflow = approved(git_repo, requester, approver)
    old = run_until_scheduled(workflow.pk, "deploy")
    claim = services.activity_claim_if_runnable(activity_id=old.pk, worker="paused", task_id="t1")
    services.workflow_supersede(workflow_id=workflow.pk, goal="Another goal", user=requester)
    drive(workflow.pk)
    services.wait_reject(wait_id=open_approval(workflow.pk).pk, user=approver, comment="no")
    workflow = drive(workflow.pk)
    assert workflow.status == "failed"

    with pytest.raises(LeaseLost, match="POST the deployment was not made"):
        run_claimed(deploy, claim)

    assert deploy_target.store.stats()["deployments"] == 0
    assert not Commitment.objects.filter(workflow=workflow, status="active").exists()


def test_a_failed_workflow_compensates_the_deployment_it_made(git_repo, deploy_target, requester, approver):
    """The deploy succeeded, verification finds another candidate on the target, the workflow
    fails. Failing compensates every active commitment: the deployment does not stay live with an
    active commitment and no way to undo it."""
    workflow = approved(git_repo, requester, approver)
    activity = run_until_scheduled(workflow.pk, "deploy")
    assert services.activity_run_if_runnable(activity_id=activity.pk) == RunOutcome.RECORDED
    deployment_id = activity_result(activity)["deployment_id"]
    # Someone else changes what the target holds under our key.
    deploy_target.store._state["deployments"][deployment_id]["body"]["candidate_hash"] = "not-ours"

    workflow = drive(workflow.pk)

    assert workflow.status == "failed"
    assert "candidate" in workflow.reason
    assert Commitment.objects.get(workflow=workflow).status == "compensated"
    assert effects(deploy_target, activity) == {"created": 1, "deleted": 1}
    assert live_deployments(deploy_target) == 0
    kinds = list(Event.objects.filter(workflow=workflow).values_list("kind", flat=True))
    assert kinds.index("workflow.failed") < kinds.index("commitment.compensated")


def test_a_failed_compensation_of_a_failed_workflow_is_retried_by_resume(
    git_repo, deploy_target, requester, approver, settings
):
    """The undo of a failed workflow's deployment runs out of attempts (the target is down): it
    says so in an event, the commitment stays active, and `resume` tries again until it holds."""
    workflow = approved(git_repo, requester, approver)
    activity = run_until_scheduled(workflow.pk, "deploy")
    assert services.activity_run_if_runnable(activity_id=activity.pk) == RunOutcome.RECORDED
    deploy_target.store._state["deployments"][activity_result(activity)["deployment_id"]]["body"][
        "candidate_hash"] = "not-ours"
    services.workflow_advance_if_runnable(workflow_id=workflow.pk)
    verify = Activity.objects.get(workflow=workflow, name="verify_deployment")
    assert services.activity_run_if_runnable(activity_id=verify.pk) == RunOutcome.RECORDED
    [undo] = compensations(Workflow.objects.get(pk=workflow.pk))
    Activity.objects.filter(pk=undo.pk).update(max_attempts=1)
    real_url, settings.AGENTOPS_DEPLOY_TARGET_URL = settings.AGENTOPS_DEPLOY_TARGET_URL, "http://127.0.0.1:9"

    assert services.activity_run_if_runnable(activity_id=undo.pk) == RunOutcome.FAILED

    workflow.refresh_from_db()
    assert workflow.status == "failed"
    assert Event.objects.filter(workflow=workflow, kind="compensation.failed").count() == 1
    assert Commitment.objects.get(activity=activity).status == "active"
    settings.AGENTOPS_DEPLOY_TARGET_URL = real_url
    assert services.workflow_resume(workflow_id=workflow.pk).outcome == services.Outcome.APPLIED
    drive(workflow.pk)
    assert Commitment.objects.get(activity=activity).status == "compensated"
    assert live_deployments(deploy_target) == 0


def activity_result(activity: Activity) -> dict[str, Any]:
    activity.refresh_from_db()
    assert activity.result is not None
    return activity.result


def at_first_task(policy: str = "record") -> tuple[Workflow, Activity]:
    workflow = services.workflow_launch(kind="autonomous", goal="Prepare notes",
                                        options=services.LaunchOptions(stagnation_policy=policy))
    plan = Activity.objects.get(workflow=workflow, name="plan_tasks")
    assert services.activity_run_if_runnable(activity_id=plan.pk) == RunOutcome.RECORDED
    return Workflow.objects.get(pk=workflow.pk), Activity.objects.get(workflow=workflow, name="execute_task")


def test_a_replan_stops_the_running_task_at_its_next_fence(workspaces):
    """Stagnation replans while a task runs. Leaving the node voids the task, so it does not keep
    calling the model and running tools beside the new round: its next model call is refused before
    any reservation or charge, and its heartbeat and checkpoint fail."""
    workflow, task = at_first_task(policy="replan")
    claim = services.activity_claim_if_runnable(activity_id=task.pk, worker="w1", task_id="t1")

    assert services.stagnation_flag_if_due(workflow_id=workflow.pk, reason="no progress") == 1

    workflow.refresh_from_db()
    task.refresh_from_db()
    assert workflow.current_node == "ADAPTATION"
    assert (task.status, task.error) == ("cancelled", "node EXECUTION (visit 2) was left")
    assert ActivityAttempt.objects.get(activity=task, number=1).status == "cancelled"
    charged_before = UsageEntry.objects.filter(workflow=workflow).count()
    with pytest.raises(LeaseLost, match="model call 0 was not made"):
        run_claimed(execute_task, claim)
    assert UsageEntry.objects.filter(workflow=workflow).count() == charged_before
    assert not (workspaces / f"wf-{workflow.pk}").exists() or not any((workspaces / f"wf-{workflow.pk}").rglob("*.md"))
    assert services.activity_checkpoint_if_current(claim=claim, state={"turn": 1}) is False
    assert services.activity_heartbeat_if_current(claim=claim) is False


class VoidedWhenAnswered(DatabaseLease):
    """The database lease of an attempt whose work is voided (a new goal) the moment the model's
    answer comes back, before the call's model.called note: the fence of the answer's first tool."""

    def note(self, claim: Claim, kind: str, data: dict[str, Any], also: RowWrite | None = None) -> bool:
        if kind == "model.called":
            services.workflow_supersede(workflow_id=claim.workflow_id, goal="Something else")
        return super().note(claim, kind, data, also=also)


def test_a_superseded_attempt_runs_no_tool(workspaces):
    """The model asked for write_file, then the attempt lost its lease. The call's note is the tool's
    fence, taken before the file is written: it raises LeaseLost, nothing is written, and the request
    the provider answered is charged all the same."""
    workflow, task = at_first_task()
    claim = services.activity_claim_if_runnable(activity_id=task.pk, worker="w1", task_id="t1")
    ctx = ActivityContext(claim=claim, lease=VoidedWhenAnswered())

    with pytest.raises(LeaseLost, match="no longer wanted"):
        execute_task.execute(ctx, claim.input)

    assert not list(Path(workspaces).rglob("*.md"))
    assert not Event.objects.filter(workflow=workflow, kind__in=("tool.called", "model.called"),
                                    data__operation_id=claim.operation_id).exists()
    entry = UsageEntry.objects.get(operation_id=claim.operation_id)
    assert entry.status == "charged" and entry.cost_usd is not None, "billed by the provider: charged"


def test_tool_output_with_nul_characters_is_stored_as_text(tmp_path):
    """A file with NUL bytes reads as escaped text (``\\x00``): a raw NUL would make the note and the
    checkpoint that store the output fail for good."""
    (tmp_path / "blob.bin").write_bytes(b"head\x00tail")

    ok, output = run_tool(tmp_path, "read_file", {"path": "blob.bin"})

    assert (ok, output) == (True, "head\\x00tail")
