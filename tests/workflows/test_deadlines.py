"""A workflow's time limit is durable: past it, beat cancels the workflow and compensates."""
from __future__ import annotations

from datetime import timedelta

import pytest

from tests.conftest import drive, release_params
from workflows import services
from workflows.errors import InvalidInput
from workflows.models import Event, Workflow

pytestmark = pytest.mark.django_db


def test_past_its_deadline_a_waiting_workflow_is_cancelled_once(git_repo, deploy_target, time_machine):
    workflow = services.workflow_launch(kind="release", goal="g", params=release_params(git_repo),
                                        options=services.LaunchOptions(max_hours=2))
    assert workflow.deadline == workflow.created_at + timedelta(hours=2)
    drive(workflow.pk)
    assert services.deadlines_enforce() == 0

    time_machine.move_to(workflow.deadline + timedelta(seconds=1))
    assert services.deadlines_enforce() == 1
    assert services.deadlines_enforce() == 0

    workflow = Workflow.objects.get(pk=workflow.pk)
    assert workflow.status == "cancelled"
    assert workflow.reason.startswith("time limit reached at")
    assert Event.objects.filter(workflow=workflow, kind="workflow.cancelling").count() == 1
    assert workflow.waits.get().status == "cancelled"


def test_a_workflow_without_a_deadline_is_never_cancelled_by_time(git_repo, deploy_target, time_machine):
    workflow = drive(services.workflow_launch(kind="release", goal="g", params=release_params(git_repo)).pk)
    time_machine.move_to(workflow.created_at + timedelta(days=400))
    assert services.deadlines_enforce() == 0
    assert Workflow.objects.get(pk=workflow.pk).status == "waiting"


@pytest.mark.parametrize("hours", [0, -1, 24 * 367])
def test_a_time_limit_out_of_range_is_refused(git_repo, hours):
    with pytest.raises(InvalidInput, match="time limit must be between 0 and 8784 hours"):
        services.workflow_launch(kind="release", goal="g", params=release_params(git_repo),
                                 options=services.LaunchOptions(max_hours=hours))
    assert not Workflow.objects.exists()
