"""The helpers a kind's author would otherwise guess at: offline answers, candidate hashes, state
versions, on_timeout and typed state (all without a database)."""
from __future__ import annotations

import json
from dataclasses import dataclass
from typing import TypedDict

import pytest

from agentops.providers import scripted
from agentops.providers.scripted import ScriptedProvider, offline_answer, offline_answers_file
from workflows.engine import Complete, Decision, Goto, NodeContext, WorkflowDefinition, hash_of_candidate, node
from workflows.errors import InvalidDecision, Permanent
from workflows.testing import WorkflowRun


@pytest.fixture(autouse=True)
def no_declared_answers(monkeypatch):
    monkeypatch.setattr(scripted, "_declared", {})


def ask(system: str, *, forced: str = "") -> scripted.ModelResponse:
    return ScriptedProvider(model="claude-sonnet-4-5").complete(
        system=system, messages=[{"role": "user", "content": "Draft a reply to Ada."}], max_tokens=100,
        tool_choice={"type": "tool", "name": forced} if forced else None)


def test_an_unknown_task_is_refused_and_never_answered_with_a_sentence():
    with pytest.raises(Permanent, match="no answer for task 'draft_reply'.*offline_answer"):
        ask("<task>draft_reply</task> You write replies.")
    with pytest.raises(Permanent, match="without a <task>NAME</task> marker"):
        ask("You write replies.")


def test_a_kind_declares_its_offline_answers_as_a_function_a_text_or_a_file(tmp_path):
    @offline_answer("draft_reply")
    def draft(system, messages):
        return f"Dear customer, about: {messages[-1]['content']}"

    offline_answer("classify", {"label": "billing"})
    (tmp_path / "answers.json").write_text(json.dumps({"greet": "Hello!"}))
    offline_answers_file(tmp_path / "answers.json")

    assert ask("<task>draft_reply</task>").text == "Dear customer, about: Draft a reply to Ada."
    assert json.loads(ask("<task>classify</task>").text) == {"label": "billing"}
    forced = ask("<task>classify</task>", forced="give_label")
    assert forced.tool_calls[0]["input"] == {"label": "billing"} and forced.stop_reason == "tool_use"
    assert ask("<task>greet</task>").text == "Hello!"
    with pytest.raises(Permanent, match="not a JSON object"):
        ask("<task>greet</task>", forced="give_label")
    with pytest.raises(ValueError, match="shipped kind"):
        offline_answer("plan_tasks", "x")


@dataclass(frozen=True)
class Draft:
    subject: str
    body: str


class State(TypedDict, total=False):
    draft: Draft
    drafts: list[Draft]
    note: str


class Approving(WorkflowDefinition):
    kind = "test-approving"
    start_node = "DRAFT"
    revalidate_node = "DRAFT"

    @node("DRAFT")
    def draft(self, ctx: NodeContext[State]) -> Decision:
        first = Draft(subject="Hi", body="Hello")
        return Goto("ASK", {"draft": first, "drafts": [first], "note": "n"})

    @node("ASK")
    def ask(self, ctx: NodeContext[State]) -> Decision:
        assert isinstance(ctx.state["draft"], Draft) and isinstance(ctx.state["drafts"][0], Draft)
        outcome = ctx.approval(candidate=ctx.state["draft"], role="support", expires_in_seconds=3600,
                               on_timeout="continue")
        return Complete({"approved": outcome.approved, "subject": ctx.state["draft"].subject,
                         "by": outcome.decided_by})


def test_typed_state_comes_back_as_the_declared_dataclasses():
    run = WorkflowRun(Approving)
    assert run.state["draft"] == {"subject": "Hi", "body": "Hello"}  # stored as JSON
    (wait,) = run.open_waits.values()
    run.approve(by="ada")
    assert run.result == {"approved": True, "subject": "Hi", "by": "ada"}
    assert wait.candidate == {"subject": "Hi", "body": "Hello"}


def test_the_candidate_hash_and_state_versions_have_defaults():
    (wait,) = WorkflowRun(Approving).open_waits.values()
    assert wait.candidate_hash == hash_of_candidate({"body": "Hello", "subject": "Hi"})
    assert wait.candidate_hash == hash_of_candidate(Draft(subject="Hi", body="Hello"))
    assert wait.state_versions == {"intent_version": 1}
    assert wait.timeout_policy == "continue"


def test_on_timeout_must_be_fail_or_continue():
    class Bad(Approving):
        kind = "test-approving-bad"

        @node("ASK")
        def ask(self, ctx: NodeContext[State]) -> Decision:
            ctx.approval(candidate={}, role="r", expires_in_seconds=1, on_timeout="retry")
            return Complete()

    with pytest.raises(InvalidDecision, match="on_timeout='retry'"):
        WorkflowRun(Bad)
