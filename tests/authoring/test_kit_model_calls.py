"""The test kit runs a model-calling activity without a database: FakeModel answers, FakeLedger meters."""
from __future__ import annotations

from dataclasses import dataclass
from decimal import Decimal

import pytest

from agentops.providers.answers import AnswerTool, ask_structured
from workflows.activity_context import ActivityContext
from workflows.errors import BudgetExhausted, InvalidInput, Retryable, Throttled
from workflows.metering import metered_complete
from workflows.provider import Usage
from workflows.registry import activity
from workflows.testing import ActivityEnvironment, FakeLedger, FakeModel, Reply, Throttle, cut_off, registered


@dataclass(frozen=True)
class Ask:
    question: str


@dataclass(frozen=True)
class Answer:
    text: str
    tokens: int


@activity("kit_test_ask", lease_seconds=20)
def ask(ctx: ActivityContext, input: Ask) -> Answer:
    response = metered_complete(ctx, call=0, system="<task>kit_answer</task> Answer briefly.",
                                messages=[{"role": "user", "content": input.question}], max_tokens=200)
    if response.stop_reason == "max_tokens":
        raise Retryable("cut off")
    return Answer(text=response.text, tokens=response.usage.output_tokens)


TOOL = AnswerTool("give_score", "A score.", {"type": "object", "properties": {"score": {"type": "integer"}}})


def score_of(data: dict) -> int:
    if not isinstance(data.get("score"), int):
        raise InvalidInput("score must be an integer")
    return data["score"]


@activity("kit_test_score", lease_seconds=20)
def score(ctx: ActivityContext, input: Ask) -> dict:
    value, responses = ask_structured(ctx, system="<task>kit_score</task>", prompt=input.question, tool=TOOL,
                                      validate=score_of, max_tokens=100, what="score")
    return {"score": value, "answers": len(responses)}


def test_a_model_calling_activity_runs_on_scripted_answers_and_is_metered_without_a_database():
    model = FakeModel([Reply(text="Hello.", usage=Usage(input_tokens=1000, output_tokens=100))])
    env = ActivityEnvironment(model=model)
    with registered(ask):
        result = env.run(ask, Ask(question="Hi?"))
    assert result == Answer(text="Hello.", tokens=100)
    assert model.calls[0]["messages"] == [{"role": "user", "content": "Hi?"}]
    (entry,) = env.ledger.entries.values()
    # claude-sonnet-4-5 prices: 3 USD/Mtok in, 15 out.
    assert (entry.status, entry.cost_usd, entry.key) == ("charged", Decimal("0.004500"), "wf-1/TEST.1/i1/0#0@1.0")
    assert [kind for kind, _ in env.lease.notes] == ["model.called"]


def test_structured_answers_get_feedback_and_a_cut_off_answer_is_asked_again():
    model = FakeModel([cut_off(data={"score": 1}), {"score": "high"}, {"score": 7}])
    env = ActivityEnvironment(model=model)
    with registered(score):
        assert env.run(score, Ask(question="Rate it.")) == {"score": 7, "answers": 3}
    assert all(call["tool_choice"] == {"type": "tool", "name": "give_score"} for call in model.calls)
    assert [kind for kind, _ in env.lease.notes].count("model.answer_rejected") == 2
    assert [e.status for e in env.ledger.entries.values()] == ["charged"] * 3


def test_a_throttle_raises_throttled_and_costs_nothing():
    env = ActivityEnvironment(model=FakeModel([Throttle(status=529, retry_after_seconds=12)]))
    with registered(ask), pytest.raises(Throttled) as raised:
        env.run(ask, Ask(question="Hi?"))
    assert raised.value.retry_after_seconds == 12
    assert [e.status for e in env.ledger.entries.values()] == ["released"] and env.ledger.spent_usd == 0


def test_the_fake_ledger_refuses_a_call_over_the_total_budget():
    env = ActivityEnvironment(model=FakeModel(["never sent"]), ledger=FakeLedger(total_usd=Decimal("0.001")))
    with registered(ask), pytest.raises(BudgetExhausted):
        env.run(ask, Ask(question="Hi?"))
    assert env.ledger.entries == {}


def test_a_call_past_the_last_answer_fails_the_test_naming_the_prompt():
    with registered(ask), pytest.raises(AssertionError, match="model call 0 but the FakeModel has 0"):
        ActivityEnvironment(model=FakeModel([])).run(ask, Ask(question="Hi?"))
