"""The harness kind's `todo` demo on real workers and beat: scaffold, approval, thirteen sessions, VERIFY_ALL."""
from __future__ import annotations

import time

import pytest
from django.contrib.auth.models import Group, User

from tests.process.harness import Cluster, wait_until_status
from workflows import services
from workflows.models import Event, Wait, Workflow

pytestmark = [pytest.mark.process, pytest.mark.django_db(transaction=True), pytest.mark.timeout(600)]


def test_the_todo_demo_completes_on_real_workers(cluster: Cluster, figures):
    """The default modules list carries the kind; workers run sessions and checks, a person approves."""
    cluster.start(workers=("wa", "wb"), beats=("beat",))
    approver = User.objects.create_user("hana", password="hana-password")
    approver.groups.add(Group.objects.get_or_create(name="harness-approvers")[0])
    started = time.monotonic()
    pk = services.workflow_launch(kind="harness", goal="Build the todo CLI of the demo", params={}).pk
    wait_until_status(cluster, [pk], "waiting", node="WAIT_FOR_APPROVAL", timeout=120)
    wait = Wait.objects.get(workflow_id=pk, kind=Wait.Kind.APPROVAL, status=Wait.Status.OPEN)
    services.wait_approve(wait_id=wait.pk, user=approver, candidate_hash=wait.candidate_hash)
    wait_until_status(cluster, [pk], "completed", timeout=400)

    workflow = Workflow.objects.get(pk=pk)
    checks = Event.objects.filter(workflow_id=pk, kind="harness.check_ran")
    figures("harness todo demo on real workers", wall_s=round(time.monotonic() - started, 1),
            sessions=workflow.state["sessions"], checks_run=checks.count(),
            tamper_reverted=Event.objects.filter(workflow_id=pk, kind="harness.tamper_reverted").count(),
            regressions=checks.filter(data__purpose="regression", data__passed=False).count())
    assert workflow.result["features_passing"] == 10
    assert all(f["status"] == "passing" and f["evidence"]["where"] == "clone" for f in workflow.state["features"])
    assert Event.objects.filter(workflow_id=pk, kind="harness.tamper_reverted").count() == 1
