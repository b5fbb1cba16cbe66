"""An operator pause (`agent pause`): nothing new starts, running work finishes, resume goes on where it stopped."""
from __future__ import annotations

import getpass
import json
from io import StringIO
from typing import Any

import pytest
from django.core.management import CommandError, call_command

from agentops.agents.release.activities import deploy
from tests.conftest import drive, open_approval, release_params, run_at_once, run_claimed
from tests.workflows.test_cancel_and_commitments import approved, run_until_scheduled
from workflows import services
from workflows.errors import TransitionRefused
from workflows.models import Activity, Event, Workflow
from workflows.services import Outcome, RunOutcome

pytestmark = [pytest.mark.django_db, pytest.mark.usefixtures("rung")]


def waiting(repo: Any, requester: Any) -> Workflow:
    workflow = drive(services.workflow_launch(kind="release", goal="Ship the release notes",
                                              params=release_params(repo), user=requester).pk)
    assert (workflow.status, workflow.current_node) == ("waiting", "WAIT_FOR_APPROVAL")
    return workflow


def events(workflow_id: int, kind: str) -> list[dict[str, Any]]:
    return list(Event.objects.filter(workflow_id=workflow_id, kind=kind).order_by("seq").values_list("data", flat=True))


def test_a_running_activity_finishes_while_paused_and_nothing_after_it_starts_until_resume(
    git_repo, deploy_target, requester, approver,
):
    """The deploy claimed before the pause runs to its end and its result is recorded; the advance that
    would schedule the verification does not run; resume replays the recorded deploy (one effect) and
    the workflow completes."""
    workflow = approved(git_repo, requester, approver)
    activity = run_until_scheduled(workflow.pk, "deploy")
    claim = services.activity_claim_if_runnable(activity_id=activity.pk, worker="w1", task_id="t1")
    assert claim is not None

    paused = services.workflow_pause(workflow_id=workflow.pk, reason="look at the target first", user=approver)
    assert paused.outcome == Outcome.APPLIED and paused.status == "paused"
    assert "1 running activity finishes and its result is recorded" in paused.message
    assert services.activity_heartbeat_if_current(claim=claim, detail="still going"), "a pause does not fence"
    result = run_claimed(deploy, claim)
    assert services.activity_result_record_if_current(claim=claim, result=result) == RunOutcome.RECORDED

    workflow = drive(workflow.pk)
    assert (workflow.status, workflow.pause_cause, workflow.reason) == (
        "paused", "operator", "look at the target first")
    assert Activity.objects.get(pk=activity.pk).status == "succeeded"
    assert not Activity.objects.filter(workflow=workflow, name="verify_deployment").exists(), "nothing new starts"
    [event] = events(workflow.pk, "workflow.paused")
    assert (event["cause"], event["by"], event["was"], event["running"]) == (
        "operator", "alice", "running", [activity.operation_id])

    resumed = services.workflow_resume(workflow_id=workflow.pk, user=approver)
    assert resumed.outcome == Outcome.APPLIED and "goes on from there" in resumed.message
    workflow = drive(workflow.pk)
    assert workflow.status == "completed", workflow.reason
    assert deploy_target.store.stats()["effects"] == {activity.sent_key: {"created": 1, "deleted": 0}}
    assert Activity.objects.filter(workflow=workflow, name="deploy").count() == 1
    assert [e["by"] for e in events(workflow.pk, "workflow.resumed")] == ["alice"]


def test_a_scheduled_activity_is_not_claimed_while_paused_and_runs_after_resume(
    git_repo, deploy_target, requester, approver, rung,
):
    """A doorbell for work scheduled before the pause is ignored (recorded); resume rings it again."""
    workflow = approved(git_repo, requester, approver)
    activity = run_until_scheduled(workflow.pk, "deploy")
    services.workflow_pause(workflow_id=workflow.pk)
    assert services.activity_run_if_runnable(activity_id=activity.pk) == RunOutcome.SKIPPED
    assert events(workflow.pk, "activity.doorbell_ignored")[-1]["status"] == "workflow paused"
    assert deploy_target.store.stats()["effects"] == {}
    rung.clear()
    services.workflow_resume(workflow_id=workflow.pk)
    assert ("activity", activity.pk) in rung
    assert drive(workflow.pk).status == "completed"
    assert deploy_target.store.stats()["effects"] == {activity.sent_key: {"created": 1, "deleted": 0}}


def test_a_decision_while_paused_is_recorded_and_taken_up_on_resume(git_repo, deploy_target, requester, approver):
    """Paused while waiting: the approval is recorded on its wait, the workflow stays paused (a
    ``workflow.wake_held`` event says why) and deploys nothing; resume goes on with the decision."""
    workflow = waiting(git_repo, requester)
    services.workflow_pause(workflow_id=workflow.pk, user=approver)
    wait = open_approval(workflow.pk)
    decided = services.wait_approve(wait_id=wait.pk, user=approver, candidate_hash=wait.candidate_hash)
    assert decided.outcome == "applied"
    workflow = drive(workflow.pk)
    assert workflow.status == "paused"
    assert not Activity.objects.filter(workflow=workflow, name="deploy").exists()
    assert events(workflow.pk, "workflow.wake_held")[0]["cause"].startswith(f"wait {wait.pk} approved")
    services.workflow_resume(workflow_id=workflow.pk, user=approver)
    assert drive(workflow.pk).status == "completed"


def test_a_workflow_paused_while_waiting_waits_again_on_resume(git_repo, deploy_target, requester, approver):
    """Resume puts it back to waiting on the same open wait, which can then be decided as before."""
    workflow = waiting(git_repo, requester)
    services.workflow_pause(workflow_id=workflow.pk)
    wait = open_approval(workflow.pk)
    resumed = services.workflow_resume(workflow_id=workflow.pk)
    assert (resumed.status, resumed.message) == (
        "waiting", f"Workflow {workflow.pk} resumed; it waits on approval wait {wait.pk} again, as before the pause.")
    assert drive(workflow.pk).status == "waiting"
    services.wait_approve(wait_id=wait.pk, user=approver, candidate_hash=wait.candidate_hash)
    assert drive(workflow.pk).status == "completed"


def test_pausing_twice_changes_nothing_and_resuming_twice_is_refused_or_a_doorbell(git_repo, requester):
    """A second pause answers ALREADY_APPLIED (one paused event); a second resume of a waiting workflow
    is refused, naming its wait; of a running one it only rings the doorbell (ALREADY_APPLIED)."""
    workflow = waiting(git_repo, requester)
    assert services.workflow_pause(workflow_id=workflow.pk).outcome == Outcome.APPLIED
    again = services.workflow_pause(workflow_id=workflow.pk, reason="other")
    assert again.outcome == Outcome.ALREADY_APPLIED and "already paused by an operator" in again.message
    assert len(events(workflow.pk, "workflow.paused")) == 1
    assert Workflow.objects.get(pk=workflow.pk).reason == "paused by unknown"
    services.workflow_resume(workflow_id=workflow.pk)
    with pytest.raises(TransitionRefused, match="is waiting on approval wait"):
        services.workflow_resume(workflow_id=workflow.pk)


def test_a_finished_or_otherwise_paused_workflow_cannot_be_paused(git_repo, requester):
    """Refused, changing nothing: a cancelled workflow, and one paused for its budget (whose cause says
    what resumes it)."""
    workflow = waiting(git_repo, requester)
    services.workflow_cancel(workflow_id=workflow.pk)
    with pytest.raises(TransitionRefused, match="is cancelled; only a running or waiting workflow can be paused"):
        services.workflow_pause(workflow_id=workflow.pk)
    other = waiting(git_repo, requester)
    Workflow.objects.filter(pk=other.pk).update(status="paused", pause_cause="budget", reason="Budget exhausted")
    with pytest.raises(TransitionRefused, match=r"already paused \(Budget exhausted"):
        services.workflow_pause(workflow_id=other.pk)
    assert Workflow.objects.get(pk=other.pk).pause_cause == "budget"
    assert not events(other.pk, "workflow.paused")


def test_a_supersede_while_paused_keeps_it_paused_until_resume(git_repo, deploy_target, requester, approver):
    """A new goal while paused is recorded (its old wait withdrawn); the workflow stays paused and
    revalidates for the new goal only when resumed."""
    workflow = waiting(git_repo, requester)
    services.workflow_pause(workflow_id=workflow.pk)
    services.workflow_supersede(workflow_id=workflow.pk, goal="Ship shorter notes")
    assert drive(workflow.pk).status == "paused"
    services.workflow_resume(workflow_id=workflow.pk)
    workflow = drive(workflow.pk)
    assert (workflow.status, workflow.intent_version) == ("waiting", 2)
    wait = open_approval(workflow.pk)
    assert wait.intent_version == 2


def test_the_command_pauses_and_resumes_recording_the_shell_login_and_refuses_with_exit_3(git_repo, requester):
    workflow = waiting(git_repo, requester)
    out = StringIO()
    call_command("agent", "pause", str(workflow.pk), "--reason", "hold on", "--json", stdout=out)
    assert (json.loads(out.getvalue())["outcome"], json.loads(out.getvalue())["status"]) == ("applied", "paused")
    assert events(workflow.pk, "workflow.paused")[0]["by"] == f"shell:{getpass.getuser()}"
    again = StringIO()
    call_command("agent", "pause", str(workflow.pk), stdout=again)
    assert "already paused by an operator (hold on); nothing changed" in again.getvalue()
    shown = StringIO()
    call_command("agent", "show", str(workflow.pk), stdout=shown)
    assert "Paused: operator" in shown.getvalue() and "Reason: hold on" in shown.getvalue()
    call_command("agent", "resume", str(workflow.pk), stdout=StringIO())
    assert events(workflow.pk, "workflow.resumed")[0]["by"] == f"shell:{getpass.getuser()}"
    assert Workflow.objects.get(pk=workflow.pk).status == "waiting"
    services.workflow_cancel(workflow_id=workflow.pk)
    with pytest.raises(CommandError, match="is cancelled; only a running or waiting workflow") as refused:
        call_command("agent", "pause", str(workflow.pk), stdout=StringIO())
    assert refused.value.returncode == 3


@pytest.mark.django_db(transaction=True)
def test_two_pauses_at_once_pause_once(git_repo, requester):
    """The row lock orders them: one APPLIED, one ALREADY_APPLIED, one paused event."""
    workflow = waiting(git_repo, requester)
    results = run_at_once(lambda: services.workflow_pause(workflow_id=workflow.pk).outcome)
    assert sorted(results) == [Outcome.ALREADY_APPLIED, Outcome.APPLIED]
    assert len(events(workflow.pk, "workflow.paused")) == 1
