"""Signals are queued per name, in order, and each event wait takes the oldest.

A signal no open wait receives is answered ``queued``, not ``applied`` ("Signal delivered."),
listed by ``agent show`` under ``signals_queued``, and delivered to the next wait for its name:
nothing is answered as delivered that no wait received, and a signal sent before its wait is not
kept without a word.
"""
from __future__ import annotations

import json
from collections.abc import Iterator
from io import StringIO
from typing import Any

import pytest
from django.core.management import call_command

from tests.conftest import drive, one_event_kind
from workflows import engine, services
from workflows.activity_context import ActivityContext
from workflows.models import Event, Signal, Wait
from workflows.registry import activity
from workflows.services import Outcome
from workflows.testing import registered

pytestmark = [pytest.mark.django_db, pytest.mark.usefixtures("rung")]

TWO_REPLIES = "test-two-replies"
ONE_REPLY = "test-one-reply"


@activity("test_signal_queue_prepare")
def prepare(ctx: ActivityContext, input: dict[str, Any]) -> dict[str, Any]:
    return {"ready": True}


class TwoReplies(engine.WorkflowDefinition):
    """PREPARE (an activity, so signals can arrive before any wait), then wait for two "reply"
    signals, one after the other, and complete with both payloads."""

    kind = TWO_REPLIES
    start_node = "PREPARE"
    revalidate_node = "PREPARE"

    @engine.node("PREPARE")
    def prepare(self, ctx: engine.NodeContext[Any]) -> engine.Decision:
        ctx.activity(prepare, {})
        return engine.Goto("FIRST")

    @engine.node("FIRST")
    def first(self, ctx: engine.NodeContext[Any]) -> engine.Decision:
        return engine.Goto("SECOND", {"first": ctx.wait_for_event("reply").payload})

    @engine.node("SECOND")
    def second(self, ctx: engine.NodeContext[Any]) -> engine.Decision:
        return engine.Complete({"first": ctx.state["first"], "second": ctx.wait_for_event("reply").payload})


OneReply = one_event_kind(ONE_REPLY, event="reply")


@pytest.fixture(autouse=True)
def kinds() -> Iterator[None]:
    with registered(TwoReplies, OneReply, prepare):
        yield


def signal(workflow_id: int, payload: Any, **kwargs: Any) -> services.Result:
    return services.workflow_signal(workflow_id=workflow_id, name="reply", payload=payload, **kwargs)


def shown(workflow_id: int) -> dict[str, Any]:
    out = StringIO()
    call_command("agent", "show", str(workflow_id), "--json", stdout=out)
    return dict(json.loads(out.getvalue()))


def test_a_second_signal_without_a_key_is_queued_and_reaches_the_next_wait():
    """Two keyless signals while the first wait is open: the first satisfies it (applied), the
    second is answered queued, and the second wait receives it."""
    workflow = drive(services.workflow_launch(kind=TWO_REPLIES, goal="Two replies").pk)
    assert (workflow.status, workflow.current_node) == ("waiting", "FIRST")

    answers = [signal(workflow.pk, {"text": "first"}), signal(workflow.pk, {"text": "second"})]

    assert [a.outcome for a in answers] == [Outcome.APPLIED, Outcome.QUEUED]
    assert answers[0].message == f"Signal 'reply' delivered to wait {Wait.objects.get(workflow=workflow).pk}."
    assert answers[1].message == (f"No wait for signal 'reply' is open on workflow {workflow.pk}; the signal is "
                                  "queued and the next wait for 'reply' receives it (oldest first).")
    workflow = drive(workflow.pk)
    assert (workflow.status, workflow.result) == ("completed", {"first": {"text": "first"},
                                                                "second": {"text": "second"}})
    assert not Signal.objects.filter(workflow=workflow, consumed_by__isnull=True).exists()


def test_a_signal_no_wait_takes_is_answered_queued_and_stays_listed():
    """A second signal to a workflow that waits only once is never called delivered: answered
    queued, recorded as queued in the history, and listed by `agent show` after the workflow
    completed on the first."""
    workflow = drive(services.workflow_launch(kind=ONE_REPLY, goal="One reply").pk)

    first, second = signal(workflow.pk, {"n": 1}), signal(workflow.pk, {"n": 2})
    workflow = drive(workflow.pk)

    assert (first.outcome, second.outcome) == (Outcome.APPLIED, Outcome.QUEUED)
    assert (workflow.status, workflow.result) == ("completed", {"reply": {"n": 1}})
    received = Event.objects.filter(workflow=workflow, kind="signal.received").order_by("seq")
    assert [e.data["queued"] for e in received] == [False, True]
    [queued] = shown(workflow.pk)["signals_queued"]
    assert queued["name"] == "reply" and queued["dedupe_key"].startswith("auto-")


def test_signals_before_the_wait_are_queued_in_order_and_each_wait_takes_the_oldest():
    """Three signals before any wait opened are each answered queued (saying how many are
    ahead); the first wait takes the oldest, the second the next, the third stays queued."""
    workflow = services.workflow_launch(kind=TWO_REPLIES, goal="Early replies")
    assert not Wait.objects.filter(workflow=workflow).exists()

    answers = [signal(workflow.pk, {"n": 1}), signal(workflow.pk, {"n": 2}, dedupe_key="mail-2"),
               signal(workflow.pk, {"n": 3})]

    assert [a.outcome for a in answers] == [Outcome.QUEUED] * 3
    assert "the signal is queued and" in answers[0].message
    assert "queued behind 1 earlier one and" in answers[1].message
    assert "queued behind 2 earlier ones and" in answers[2].message
    assert [q["dedupe_key"] for q in shown(workflow.pk)["signals_queued"]][1] == "mail-2"
    workflow = drive(workflow.pk)
    assert (workflow.status, workflow.result) == ("completed", {"first": {"n": 1}, "second": {"n": 2}})
    assert len(shown(workflow.pk)["signals_queued"]) == 1
    assert Signal.objects.get(workflow=workflow, consumed_by__isnull=True).payload == {"n": 3}


def test_a_repeated_key_of_a_queued_signal_changes_nothing():
    """A queued signal sent again with its key is answered already_applied, saying it is still queued."""
    workflow = services.workflow_launch(kind=TWO_REPLIES, goal="Early reply")
    signal(workflow.pk, {"n": 1}, dedupe_key="mail-1")

    again = signal(workflow.pk, {"n": 99}, dedupe_key="mail-1")

    assert (again.outcome, again.message) == (
        Outcome.ALREADY_APPLIED,
        "A signal with dedupe key 'mail-1' was received before (still queued); nothing changed.")
    assert list(Signal.objects.filter(workflow=workflow).values_list("payload", flat=True)) == [{"n": 1}]
