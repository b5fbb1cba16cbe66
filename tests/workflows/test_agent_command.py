"""`manage.py agent`: JSON shapes, readable output, exit codes 2 (bad input) and 3 (refused)."""
from __future__ import annotations

import json
import subprocess
import sys
from io import StringIO
from pathlib import Path

import pytest
from django.core.management import CommandError, call_command

from tests.conftest import drive, open_approval
from workflows.models import Activity, Event, Intent, Workflow
from workflows.selectors import ACTIVITIES_SHOWN, ERROR_CHARS_SHOWN

pytestmark = pytest.mark.django_db
REPO_ROOT = Path(__file__).resolve().parents[2]


def agent(*args: str) -> str:
    out = StringIO()
    call_command("agent", *args, stdout=out)
    return out.getvalue()


def agent_json(*args: str):
    return json.loads(agent(*args, "--json"))


def launch(repo: Path, *extra: str) -> int:
    data = agent_json("launch", "release", "--goal", "Ship it", "--param", f"repo={repo}",
                      "--param", "test_command=python3 check.py", *extra)
    return data["id"]


def test_launch_prints_the_id_and_show_has_the_documented_shape(git_repo, deploy_target, requester):
    workflow_id = launch(git_repo, "--user", "rita")
    drive(workflow_id)
    detail = agent_json("show", str(workflow_id))
    assert {"id", "kind", "status", "current_node", "intent_version", "waits", "activities", "commitments",
            "events"} <= set(detail)
    assert (detail["id"], detail["kind"], detail["status"]) == (workflow_id, "release", "waiting")
    wait = detail["waits"][0]
    assert {"id", "kind", "status", "candidate_hash", "required_role", "expires_at"} <= set(wait)
    assert (wait["kind"], wait["status"], wait["required_role"]) == ("approval", "open", "release-approvers")
    assert {"operation_id", "name", "status", "attempts"} <= set(detail["activities"][0])
    assert [e["seq"] for e in detail["events"]] == sorted(e["seq"] for e in detail["events"])


def test_show_lists_the_unfinished_and_the_newest_finished_activities_and_counts_the_rest(git_repo, deploy_target):
    """A long run's detail stays small: every activity that has not finished, the newest
    ACTIVITIES_SHOWN finished ones (oldest first), a count of the others and each error's end."""
    workflow = Workflow.objects.get(pk=launch(git_repo))
    drive(workflow.pk)
    before = workflow.activities.count()
    template = workflow.activities.order_by("pk").first()
    Activity.objects.bulk_create(
        Activity(workflow=workflow, operation_id=f"{template.operation_id}/old{n}", name=template.name,
                 node=template.node, node_visit=template.node_visit, intent_version=1, input={}, attempt=1,
                 status="failed", error="e" * 5_000 + f"end {n}", next_attempt_at=template.next_attempt_at,
                 created_at=template.created_at)
        for n in range(ACTIVITIES_SHOWN + 30))
    Activity.objects.filter(pk=template.pk).update(status="scheduled")  # the oldest: not finished

    detail = agent_json("show", str(workflow.pk))

    listed = [a["operation_id"] for a in detail["activities"]]
    newest = list(workflow.activities.exclude(status="scheduled").order_by("-pk")
                  .values_list("operation_id", flat=True)[:ACTIVITIES_SHOWN])
    assert listed == [template.operation_id, *reversed(newest)]
    assert detail["activities_left_out"] == before + ACTIVITIES_SHOWN + 30 - len(listed) == before + 29
    errors = [a["error"] for a in detail["activities"] if a["status"] == "failed"]
    assert errors and all(len(e) == ERROR_CHARS_SHOWN and e.startswith("e") and "end " in e for e in errors)
    assert f"{before + 29} older finished activities not listed" in agent("show", str(workflow.pk))


def test_list_json_has_no_nested_lists_and_filters_by_status(git_repo, deploy_target):
    first = launch(git_repo)
    drive(first)
    launch(git_repo)
    rows = agent_json("list")
    assert [r["id"] for r in rows] == [first + 1, first]
    assert not any(isinstance(v, list) for r in rows for v in r.values())
    assert [r["id"] for r in agent_json("list", "--status", "waiting")] == [first]


def test_approve_through_the_command_completes_the_release(git_repo, deploy_target, approver, requester):
    workflow_id = launch(git_repo, "--user", "rita")
    drive(workflow_id)
    wait = open_approval(workflow_id)
    result = agent_json("approve", str(wait.pk), "--user", "alice", "--candidate-hash", wait.candidate_hash)
    assert result["outcome"] == "applied"
    again = agent_json("approve", str(wait.pk), "--user", "alice", "--candidate-hash", wait.candidate_hash)
    assert again["outcome"] == "already_applied"
    assert "already approved by alice" in again["message"]
    assert drive(workflow_id).status == "completed"


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["launch", "release", "--goal", "g", "--param", "repo"], "is not KEY=VALUE"),
        (["launch", "nope", "--goal", "g"], "Unknown workflow kind"),
        (["launch", "release", "--goal", "g", "--param", "repo=/nowhere", "--param", "test_command=x"],
         "not a git repository"),
        (["show", "999999"], "Workflow 999999 does not exist"),
        (["approve", "999999", "--user", "alice", "--candidate-hash", "x"], "Wait 999999 does not exist"),
        (["signal", "1", "go", "--payload", "{not json"], "--payload is not valid JSON"),
        (["launch", "release", "--goal", "g", "--user", "ghost"], "No user named 'ghost'"),
    ],
)
def test_bad_input_exits_2_and_changes_nothing(args, message, approver):
    events = Event.objects.count()
    with pytest.raises(CommandError, match=message) as excinfo:
        agent(*args)
    assert excinfo.value.returncode == 2
    assert (Workflow.objects.count(), Event.objects.count()) == (0, events)


def test_refusals_exit_3_and_change_nothing(git_repo, deploy_target, approver, outsider, requester):
    workflow_id = launch(git_repo, "--user", "rita")
    drive(workflow_id)
    wait = open_approval(workflow_id)
    before = (wait.decided_at, Event.objects.filter(workflow_id=workflow_id).count())
    for args, message in [
        (["approve", str(wait.pk), "--user", "alice", "--candidate-hash", "0" * 64], "bound to candidate"),
        (["approve", str(wait.pk), "--user", "oscar", "--candidate-hash", wait.candidate_hash],
         "needs a member of group"),
        (["approve", str(wait.pk), "--user", "rita", "--candidate-hash", wait.candidate_hash], "launched workflow"),
        (["resume", str(workflow_id)], "is waiting on approval wait"),
    ]:
        with pytest.raises(CommandError, match=message) as excinfo:
            agent(*args)
        assert excinfo.value.returncode == 3
    wait.refresh_from_db()
    assert (wait.decided_at, Event.objects.filter(workflow_id=workflow_id).count()) == before


def test_supersede_cancel_and_readable_show(git_repo, deploy_target, requester):
    workflow_id = launch(git_repo)
    drive(workflow_id)
    assert agent_json("supersede", str(workflow_id), "--goal", "Ship it twice")["intent_version"] == 2
    assert Intent.objects.filter(workflow_id=workflow_id).count() == 2
    assert agent_json("cancel", str(workflow_id), "--reason", "changed our mind")["status"] == "cancelled"
    assert agent_json("cancel", str(workflow_id))["outcome"] == "already_applied"
    text = agent("show", str(workflow_id))
    assert f"Workflow {workflow_id} release — cancelled" in text
    assert "changed our mind" in text


def test_the_real_command_line_exits_with_status_2_on_bad_input():
    """Exit statuses hold for a real process, not only for call_command."""
    done = subprocess.run([sys.executable, "manage.py", "agent", "show", "not-a-number"], cwd=REPO_ROOT,
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 2
    assert "invalid int value" in done.stderr
