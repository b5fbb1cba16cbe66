"""Stagnation: beat flags the stuck workflow, never the one waiting for a person or the busy one."""
from __future__ import annotations

from datetime import timedelta

import pytest

from tests.conftest import drive, release_params
from workflows import clock, services
from workflows.models import Activity, Event, ProgressSample, Workflow

pytestmark = pytest.mark.django_db


@pytest.fixture(autouse=True)
def workspaces(settings, tmp_path):
    settings.AGENTOPS_WORKSPACE_DIR = tmp_path / "workspaces"


def at_first_task(policy: str = "record") -> tuple[Workflow, Activity]:
    """An autonomous workflow that planned and has its first task scheduled, not yet run."""
    workflow = services.workflow_launch(kind="autonomous", goal="Prepare notes",
                                        options=services.LaunchOptions(stagnation_policy=policy))
    services.workflow_advance_if_runnable(workflow_id=workflow.pk)
    plan = Activity.objects.get(workflow=workflow, name="plan_tasks")
    services.activity_run_if_runnable(activity_id=plan.pk)
    return Workflow.objects.get(pk=workflow.pk), Activity.objects.get(workflow=workflow, name="execute_task")


def flagged(workflow: Workflow) -> list[Event]:
    return list(Event.objects.filter(workflow=workflow, kind="workflow.stagnating"))


def test_only_the_stuck_workflow_is_flagged(git_repo, deploy_target, time_machine):
    """Three workflows sit for three hours: one lost its doorbell (stuck), one waits for an approval,
    one runs a task that heartbeats. Only the stuck one is flagged, and only once."""
    t0 = clock.now()
    time_machine.move_to(t0, tick=False)
    stuck, _ = at_first_task()
    waiting = drive(services.workflow_launch(kind="release", goal="g", params=release_params(git_repo)).pk)
    busy, task = at_first_task()
    claim = services.activity_claim_if_runnable(activity_id=task.pk, worker="w1", task_id="t")

    time_machine.move_to(t0 + timedelta(hours=3), tick=False)
    assert services.activity_heartbeat_if_current(claim=claim, detail="still working") is True
    assert services.stagnation_check() == 1
    assert services.stagnation_check() == 0

    assert [e.data["reason"] for e in flagged(stuck)] == ["no event for 3.0 h and nothing is pending"]
    assert flagged(waiting) == [] and flagged(busy) == []
    assert Workflow.objects.get(pk=stuck.pk).status == "running"


def test_progress_under_five_points_in_the_window_replans(time_machine):
    """40% six hours ago and 42% now: the replan policy sends the workflow to ADAPTATION."""
    t0 = clock.now()
    time_machine.move_to(t0, tick=False)
    workflow, task = at_first_task(policy="replan")
    claim = services.activity_claim_if_runnable(activity_id=task.pk, worker="w1", task_id="t")
    for hours, percent in ((0, 40), (6, 42)):
        ProgressSample.objects.create(workflow=workflow, operation_id=f"sample-{hours}", percent=percent,
                                      confidence=0.5, created_at=t0 + timedelta(hours=hours))
    time_machine.move_to(t0 + timedelta(hours=6, minutes=30), tick=False)
    services.activity_heartbeat_if_current(claim=claim)

    assert services.stagnation_check() == 1

    workflow.refresh_from_db()
    assert workflow.current_node == "ADAPTATION"
    [event] = flagged(workflow)
    assert event.data == {"reason": "progress moved 2 points (40% → 42%) in 6 h, under 5", "policy": "replan"}


def test_pause_policy_pauses_for_a_person(time_machine):
    t0 = clock.now()
    time_machine.move_to(t0, tick=False)
    workflow, _ = at_first_task(policy="pause")
    time_machine.move_to(t0 + timedelta(hours=3), tick=False)
    assert services.stagnation_check() == 1
    workflow.refresh_from_db()
    assert workflow.status == "paused"
    assert workflow.reason.startswith("Stagnating: no event for 3.0 h")
    assert f"manage.py agent resume {workflow.pk}" in workflow.reason


def test_steady_progress_is_not_stagnation(time_machine):
    t0 = clock.now()
    time_machine.move_to(t0, tick=False)
    workflow, task = at_first_task(policy="pause")
    claim = services.activity_claim_if_runnable(activity_id=task.pk, worker="w1", task_id="t")
    for hours, percent in ((0, 40), (6, 60)):
        ProgressSample.objects.create(workflow=workflow, operation_id=f"s{hours}", percent=percent, confidence=0.5,
                                      created_at=t0 + timedelta(hours=hours))
    time_machine.move_to(t0 + timedelta(hours=6, minutes=30), tick=False)
    services.activity_heartbeat_if_current(claim=claim)
    assert services.stagnation_check() == 0


def test_a_workflow_younger_than_its_window_and_the_silence_costs_the_pass_no_statement(
        time_machine, django_assert_num_queries):
    """Launched an hour ago (the silence is 2 h, the window 6 h): none of its samples or events can
    be old enough to find it stuck, so the pass reads only the list of running workflows."""
    t0 = clock.now()
    time_machine.move_to(t0, tick=False)
    young = [at_first_task()[0] for _ in range(3)]
    time_machine.move_to(t0 + timedelta(hours=1), tick=False)
    with django_assert_num_queries(1):
        assert services.stagnation_check() == 0

    time_machine.move_to(t0 + timedelta(hours=3), tick=False)  # past the silence: each is read, and flagged
    assert services.stagnation_check() == 3
    assert all(flagged(workflow) for workflow in young)
