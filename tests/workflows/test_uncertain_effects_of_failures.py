"""An activity that declares a commitment and fails may have acted before it failed. Its handler
may catch the failure and go on; the effect it may have made is still undone whichever way the
workflow ends: a cancel, a failure, a new goal, or a completion that took another path."""
from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from agentops.kind import (
    ActivityContext,
    ActivityFailed,
    CompensationInput,
    Complete,
    Decision,
    Goto,
    NodeContext,
    Permanent,
    WorkflowDefinition,
    activity,
    node,
)
from agentops.kind.testing import cancel, launch, registered, signal, supersede
from workflows.models import Commitment

SENT: list[str] = []
RETRACTED: list[tuple[str, bool]] = []


@activity("uncertain_retract")
def retract(ctx: ActivityContext, input: CompensationInput) -> dict[str, Any]:
    RETRACTED.append((input.sent_key, input.uncertain))
    return {"retracted": input.sent_key}


@activity("uncertain_send", commitment="message", compensation=retract)
def send_then_fail(ctx: ActivityContext, input: dict[str, Any]) -> dict[str, Any]:
    """Sends, then fails to read the answer: the message went out, the activity reports a failure."""
    SENT.append(ctx.idempotency_key)
    raise Permanent("the mail API's answer could not be read")


class SendOrWait(WorkflowDefinition):
    """Try to send; when the send fails, wait for a person to say go, then complete."""

    kind = "uncertain_send_or_wait"
    start_node = "SEND"
    revalidate_node = "WAIT"

    @node("SEND")
    def send(self, ctx: NodeContext[Any]) -> Decision:
        try:
            ctx.activity(send_then_fail, {"to": "ada@example.com"})
        except ActivityFailed:
            return Goto("WAIT", {"send_failed": True})
        return Goto("WAIT")

    @node("WAIT")
    def wait(self, ctx: NodeContext[Any]) -> Decision:
        return Complete({"go": ctx.wait_for_event("go").payload})


@pytest.fixture(autouse=True)
def kind() -> Iterator[None]:
    SENT.clear()
    RETRACTED.clear()
    with registered(SendOrWait, send_then_fail, retract):
        yield


pytestmark = pytest.mark.django_db


def sent_and_waiting(drive: Any) -> Any:
    workflow = drive(launch("uncertain_send_or_wait"))
    assert (workflow.status, workflow.current_node, workflow.state, len(SENT)) == (
        "waiting", "WAIT", {"send_failed": True}, 1)
    return workflow


def test_a_new_goal_undoes_what_a_failed_send_may_have_sent(drive, doorbells) -> None:
    workflow = sent_and_waiting(drive)
    supersede(workflow, "Tell Ada something else")
    workflow = drive(workflow)
    assert RETRACTED == [(SENT[0], True)]
    assert list(Commitment.objects.filter(workflow=workflow).values_list("status", flat=True)) == ["compensated"]


def test_a_completion_by_another_path_undoes_what_a_failed_send_may_have_sent(drive, doorbells) -> None:
    workflow = sent_and_waiting(drive)
    signal(workflow, "go", {"by": "lead"})
    workflow = drive(workflow)
    assert (workflow.status, workflow.result) == ("completed", {"go": {"by": "lead"}})
    assert RETRACTED == [(SENT[0], True)]


def test_a_cancel_undoes_what_a_failed_send_may_have_sent(drive, doorbells) -> None:
    workflow = sent_and_waiting(drive)
    cancel(workflow)
    assert drive(workflow).status == "cancelled"
    assert RETRACTED == [(SENT[0], True)]
