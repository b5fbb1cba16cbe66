"""A definition deployed under workflows in flight: those it does not touch finish on it, those it
breaks stop for a person with the reason (never failed, never an effect repeated), and a
definition that branches on the recorded version lets them finish."""
from __future__ import annotations

from typing import Any

import pytest

from workflows import engine, registry, services
from workflows.activity_context import ActivityContext
from workflows.models import Activity, Workflow
from workflows.services import RunOutcome
from workflows.testing import deployed, registered

pytestmark = [pytest.mark.django_db, pytest.mark.usefixtures("rung")]

KIND = "test-upgrade"
SENT: list[str] = []  # the external effects of the first node's activity


@registry.activity("test_upgrade_send")
def send(ctx: ActivityContext, input: dict[str, Any]) -> dict[str, Any]:
    SENT.append(ctx.operation_id)
    return {"sent": len(SENT)}


class V1(engine.WorkflowDefinition):
    """SEND an effect, WAIT for "go", DONE."""

    kind = KIND
    version = 1
    start_node = "SEND"
    revalidate_node = "SEND"

    @engine.node("SEND")
    def send(self, ctx: engine.NodeContext[Any]) -> engine.Decision:
        return engine.Goto("WAIT", {"receipt": ctx.activity(send, {"to": ctx.goal})})

    @engine.node("WAIT")
    def wait(self, ctx: engine.NodeContext[Any]) -> engine.Decision:
        ctx.wait_for_event("go")
        return engine.Goto("DONE")

    @engine.node("DONE")
    def done(self, ctx: engine.NodeContext[Any]) -> engine.Decision:
        return engine.Complete({"receipt": ctx.state["receipt"]})


class V2WithoutSend(V1):
    """Version 2 removes the activity from SEND: a workflow already past SEND is not concerned."""

    version = 2

    @engine.node("SEND")
    def send(self, ctx: engine.NodeContext[Any]) -> engine.Decision:
        return engine.Goto("WAIT", {"receipt": None})


class V2Renamed(engine.WorkflowDefinition):
    """Version 2 renames WAIT to WAIT_FOR_GO: a workflow waiting at WAIT cannot go on."""

    kind = KIND
    version = 2
    start_node = "SEND"
    revalidate_node = "SEND"

    @engine.node("SEND")
    def send(self, ctx: engine.NodeContext[Any]) -> engine.Decision:
        return engine.Goto("WAIT_FOR_GO", {"receipt": ctx.activity(send, {"to": ctx.goal})})

    @engine.node("WAIT_FOR_GO")
    def wait_for_go(self, ctx: engine.NodeContext[Any]) -> engine.Decision:
        ctx.wait_for_event("go")
        return engine.Goto("DONE")

    @engine.node("DONE")
    def done(self, ctx: engine.NodeContext[Any]) -> engine.Decision:
        return engine.Complete({"receipt": ctx.state["receipt"]})


class V2RenamedKeepingTheOldPath(V2Renamed):
    """The fix: the old node stays for workflows launched on version 1."""

    @engine.node("WAIT")
    def wait(self, ctx: engine.NodeContext[Any]) -> engine.Decision:
        assert ctx.definition_version == 1, "only version-1 workflows are ever at WAIT"
        ctx.wait_for_event("go")
        return engine.Goto("DONE")


@pytest.fixture(autouse=True)
def upgrade_kind(settings: Any) -> Any:
    settings.AGENTOPS_HANDLER_MAX_FAILURES = 2
    SENT.clear()
    with registered(V1, send):
        yield


def parked() -> Workflow:
    """A version-1 workflow that sent its effect and waits at WAIT for "go"."""
    workflow = services.workflow_launch(kind=KIND, goal="ops@example.com")
    activity = Activity.objects.get(workflow=workflow)
    assert services.activity_run_if_runnable(activity_id=activity.pk) == RunOutcome.RECORDED
    workflow.refresh_from_db()
    assert (workflow.status, workflow.current_node, workflow.definition_version) == ("waiting", "WAIT", 1)
    return workflow


def test_a_change_elsewhere_in_the_path_lets_a_parked_workflow_finish():
    workflow = parked()

    with deployed(V2WithoutSend):
        services.workflow_signal(workflow_id=workflow.pk, name="go")
        services.workflow_advance_if_runnable(workflow_id=workflow.pk)
        fresh = services.workflow_launch(kind=KIND, goal="new@example.com")

    workflow.refresh_from_db()
    assert (workflow.status, workflow.result) == ("completed", {"receipt": {"sent": 1}})
    assert fresh.definition_version == 2 and not Activity.objects.filter(workflow=fresh).exists()
    assert len(SENT) == 1


def test_a_removed_node_stops_the_workflow_for_a_person_and_a_fixed_deploy_finishes_it(time_machine):
    workflow = parked()

    with deployed(V2Renamed):
        services.workflow_signal(workflow_id=workflow.pk, name="go")
        assert services.workflow_advance_if_runnable(workflow_id=workflow.pk) == services.Outcome.HANDLER_FAILED
        workflow.refresh_from_db()
        assert workflow.status == "running" and workflow.handler_failures == 1
        assert "Node 'WAIT' is not a node of 'test-upgrade' (version 2" in workflow.reason
        time_machine.move_to(workflow.advance_retry_at)
        assert services.workflow_advance_if_runnable(workflow_id=workflow.pk) == services.Outcome.HANDLER_FAILED

    workflow.refresh_from_db()
    assert (workflow.status, workflow.pause_cause) == ("paused", "handler_failed")
    assert "the definition changed under a workflow that is there" in workflow.reason

    with deployed(V2RenamedKeepingTheOldPath):
        result = services.workflow_resume(workflow_id=workflow.pk)

    workflow.refresh_from_db()
    assert result.outcome == services.Outcome.APPLIED
    assert (workflow.status, workflow.result) == ("completed", {"receipt": {"sent": 1}})
    assert len(SENT) == 1, "the effect sent before the upgrade was never repeated"
