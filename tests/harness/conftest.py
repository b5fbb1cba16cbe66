"""Fixtures for the harness kind: a workspace directory, an approver, and driving a workflow to its approval."""
from __future__ import annotations

from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
from django.contrib.auth.models import Group, User

from tests.conftest import drive
from workflows import clock, services
from workflows.models import Activity, Wait, Workflow


@pytest.fixture(autouse=True)
def harness_workspaces(tmp_path: Path, settings: Any) -> Path:
    settings.AGENTOPS_WORKSPACE_DIR = tmp_path / "workspaces"
    settings.AGENTOPS_MODEL_PROVIDER = "scripted"
    return tmp_path / "workspaces"


@pytest.fixture
def harness_approver(db: None) -> User:
    user = User.objects.create_user("hana", password="hana-password")
    user.groups.add(Group.objects.get_or_create(name="harness-approvers")[0])
    return user


def drive_all(workflow_id: int, *, max_rounds: int = 400) -> Workflow:
    """``drive`` until nothing runs, making retry windows due at once (no clock waits in tests)."""
    for _ in range(max_rounds):
        Activity.objects.filter(workflow_id=workflow_id, status=Activity.Status.SCHEDULED).update(
            next_attempt_at=clock.now() - timedelta(seconds=1))
        workflow = drive(workflow_id, max_rounds=5)
        if not Activity.objects.filter(workflow_id=workflow_id, status=Activity.Status.SCHEDULED).exists():
            return workflow
    return Workflow.objects.get(pk=workflow_id)


def approve_feature_list(workflow_id: int, user: User) -> None:
    wait = Wait.objects.get(workflow_id=workflow_id, kind=Wait.Kind.APPROVAL, status=Wait.Status.OPEN)
    services.wait_approve(wait_id=wait.pk, user=user, candidate_hash=wait.candidate_hash)
