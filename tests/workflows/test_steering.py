"""Steer messages: durable, ordered, recorded with who sent them, taken once by the next model call."""
from __future__ import annotations

from datetime import timedelta
from typing import Any

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext

from agentops.providers.scripted import ScriptedProvider
from tests.conftest import drive, one_event_kind
from workflows import clock, registry, selectors, services
from workflows.errors import InvalidInput, Retryable, TransitionRefused
from workflows.models import Activity, Event, SteerMessage, Workflow
from workflows.testing import registered

pytestmark = pytest.mark.django_db

STEER = "Also write a changelog entry for what you change."


@pytest.fixture(autouse=True)
def workspaces(settings: Any, tmp_path: Any) -> Any:
    settings.AGENTOPS_WORKSPACE_DIR = tmp_path / "workspaces"
    return settings.AGENTOPS_WORKSPACE_DIR


@pytest.fixture
def requests(monkeypatch: pytest.MonkeyPatch) -> list[dict[str, Any]]:
    """The messages of every request the scripted provider answers, with its task."""
    seen: list[dict[str, Any]] = []
    complete = ScriptedProvider.complete

    def recording(self: ScriptedProvider, **kwargs: Any) -> Any:
        seen.append({"system": kwargs["system"], "messages": [dict(m) for m in kwargs["messages"]]})
        return complete(self, **kwargs)

    monkeypatch.setattr(ScriptedProvider, "complete", recording)
    return seen


def carries(request: dict[str, Any], text: str) -> int:
    """How many user turns of the request hold ``text``."""
    return sum(1 for m in request["messages"] if m["role"] == "user" and text in str(m["content"]))


def claim_of(activity: Activity) -> Any:
    claim = services.activity_claim_if_runnable(activity_id=activity.pk, worker="test", task_id="t")
    assert claim is not None
    return claim


def test_a_steer_message_reaches_the_next_model_call_once_as_a_user_turn(requests, requester) -> None:
    """Sent while the plan is scheduled: the plan's model call carries it as its last user turn, no other
    call of another activity does, and the history says who sent it and which call took it."""
    workflow = services.workflow_launch(kind="autonomous", goal="Prepare onboarding notes")
    result = services.workflow_steer(workflow_id=workflow.pk, message=STEER, user=requester)
    assert (result.outcome, result.seq) == (services.Outcome.APPLIED, 1)
    assert "its next model call receives it as a user turn" in result.message

    workflow = drive(workflow.pk)

    assert workflow.status == "completed", workflow.reason
    first = [n for n, r in enumerate(requests) if carries(r, STEER)]
    assert first == [0], "only the plan's call holds it (the plan is one call; no other activity takes it)"
    last_turn = requests[0]["messages"][-1]
    assert last_turn["role"] == "user" and "<steering>" in last_turn["content"] and 'from="rita"' in last_turn[
        "content"]
    plan = Activity.objects.get(workflow=workflow, name="plan_tasks")
    row = SteerMessage.objects.get(workflow=workflow)
    assert (row.activity_id, row.call, row.sender, row.sent_by) == (plan.pk, 0, "rita", requester)
    received = Event.objects.get(workflow=workflow, kind="steer.received")
    assert (received.data["by"], received.data["seq"], received.data["text"]) == ("rita", 1, STEER)
    delivered = Event.objects.get(workflow=workflow, kind="steer.delivered")
    assert (delivered.data["operation_id"], delivered.data["call"]) == (plan.operation_id, 0)
    shown = selectors.workflow_detail(workflow)["steering"]
    assert [(m["seq"], m["status"], m["operation_id"], m["call"]) for m in shown] == [
        (1, "delivered", plan.operation_id, 0)]


def test_messages_are_taken_in_order_by_one_call_and_a_later_turn_keeps_them_in_its_history(requests) -> None:
    """Two messages before a task's turn: one user turn holds both, oldest first; the task's later turns
    carry that turn as history (once), and the next task's calls never see them."""
    workflow = services.workflow_launch(kind="autonomous", goal="Prepare onboarding notes")
    drive_plan_only(workflow)
    services.workflow_steer(workflow_id=workflow.pk, message="first: keep notes short", by="shell:ops")
    services.workflow_steer(workflow_id=workflow.pk, message="second: use British spelling", by="shell:ops")
    workflow = drive(workflow.pk)

    assert workflow.status == "completed", workflow.reason
    holding = [r for r in requests if carries(r, "first: keep notes short")]
    assert holding and all(carries(r, "first: keep notes short") == 1 for r in holding)
    turn = next(m["content"] for m in holding[0]["messages"] if "first:" in str(m["content"]))
    assert turn.index("first:") < turn.index("second:")
    assert {"<task>execute_task</task>" in r["system"] for r in holding} == {True}
    task_ops = set(SteerMessage.objects.filter(workflow=workflow).values_list("activity__operation_id", flat=True))
    assert len(task_ops) == 1 and "/EXECUTION." in task_ops.pop()
    assert Event.objects.filter(workflow=workflow, kind="steer.delivered").count() == 2


def drive_plan_only(workflow: Workflow) -> None:
    plan = Activity.objects.get(workflow=workflow, name="plan_tasks")
    services.activity_run_if_runnable(activity_id=plan.pk, worker="in-process")


def test_a_retried_attempt_takes_its_messages_again_and_no_other_activity_does() -> None:
    """Attempt 1 takes the message at call 0 and fails; attempt 2, starting over, takes it again at call
    0 (its conversation resumes before it); a later call of the same attempt and a stale attempt get
    nothing; once the goal is superseded the voided activity's message goes to the new plan."""
    workflow = services.workflow_launch(kind="autonomous", goal="Prepare onboarding notes")
    services.workflow_steer(workflow_id=workflow.pk, message=STEER, by="shell:ops")
    plan = Activity.objects.get(workflow=workflow, name="plan_tasks")
    first = claim_of(plan)
    assert [m["text"] for m in services.steering_take_if_current(claim=first, call=0)] == [STEER]
    assert services.steering_take_if_current(claim=first, call=1) == []
    services.activity_failure_record_if_current(claim=first, error=Retryable("the answer was lost"))
    Activity.objects.filter(pk=plan.pk).update(next_attempt_at=clock.now() - timedelta(seconds=1))
    second = claim_of(plan)
    assert second.attempt == 2
    assert services.steering_take_if_current(claim=first, call=0) is None, "a stale attempt is fenced off"
    again = services.steering_take_if_current(claim=second, call=0)
    assert [m["seq"] for m in again] == [1]
    assert services.steering_take_if_current(claim=second, call=0) == again, "the same call, the same messages"
    assert Event.objects.filter(workflow=workflow, kind="steer.delivered", data__again=True).count() == 2

    services.workflow_supersede(workflow_id=workflow.pk, goal="Prepare shorter onboarding notes")
    services.workflow_advance_if_runnable(workflow_id=workflow.pk)
    assert selectors.steering_of(Workflow.objects.get(pk=workflow.pk))[0]["status"] == "pending"
    replan = Activity.objects.get(workflow=workflow, name="plan_tasks", status="scheduled")
    taken = services.steering_take_if_current(claim=claim_of(replan), call=0)
    assert [m["seq"] for m in taken] == [1]
    assert SteerMessage.objects.get(workflow=workflow).activity_id == replan.pk


def test_a_repeated_dedupe_key_is_one_message() -> None:
    workflow = services.workflow_launch(kind="autonomous", goal="Prepare onboarding notes")
    services.workflow_steer(workflow_id=workflow.pk, message=STEER, dedupe_key="changelog", by="shell:ops")
    repeat = services.workflow_steer(workflow_id=workflow.pk, message=STEER, dedupe_key="changelog", by="shell:ops")
    assert repeat.outcome == services.Outcome.ALREADY_APPLIED
    assert repeat.message == (f"Steer message #1 with dedupe key 'changelog' was sent to workflow {workflow.pk} "
                              "before; nothing changed.")
    assert SteerMessage.objects.filter(workflow=workflow).count() == 1
    assert Event.objects.filter(workflow=workflow, kind="steer.received").count() == 1


def test_bad_steers_are_refused_and_change_nothing(requester) -> None:
    workflow = services.workflow_launch(kind="autonomous", goal="Prepare onboarding notes")
    with pytest.raises(InvalidInput, match="The steer message must be non-empty text"):
        services.workflow_steer(workflow_id=workflow.pk, message="   ")
    with pytest.raises(InvalidInput, match="limit is 10000"):
        services.workflow_steer(workflow_id=workflow.pk, message="x" * 10_001)
    with pytest.raises(InvalidInput, match="control character"):
        services.workflow_steer(workflow_id=workflow.pk, message="go", dedupe_key="a\nb")
    finished = drive(workflow.pk)
    with pytest.raises(TransitionRefused, match=rf"Workflow {workflow.pk} is completed; it makes no more model "
                                                r"calls.*agent fork"):
        services.workflow_steer(workflow_id=finished.pk, message=STEER)
    with registered(one_event_kind("quiet")):
        quiet = services.workflow_launch(kind="quiet", goal="wait")
        assert not registry.definition("quiet").reads_steering
        with pytest.raises(TransitionRefused, match="whose model calls do not read steer messages"):
            services.workflow_steer(workflow_id=quiet.pk, message=STEER)
    assert not SteerMessage.objects.exists()


def test_a_message_sent_while_a_tool_runs_reaches_the_next_call_and_an_unsteered_turn_asks_nothing(
        requests, monkeypatch) -> None:
    """A tool turn's checkpoint says whether the workflow has steer messages: the next model call asks
    the steering question only when it has (on PostgreSQL). A message sent while a tool runs, before
    that checkpoint, is in the task's very next call."""
    from agentops.agents.autonomous import activities

    run_tool = activities.run_tool_isolated
    tools: list[str] = []
    sent: list[int] = []

    def steering_meanwhile(root: Any, name: str, args: dict[str, Any]) -> Any:
        tools.append(name)
        if len(tools) == 2:  # a later tool turn: the turns before it found no message
            sent.append(services.workflow_steer(workflow_id=workflow.pk, message=STEER, by="shell:ops").seq)
        return run_tool(root, name, args)

    monkeypatch.setattr(activities, "run_tool_isolated", steering_meanwhile)
    workflow = services.workflow_launch(kind="autonomous", goal="Prepare onboarding notes")
    with CaptureQueriesContext(connection) as queries:
        workflow = drive(workflow.pk)

    assert workflow.status == "completed", workflow.reason
    assert sent == [1]
    steered = [n for n, r in enumerate(requests) if carries(r, STEER)]
    delivered = Event.objects.get(workflow=workflow, kind="steer.delivered")
    task = Activity.objects.get(operation_id=delivered.data["operation_id"])
    assert task.name == "execute_task" and delivered.data["call"] >= 1, "taken by the turn after the tool"
    assert steered and requests[steered[0]]["messages"][-1]["content"].startswith("<steering>")
    if connection.vendor == "postgresql":
        calls = Event.objects.filter(workflow=workflow, kind="model.called").count()
        asked = sum(q["sql"].startswith('SELECT 1 FROM "workflows_steermessage"') for q in queries.captured_queries)
        assert asked < calls, f"{asked} steering questions for {calls} model calls: none answered by a checkpoint"


def test_a_chained_activity_asks_its_first_steering_question_only_when_the_workflow_has_messages(
        requests, settings, monkeypatch) -> None:
    """The row lock of the result that chains the next activity says whether the workflow has steer
    messages: without any, the chained activity's first call asks nothing (on PostgreSQL); a message
    sent during the plan's call is in the first call of the task chained after it."""
    settings.AGENTOPS_ACTIVITY_CHAIN_SECONDS = 60
    complete, target, sent = ScriptedProvider.complete, [], []

    def steering_during_the_plan(self: ScriptedProvider, **kwargs: Any) -> Any:
        if target and not sent:
            sent.append(services.workflow_steer(workflow_id=target[0], message=STEER, by="shell:ops").seq)
        return complete(self, **kwargs)

    def run_chained(workflow: Workflow) -> Workflow:
        first = Activity.objects.get(workflow=workflow)
        services.activity_run_if_runnable(activity_id=first.pk, worker="w1", task_id="task-1")
        workflow.refresh_from_db()
        assert workflow.status == "completed", workflow.reason
        return workflow

    quiet = services.workflow_launch(kind="autonomous", goal="Prepare onboarding notes")
    with CaptureQueriesContext(connection) as queries:
        run_chained(quiet)
    asked = sum(q["sql"].startswith('SELECT 1 FROM "workflows_steermessage"') for q in queries.captured_queries)
    if connection.vendor == "postgresql":
        assert asked == 1, "only the plan's call, claimed by its doorbell, asks"

    monkeypatch.setattr(ScriptedProvider, "complete", steering_during_the_plan)
    steered = services.workflow_launch(kind="autonomous", goal="Prepare onboarding notes")
    target.append(steered.pk)
    run_chained(steered)
    assert sent == [1]
    delivered = Event.objects.get(workflow=steered, kind="steer.delivered")
    task = Activity.objects.get(operation_id=delivered.data["operation_id"])
    assert (task.name, delivered.data["call"]) == ("execute_task", 0)
