"""The harness's reviewer option: a `reviewer` child workflow reviews each accepted feature's diff
against its steps, with its own budget, and the next session's briefing carries its findings."""
from __future__ import annotations

from decimal import Decimal
from typing import Any

import pytest

from agentops.agents.harness.session import briefing, harness_session
from agentops.agents.reviewer.activities import ReviewInput, offline_review, review_prompt
from agentops.kind.presentation import Activity, Workflow
from agentops.kind.testing import approve, drive, launch
from tests.harness.conftest import APP_BOTH, APP_GREET, events, solve

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.timeout(300)]


def test_each_accepted_feature_is_reviewed_and_the_next_briefing_has_the_findings(
    mini_schedule: Any, doorbells: Any,
) -> None:
    mini_schedule({"F01/1": solve("F01", APP_GREET), "F02/1": solve("F02", APP_BOTH)})
    wf = drive(launch("harness", goal="Build app.py", budget_total_usd="5",
                      params={"reviewer": True, "reviewer_budget_usd": 0.25, "isolation": "none"}))
    approve(wf, by="hana")
    done = drive(wf)
    assert done.status == "completed", (done.status, done.reason)
    reviewers = list(Workflow.objects.filter(parent_id=wf.pk).order_by("pk"))
    assert [(r.kind, r.status, r.params["feature"], r.budget_total_usd) for r in reviewers] == [
        ("reviewer", "completed", "F01", Decimal("0.2500")), ("reviewer", "completed", "F02", Decimal("0.2500"))]
    assert reviewers[0].result["findings"] == ["No test changed alongside app.py: add one for what the steps ask."]
    # F02's session was briefed with F01's review.
    f02 = Activity.objects.get(workflow_id=wf.pk, name="harness_session", input__feature__id="F02")
    assert [r["feature"] for r in f02.input["reviews"]] == ["F01"]
    text = briefing(harness_session.decode_input(f02.input), None, deadline="-", git_log="")
    assert '<review feature="F01" verdict="concerns">' in text and "No test changed alongside app.py" in text
    assert [e["child_kind"] for e in events(wf.pk, "child.started")] == ["reviewer", "reviewer"]
    assert [r["feature"] for r in done.state["reviews"]] == ["F01", "F02"]


def test_without_the_option_no_reviewer_starts(mini_schedule: Any, doorbells: Any) -> None:
    mini_schedule({"F01/1": solve("F01", APP_GREET), "F02/1": solve("F02", APP_BOTH)})
    wf = drive(launch("harness", goal="Build app.py", params={"isolation": "none"}))
    approve(wf, by="hana")
    assert drive(wf).status == "completed"
    assert not Workflow.objects.filter(parent_id=wf.pk).exists()


def test_the_offline_reviewer_names_an_uncovered_step_and_a_missing_test() -> None:
    prompt = review_prompt(ReviewInput(workspace="/w", base_sha="a" * 40, head="b" * 40, feature="F07",
                                       steps=["python todo.py remove 1 deletes the item"]),
                           ["todo.py"], "+def add(item):\n+    items.append(item)\n")
    answer = offline_review("", [{"role": "user", "content": prompt}])
    assert answer["verdict"] == "concerns"
    assert answer["findings"] == ["No test changed alongside todo.py: add one for what the steps ask.",
                                  "The diff does not mention 'remove' of the step "
                                  "'python todo.py remove 1 deletes the item'."]
