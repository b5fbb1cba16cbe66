"""The autonomous agent: plan, one task at a time with tools, verify, adapt, complete — offline."""
from __future__ import annotations

import json
from decimal import Decimal
from pathlib import Path
from typing import Any

import pytest

from agentops.agents.autonomous.activities import run_tool, validate_tasks
from agentops.agents.autonomous.presentation import earlier_tasks
from agentops.kind import InvalidInput
from agentops.kind.presentation import Activity, ProgressSample, UsageEntry
from agentops.kind.testing import drive, events, launch

pytestmark = pytest.mark.django_db


@pytest.fixture(autouse=True)
def workspaces(settings, tmp_path):
    settings.AGENTOPS_WORKSPACE_DIR = tmp_path / "workspaces"
    return settings.AGENTOPS_WORKSPACE_DIR


def test_runs_to_completion_offline_with_tools_spend_and_progress(workspaces):
    workflow = drive(launch("autonomous", goal="Prepare onboarding notes"))

    assert workflow.status == "completed", workflow.reason
    assert workflow.result["tasks_done"] == 3 and workflow.result["tasks_skipped"] == 0
    assert [t["status"] for t in workflow.state["tasks"]] == ["done", "done", "done"]
    assert [e.data["tool"] for e in events(workflow, "tool.called")] == ["write_file", "list_files"] * 3
    notes = sorted(p.name for p in (workspaces / f"wf-{workflow.pk}" / "notes").iterdir())
    assert notes == ["lay-out-the-steps.md", "record-the-outcome.md", "write-a-brief.md"]
    assert ProgressSample.objects.get(workflow=workflow).percent == 100
    charged = UsageEntry.objects.filter(workflow=workflow, status="charged")
    assert charged.count() == 11 and sum(entry.amount_usd for entry in charged) > Decimal(0)


def test_a_task_that_keeps_failing_is_skipped_then_replanned(settings, tmp_path):
    """The first task fails on all three attempts: it is skipped with the reason, verification finds
    the goal unmet, adaptation plans a retry, and the second round completes it."""
    workflow = launch("autonomous", goal="Prepare onboarding notes")
    settings.AGENTOPS_FAULT_LOG = str(tmp_path / "faults.log")
    settings.AGENTOPS_TESTING_FAULTS = json.dumps([{
        "point": "activity.before_external_call", "action": "raise",
        "when": {"operation_id": f"wf-{workflow.pk}/EXECUTION.2/i1/0"},
    }])
    workflow = drive(workflow, retry_now=True)

    assert workflow.status == "completed", workflow.reason
    first = Activity.objects.get(operation_id=f"wf-{workflow.pk}/EXECUTION.2/i1/0")
    assert (first.status, first.attempt) == ("failed", 3)
    assert len((tmp_path / "faults.log").read_text().splitlines()) == 3
    # The first round left the hot state with the replan: it is read from its checkpoint.
    assert workflow.state["history"] == []
    assert (workflow.state["done_before"], workflow.state["skipped_before"]) == (2, 1)
    history = {t["title"]: t for t in earlier_tasks(workflow)}
    assert history["Write a brief"]["status"] == "skipped"
    assert "fault injected" in history["Write a brief"]["reason"]
    assert [t["title"] for t in workflow.state["tasks"]] == ["Retry Write a brief"]
    assert workflow.result == {"rounds": 2, "tasks_done": 3, "tasks_skipped": 1,
                               "summary": "1 of 1 tasks done; the goal is met."}
    assert [s.percent for s in ProgressSample.objects.filter(workflow=workflow).order_by("created_at")] == [67, 100]


def test_tools_stay_inside_the_workspace(tmp_path):
    root = tmp_path.resolve()
    (tmp_path / "outside").symlink_to("/etc")
    for args in ({"path": "../x"}, {"path": "/etc/passwd"}, {"path": "outside/passwd"}):
        ok, output = run_tool(root, "read_file", args)
        assert not ok and "outside the workspace" in output
    ok, output = run_tool(root, "write_file", {"path": "../escape.txt", "content": "x"})
    assert not ok and not (tmp_path.parent / "escape.txt").exists()
    assert run_tool(root, "write_file", {"path": "a/b.txt", "content": "x"}) == (True, "wrote 1 characters to a/b.txt")
    assert (root / "a" / "b.txt").read_text() == "x"
    assert run_tool(root, "delete_everything", {}) == (False, "unknown tool 'delete_everything'; tools are "
                                                              "list_files, read_file, write_file, run_command")
    ok, output = run_tool(root, "run_command", {"command": "python3 -c 'print(6*7)'"})
    assert ok and "42" in output


@pytest.mark.parametrize(
    ("plan", "message"),
    [
        ({"tasks": []}, "between 1 and 12 tasks"),
        ({"tasks": [{"title": ""}]}, "has no title"),
        ({"tasks": [{"title": "x", "instructions": 5}]}, "too long or malformed"),
        ({"state": "completed"}, "between 1 and 12 tasks"),
    ],
)
def test_malformed_plans_from_the_model_are_refused(plan, message):
    with pytest.raises(InvalidInput, match=message):
        validate_tasks(plan)


def test_bad_parameters_are_refused():
    with pytest.raises(InvalidInput, match=r"max_rounds=-1 must be between 0 and 1000000: adaptation rounds at most; "
                                           r"0: no cap"):
        launch("autonomous", goal="g", params={"max_rounds": "-1"})
    with pytest.raises(InvalidInput, match="max_rounds=1000001 must be between"):
        launch("autonomous", goal="g", params={"max_rounds": "1000001"})
    with pytest.raises(InvalidInput, match="Unknown parameter"):
        launch("autonomous", goal="g", params={"repo": "/tmp"})


def test_workspace_path_is_per_workflow(workspaces):
    a = drive(launch("autonomous", goal="one"))
    b = drive(launch("autonomous", goal="two"))
    assert Path(workspaces / f"wf-{a.pk}").is_dir() and Path(workspaces / f"wf-{b.pk}").is_dir()


def fail_first_task_at_turn(settings: Any, tmp_path: Path, workflow_id: int, turn: int) -> None:
    settings.AGENTOPS_FAULT_LOG = str(tmp_path / "faults.log")
    settings.AGENTOPS_TESTING_FAULTS = json.dumps([{
        "point": "activity.before_external_call", "action": "raise",
        "when": {"operation_id": f"wf-{workflow_id}/EXECUTION.2/i1/0", "attempt": 1, "turn": turn},
    }])


def test_a_retried_task_resumes_from_its_checkpoint_without_redoing_tool_calls(settings, tmp_path):
    """Checkpoint after every turn (interval 0): attempt 1 of the first task dies before its third
    model call; attempt 2 carries on from turn 2 with the conversation so far."""
    settings.AGENTOPS_CHECKPOINT_SECONDS = 0
    workflow = launch("autonomous", goal="Prepare onboarding notes")
    fail_first_task_at_turn(settings, tmp_path, workflow.pk, turn=2)

    workflow = drive(workflow, retry_now=True)

    assert workflow.status == "completed", workflow.reason
    assert len((tmp_path / "faults.log").read_text().splitlines()) == 1
    first = Activity.objects.get(operation_id=f"wf-{workflow.pk}/EXECUTION.2/i1/0")
    assert (first.status, first.attempt, first.checkpoint) == ("succeeded", 2, None)
    assert [e.data["tool"] for e in events(workflow, "tool.called")] == ["write_file", "list_files"] * 3
    (resumed,) = events(workflow, "task.resumed")
    assert (resumed.data["attempt"], resumed.data["turn"]) == (2, 2)
    saved = [e for e in events(workflow, "activity.checkpointed") if e.data["operation_id"] == first.operation_id]
    assert [e.data["detail"] for e in saved] == ["task 1 turn 1", "task 1 turn 2"]
    assert UsageEntry.objects.filter(workflow=workflow, status="charged").count() == 11


def test_between_checkpoints_a_retried_task_starts_over(settings, tmp_path):
    """With the interval not yet reached nothing was saved, so attempt 2 redoes the task's tool calls."""
    settings.AGENTOPS_CHECKPOINT_SECONDS = 3600
    workflow = launch("autonomous", goal="Prepare onboarding notes")
    fail_first_task_at_turn(settings, tmp_path, workflow.pk, turn=2)

    workflow = drive(workflow, retry_now=True)

    assert workflow.status == "completed", workflow.reason
    assert not events(workflow, "task.resumed") and not events(workflow, "activity.checkpointed")
    assert [e.data["tool"] for e in events(workflow, "tool.called")] == ["write_file", "list_files"] * 4
