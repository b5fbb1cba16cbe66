"""The kernel's own statements (``workflows/sql/``) read and write what they say, on the database
the tests run on: each is called directly here; the services that use them have their own tests."""
from __future__ import annotations

import threading
import time
from datetime import timedelta
from decimal import Decimal

import pytest
from django.db import connection, connections, transaction

from workflows import clock, services
from workflows.models import Activity, Event, UsageEntry, Workflow
from workflows.sql import budgets as sql_budgets
from workflows.sql import db_value, row_get_with, where_params, where_shape
from workflows.sql import server as sql_server
from workflows.sql import slots as sql_slots
from workflows.sql import steering as sql_steering
from workflows.sql import workflow as sql_workflow

pytestmark = pytest.mark.django_db

postgres_only = pytest.mark.skipif("connection.vendor != 'postgresql'")


def launched() -> Workflow:
    return services.workflow_launch(kind="autonomous", goal="Prepare onboarding notes")


def test_seq_take_takes_the_next_numbers_under_the_row_lock() -> None:
    wf = launched()
    with transaction.atomic():
        first = sql_workflow.seq_take(wf.pk, 3)
    assert first == wf.event_seq + 1
    assert Workflow.objects.get(pk=wf.pk).event_seq == wf.event_seq + 3
    assert sql_workflow.seq_take(wf.pk + 1000, 1) is None


@postgres_only
def test_events_with_seq_inserts_them_numbered_or_not_and_nothing_behind_a_failed_fence() -> None:
    wf = launched()
    activity = Activity.objects.filter(workflow=wf).get()
    at = clock.now()
    with transaction.atomic():
        count, _ = sql_workflow.events_with_seq(wf.pk, 2, [(0, "test.a", at, {"n": 0}), (1, "test.b", at, {"n": 1})],
                                                numbered=False)
    assert count == 2
    seq = Workflow.objects.get(pk=wf.pk).event_seq
    assert list(Event.objects.filter(workflow=wf, kind__startswith="test.").values_list("seq", "kind", "data")) == [
        (seq - 1, "test.a", {"n": 0}), (seq, "test.b", {"n": 1})]

    where = {"id": activity.pk, "lease_token": "not its lease"}
    fenced = sql_workflow.fenced_sql(Activity, ("heartbeat_at",), where_shape(where))
    with transaction.atomic():
        count, _ = sql_workflow.events_with_seq(
            wf.pk, 1, [(0, "test.c", at, {})], numbered=False, fenced=fenced,
            fence_params=[wf.pk, db_value(Activity, "heartbeat_at", at), *where_params(Activity, where)])
    assert count == 0, "the fence did not hold: nothing is written"
    assert Workflow.objects.get(pk=wf.pk).event_seq == seq
    assert not Event.objects.filter(workflow=wf, kind="test.c").exists()

    with transaction.atomic():
        count, _ = sql_workflow.events_with_seq(wf.pk, seq + 1, [(seq + 1, "test.d", at, {})], numbered=True,
                                                status=Workflow.Status.COMPLETED)
    assert count == 0, "the row's status is not the one given"
    with transaction.atomic():
        count, _ = sql_workflow.events_with_seq(wf.pk, seq + 1, [(seq + 1, "test.d", at, {})], numbered=True,
                                                status=wf.status, returning=sql_workflow.steer_probe_sql())
    assert count == 1 and Event.objects.get(workflow=wf, kind="test.d").seq == seq + 1


def test_advance_reads_read_the_goal_and_whether_the_workflow_is_steered() -> None:
    wf = launched()
    with transaction.atomic():
        got = row_get_with(Workflow, wf.pk, sql_workflow.advance_reads(), lock=True)
    assert got is not None
    goal, _, _, child_waits_open, steered = got[1]
    assert (goal, bool(child_waits_open), bool(steered)) == ("Prepare onboarding notes", False, False)
    services.workflow_steer(workflow_id=wf.pk, message="Mention the parking", by="ops")
    with transaction.atomic():
        got = row_get_with(Workflow, wf.pk, sql_workflow.advance_reads(), lock=True)
    assert got is not None and bool(got[1][4])


def test_takeable_exists_finds_a_message_no_call_holds() -> None:
    wf = launched()
    activity = Activity.objects.filter(workflow=wf).get()
    assert not sql_steering.takeable_exists(wf.pk, activity.pk, 1)
    services.workflow_steer(workflow_id=wf.pk, message="Mention the parking", by="ops")
    assert sql_steering.takeable_exists(wf.pk, activity.pk, 1)
    other = launched()
    assert not sql_steering.takeable_exists(other.pk, activity.pk, 1), "another workflow's message is not its own"


def test_slots_statements_list_the_waiting_count_the_held_and_grant_only_the_waiting() -> None:
    now = clock.now()
    waiting = [Activity.objects.filter(workflow=launched()).get() for _ in range(3)]
    for n, activity in enumerate(waiting):
        Activity.objects.filter(pk=activity.pk).update(tenant="acme", kind="autonomous", slot_priority=n,
                                                       slot_waiting_since=now - timedelta(seconds=10 - n))
    running = Activity.objects.filter(workflow=launched()).get()
    Activity.objects.filter(pk=running.pk).update(tenant="acme", kind="autonomous", status=Activity.Status.RUNNING)

    heads = sql_slots.waiting_heads(tenant="acme", kind="other", hold=now, per_tenant=2, limit=10)
    by_name = [dict(zip(sql_slots.WAITING_FIELDS, row, strict=True)) for row in heads]
    assert [row["id"] for row in by_name] == [waiting[2].pk, waiting[1].pk], "by priority, at most 2 a tenant"
    assert sql_slots.held_counts(["acme"], ["nothing"], hold=now) == [("acme", "autonomous", 1)]

    granted = sql_slots.grant([waiting[2].pk, running.pk], now=now)
    assert granted == [waiting[2].pk], "a running attempt waits for no slot"
    assert Activity.objects.get(pk=waiting[2].pk).slot_granted_at == now
    assert sql_slots.held_counts(["acme"], [], hold=now - timedelta(seconds=1)) == [("acme", "autonomous", 2)]
    heads = sql_slots.waiting_heads(tenant="acme", kind="", hold=now - timedelta(seconds=1), per_tenant=8, limit=10)
    assert [row[0] for row in heads] == [waiting[1].pk, waiting[0].pk], "one handed a slot in the hold waits no more"


def test_budget_row_lock_reads_the_limits_and_whether_the_key_is_in_the_ledger() -> None:
    wf = launched()
    Workflow.objects.filter(pk=wf.pk).update(budget_total_usd=Decimal("2.5"))
    with transaction.atomic():
        row = sql_budgets.budget_row_lock(wf.pk, "op#1@1.1")
        missing = sql_budgets.budget_row_lock(wf.pk + 1000, "op#1@1.1")
    assert row is not None and missing is None
    total, hourly, _, reserved, parent, has_children = row
    assert (Decimal(str(total)), hourly, bool(reserved), parent, bool(has_children)) == (
        Decimal("2.5"), None, False, None, False)


@postgres_only
def test_reserve_without_limits_writes_only_behind_its_fence_and_once() -> None:
    wf = launched()
    activity = Activity.objects.filter(workflow=wf).get()
    Activity.objects.filter(pk=activity.pk).update(lease_token="lease")
    now = clock.now()
    row = {"workflow": wf.pk, "key": "op#1@1.1", "operation_id": "op", "attempt": 1, "provider": "scripted",
           "model": "m", "reserved_usd": Decimal("0.01"), "created_at": now}
    with transaction.atomic():
        got = sql_budgets.reserve_without_limits(wf.pk, {"heartbeat_at": now},
                                                 {"id": activity.pk, "lease_token": "not its lease"}, row)
    assert got == (False, True, False) and not UsageEntry.objects.exists()
    for expected in ((True, True, True), (True, True, False)):
        with transaction.atomic():
            got = sql_budgets.reserve_without_limits(wf.pk, {"heartbeat_at": now},
                                                     {"id": activity.pk, "lease_token": "lease"}, row)
        assert got == expected
    assert UsageEntry.objects.filter(key="op#1@1.1").count() == 1
    Workflow.objects.filter(pk=wf.pk).update(budget_hourly_usd=Decimal("1"))
    with transaction.atomic():
        got = sql_budgets.reserve_without_limits(wf.pk, {"heartbeat_at": now},
                                                 {"id": activity.pk, "lease_token": "lease"}, {**row, "key": "k2"})
    assert got == (False, False, False), "a workflow with a limit takes the locked way"


def test_server_clock_is_the_servers_and_pinned_to_the_round_trip() -> None:
    before = time.monotonic()
    at, monotonic = sql_server.server_clock()
    assert before <= monotonic <= time.monotonic()
    assert abs((at - clock.now()).total_seconds()) < 5


@postgres_only
@pytest.mark.django_db(transaction=True)
def test_repeatable_read_sets_the_transactions_isolation() -> None:
    with transaction.atomic():
        sql_server.repeatable_read()
        with connection.cursor() as cursor:
            cursor.execute("SHOW transaction_isolation")
            assert cursor.fetchone() == ("repeatable read",)


@postgres_only
def test_open_transaction_ids_are_the_other_sessions_that_hold_one() -> None:
    holding, release, ready = {}, threading.Event(), threading.Event()

    def writer() -> None:
        try:
            with transaction.atomic(), connection.cursor() as cursor:
                cursor.execute("SELECT pg_current_xact_id()::text")
                holding["xid"] = cursor.fetchone()[0]
                ready.set()
                release.wait(10)
        finally:
            connections.close_all()

    thread = threading.Thread(target=writer)
    thread.start()
    try:
        assert ready.wait(10)
        assert holding["xid"] in sql_server.open_transaction_ids()
    finally:
        release.set()
        thread.join(10)
    assert holding["xid"] not in sql_server.open_transaction_ids()
