"""The statements built from the models' metadata (``workflows/sql/__init__.py``) read and write
what the ORM would."""
from __future__ import annotations

import threading
import time
from datetime import UTC, datetime

import pytest
from django.apps import apps
from django.db import connection, connections, transaction
from django.db.transaction import TransactionManagementError
from django.test.utils import CaptureQueriesContext
from django_fsm import ConcurrentTransition

from workflows import clock, services
from workflows.errors import NotFound
from workflows.models import Activity, ActivityAttempt, BehavioralRelease, Event, ProgressSample, Workflow
from workflows.services.common import event_record, events_append, events_batched, workflow_lock, workflow_save
from workflows.sql import (
    RowWrite,
    _db_value,
    row_get,
    row_insert_unless_exists,
    row_insert_with,
    row_update_then,
    row_update_then_select,
)

pytestmark = pytest.mark.django_db

SAMPLES = ("a value", 7, True, datetime(2026, 12, 3, 4, 50, tzinfo=UTC), None)


def test_a_value_on_a_fast_path_is_what_the_field_would_store() -> None:
    checked = 0
    for model in apps.get_models():
        for field in model._meta.concrete_fields:
            for value in SAMPLES:
                try:
                    expected = field.get_db_prep_save(value, connection)
                except Exception:  # noqa: BLE001 - a value the field refuses: nothing to compare
                    continue
                got = _db_value(field, value)  # an adapter (Jsonb, Int8) compares by its repr
                assert (type(got), repr(got)) == (type(expected), repr(expected)), (model.__name__, field.name)
                checked += 1
    assert checked > 100


def test_row_get_loads_the_workflow_and_its_release_as_the_orm_does() -> None:
    pk = services.workflow_launch(kind="autonomous", goal="Prepare onboarding notes").pk
    expected = Workflow.objects.select_related("release").get(pk=pk)
    with transaction.atomic():
        loaded = row_get(Workflow, pk, lock=True, related="release")
    assert loaded is not None
    for field in Workflow._meta.concrete_fields:
        assert getattr(loaded, field.attname) == getattr(expected, field.attname), field.name
    assert loaded.release.fingerprint == expected.release.fingerprint
    assert loaded.status_as_read == expected.status
    assert row_get(Workflow, pk + 1000) is None
    activity = Activity.objects.filter(workflow_id=pk).first()
    assert activity is not None
    got = row_get(Activity, activity.pk)
    assert got is not None and (got.input, got.next_attempt_at) == (activity.input, activity.next_attempt_at)


@pytest.mark.django_db(transaction=True)
def test_row_get_locks_only_inside_a_transaction() -> None:
    pk = services.workflow_launch(kind="autonomous", goal="Prepare onboarding notes").pk
    with pytest.raises(TransactionManagementError):
        row_get(Workflow, pk, lock=True)


def test_a_save_after_another_transaction_moved_the_status_refuses_and_writes_nothing() -> None:
    pk = services.workflow_launch(kind="autonomous", goal="Prepare onboarding notes").pk
    with transaction.atomic():
        workflow = workflow_lock(pk)
        Workflow.objects.filter(pk=pk).update(status="paused")  # another writer, as the check sees it
        workflow.priority = 9
        with pytest.raises(ConcurrentTransition, match="no longer running"):
            workflow_save(workflow, "priority", at=clock.now())
    assert Workflow.objects.values_list("priority", flat=True).get(pk=pk) != 9


def test_events_appended_take_the_next_numbers_and_a_missing_workflow_changes_nothing() -> None:
    pk = services.workflow_launch(kind="autonomous", goal="Prepare onboarding notes").pk
    before = Workflow.objects.values_list("event_seq", flat=True).get(pk=pk)
    now = clock.now()
    events_append(pk, [("test.one", now, {"n": 1}), ("test.two", now, {"n": 2, "text": "it's \"quoted\""})])
    assert list(Event.objects.filter(workflow_id=pk, seq__gt=before).order_by("seq").values_list(
        "seq", "kind", "data")) == [(before + 1, "test.one", {"n": 1}),
                                     (before + 2, "test.two", {"n": 2, "text": "it's \"quoted\""})]
    assert Workflow.objects.values_list("event_seq", flat=True).get(pk=pk) == before + 2
    with pytest.raises(NotFound):
        events_append(pk + 1000, [("test.one", now, {})])
    assert not Event.objects.filter(workflow_id=pk + 1000).exists()


def test_a_batch_of_events_is_written_with_the_workflows_sequence_in_one_statement() -> None:
    pk = services.workflow_launch(kind="autonomous", goal="Prepare onboarding notes").pk
    now = clock.now()
    with transaction.atomic():
        workflow = workflow_lock(pk)
        before = workflow.event_seq
        with CaptureQueriesContext(connection) as writes, events_batched(workflow):
            for n in range(3):
                event_record(workflow=workflow, kind="test.batched", at=now, n=n, text="it's \"quoted\"")
    assert len(writes.captured_queries) == (1 if connection.vendor == "postgresql" else 2)
    assert list(Event.objects.filter(workflow_id=pk, seq__gt=before).order_by("seq").values_list(
        "seq", "kind", "data")) == [(before + n + 1, "test.batched", {"n": n, "text": "it's \"quoted\""})
                                     for n in range(3)]
    assert Workflow.objects.values_list("event_seq", flat=True).get(pk=pk) == before + 3


def test_an_insert_unless_exists_inserts_once_and_then_changes_nothing() -> None:
    workflow = services.workflow_launch(kind="autonomous", goal="Prepare onboarding notes")
    at = clock.now()
    first = ProgressSample(workflow=workflow, operation_id="op-1", percent=40, confidence=0.5,
                           achievements=["a"], created_at=at)

    assert row_insert_unless_exists(first, unique="operation_id") is True
    assert first.pk is not None and not first._state.adding
    stored = ProgressSample.objects.get(operation_id="op-1")
    assert (stored.pk, stored.percent, stored.achievements, stored.remaining) == (first.pk, 40, ["a"], [])

    again = ProgressSample(workflow=workflow, operation_id="op-1", percent=90, confidence=0.9, created_at=at)
    assert row_insert_unless_exists(again, unique="operation_id") is False
    assert again.pk is None
    assert list(ProgressSample.objects.values_list("operation_id", "percent")) == [("op-1", 40)]


def test_an_insert_unless_exists_needs_a_unique_field() -> None:
    workflow = services.workflow_launch(kind="autonomous", goal="Prepare onboarding notes")
    sample = ProgressSample(workflow=workflow, operation_id="op-1", percent=40, confidence=0.5, created_at=clock.now())
    with pytest.raises(TypeError, match="percent is not unique"):
        row_insert_unless_exists(sample, unique="percent")


def test_a_second_write_follows_the_first_only_when_the_first_moved_a_row() -> None:
    first, second = (services.workflow_launch(kind="autonomous", goal=f"Notes {n}") for n in range(2))
    moved = RowWrite(Workflow, {"reason": "moved"}, {"id": first.pk, "status": first.status})
    follows = RowWrite(Workflow, {"reason": "followed"}, {"id": second.pk})

    with CaptureQueriesContext(connection) as writes:
        assert row_update_then(moved, follows) == 1
    assert len(writes.captured_queries) == (1 if connection.vendor == "postgresql" else 2)
    assert dict(Workflow.objects.values_list("pk", "reason")) == {first.pk: "moved", second.pk: "followed"}

    Workflow.objects.filter(pk=second.pk).update(reason="")
    stale = RowWrite(Workflow, {"reason": "moved again"}, {"id": first.pk, "status": "completed"})
    assert row_update_then(stale, follows) == 0
    assert dict(Workflow.objects.values_list("pk", "reason")) == {first.pk: "moved", second.pk: ""}


def test_a_write_and_a_read_after_it_are_one_statement_and_the_read_sees_the_written_row() -> None:
    a, b, c = (services.workflow_launch(kind="autonomous", goal=f"Notes {n}") for n in range(3))
    moved = RowWrite(Workflow, {"reason": "moved"}, {"id": a.pk, "status": a.status})
    follows = RowWrite(Workflow, {"reason": "followed"}, {"id": b.pk})

    with CaptureQueriesContext(connection) as statements:
        rows = row_update_then_select(moved, follows, ("id", "reason"), {"id": (a.pk, c.pk)})
    assert len(statements.captured_queries) == (1 if connection.vendor == "postgresql" else 3)
    assert sorted(rows or []) == [(a.pk, "moved"), (c.pk, "")]
    assert dict(Workflow.objects.values_list("pk", "reason")) == {a.pk: "moved", b.pk: "followed", c.pk: ""}

    elsewhere = RowWrite(Workflow, {"reason": "moved twice"}, {"id": a.pk, "status": a.status})
    assert row_update_then_select(elsewhere, follows, ("id", "reason"), {"id": (c.pk,)}) == [(c.pk, "")]

    stale = RowWrite(Workflow, {"reason": "moved again"}, {"id": a.pk, "status": "completed"})
    assert row_update_then_select(stale, follows, ("id", "reason"), {"id": (a.pk, c.pk)}) is None
    assert Workflow.objects.get(pk=a.pk).reason == "moved twice"


def test_a_row_and_a_row_that_refers_to_it_are_inserted_together() -> None:
    workflow = services.workflow_launch(kind="autonomous", goal="Prepare onboarding notes")
    now = clock.now()
    activity = Activity(workflow=workflow, kind=workflow.kind, name="plan_tasks", node="PLANNING", node_visit=9,
                        intent_version=1, input={"it's": "quoted"}, max_attempts=3, next_attempt_at=now,
                        dispatched_at=now, created_at=now, operation_id="op-with", idempotency_key="key-with")

    with CaptureQueriesContext(connection) as writes:
        row_insert_with(activity, ActivityAttempt, {"number": 1, "lease_token": "t" * 32, "worker": "w",
                                                    "started_at": now}, key="activity")
    assert len(writes.captured_queries) == (1 if connection.vendor == "postgresql" else 2)
    assert activity.pk is not None and not activity._state.adding
    stored = Activity.objects.get(operation_id="op-with")
    assert (stored.pk, stored.input, stored.node_visit, stored.status) == (activity.pk, {"it's": "quoted"}, 9,
                                                                          "scheduled")
    assert list(ActivityAttempt.objects.filter(activity=stored).values_list(
        "number", "lease_token", "worker", "status", "started_at")) == [(1, "t" * 32, "w", "running", now)]


@pytest.mark.django_db(transaction=True)
def test_a_lock_waiting_while_another_transaction_moves_the_release_gets_the_row_and_the_new_release() -> None:
    """The locked row is rechecked against the join once the other transaction commits: the
    workflow's new release, not no row (a release change woke the workflow while a sweep waited)."""
    pk = services.workflow_launch(kind="autonomous", goal="Prepare onboarding notes").pk
    old = Workflow.objects.get(pk=pk).release
    new = BehavioralRelease.objects.create(
        fingerprint="f" * 64, provider=old.provider, model=old.model, prompt_version="prompts-next",
        tool_versions=old.tool_versions, created_at=clock.now())
    locked, got = threading.Event(), {}

    def waiter() -> None:
        try:
            with transaction.atomic():
                locked.wait(10)
                got["row"] = workflow_lock(pk)
        except NotFound as exc:
            got["error"] = exc
        finally:
            connections.close_all()

    with transaction.atomic():
        workflow_lock(pk)
        Workflow.objects.filter(pk=pk).update(release=new)
        thread = threading.Thread(target=waiter)
        thread.start()
        locked.set()
        time.sleep(0.5)  # the waiter is blocked on the row lock
    thread.join(10)
    assert "error" not in got, got
    assert got["row"].release_id == new.pk and got["row"].release.prompt_version == "prompts-next"
