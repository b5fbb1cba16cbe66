"""`manage.py agent steer` and `agent fork`: JSON shapes, readable output, exit codes 2 and 3."""
from __future__ import annotations

import pytest
from django.core.management import CommandError

from tests.conftest import drive, open_approval
from tests.workflows.test_agent_command import agent, agent_json, launch
from workflows import services
from workflows.models import Event, SteerMessage, Workflow

pytestmark = pytest.mark.django_db


def test_steer_records_who_sent_it_and_show_lists_it(git_repo, deploy_target, requester):
    """Sent to a release waiting for approval (its model call is behind it): pending in show, with who sent it."""
    workflow_id = launch(git_repo, "--user", "rita")
    drive(workflow_id)
    sent = agent_json("steer", str(workflow_id), "Mention the migration in the summary.", "--user", "rita",
                      "--dedupe-key", "mig-1")
    assert sent == {"id": workflow_id, "outcome": "applied", "status": "waiting", "seq": 1, "message": (
        f"Steer message #1 recorded for workflow {workflow_id}; its next model call receives it as a user turn "
        "(`agent show` says when it was delivered).")}
    assert agent_json("steer", str(workflow_id), "Mention the migration in the summary.", "--dedupe-key",
                      "mig-1")["outcome"] == "already_applied"
    shell = agent_json("steer", str(workflow_id), "And keep it short.")
    assert shell["seq"] == 2
    assert SteerMessage.objects.get(seq=2).sender.startswith("shell:")
    detail = agent_json("show", str(workflow_id))
    assert [(m["seq"], m["sender"], m["status"]) for m in detail["steering"]] == [
        (1, "rita", "pending"), (2, SteerMessage.objects.get(seq=2).sender, "pending")]
    text = agent("show", str(workflow_id))
    assert "Steer messages" in text and "Mention the migration" in text


def test_steer_refusals_exit_with_their_codes(git_repo, deploy_target, requester, approver):
    workflow_id = launch(git_repo, "--user", "rita")
    with pytest.raises(CommandError, match="The steer message must be non-empty text") as bad:
        agent("steer", str(workflow_id), "  ")
    assert bad.value.returncode == 2
    with pytest.raises(CommandError, match="does not exist") as missing:
        agent("steer", "999999", "hello")
    assert missing.value.returncode == 2
    drive(workflow_id)
    wait = open_approval(workflow_id)
    services.wait_approve(wait_id=wait.pk, user=approver, candidate_hash=wait.candidate_hash)
    drive(workflow_id)
    with pytest.raises(CommandError, match="is completed; it makes no more model calls") as refused:
        agent("steer", str(workflow_id), "too late")
    assert refused.value.returncode == 3
    assert not SteerMessage.objects.exists()


def test_fork_prints_the_new_workflow_and_show_names_the_relation(git_repo, deploy_target, requester, approver):
    workflow_id = launch(git_repo, "--user", "rita")
    drive(workflow_id)
    forked = agent_json("fork", str(workflow_id), "--from-visit", "3", "--user", "alice")
    fork = Workflow.objects.get(pk=forked["id"])
    # Advanced at once, as a launch is: REQUEST_APPROVAL (visit 4) schedules nothing and opens the wait.
    assert forked == {"id": fork.pk, "kind": "release", "status": "waiting", "current_node": "WAIT_FOR_APPROVAL",
                      "node_visit": 5, "forked_from": workflow_id, "forked_from_visit": 3}
    assert fork.launched_by == approver
    assert Event.objects.get(workflow_id=workflow_id, kind="workflow.forked").data["by"] == "alice"
    assert agent_json("show", str(fork.pk))["forked_from"] == workflow_id
    assert f"Forks: workflow {fork.pk} (from visit 3" in agent("show", str(workflow_id))
    assert f"Forked from workflow {workflow_id}: reused its visits 1–3" in agent("show", str(fork.pk))
    readable = agent("fork", str(workflow_id), "--from-visit", "1")
    assert f"Forked workflow {workflow_id} at visit 1" in readable


def test_fork_refuses_a_visit_out_of_range(git_repo, deploy_target, requester):
    workflow_id = launch(git_repo, "--user", "rita")
    drive(workflow_id)
    for visit, code in (("0", 2), ("-3", 2), ("5", 3)):  # bad input; a visit this workflow has not finished
        with pytest.raises(CommandError, match="must be (at least 1|between 1 and 4)") as bad:
            agent("fork", str(workflow_id), "--from-visit", visit)
        assert bad.value.returncode == code
    assert Workflow.objects.count() == 1
