"""Operators' small things: the candidate in `agent show`, approver roles from the command line,
retries that say when the next try is, who cancelled, and no recovery after a cancel."""
from __future__ import annotations

import getpass
import json
from io import StringIO
from typing import Any

import pytest
from django.contrib.auth.models import Group, User
from django.core.management import CommandError, call_command

from tests.conftest import drive, open_approval
from workflows import services
from workflows.activity_context import ActivityContext
from workflows.engine import Complete, Decision, Goto, NodeContext, WorkflowDefinition, node
from workflows.errors import Retryable
from workflows.models import Event
from workflows.registry import CompensationInput, RetryPolicy, activity
from workflows.testing import registered

pytestmark = pytest.mark.django_db


def agent(*args: str) -> str:
    out = StringIO()
    call_command("agent", *args, stdout=out)
    return out.getvalue()


class Replying(WorkflowDefinition):
    kind = "test-replying"
    start_node = "ASK"
    revalidate_node = "ASK"

    @node("ASK")
    def ask(self, ctx: NodeContext[Any]) -> Decision:
        outcome = ctx.approval(candidate={"reply": "Dear Ada, [your order] ships today."}, role="support-leads",
                               expires_in_seconds=3600)
        return Complete({"approved": outcome.approved, "by": outcome.decided_by})


def test_show_prints_the_candidate_and_a_role_made_on_the_command_line_can_approve_it():
    User.objects.create_user("ada")
    with registered(Replying):
        wf = services.workflow_launch(kind="test-replying", goal="Answer Ada", params={}).pk
        wait = open_approval(wf)
        text = agent("show", str(wf))
        assert "Dear Ada, [your order] ships today." in " ".join(text.split()) and wait.candidate_hash in text
        detail = json.loads(agent("show", str(wf), "--json"))
        assert detail["waits"][0]["candidate"] == {"reply": "Dear Ada, [your order] ships today."}
        assert detail["waits"][0]["state_versions"] == {"intent_version": 1}

        with pytest.raises(CommandError, match="needs a member of group 'support-leads'"):
            agent("approve", str(wait.pk), "--user", "ada", "--candidate-hash", wait.candidate_hash)
        assert "ada added to support-leads." in agent("role", "add", "support-leads", "--user", "ada")
        assert "already a member" in agent("role", "add", "support-leads", "--user", "ada")
        assert json.loads(agent("role", "list", "--json")) == [
            {"role": "support-leads", "members": ["ada"], "open_approvals": 1}]
        agent("approve", str(wait.pk), "--user", "ada", "--candidate-hash", wait.candidate_hash)
        assert drive(wf).result == {"approved": True, "by": "ada"}

    assert "ada removed from support-leads." in agent("role", "remove", "support-leads", "--user", "ada")
    assert not Group.objects.get(name="support-leads").user_set.exists()
    with pytest.raises(CommandError, match="No role named 'support-lead'") as refused:
        agent("role", "remove", "support-lead", "--user", "ada")
    assert refused.value.returncode == 2
    with pytest.raises(CommandError, match="needs ROLE and at least one --user"):
        agent("role", "add", "support-leads")


calls: list[int] = []


@activity("test_flaky_lookup", retry=RetryPolicy(max_attempts=4, initial_interval_seconds=90))
def flaky_lookup(ctx: ActivityContext, input: dict) -> dict:
    raise Retryable("the CRM answered 503")


class Looking(WorkflowDefinition):
    kind = "test-looking"
    start_node = "LOOK"
    revalidate_node = "LOOK"

    @node("LOOK")
    def look(self, ctx: NodeContext[Any]) -> Decision:
        return Complete(ctx.activity(flaky_lookup, {}))


def test_a_failing_activity_shows_retrying_with_the_next_try_s_time():
    with registered(Looking, flaky_lookup):
        wf = services.workflow_launch(kind="test-looking", goal="Look up Ada", params={}).pk
        drive(wf)
        (event,) = Event.objects.filter(workflow_id=wf, kind="activity.retry_scheduled")
        assert event.data["retry_at"] and event.data["max_attempts"] == 4
        detail = json.loads(agent("show", str(wf), "--json"))
        assert detail["status"] == "running"
        (retrying,) = detail["retrying"]
        assert (retrying["name"], retrying["attempts"], retrying["max_attempts"]) == ("test_flaky_lookup", 1, 4)
        assert retrying["next_attempt_at"] == event.data["retry_at"]
        text = " ".join(agent("show", str(wf)).split())
        at = event.data["retry_at"][:19].replace("T", " ")
        assert (f"Retrying: test_flaky_lookup (wf-{wf}/LOOK.1/i1/0) failed attempt 1 of 4; next try at {at} UTC: "
                "Retryable: the CRM answered 503") in text
        assert "running (retrying)" in agent("list")


@activity("test_undo_hold")
def undo_hold(ctx: ActivityContext, input: CompensationInput) -> dict:
    return {"undone": input.operation_id}


@activity("test_place_hold", commitment="hold", compensation=undo_hold)
def place_hold(ctx: ActivityContext, input: dict) -> dict:
    return {"hold": "h-1"}


class Holding(WorkflowDefinition):
    kind = "test-holding"
    start_node = "HOLD"
    revalidate_node = "HOLD"

    @node("HOLD")
    def hold(self, ctx: NodeContext[Any]) -> Decision:
        ctx.activity(place_hold, {})
        return Goto("BROKEN")

    @node("BROKEN")
    def broken(self, ctx: NodeContext[Any]) -> Decision:
        raise RuntimeError("a bug in the definition")


def test_a_cancel_records_who_and_no_recovery_is_recorded_after_it():
    with registered(Holding, place_hold, undo_hold):
        wf = services.workflow_launch(kind="test-holding", goal="Hold a slot", params={}).pk
        drive(wf)
        assert Event.objects.filter(workflow_id=wf, kind="workflow.handler_failed").exists()
        agent("cancel", str(wf), "--reason", "not needed")
        final = drive(wf)
    assert final.status == "cancelled"
    kinds = list(Event.objects.filter(workflow_id=wf).order_by("seq").values_list("kind", flat=True))
    assert "workflow.handler_recovered" not in kinds[kinds.index("workflow.cancelling"):]
    who = f"shell:{getpass.getuser()}"
    assert Event.objects.get(workflow_id=wf, kind="workflow.cancelling").data["by"] == who
    assert Event.objects.get(workflow_id=wf, kind="workflow.cancelled").data["by"] == who
