"""The failure boundary: a handler that raises never undoes recorded work; it is recorded, retried
with backoff, then paused for a person; a sweep row that raises does not stop the other rows."""
from __future__ import annotations

import contextlib
import importlib
from collections.abc import Callable, Iterator
from datetime import timedelta
from io import StringIO
from typing import Any

import pytest
from django.apps import apps
from django.core.management import call_command
from django.db import connection, transaction
from django.test.utils import CaptureQueriesContext

from workflows import clock, engine, installation, registry, services
from workflows.activity_context import ActivityContext
from workflows.models import Activity, Event, Intent, Wait, Workflow
from workflows.services import Outcome, RunOutcome, sweeps, visits, waits
from workflows.services.common import events_batched, workflow_lock
from workflows.services.workflows import advance_locked
from workflows.testing import registered

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.usefixtures("rung")]

KIND = "test-failure-boundary"
CALLS: list[str] = []  # the external calls of the side-effecting activity


@registry.activity("test_failure_boundary_call")
def side_effect(ctx: ActivityContext, input: dict[str, Any]) -> dict[str, Any]:
    CALLS.append(input["key"])
    return {"call": len(CALLS)}


class Boundary(engine.WorkflowDefinition):
    """CALL runs one side-effecting activity, then AFTER breaks as the goal says (see BREAKS)."""

    kind = KIND
    start_node = "CALL"
    revalidate_node = "CALL"

    @engine.node("CALL")
    def call(self, ctx: engine.NodeContext[Any]) -> engine.Decision:
        if ctx.goal == "at launch":
            ctx.state["missing"]
        return engine.Goto("AFTER", {"receipt": ctx.activity(side_effect, {"key": ctx.goal})})

    @engine.node("AFTER")
    def after(self, ctx: engine.NodeContext[Any]) -> engine.Decision:
        return BREAKS[ctx.goal](ctx)

    @engine.node("DONE")
    def done(self, ctx: engine.NodeContext[Any]) -> engine.Decision:
        return engine.Complete({"receipt": ctx.state["receipt"]})


def _long_role(ctx: engine.NodeContext[Any]) -> engine.Decision:
    ctx.approval(candidate={}, candidate_hash="0" * 64, role="r" * 200, expires_in_seconds=60, state_versions={})
    return engine.Goto("DONE")


def _after_a_signal(ctx: engine.NodeContext[Any]) -> engine.Decision:
    ctx.wait_for_event("go")
    return engine.Goto("DONE", {"x": ctx.state["missing"]})


BREAKS: dict[str, Callable[[engine.NodeContext[Any]], engine.Decision]] = {
    "attribute": lambda ctx: engine.Goto("DONE", {"x": ctx.goal.no_such_method()}),
    "key": lambda ctx: engine.Goto("DONE", {"x": ctx.state["missing"]}),
    "nul": lambda ctx: engine.Goto("DONE", {"note": "a\x00b"}),
    "long role": _long_role,
    "long role, not refused": _long_role,  # the test turns the length check off: the column refuses it
    "after a signal": _after_a_signal,
    "done": lambda ctx: engine.Goto("DONE"),
    "bad goto": lambda ctx: engine.Goto("NO_SUCH_NODE"),
    "bad return": lambda ctx: {"not": "a decision"},  # type: ignore[return-value,arg-type,dict-item]
}


def fixed(ctx: engine.NodeContext[Any]) -> engine.Decision:
    return engine.Goto("DONE")


@pytest.fixture(autouse=True)
def boundary_kind(settings: Any) -> Iterator[None]:
    settings.AGENTOPS_HANDLER_MAX_FAILURES = 3
    CALLS.clear()
    with registered(Boundary, side_effect):
        yield


@pytest.fixture
def frozen(time_machine: Any) -> Any:
    time_machine.move_to(clock.now(), tick=False)
    return time_machine


def launch_and_call(goal: str) -> tuple[Workflow, Activity]:
    """Launch, run the side-effecting activity once; its result's advance runs AFTER."""
    workflow = services.workflow_launch(kind=KIND, goal=goal)
    activity = Activity.objects.get(workflow=workflow, name=side_effect.name)
    assert services.activity_run_if_runnable(activity_id=activity.pk) == RunOutcome.RECORDED
    workflow.refresh_from_db()
    activity.refresh_from_db()
    return workflow, activity


def events(workflow: Workflow, kind: str) -> list[dict[str, Any]]:
    return list(Event.objects.filter(workflow=workflow, kind=kind).order_by("seq").values_list("data", flat=True))


def assert_history_contiguous(workflow: Workflow) -> None:
    seqs = list(Event.objects.filter(workflow=workflow).values_list("seq", flat=True))
    assert seqs == list(range(1, len(seqs) + 1))
    assert Workflow.objects.get(pk=workflow.pk).event_seq == len(seqs)


@pytest.mark.parametrize(("goal", "error_type", "message"), [
    ("attribute", "AttributeError", "'str' object has no attribute 'no_such_method'"),
    ("key", "KeyError", "'missing'"),
    ("nul", "InvalidInput", "State written by node AFTER contains a NUL character"),
    ("long role", "InvalidInput", "whose required_role is 200 characters long; the limit is 150"),
    ("long role, not refused", "DataError", "value too long for type character varying(150)"),
    ("bad goto", "InvalidDecision", "sent the workflow to unknown node 'NO_SUCH_NODE'; the definition's nodes are "
                                    "AFTER, CALL, DONE"),
    ("bad return", "InvalidDecision", "returned {'not': 'a decision'}, not Goto, Complete or Fail"),
])
def test_a_raising_handler_keeps_the_recorded_result_and_retries_later(frozen, monkeypatch, goal, error_type,
                                                                       message):
    """The activity ran once and its result stays recorded; the failure is an event, the workflow
    stays running at the recorded node with a retry time, and a second doorbell runs nothing."""
    if goal.endswith("not refused"):
        monkeypatch.setattr(waits, "wait_check_lengths", lambda workflow, command: None)
    node = "AFTER"
    workflow, activity = launch_and_call(goal)

    assert CALLS == [goal]
    assert (activity.status, activity.result) == ("succeeded", {"call": 1})
    assert (workflow.status, workflow.current_node, workflow.handler_failures) == ("running", "CALL", 1)
    assert workflow.advance_retry_at == clock.now() + timedelta(seconds=30)
    [failure] = events(workflow, "workflow.handler_failed")
    assert (failure["node"], failure["error_type"], failure["failures"]) == (node, error_type, 1)
    assert message in failure["message"]
    assert len(failure["traceback_sha256"]) == 64 and failure["frames"]
    assert f"Advancing failed at node {node} (1 of 3 tries): {error_type}" in workflow.reason
    assert f"`manage.py agent resume {workflow.pk}` tries at once" in workflow.reason
    assert not Wait.objects.filter(workflow=workflow).exists()
    assert_history_contiguous(workflow)
    assert services.activity_run_if_runnable(activity_id=activity.pk) == RunOutcome.SKIPPED
    assert CALLS == [goal]


@pytest.mark.skipif(connection.vendor != "postgresql", reason="counts PostgreSQL's statements")
@pytest.mark.parametrize(("goal", "savepoints"), [("done", 0), ("key", 2)])
def test_a_result_advances_in_its_own_transaction_and_only_a_raising_handler_takes_a_savepoint(goal, savepoints):
    """The advance after a result runs in the result's transaction itself (a savepoint is two
    statements on every activity); when the handler raises, the transaction is done again with
    the savepoint, which keeps the result: the activity ran once, its result is recorded once."""
    workflow = services.workflow_launch(kind=KIND, goal=goal)
    activity = Activity.objects.get(workflow=workflow, name=side_effect.name)
    with CaptureQueriesContext(connection) as queries:
        assert services.activity_run_if_runnable(activity_id=activity.pk) == RunOutcome.RECORDED

    assert sum(q["sql"].startswith(("SAVEPOINT", "RELEASE SAVEPOINT")) for q in queries.captured_queries) == savepoints
    assert sum(q["sql"].startswith('WITH moved AS (UPDATE "workflows_activity"') for q in queries.captured_queries) == (
        1 + bool(savepoints))  # the result's statement, once more in the transaction done again
    assert CALLS == [goal]
    assert len(events(workflow, "activity.succeeded")) == 1
    assert len(events(workflow, "workflow.handler_failed")) == bool(savepoints)
    assert Activity.objects.get(pk=activity.pk).result == {"call": 1}
    assert_history_contiguous(workflow)


def test_a_node_entered_with_the_events_before_a_raising_advance_stays_entered(frozen):
    """A node entry's fields are written with the block's events, when it ends; an advance that
    raises after one, in the same block, rolls back its own savepoint only: the entry stays."""
    workflow, _ = launch_and_call("key")  # at CALL; AFTER's handler raises
    with transaction.atomic():
        locked = workflow_lock(workflow.pk, advance=True)
        with events_batched(locked):
            visits.enter_node(locked, "AFTER", {"receipt": {"call": 1}}, now=clock.now())
            assert advance_locked(locked) == Outcome.HANDLER_FAILED

    workflow.refresh_from_db()
    assert (workflow.current_node, workflow.handler_failures, workflow.state) == ("AFTER", 2, {"receipt": {"call": 1}})
    assert workflow.checkpoint.node == "AFTER"
    assert [e["node"] for e in events(workflow, "node.entered")][-1] == "AFTER"
    assert_history_contiguous(workflow)


def test_failures_back_off_then_pause_and_resume_after_a_fix_completes(frozen, rung, monkeypatch):
    """Retries come from the idle sweep at 30 s, then 60 s; the third failure pauses the workflow
    for a person; resumed after a fix, it completes with the activity's one result."""
    t0 = clock.now()
    workflow, _ = launch_and_call("key")
    rung.clear()
    assert services.workflow_advance_if_runnable(workflow_id=workflow.pk) == Outcome.NOT_RUNNABLE  # before retry
    frozen.move_to(t0 + timedelta(seconds=29), tick=False)
    assert services.workflows_redrive_idle() == 0

    frozen.move_to(t0 + timedelta(seconds=31), tick=False)
    assert services.workflows_redrive_idle() == 1
    assert rung == [("workflow", workflow.pk)]
    assert services.workflow_advance_if_runnable(workflow_id=workflow.pk) == Outcome.HANDLER_FAILED
    workflow.refresh_from_db()
    assert workflow.handler_failures == 2
    assert workflow.advance_retry_at == t0 + timedelta(seconds=31 + 60)
    frozen.move_to(t0 + timedelta(seconds=31 + 45), tick=False)  # idle past the cutoff, not yet its retry time
    assert services.workflows_redrive_idle() == 0

    frozen.move_to(t0 + timedelta(seconds=31 + 61), tick=False)
    assert services.workflows_redrive_idle() == 1
    assert services.workflow_advance_if_runnable(workflow_id=workflow.pk) == Outcome.HANDLER_FAILED
    workflow.refresh_from_db()
    assert (workflow.status, workflow.pause_cause, workflow.handler_failures) == ("paused", "handler_failed", 3)
    assert workflow.advance_retry_at is None
    assert workflow.reason.startswith("Paused: advancing at node AFTER failed 3 times in a row: KeyError")
    assert f"then `manage.py agent resume {workflow.pk}`; or `manage.py agent cancel {workflow.pk}`" in workflow.reason
    assert [e["failures"] for e in events(workflow, "workflow.handler_failed")] == [1, 2, 3]
    assert events(workflow, "workflow.paused") == [{"reason": workflow.reason, "cause": "handler_failed"}]
    frozen.move_to(t0 + timedelta(hours=1), tick=False)
    assert services.workflows_redrive_idle() == 0

    monkeypatch.setitem(BREAKS, "key", fixed)
    assert services.workflow_resume(workflow_id=workflow.pk).outcome == Outcome.APPLIED

    workflow.refresh_from_db()
    assert (workflow.status, workflow.result) == ("completed", {"receipt": {"call": 1}})
    assert (workflow.handler_failures, workflow.pause_cause, workflow.reason) == (0, "", "")
    assert CALLS == ["key"]
    assert_history_contiguous(workflow)


def test_resuming_without_a_fix_records_one_more_failure_and_says_so(frozen, monkeypatch):
    """A resume runs the advance at once with a fresh count: failing again is reported, not raised."""
    workflow, _ = launch_and_call("key")
    Workflow.objects.filter(pk=workflow.pk).update(handler_failures=3)  # as if paused at the cap
    frozen.shift(timedelta(minutes=5))
    workflow = Workflow.objects.get(pk=workflow.pk)

    assert services.workflow_resume(workflow_id=workflow.pk).outcome == Outcome.HANDLER_FAILED

    workflow.refresh_from_db()
    assert (workflow.status, workflow.handler_failures) == ("running", 1)
    assert events(workflow, "workflow.advance_retried") == [{"by": "an operator", "failures": 3}]
    out = StringIO()
    call_command("agent", "show", str(workflow.pk), stdout=out)
    text = " ".join(out.getvalue().split())
    assert "Handler failures: 1 in a row; next try at" in text
    assert "Advancing failed at node AFTER (1 of 3 tries): KeyError" in text


def test_the_doorbell_path_records_a_failure_instead_of_raising(frozen):
    """A signal wakes the workflow; its doorbell's advance raises: recorded, nothing undone."""
    workflow, _ = launch_and_call("after a signal")
    assert workflow.status == "waiting"
    services.workflow_signal(workflow_id=workflow.pk, name="go", payload={"n": 1})

    assert services.workflow_advance_if_runnable(workflow_id=workflow.pk) == Outcome.HANDLER_FAILED

    workflow.refresh_from_db()
    assert (workflow.status, workflow.current_node, workflow.handler_failures) == ("running", "AFTER", 1)
    assert Wait.objects.get(workflow=workflow).status == "satisfied"
    assert [e["error_type"] for e in events(workflow, "workflow.handler_failed")] == ["KeyError"]
    assert CALLS == ["after a signal"]
    assert_history_contiguous(workflow)


@pytest.mark.parametrize("savepoint", [False, True])
def test_a_handler_raising_at_launch_is_recorded_not_raised(frozen, savepoint):
    """The launch commits its workflow with the failure recorded; nothing was scheduled. Also
    inside a caller's transaction (a child's launch is a savepoint of its parent's advance)."""
    with transaction.atomic() if savepoint else contextlib.nullcontext():
        workflow = services.workflow_launch(kind=KIND, goal="at launch")

    workflow.refresh_from_db()
    assert (workflow.status, workflow.handler_failures) == ("running", 1)
    assert [e["node"] for e in events(workflow, "workflow.handler_failed")] == ["CALL"]
    assert not Activity.objects.filter(workflow=workflow).exists()
    assert Intent.objects.filter(workflow=workflow).count() == 1
    assert Workflow.objects.filter(kind=KIND).count() == 1, "the launch done again left no other workflow"
    assert_history_contiguous(workflow)


@pytest.mark.skipif(connection.vendor != "postgresql", reason="counts PostgreSQL's statements")
@pytest.mark.django_db(transaction=True)
def test_a_launch_is_its_rows_and_first_step_in_a_few_statements_and_no_savepoint():
    """The workflow and its goal in one statement, no read of recorded steps (it has none), the
    first advance without a savepoint (done again with one only when the handler raises)."""
    services.workflow_launch(kind=KIND, goal="done")  # the release's row and the installation's id, made once
    installation.installation_id()  # and read back: a process reads it once
    with CaptureQueriesContext(connection) as queries:
        workflow = services.workflow_launch(kind=KIND, goal="done")

    statements = [q["sql"] for q in queries.captured_queries if q["sql"] not in ("BEGIN", "COMMIT")]
    assert not [sql for sql in statements if "SAVEPOINT" in sql]
    assert sum(sql.startswith('WITH new AS (INSERT INTO "workflows_workflow"') for sql in statements) == 1
    assert not [sql for sql in statements if sql.startswith("SELECT") and '"workflows_activity"' in sql]
    assert len(statements) <= 6, statements
    assert Intent.objects.get(workflow=workflow).goal == "done"
    assert Activity.objects.filter(workflow=workflow).count() == 1


def test_a_paused_handler_failure_shows_in_agent_show(frozen, settings):
    """`agent show` names the pause cause and the reason that says what to do."""
    settings.AGENTOPS_HANDLER_MAX_FAILURES = 1
    workflow, _ = launch_and_call("key")
    assert workflow.status == "paused"

    out = StringIO()
    call_command("agent", "show", str(workflow.pk), stdout=out)

    text = " ".join(out.getvalue().split())
    assert "Paused: handler_failed" in text
    assert f"Fix the cause (the workflow.handler_failed events hold the last frames), then `manage.py agent resume " \
           f"{workflow.pk}`" in text


def test_a_new_goal_during_the_backoff_advances_at_once(frozen):
    """A failed advance waits 30 s before the next try; a new goal is a fresh path, taken now."""
    workflow, _ = launch_and_call("key")
    assert workflow.advance_retry_at is not None and workflow.handler_failures == 1

    services.workflow_supersede(workflow_id=workflow.pk, goal="done")

    workflow.refresh_from_db()
    assert (workflow.advance_retry_at, workflow.handler_failures, workflow.reason) == (None, 0, "")
    assert services.workflow_advance_if_runnable(workflow_id=workflow.pk) == Outcome.SUSPENDED
    call = Activity.objects.get(workflow=workflow, status="scheduled")
    assert services.activity_run_if_runnable(activity_id=call.pk) == RunOutcome.RECORDED
    assert Workflow.objects.get(pk=workflow.pk).status == "completed"
    assert CALLS == ["key", "done"]


def test_a_poisoned_row_does_not_stop_the_lease_sweep(frozen, monkeypatch):
    """One row whose reaping raises (a database error, even) is recorded on its workflow and
    skipped; the other expired leases are reaped in the same batch."""
    rows = [services.workflow_launch(kind=KIND, goal="key") for _ in range(3)]
    activities = [Activity.objects.get(workflow=w) for w in rows]
    for row in activities:
        services.activity_claim_if_runnable(activity_id=row.pk, worker="doomed", task_id="")
    frozen.shift(timedelta(minutes=10))
    poisoned = activities[0]
    reap = sweeps.activity_lease_expire_if_due

    def poisoning(*, activity_id: int) -> bool:
        if activity_id == poisoned.pk:
            Workflow.objects.filter(pk=poisoned.workflow_id).update(current_node="N" * 80)  # DataError
        return reap(activity_id=activity_id)

    monkeypatch.setattr(sweeps, "activity_lease_expire_if_due", poisoning)

    assert services.leases_reap_expired() == 2

    statuses = dict(Activity.objects.values_list("pk", "status"))
    assert [statuses[a.pk] for a in activities] == ["running", "scheduled", "scheduled"]
    [failure] = events(rows[0], "sweep.row_failed")
    assert (failure["sweep"], failure["row_id"], failure["error_type"]) == ("reap_leases", poisoned.pk, "DataError")
    assert Workflow.objects.get(pk=poisoned.workflow_id).current_node == "CALL"
    for _ in range(3):  # the same failure on the next ticks is logged, not written to the history again
        assert services.leases_reap_expired() == 0
    assert len(events(rows[0], "sweep.row_failed")) == 1
    monkeypatch.setattr(sweeps, "activity_lease_expire_if_due", reap)
    assert services.leases_reap_expired() == 1


def test_the_migration_sets_the_pause_cause_from_the_reason_prefix(frozen):
    """Paused rows from before the field get their cause from the prefix of their reason."""
    migration = importlib.import_module("workflows.migrations.0003_workflow_handler_failures_pause_cause")
    budget, stagnating, other = (services.workflow_launch(kind=KIND, goal="key") for _ in range(3))
    for workflow, reason in ((budget, "Budget exhausted: workflow 1 has used …"),
                             (stagnating, "Stagnating: no event for 3.0 h. Look at it"), (other, "Something else")):
        Workflow.objects.filter(pk=workflow.pk).update(status="paused", reason=reason, pause_cause="")

    migration.pause_cause_from_reason(apps, None)

    causes = dict(Workflow.objects.values_list("pk", "pause_cause"))
    assert [causes[w.pk] for w in (budget, stagnating, other)] == ["budget", "stagnation", ""]
