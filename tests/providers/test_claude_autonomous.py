"""The autonomous agent on Claude, against the fake Messages API: caching that pays, answers that hold up."""
from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from tests.conftest import drive
from tests.fakes import anthropic_api as fake
from tests.fakes.anthropic_api import FakeAnthropicAPI
from tests.fakes.claude_agent import TASKS, ClaudeForAutonomous, seed_workspace
from workflows import selectors, services
from workflows.models import Activity, Event, UsageEntry, Workflow

pytestmark = pytest.mark.django_db

GOAL = "Prepare onboarding notes from the docs"


@pytest.fixture(autouse=True)
def workspaces(settings: Any, tmp_path: Path) -> Path:
    settings.AGENTOPS_WORKSPACE_DIR = tmp_path / "workspaces"
    return Path(settings.AGENTOPS_WORKSPACE_DIR)


def launch(workspaces: Path) -> Workflow:
    workflow = services.workflow_launch(kind="autonomous", goal=GOAL)
    seed_workspace(workspaces / f"wf-{workflow.pk}")
    return workflow


def cache_read_fraction(usage: dict[str, int]) -> float:
    prompt = usage["input_tokens"] + usage["cache_read_input_tokens"] + usage["cache_creation_input_tokens"]
    return usage["cache_read_input_tokens"] / prompt


def test_a_multi_task_run_reads_most_of_its_input_from_cache(claude: FakeAnthropicAPI, workspaces: Path) -> None:
    """With the real minimum cacheable length (1024 tokens for Sonnet), the moving breakpoint on
    the last message makes each turn of a task's tool loop read the turns before it from cache."""
    claude.responder = ClaudeForAutonomous()
    workflow = drive(launch(workspaces).pk)

    assert workflow.status == "completed", workflow.reason
    assert workflow.result["tasks_done"] == len(TASKS)
    served = claude.usage_totals()
    fraction = cache_read_fraction(served)
    print(f"\ncache-read fraction of input tokens: {fraction:.1%} over {len(claude.requests)} requests "
          f"({served['cache_read_input_tokens']} read, {served['cache_creation_input_tokens']} written, "
          f"{served['input_tokens']} uncached)")
    assert fraction >= 0.60

    # The ledger recorded what the server reported, call by call.
    entries = UsageEntry.objects.filter(workflow=workflow, status="charged")
    assert entries.count() == len(claude.answered())
    assert sum(e.cache_read_tokens for e in entries) == served["cache_read_input_tokens"]
    assert sum(e.cache_write_tokens for e in entries) == served["cache_creation_input_tokens"]
    assert sum(e.input_tokens for e in entries) == served["input_tokens"]
    # agent show and the admin report the same share.
    assert selectors.spend_summary(workflow)["cache_read_share"] == round(fraction, 3)


def test_without_the_moving_breakpoint_nothing_would_be_read(claude: FakeAnthropicAPI, workspaces: Path,
                                                              monkeypatch: pytest.MonkeyPatch) -> None:
    """The ablation: breakpoints on tools and system only (the prefix is under 1024 tokens) read nothing."""
    from agentops.providers import anthropic as provider_module

    monkeypatch.setattr(provider_module, "with_breakpoint", lambda messages: messages)
    claude.responder = ClaudeForAutonomous()
    workflow = drive(launch(workspaces).pk)

    assert workflow.status == "completed", workflow.reason
    assert claude.usage_totals()["cache_read_input_tokens"] == 0


def test_each_model_call_is_an_event_with_its_usage_and_request_id(claude: FakeAnthropicAPI,
                                                                   workspaces: Path) -> None:
    claude.responder = ClaudeForAutonomous()
    workflow = drive(launch(workspaces).pk)

    calls = list(Event.objects.filter(workflow=workflow, kind="model.called").order_by("seq"))
    assert len(calls) == len(claude.requests)
    by_request = {r.request_id: r for r in claude.requests}
    for event in calls:
        served = by_request[event.data["request_id"]]
        assert served.usage is not None
        assert (event.data["input_tokens"], event.data["output_tokens"], event.data["cache_read_tokens"],
                event.data["cache_write_tokens"]) == (served.usage["input_tokens"], served.usage["output_tokens"],
                                                      served.usage["cache_read_input_tokens"],
                                                      served.usage["cache_creation_input_tokens"])
        assert event.data["model"] == "claude-sonnet-5-5"
        assert event.data["stop_reason"] in ("tool_use", "end_turn")
        assert isinstance(event.data["latency_ms"], int) and event.data["latency_ms"] >= 0
        entry = UsageEntry.objects.get(request_id=event.data["request_id"])
        assert entry.key == f"{event.data['operation_id']}#{event.data['call']}@{event.data['attempt']}.0"
        assert (entry.status, event.data["cost_usd"]) == ("charged", str(entry.cost_usd))


# --- structured answers -----------------------------------------------------------------------

def test_plans_and_verdicts_are_asked_for_as_forced_tool_calls(claude: FakeAnthropicAPI, workspaces: Path) -> None:
    claude.responder = ClaudeForAutonomous()
    drive(launch(workspaces).pk)

    forced = {fake_task(body): body["tool_choice"] for body in claude.bodies() if "tool_choice" in body}
    assert forced == {"plan_tasks": {"type": "tool", "name": "submit_plan"},
                      "verify_goal": {"type": "tool", "name": "submit_verdict"}}


def fake_task(body: dict[str, Any]) -> str:
    from tests.fakes.claude_agent import task_of

    return task_of(body)


def test_a_fenced_json_plan_is_accepted(claude: FakeAnthropicAPI, workspaces: Path) -> None:
    """A model (or gateway) that answers in text with the plan in a ```json fence is understood."""
    claude.script(fake.fenced_json({"tasks": TASKS}, preamble="Sure! Here is the plan:"))
    claude.responder = ClaudeForAutonomous()
    workflow = drive(launch(workspaces).pk)

    assert workflow.status == "completed", workflow.reason
    assert [t["title"] for t in workflow.state["tasks"]] == [t["title"] for t in TASKS]
    assert Activity.objects.get(workflow=workflow, name="plan_tasks").attempt == 1


def test_a_malformed_plan_is_sent_back_with_the_reason_and_the_corrected_one_is_used(
    claude: FakeAnthropicAPI, workspaces: Path,
) -> None:
    claude.script(fake.tool_use("submit_plan", {"tasks": [{"instructions": "no title"}]}),
                  fake.text("I think the plan should be: first read, then write."))
    claude.responder = ClaudeForAutonomous()
    workflow = drive(launch(workspaces).pk)

    assert workflow.status == "completed", workflow.reason
    planning = claude.bodies()[:3]
    assert [len(body["messages"]) for body in planning] == [1, 3, 5]
    rejected = planning[1]["messages"][2]["content"][0]
    assert rejected["type"] == "tool_result" and rejected["is_error"] is True
    assert "Task 1 of the model's plan has no title" in rejected["content"]
    assert "not a JSON object" in planning[2]["messages"][4]["content"][0]["text"]
    events = Event.objects.filter(workflow=workflow, kind="model.answer_rejected")
    assert [e.data["call"] for e in events] == [0, 1]
    assert Activity.objects.get(workflow=workflow, name="plan_tasks").attempt == 1


def test_a_plan_that_stays_malformed_is_retried_not_failed(claude: FakeAnthropicAPI, workspaces: Path) -> None:
    claude.script(*[fake.text("Let me think about it more.")] * 3)
    claude.responder = ClaudeForAutonomous()
    workflow = launch(workspaces)
    workflow = drive(workflow.pk, max_rounds=2)

    planning = Activity.objects.get(workflow=workflow, name="plan_tasks")
    assert workflow.status == "running"
    assert (planning.status, planning.attempt) == ("scheduled", 1)
    assert "still unusable after 3 answers" in planning.error

    Activity.objects.filter(pk=planning.pk).update(next_attempt_at=workflow.created_at)
    assert drive(workflow.pk).status == "completed"


def test_a_plan_cut_off_by_max_tokens_is_not_used(claude: FakeAnthropicAPI, workspaces: Path) -> None:
    claude.script(fake.Answer(content=[{"type": "tool_use", "id": "toolu_cut", "name": "submit_plan",
                                        "input": {"tasks": [{"title": "Read", "instructions": "Read the"}]}}],
                              stop_reason="max_tokens"))
    claude.responder = ClaudeForAutonomous()
    workflow = drive(launch(workspaces).pk)

    assert workflow.status == "completed", workflow.reason
    assert [t["title"] for t in workflow.state["tasks"]] == [t["title"] for t in TASKS], "not the cut-off plan"
    feedback = claude.bodies()[1]["messages"][2]["content"][0]
    assert "cut off at the output limit (max_tokens=1500)" in feedback["content"]


def test_a_task_answer_cut_off_by_max_tokens_is_continued_not_taken_as_done(
    claude: FakeAnthropicAPI, workspaces: Path,
) -> None:
    player = ClaudeForAutonomous()
    cut = {"done": False}

    def respond(body: dict[str, Any]) -> fake.Answer:
        if fake_task(body) == "execute_task" and not cut["done"]:
            cut["done"] = True
            return fake.cut_off("I have looked at the workspace and I will now summarise the guide, which says")
        return player(body)

    claude.responder = respond
    workflow = drive(launch(workspaces).pk)

    assert workflow.status == "completed", workflow.reason
    first_task = next(t for t in workflow.state["tasks"] if t["id"] == 1)
    assert not first_task["summary"].startswith("I have looked"), "the cut-off text was not taken as the summary"
    executing = [b for b in claude.bodies() if fake_task(b) == "execute_task"]
    assert "cut off at the output limit" in executing[1]["messages"][-1]["content"][0]["text"]
