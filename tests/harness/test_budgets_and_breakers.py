"""H8 budgets and H9 loop breakers of the harness, each on the two-feature project: scripted provider,
real git, real subprocesses, PostgreSQL. A budget or breaker that fires is an event; its consequence
is a blocked feature, an ended session, or a durable pause that ``agent resume`` ends."""
from __future__ import annotations

from decimal import Decimal

import pytest

from agentops.kind import TransitionRefused
from agentops.kind.presentation import Workflow
from agentops.kind.testing import launch, resume, set_budget
from tests.harness.conftest import (
    APP_BOTH,
    APP_GREET,
    approve_feature_list,
    commit,
    drive_all,
    events,
    launch_approved,
    request_pass,
    solve,
    write,
)

SLEEP = {"tool": "run_command", "input": {"command": "python -c \"import time; time.sleep(30)\"",
                                         "timeout_seconds": 60, "idle_seconds": 60}}
pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.timeout(180)]


def board(workflow: Workflow) -> dict[str, dict]:
    return {f["id"]: f for f in workflow.state["features"]}


def test_a_feature_out_of_attempts_is_blocked_and_pauses_for_a_person(harness_approver, mini_schedule):
    """max_attempts=2: the second red session blocks F01 and pauses the workflow (not failed);
    resuming gives F01 two more attempts and the list is finished."""
    mini_schedule({
        "F01/1": solve("F01", "print('helo')\n"),
        "F01/2": solve("F01", "print('hullo')\n"),
        "F01/3": solve("F01", APP_GREET),
        "F02/1": solve("F02", APP_BOTH),
    })
    workflow = launch_approved(harness_approver, max_attempts=2)
    assert (workflow.status, workflow.pause_cause, workflow.current_node) == ("paused", "definition", "DECIDE")
    assert "feature F01 used its 2 attempts" in workflow.reason and f"agent resume {workflow.pk}" in workflow.reason
    assert board(workflow)["F01"]["status"] == "blocked"
    assert [(b["level"], b["what"]) for b in events(workflow.pk, "harness.budget_exhausted")] == [
        ("feature", "used its 2 attempts")]
    assert workflow.state["paused_for"]["kind"] == "feature_budget"

    resume(workflow, by="hana")
    workflow = drive_all(workflow.pk)
    assert workflow.status == "completed", workflow.reason
    assert (board(workflow)["F01"]["attempts"], board(workflow)["F01"]["attempt_limit"]) == (3, 4)


def test_a_feature_budget_in_usd_pauses_once_its_sessions_spent_it(harness_approver, mini_schedule):
    """feature_budget_usd: the spend of F01's sessions (the ledger's prices) is counted per feature."""
    mini_schedule({"F01/1": solve("F01", "print('helo')\n")})
    workflow = launch_approved(harness_approver, feature_budget_usd="0.000001")
    assert (workflow.status, workflow.pause_cause) == ("paused", "definition")
    spent = Decimal(board(workflow)["F01"]["spent_usd"])
    assert spent > 0 and "USD budget" in workflow.reason


def test_the_same_diff_three_times_blocks_the_feature_with_counters_kept_in_the_database(
        harness_approver, mini_schedule):
    """Three sessions that leave the same tree block F01 (same_diff); the streak is in the workflow's
    stored state after every session, so no process holds it. Only F01 blocked left: a pause."""
    wrong = solve("F01", "print('helo')\n")
    mini_schedule({"F01/1": wrong, "F01/2": wrong, "F01/3": wrong, "F02/1": solve("F02", APP_BOTH)})
    workflow = launch_approved(harness_approver, max_attempts=5)
    breakers = events(workflow.pk, "harness.loop_breaker")
    assert [(b["breaker"], b["feature"], b["count"], b["consequence"]) for b in breakers] == [
        ("same_diff", "F01", 3, "feature blocked")]
    f01 = board(Workflow.objects.get(pk=workflow.pk))["F01"]
    assert (f01["status"], f01["diff_streak"], f01["attempts"]) == ("blocked", 3, 3)
    assert f01["reason"].startswith("the same diff 3 sessions in a row")
    # F02 went on meanwhile and passed; then only the blocked F01 was left.
    assert board(workflow)["F02"]["status"] == "passing"
    assert (workflow.status, workflow.state["paused_for"]["kind"]) == ("paused", "blocked_only")


def test_the_same_failure_three_times_blocks_the_feature(harness_approver, mini_schedule):
    """Different code, the same failing output (numbers masked): same_error after three sessions."""
    mini_schedule({**{f"F01/{n}": solve("F01", f"print('helo')  # try {n}\n") for n in (1, 2, 3)},
                   "F02/1": solve("F02", APP_BOTH)})
    workflow = launch_approved(harness_approver, max_attempts=5)
    assert [(b["breaker"], b["feature"], b["count"]) for b in events(workflow.pk, "harness.loop_breaker")] == [
        ("same_error", "F01", 3)]
    assert board(workflow)["F01"]["status"] == "blocked"


def test_sessions_without_a_new_pass_pause_and_resume_counts_again(harness_approver, mini_schedule):
    """stagnation_sessions=2: two sessions without a new pass pause the workflow; resumed, it goes on."""
    mini_schedule({"F01/1": solve("F01", "print('a')\n"), "F01/2": solve("F01", "print('b')\n"),
                   "F01/3": solve("F01", APP_GREET), "F02/1": solve("F02", APP_BOTH)})
    workflow = launch_approved(harness_approver, max_attempts=5, stagnation_sessions=2)
    assert (workflow.status, workflow.state["paused_for"]["kind"]) == ("paused", "stagnation")
    assert [(b["breaker"], b["count"]) for b in events(workflow.pk, "harness.loop_breaker")] == [("no_new_pass", 2)]
    resume(workflow, by="hana")
    assert drive_all(workflow.pk).status == "completed"


def test_identical_tool_calls_end_the_session(harness_approver, mini_schedule):
    """The third identical call ends the session (recorded; compared as the model asked, before the
    engine caps its timeout by the deadline); the next session passes."""
    same = {"tool": "run_command", "input": {"command": "python -c pass", "timeout_seconds": 30}}
    mini_schedule({"F01/1": [same, same, same, write("app.py", APP_GREET)],
                   "F01/2": solve("F01", APP_GREET), "F02/1": solve("F02", APP_BOTH)})
    workflow = launch_approved(harness_approver)
    assert workflow.status == "completed"
    assert [(b["breaker"], b["tool"], b["count"]) for b in events(workflow.pk, "harness.loop_breaker")] == [
        ("repeated_tool_call", "run_command", 3)]
    first = events(workflow.pk, "harness.session_ended")[0]
    assert (first["feature"], first["outcome"], first["turns"]) == ("F01", "repeated_call", 3)


def test_out_of_sessions_pauses_instead_of_failing(harness_approver, mini_schedule):
    """max_sessions=1: after one session the workflow pauses; resume allows max_sessions more."""
    mini_schedule({"F01/1": solve("F01", APP_GREET), "F02/1": solve("F02", APP_BOTH)})
    workflow = launch_approved(harness_approver, max_sessions=1)
    assert (workflow.status, workflow.state["paused_for"]["kind"]) == ("paused", "max_sessions")
    assert "1 coding sessions used" in workflow.reason
    resume(workflow, by="hana")
    workflow = drive_all(workflow.pk)
    assert (workflow.status, workflow.state["session_limit"]) == ("completed", 2)


def test_a_session_out_of_turns_or_time_ends_as_such_and_keeps_its_work(harness_approver, mini_schedule):
    """session_max_turns=3: the session is stopped before a fourth model call (budget_turns); its
    commit stays. session_max_seconds=5: a command is capped by the deadline and the session
    ends as a timeout, not a crash."""
    mini_schedule({
        "F01/1": [write("app.py", APP_GREET), commit("F01: greet"), {"tool": "list_files", "input": {}},
                  request_pass("F01")],
        "F01/2": [SLEEP, SLEEP, SLEEP, SLEEP, request_pass("F01")],
        "F01/3": [request_pass("F01")],
        "F02/1": solve("F02", APP_BOTH),
    })
    workflow = launch_approved(harness_approver, session_max_turns=3, session_max_seconds=5)
    assert workflow.status == "completed", workflow.reason
    ended = events(workflow.pk, "harness.session_ended")
    assert [(e["feature"], e["outcome"], e["crashed_attempts"]) for e in ended[:2]] == [
        ("F01", "budget_turns", 0), ("F01", "timeout", 0)]
    assert [(b["level"], b["what"]) for b in events(workflow.pk, "harness.budget_exhausted")] == [
        ("session", "turns"), ("session", "timeout")]
    command = next(e for e in events(workflow.pk, "tool.called") if e["tool"] == "run_command")
    assert "timed out after" in command["output"]
    assert workflow.state["memory"][0]["outcome"] == "budget_turns"


def test_the_workflow_budget_pauses_and_raising_it_goes_on(harness_approver, mini_schedule):
    """The kernel's total budget (the usage ledger) pauses the workflow at a model call; `agent
    resume` is refused with what to do, and raising the budget resumes it."""
    mini_schedule({"F01/1": solve("F01", APP_GREET), "F02/1": solve("F02", APP_BOTH)})
    wf = launch("harness", goal="Build app.py", params={}, budget_total_usd="0.01")
    workflow = drive_all(wf.pk)
    assert (workflow.status, workflow.pause_cause) == ("paused", "budget")
    with pytest.raises(TransitionRefused, match="budget ran out"):
        resume(wf, by="hana")
    set_budget(wf, total_usd="100", by="hana")
    workflow = drive_all(wf.pk)
    assert (workflow.status, workflow.current_node) == ("waiting", "WAIT_FOR_APPROVAL")
    approve_feature_list(wf.pk, harness_approver)
    assert drive_all(wf.pk).status == "completed"
