"""The all-workflows cursor (workflows/features/webhooks/feed.py) never passes over an event that will still
commit: a transaction that took a lower event number and holds it open, however long, is waited
for; a rolled-back one is passed as soon as it is gone. Real PostgreSQL transactions on two
connections; the live stream and the outbound webhooks read through the same cursor."""
from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import pytest
from django.db import connection, transaction

from tests.conftest import one_event_kind
from workflows import clock, services
from workflows.features.webhooks import services as hooks
from workflows.features.webhooks.feed import EventFilter, GlobalCursor, latest_event_pk
from workflows.models import WebhookDelivery
from workflows.services.common import event_record, workflow_lock
from workflows.testing import registered

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.usefixtures("rung")]

KIND = "test-event-cursor"
GAP = 0.2


@pytest.fixture(autouse=True)
def kind(settings: Any) -> Iterator[None]:
    settings.AGENTOPS_STREAM_GAP_SECONDS = GAP
    with registered(one_event_kind(KIND)):
        yield


def record(workflow_id: int, kind: str) -> None:
    with transaction.atomic():
        event_record(workflow=workflow_lock(workflow_id), kind=kind, at=clock.now())


@contextmanager
def open_transaction(workflow_id: int, kind: str, *, roll_back: bool = False) -> Iterator[Callable[[], None]]:
    """A transaction on another connection that records an event (taking its number) and stays open
    until the caller lets it end, committed or rolled back."""
    inserted, release = threading.Event(), threading.Event()

    def hold() -> None:
        try:
            with transaction.atomic():
                event_record(workflow=workflow_lock(workflow_id), kind=kind, at=clock.now())
                inserted.set()
                release.wait(30)
                if roll_back:
                    transaction.set_rollback(True)
        finally:
            connection.close()

    thread = threading.Thread(target=hold)
    thread.start()
    assert inserted.wait(10)

    def end() -> None:
        release.set()
        thread.join(10)

    try:
        yield end
    finally:
        end()


def kinds(events: Any) -> list[str]:
    return [event.kind for event in events]


def test_a_transaction_holding_an_earlier_number_past_the_wait_is_still_waited_for() -> None:
    slow, fast = (services.workflow_launch(kind=KIND, goal=g).pk for g in ("slow", "fast"))
    cursor = GlobalCursor(after=latest_event_pk())
    with open_transaction(slow, "test.slow") as end:
        record(fast, "test.fast")
        waited = 0
        while waited < 10 * GAP:  # ten times the wait: the old rule passed the hole after one
            assert cursor.read(EventFilter(), limit=50) == []
            time.sleep(GAP / 2)
            waited += GAP / 2
        assert cursor.hole_waits_on  # it waits on the open transaction, not on the clock
        end()
    assert kinds(cursor.read(EventFilter(), limit=50)) == ["test.slow", "test.fast"]


def test_a_rolled_back_number_is_passed_once_its_transaction_is_gone() -> None:
    gone, fast = (services.workflow_launch(kind=KIND, goal=g).pk for g in ("gone", "fast"))
    cursor = GlobalCursor(after=latest_event_pk())
    with open_transaction(gone, "test.gone", roll_back=True) as end:
        record(fast, "test.fast")
        assert cursor.read(EventFilter(), limit=50) == []
        end()
    time.sleep(GAP * 1.5)
    assert kinds(cursor.read(EventFilter(), limit=50)) == ["test.fast"]


def test_the_outbound_scan_keeps_waiting_across_scans_and_loses_nothing(settings: Any) -> None:
    """Each scan is its own transaction and rebuilds the cursor from the subscription's row: what it
    waits on is kept there (``cursor_hole_waits_on``)."""
    hooks.webhook_subscription_create(name="all", url="http://127.0.0.1:9/hooks", secret="s" * 40)
    slow, fast = (services.workflow_launch(kind=KIND, goal=g).pk for g in ("slow", "fast"))
    with open_transaction(slow, "test.slow") as end:
        record(fast, "test.fast")
        for _ in range(8):
            hooks.webhook_deliveries_scan()
            time.sleep(GAP / 2)
        assert not WebhookDelivery.objects.filter(kind__in=("test.slow", "test.fast")).exists()
        end()
    hooks.webhook_deliveries_scan()
    made = list(WebhookDelivery.objects.filter(kind__in=("test.slow", "test.fast")).order_by("event_id")
                .values_list("kind", flat=True))
    assert made == ["test.slow", "test.fast"]
