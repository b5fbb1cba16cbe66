"""A release change never repeats or strands an effect, and never eats a signal.

A customer follow-up: draft a reply, send it (an effect with a compensation), wait for the
customer. A worker with a new prompt version wakes it: the reply that was sent stands and the
customer's answer reaches the handler; before any effect, the workflow revalidates and the signal
that woke it waits for the revalidated path's wait instead of vanishing.
"""
from __future__ import annotations

from collections.abc import Iterator
from io import StringIO
from typing import Any

import pytest
from django.core.management import call_command

from tests.conftest import drive
from workflows import engine, registry, services
from workflows.activity_context import ActivityContext
from workflows.models import Event, Workflow
from workflows.registry import CompensationInput
from workflows.testing import registered

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.usefixtures("rung")]

FOLLOW_UP, FIRST_WAIT, PINNED = "test-follow-up", "test-wait-first", "test-pinned-kind"
SENT: list[str] = []
UNSENT: list[str] = []


@registry.activity("test_follow_up_unsend")
def unsend(ctx: ActivityContext, input: CompensationInput) -> dict[str, Any]:
    UNSENT.append(input.sent_key)
    return {"unsent": True}


@registry.activity("test_follow_up_draft")
def draft(ctx: ActivityContext, input: dict[str, Any]) -> dict[str, Any]:
    return {"text": f"About ticket {input['ticket']}: we are on it."}


@registry.activity("test_follow_up_send", commitment="reply", compensation=unsend)
def send(ctx: ActivityContext, input: dict[str, Any]) -> dict[str, Any]:
    SENT.append(ctx.idempotency_key)
    return {"message": len(SENT)}


class FollowUp(engine.WorkflowDefinition):
    kind = FOLLOW_UP
    start_node = "DRAFT"
    revalidate_node = "DRAFT"

    @engine.node("DRAFT")
    def draft(self, ctx: engine.NodeContext[Any]) -> engine.Decision:
        return engine.Goto("SEND", {"draft": ctx.activity(draft, {"ticket": 7})})

    @engine.node("SEND")
    def send(self, ctx: engine.NodeContext[Any]) -> engine.Decision:
        return engine.Goto("WAIT_CUSTOMER", {"sent": ctx.activity(send, {"text": ctx.state["draft"]["text"]})})

    @engine.node("WAIT_CUSTOMER")
    def wait_customer(self, ctx: engine.NodeContext[Any]) -> engine.Decision:
        return engine.Complete({"answer": ctx.wait_for_event("customer").payload, "sent": ctx.state["sent"]})


class WaitFirst(engine.WorkflowDefinition):
    """Waits for "go" before doing anything: a release change there revalidates (no effect made)."""

    kind = FIRST_WAIT
    start_node = "WAIT"
    revalidate_node = "WAIT"

    @engine.node("WAIT")
    def wait(self, ctx: engine.NodeContext[Any]) -> engine.Decision:
        return engine.Complete({"go": ctx.wait_for_event("go").payload})


class Pinned(WaitFirst):
    kind = PINNED
    default_release_policy = "pin"


@pytest.fixture(autouse=True)
def kinds() -> Iterator[None]:
    SENT.clear()
    UNSENT.clear()
    with registered(FollowUp, WaitFirst, Pinned, draft, send, unsend):
        yield


def kinds_of(workflow_id: int) -> list[str]:
    return list(Event.objects.filter(workflow_id=workflow_id).order_by("seq").values_list("kind", flat=True))


def test_a_release_change_after_the_reply_was_sent_keeps_it_and_the_customer_answer_arrives(settings):
    workflow = drive(services.workflow_launch(kind=FOLLOW_UP, goal="Follow up ticket 7").pk)
    assert (workflow.status, workflow.current_node, len(SENT)) == ("waiting", "WAIT_CUSTOMER", 1)

    settings.AGENTOPS_PROMPT_VERSION = "follow-up-prompt-2"  # a worker restarted with a new prompt
    assert services.workflow_signal(workflow_id=workflow.pk, name="customer", payload="thanks!").outcome == "applied"
    workflow = drive(workflow.pk)

    assert workflow.status == Workflow.Status.COMPLETED
    assert workflow.result == {"answer": "thanks!", "sent": {"message": 1}}
    assert len(SENT) == 1 and UNSENT == []  # one reply, never undone, never sent again
    history = kinds_of(workflow.pk)
    assert "release.changed" in history and "release.kept_course" in history
    kept = Event.objects.get(workflow=workflow, kind="release.kept_course").data
    assert kept["node"] == "WAIT_CUSTOMER" and len(kept["effects"]) == 1
    assert workflow.release.fingerprint != "" and "follow-up-prompt-2" in str(workflow.release)


def test_a_release_change_before_any_effect_revalidates_and_the_signal_reaches_the_new_wait(settings):
    workflow = drive(services.workflow_launch(kind=FIRST_WAIT, goal="Wait for go").pk)
    assert workflow.status == "waiting"

    settings.AGENTOPS_PROMPT_VERSION = "wait-first-prompt-2"
    services.workflow_signal(workflow_id=workflow.pk, name="go", payload={"n": 1})
    workflow = drive(workflow.pk)

    assert (workflow.status, workflow.result) == (Workflow.Status.COMPLETED, {"go": {"n": 1}})
    history = kinds_of(workflow.pk)
    assert history.index("release.changed") < history.index("signal.requeued") < history.index("workflow.completed")
    assert "release.kept_course" not in history


def test_a_kind_declares_its_default_release_policy(settings):
    assert services.workflow_launch(kind=PINNED, goal="g").release_policy == "pin"
    assert services.workflow_launch(kind=FIRST_WAIT, goal="g").release_policy == "revalidate"
    chosen = services.workflow_launch(kind=PINNED, goal="g", options=services.LaunchOptions(release_policy="fail"))
    assert chosen.release_policy == "fail"
    out = StringIO()
    call_command("agent", "launch", PINNED, "--goal", "from the command line", "--json", stdout=out)
    assert Workflow.objects.order_by("-pk").first().release_policy == "pin"
