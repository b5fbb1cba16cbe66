"""Budgets are durable: reservations under the row lock, hourly deferral, total exhaustion pauses."""
from __future__ import annotations

import threading
from datetime import timedelta
from decimal import Decimal

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext

from tests.conftest import drive, open_approval, release_params, write_while_held
from workflows import clock, selectors, services
from workflows.activity_context import ActivityContext, LeaseLost
from workflows.errors import BudgetDeferred, BudgetExhausted, InvalidInput, TransitionRefused
from workflows.models import Activity, Event, UsageEntry, Workflow
from workflows.services.activities import DatabaseLease
from workflows.services.common import workflow_lock
from workflows.sql import RowWrite

pytestmark = pytest.mark.django_db


def launch(repo, **budget) -> Workflow:
    return services.workflow_launch(kind="release", goal="Ship the notes", params=release_params(repo),
                                    options=services.LaunchOptions(**budget))


def reserve(workflow: Workflow, key: str, usd: str) -> bool:
    return services.budget_reserve_ensure(workflow_id=workflow.pk, key=key, operation_id=key.split("#")[0],
                                          provider="scripted", model="scripted/m", estimate_usd=Decimal(usd))


def test_hourly_deferral_waits_until_enough_of_the_last_hour_ages_out(git_repo, time_machine):
    """Spend 0.4 at t0, t0+10m and t0+20m under a 1.20/h limit: at t0+30m a 0.50 call must wait
    until t0+10m's entry leaves the window, at t0+70m, 40 minutes from now."""
    t0 = clock.now().replace(microsecond=0)
    time_machine.move_to(t0, tick=False)
    workflow = launch(git_repo, budget_hourly_usd=Decimal("1.20"))
    for minutes in (0, 10, 20):
        time_machine.move_to(t0 + timedelta(minutes=minutes), tick=False)
        reserve(workflow, f"op{minutes}#0", "0.40")
    time_machine.move_to(t0 + timedelta(minutes=30), tick=False)

    with pytest.raises(BudgetDeferred, match="waits until") as excinfo:
        reserve(workflow, "late#0", "0.50")
    assert excinfo.value.retry_after_seconds == 40 * 60
    assert not UsageEntry.objects.filter(key="late#0").exists()


def test_priority_nine_passes_the_hourly_limit_but_never_the_total(git_repo):
    workflow = launch(git_repo, budget_hourly_usd=Decimal("0.10"), budget_total_usd=Decimal("1.00"), priority=9)
    reserve(workflow, "a#0", "0.60")
    with pytest.raises(BudgetExhausted, match="has used 0.6000 of its 1.0000 USD"):
        reserve(workflow, "b#0", "0.50")


def test_a_repeated_reservation_and_charge_count_once(git_repo):
    """Recording the same request again (same ledger key) finds its row: one row, one charge."""
    workflow = launch(git_repo, budget_total_usd=Decimal("1.00"))
    assert reserve(workflow, "op#0", "0.50") is True
    assert reserve(workflow, "op#0", "0.50") is False
    assert UsageEntry.objects.filter(key="op#0").count() == 1
    usage = {"input_tokens": 100, "output_tokens": 10, "cache_read_tokens": 0, "cache_write_tokens": 0}
    assert services.budget_charge_once(key="op#0", cost_usd=Decimal("0.02"), usage=usage) is True
    assert services.budget_charge_once(key="op#0", cost_usd=Decimal("0.02"), usage=usage) is False
    assert selectors.spent_usd(workflow) == Decimal("0.02")
    assert UsageEntry.objects.filter(workflow=workflow).count() == 1


@pytest.mark.django_db(transaction=True)
def test_two_workers_racing_for_the_last_dollars_reserve_at_most_the_budget(git_repo):
    """Twenty rounds of two threads reserving 0.60 of a 1.00 budget at once: one wins each round."""
    for round_ in range(20):
        workflow = launch(git_repo, budget_total_usd=Decimal("1.00"))
        barrier = threading.Barrier(2)
        outcomes: list[str] = []

        def race(name: str, workflow_id: int = workflow.pk, barrier: threading.Barrier = barrier,
                 outcomes: list[str] = outcomes) -> None:
            try:
                barrier.wait()
                services.budget_reserve_ensure(workflow_id=workflow_id, key=f"{name}#0", operation_id=name,
                                               provider="scripted", model="m", estimate_usd=Decimal("0.60"))
                outcomes.append("reserved")
            except BudgetExhausted:
                outcomes.append("exhausted")
            finally:
                connection.close()

        threads = [threading.Thread(target=race, args=(f"r{round_}w{i}",)) for i in range(2)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(timeout=30)
        assert sorted(outcomes) == ["exhausted", "reserved"], f"round {round_}: {outcomes}"
        assert selectors.spent_usd(workflow) == Decimal("0.60")


def test_total_exhaustion_pauses_the_workflow_and_a_raise_resumes_it(git_repo, deploy_target, approver):
    """The proposal call does not fit: the workflow pauses with the reason and the command to fix it,
    the attempt is given back, nothing runs while paused, and a budget raise carries on."""
    workflow = drive(launch(git_repo, budget_total_usd=Decimal("0.001")).pk)
    assert workflow.status == "paused"
    assert f"manage.py agent budget {workflow.pk} --total USD" in workflow.reason
    propose = Activity.objects.get(workflow=workflow, name="propose_change")
    assert (propose.status, propose.max_attempts - propose.attempt) == ("scheduled", 4)
    assert services.activity_run_if_runnable(activity_id=propose.pk) == services.RunOutcome.SKIPPED
    with pytest.raises(TransitionRefused, match="paused because its budget ran out"):
        services.workflow_resume(workflow_id=workflow.pk)

    services.workflow_budget_set(workflow_id=workflow.pk, user=approver, total_usd=Decimal("5"))
    workflow = drive(workflow.pk)
    assert (workflow.status, workflow.current_node) == ("waiting", "WAIT_FOR_APPROVAL")
    changed = Event.objects.get(workflow=workflow, kind="budget.changed")
    assert changed.data["by"] == "alice" and changed.data["new"]["total"] == "5"
    assert Decimal(0) < selectors.spent_usd(workflow) <= Decimal(5)
    assert open_approval(workflow.pk)


def test_hourly_limit_defers_the_activity_without_using_an_attempt(git_repo, deploy_target):
    """With the hour nearly spent, the proposal call is deferred to when the earlier spend ages out:
    a stored retry window, and the attempt is given back."""
    workflow = launch(git_repo, budget_hourly_usd=Decimal("0.05"))
    reserve(workflow, "earlier#0", "0.04")
    earlier = UsageEntry.objects.get(key="earlier#0")
    drive(workflow.pk)

    propose = Activity.objects.get(workflow=workflow, name="propose_change")
    assert (propose.status, propose.attempt, propose.max_attempts) == ("scheduled", 1, 5)
    assert abs(propose.next_attempt_at - (earlier.created_at + timedelta(hours=1))) < timedelta(seconds=1)
    assert "waits until" in propose.error
    assert Event.objects.filter(workflow=workflow, kind="activity.deferred").count() == 1
    assert services.activities_redrive_due() == 0


@pytest.mark.parametrize("field", ["budget_total_usd", "budget_hourly_usd"])
def test_budgets_must_be_positive(git_repo, field):
    with pytest.raises(InvalidInput, match="must be a positive amount of USD"):
        launch(git_repo, **{field: Decimal("-1")})
    assert not Workflow.objects.exists()


USAGE = {"input_tokens": 100, "output_tokens": 10, "cache_read_tokens": 0, "cache_write_tokens": 0}


def test_each_request_has_its_own_key_and_a_retried_call_is_checked_again(git_repo):
    """The same logical call made by attempt 2 (after attempt 1 went silent) is a new request: a
    new row, checked against the budget, refused when it does not fit beside the uncertain one."""
    workflow = launch(git_repo, budget_total_usd=Decimal("1.00"))
    first = services.usage_key(operation_id="op", call=0, attempt=1, request=0)
    retry = services.usage_key(operation_id="op", call=0, attempt=2, request=0)
    assert (first, retry) == ("op#0@1.0", "op#0@2.0")
    reserve(workflow, first, "0.60")
    assert services.budget_uncertain_once(key=first, reason="read timeout") is True
    assert services.budget_uncertain_once(key=first, reason="read timeout") is False
    with pytest.raises(BudgetExhausted, match="has used 0.6000 of its 1.0000 USD"):
        reserve(workflow, retry, "0.60")
    assert selectors.spent_usd(workflow) == Decimal("0.60")
    assert selectors.spend_summary(workflow)["uncertain_usd"] == "0.600000"


def test_released_requests_count_nothing_and_a_late_answer_settles_an_uncertain_one(git_repo):
    """A 429 is released (not billed); an uncertain request whose usage becomes known is charged
    once with its real cost, however often that is recorded."""
    workflow = launch(git_repo, budget_total_usd=Decimal("1.00"))
    reserve(workflow, "op#0@1.0", "0.50")
    reserve(workflow, "op#0@1.1", "0.50")
    assert services.budget_release_once(key="op#0@1.0", reason="answered 429", http_status=429) is True
    assert services.budget_release_once(key="op#0@1.0", reason="answered 429", http_status=429) is False
    services.budget_uncertain_once(key="op#0@1.1", reason="dropped connection")
    assert selectors.spent_usd(workflow) == Decimal("0.50")
    assert services.budget_charge_once(key="op#0@1.1", cost_usd=Decimal("0.03"), usage=USAGE) is True
    assert services.budget_charge_once(key="op#0@1.1", cost_usd=Decimal("0.03"), usage=USAGE) is False
    assert services.budget_charge_once(key="op#0@1.0", cost_usd=Decimal("0.03"), usage=USAGE) is False
    assert selectors.spent_usd(workflow) == Decimal("0.03")
    statuses = dict(UsageEntry.objects.filter(workflow=workflow).values_list("key", "status"))
    assert statuses == {"op#0@1.0": "released", "op#0@1.1": "charged"}


def test_the_lease_sweep_turns_a_dead_attempts_reservation_uncertain(settings, tmp_path):
    """A worker killed mid-call leaves its request reserved; once the lease sweep has reaped the
    attempt the reservation is uncertain (still counted); a running attempt's is left alone."""
    settings.AGENTOPS_WORKSPACE_DIR = tmp_path
    workflow = services.workflow_launch(kind="autonomous", goal="Write notes")
    services.workflow_advance_if_runnable(workflow_id=workflow.pk)
    activity = Activity.objects.get(workflow=workflow, name="plan_tasks")
    claim = services.activity_claim_if_runnable(activity_id=activity.pk, worker="w1", task_id="t1")
    assert claim is not None
    key = services.usage_key(operation_id=claim.operation_id, call=0, attempt=claim.attempt, request=0)
    services.budget_reserve_ensure(workflow_id=workflow.pk, key=key, operation_id=claim.operation_id,
                                   attempt=claim.attempt, provider="scripted", model="scripted/m",
                                   estimate_usd=Decimal("0.02"))
    services.leases_reap_expired()
    assert UsageEntry.objects.get(key=key).status == "reserved", "the attempt still runs"

    Activity.objects.filter(pk=activity.pk).update(lease_expires_at=clock.now() - timedelta(seconds=1))
    assert services.leases_reap_expired() == 1
    entry = UsageEntry.objects.get(key=key)
    assert (entry.status, entry.amount_usd) == ("uncertain", Decimal("0.02"))
    assert "attempt that sent it stopped" in entry.outcome
    assert selectors.spent_usd(workflow) == Decimal("0.02")


def running_attempt(tmp_path, settings, **budget):
    settings.AGENTOPS_WORKSPACE_DIR = tmp_path
    workflow = services.workflow_launch(kind="autonomous", goal="Write notes", options=services.LaunchOptions(**budget))
    services.workflow_advance_if_runnable(workflow_id=workflow.pk)
    activity = Activity.objects.get(workflow=workflow, name="plan_tasks")
    claim = services.activity_claim_if_runnable(activity_id=activity.pk, worker="w1", task_id="t1")
    assert claim is not None
    return workflow, activity, ActivityContext(claim=claim, lease=DatabaseLease())


def key_of(ctx: ActivityContext, request: int) -> str:
    return services.usage_key(operation_id=ctx.operation_id, call=0, attempt=ctx.attempt, request=request)


def reserve_fenced(ctx: ActivityContext, request: int = 0, usd: str = "0.02") -> bool:
    key = key_of(ctx, request)
    return services.budget_reserve_ensure(workflow_id=ctx.workflow_id, key=key, operation_id=ctx.operation_id,
                                          attempt=ctx.attempt, provider="scripted", model="scripted/m",
                                          estimate_usd=Decimal(usd), fence=ctx.fence_of("model call 0"))


def test_a_fenced_reservation_without_budget_limits_is_one_statement_and_fences_like_the_locked_one(
        tmp_path, settings):
    workflow, activity, ctx = running_attempt(tmp_path, settings)
    with CaptureQueriesContext(connection) as statements:
        assert reserve_fenced(ctx) is True
    if connection.vendor == "postgresql":
        assert len(statements.captured_queries) == 1, "the fence, the limits and the reservation in one statement"
    activity.refresh_from_db()
    assert activity.heartbeat_detail == "before model call 0", "the fence extended the lease, as ctx.fence does"
    assert reserve_fenced(ctx) is False, "the same request again: reserved already, changing nothing"
    entry = UsageEntry.objects.get(workflow=workflow)
    assert (entry.status, entry.reserved_usd, entry.attempt, entry.operation_id) == (
        "reserved", Decimal("0.02"), ctx.attempt, ctx.operation_id)

    services.workflow_cancel(workflow_id=workflow.pk, reason="not needed")
    with pytest.raises(LeaseLost, match="model call 0 was not made"):
        reserve_fenced(ctx, request=1)
    assert UsageEntry.objects.filter(workflow=workflow).count() == 1


def test_a_fenced_reservation_under_a_budget_limit_is_checked_under_the_lock(tmp_path, settings):
    """A limit set after the launch (a person changing their mind) applies to the next request."""
    workflow, _, ctx = running_attempt(tmp_path, settings)
    assert reserve_fenced(ctx, request=0, usd="0.40") is True
    Workflow.objects.filter(pk=workflow.pk).update(budget_total_usd=Decimal("0.50"))
    with pytest.raises(BudgetExhausted):
        reserve_fenced(ctx, request=1, usd="0.40")
    assert reserve_fenced(ctx, request=2, usd="0.05") is True
    assert sorted(UsageEntry.objects.filter(workflow=workflow).values_list("key", flat=True)) == [
        services.usage_key(operation_id=ctx.operation_id, call=0, attempt=ctx.attempt, request=n) for n in (0, 2)]


@pytest.mark.django_db(transaction=True)
def test_a_fenced_reservation_waits_for_a_cancel_holding_the_workflow_and_then_sees_it(tmp_path, settings):
    """The reservation takes the workflow's row before the activity's, as every writer does: a
    cancel that holds the workflow's row when the reservation starts, and only then voids the
    activity, is waited for (not deadlocked with), and the reservation sees the void."""
    workflow, _, ctx = running_attempt(tmp_path, settings)
    cancelled, reserved = write_while_held(
        lambda: workflow_lock(workflow.pk), lambda: reserve_fenced(ctx),
        then=lambda: services.workflow_cancel(workflow_id=workflow.pk, reason="not needed").outcome.value)

    assert cancelled == "applied", cancelled
    assert isinstance(reserved, LeaseLost) and "was not made" in str(reserved), reserved
    assert not UsageEntry.objects.filter(workflow=workflow).exists()


def test_a_calls_charge_and_its_note_are_one_statement_and_the_charge_holds_when_the_note_is_fenced_off(
        tmp_path, settings):
    """A model call's charge rides on its model.called note (``ctx.note_with``); the provider billed
    the request whether or not the attempt still holds its lease, so a note fenced off by a cancel
    writes nothing but the charge."""
    workflow, activity, ctx = running_attempt(tmp_path, settings)
    usage = {"input_tokens": 120, "output_tokens": 30, "cache_read_tokens": 0, "cache_write_tokens": 0,
             "cache_write_1h_tokens": 0}

    def charge(request: int) -> RowWrite:
        assert reserve_fenced(ctx, request=request) is True
        return services.budget_charge_write(key=key_of(ctx, request), cost_usd=Decimal("0.0012"), usage=usage,
                                            request_id=f"req_{request}")

    first = charge(0)
    before = Activity.objects.get(pk=activity.pk).lease_expires_at
    with CaptureQueriesContext(connection) as statements:
        ctx.note_with(first, "model.called", call=0)
    if connection.vendor == "postgresql":
        assert len(statements.captured_queries) == 1, "the charge, the fence and the note in one statement"
    assert Activity.objects.get(pk=activity.pk).lease_expires_at > before, "a note extends the lease"
    second = charge(1)
    services.workflow_cancel(workflow_id=workflow.pk, reason="not needed")
    with pytest.raises(LeaseLost):
        ctx.note_with(second, "model.called", call=1)

    entries = UsageEntry.objects.filter(workflow=workflow).order_by("key")
    assert [(e.status, e.cost_usd, e.request_id, e.input_tokens) for e in entries] == [
        ("charged", Decimal("0.0012"), "req_0", 120), ("charged", Decimal("0.0012"), "req_1", 120)]
    noted = Event.objects.filter(workflow=workflow, kind="model.called").values_list("data__call", flat=True)
    assert list(noted) == [0], "the fenced-off note wrote nothing but its charge"
