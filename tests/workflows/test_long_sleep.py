"""6.9: a long durable sleep whose subject was cancelled meanwhile never acts on it."""
from __future__ import annotations

from collections.abc import Iterator
from datetime import timedelta

import pytest

from agentops.agents.release import activities as release
from tests.conftest import drive
from workflows import clock, services
from workflows.engine import Complete, Decision, Fail, Goto, NodeContext, WorkflowDefinition, node
from workflows.models import Timer, Workflow
from workflows.testing import registered

pytestmark = pytest.mark.django_db

SOAK_SECONDS = 3 * 3600


class SoakThenPromote(WorkflowDefinition):
    """Deploy, sleep three hours, check the deployment still stands, then promote it."""

    kind = "test-soak-then-promote"
    start_node = "DEPLOY"
    revalidate_node = "DEPLOY"

    @node("DEPLOY")
    def deploy(self, ctx: NodeContext) -> Decision:
        deployment = ctx.activity(release.deploy, release.DeployInput(candidate_hash="c" * 64, head="h", title="soak",
                                                                       files={}))
        return Goto("SOAK", {"deployment": deployment})

    @node("SOAK")
    def soak(self, ctx: NodeContext) -> Decision:
        ctx.sleep(SOAK_SECONDS)
        return Goto("PROMOTE")

    @node("PROMOTE")
    def promote(self, ctx: NodeContext) -> Decision:
        check = ctx.activity(release.verify_deployment, release.DeploymentCheckInput(
            deployment=ctx.state["deployment"], candidate_hash="c" * 64))
        if not check["ok"]:
            return Fail(f"obsolete: {check['reason']}; nothing was promoted")
        return Complete({"promoted": ctx.state["deployment"]["deployment_id"]})


@pytest.fixture(autouse=True)
def soak_registered() -> Iterator[None]:
    with registered(SoakThenPromote):
        yield


def sleeping_workflow() -> Workflow:
    workflow = drive(services.workflow_launch(kind=SoakThenPromote.kind, goal="soak and promote").pk)
    assert (workflow.status, workflow.current_node) == ("waiting", "SOAK")
    timer = Timer.objects.get(workflow=workflow)
    assert timer.fire_at - workflow.created_at >= timedelta(seconds=SOAK_SECONDS - 5)
    return workflow


def fire_now(workflow: Workflow) -> None:
    Timer.objects.filter(workflow=workflow).update(fire_at=clock.now() - timedelta(seconds=1))
    services.timers_fire_due()


def test_cancel_during_the_sleep_voids_the_timer_and_compensates_the_deployment(deploy_target):
    workflow = sleeping_workflow()
    services.workflow_cancel(workflow_id=workflow.pk, reason="release withdrawn")
    workflow = drive(workflow.pk)
    assert workflow.status == "cancelled"
    timer = Timer.objects.get(workflow=workflow)
    assert (timer.status, timer.note) == ("ignored", "workflow cancelled")
    fire_now(workflow)
    assert Timer.objects.get(workflow=workflow).fired_at is None
    effects = deploy_target.store.stats()["effects"]
    assert [e["deleted"] for e in effects.values()] == [1]


def test_subject_removed_outside_is_found_by_the_check_after_waking(deploy_target):
    """Nobody told the workflow; the precondition check after the sleep finds the deployment gone."""
    workflow = sleeping_workflow()
    key = workflow.state["deployment"]["idempotency_key"]
    deploy_target.store.delete(key)
    fire_now(workflow)
    workflow = drive(workflow.pk)
    assert workflow.status == "failed"
    assert workflow.reason.startswith("obsolete: deployment") and "is deleted" in workflow.reason
    assert deploy_target.store.stats()["effects"][key] == {"created": 1, "deleted": 1}


def test_sleep_ends_and_the_workflow_promotes(deploy_target):
    workflow = sleeping_workflow()
    fire_now(workflow)
    workflow = drive(workflow.pk)
    assert workflow.status == "completed"
    assert workflow.result["promoted"] == workflow.state["deployment"]["deployment_id"]
