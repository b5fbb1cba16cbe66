"""A definition pauses for a person with ``Goto(node, updates, pause=reason)``: durable, resumable."""
from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from tests.conftest import drive
from workflows import services
from workflows.engine import Complete, Decision, Goto, NodeContext, WorkflowDefinition, node
from workflows.models import Event
from workflows.testing import WorkflowRun, registered


class AskFirst(WorkflowDefinition):
    kind = "ask_first"
    start_node = "START"
    revalidate_node = "START"

    @node("START")
    def start(self, ctx: NodeContext[Any]) -> Decision:
        return Goto("GO_ON", {"asked": True}, pause="Paused for a person: check the numbers, then resume.")

    @node("GO_ON")
    def go_on(self, ctx: NodeContext[Any]) -> Decision:
        return Complete({"asked": ctx.state["asked"]})


@pytest.fixture
def ask_first() -> Iterator[None]:
    with registered(AskFirst):
        yield


def test_the_test_kit_pauses_at_the_node_entered_and_resume_runs_it():
    run = WorkflowRun(AskFirst, goal="g")
    assert (run.status, run.node, run.state) == ("paused", "GO_ON", {"asked": True})
    run.resume()
    assert (run.status, run.result) == ("completed", {"asked": True})


@pytest.mark.django_db
def test_a_definition_pause_is_durable_with_its_cause_and_agent_resume_goes_on(ask_first):
    """The state is saved with the node entered, the workflow is paused (cause ``definition``,
    the reason as given, an event); advancing does nothing until a person resumes."""
    wf = services.workflow_launch(kind="ask_first", goal="g")
    workflow = drive(wf.pk)
    assert (workflow.status, workflow.pause_cause, workflow.current_node) == ("paused", "definition", "GO_ON")
    assert workflow.reason == "Paused for a person: check the numbers, then resume." and workflow.state["asked"]
    paused = Event.objects.get(workflow_id=wf.pk, kind="workflow.paused")
    assert (paused.data["cause"], paused.data["node"]) == ("definition", "GO_ON")
    assert drive(wf.pk).status == "paused"
    services.workflow_resume(workflow_id=wf.pk)
    workflow = drive(wf.pk)
    assert (workflow.status, workflow.result, workflow.pause_cause, workflow.reason) == (
        "completed", {"asked": True}, "", "")
