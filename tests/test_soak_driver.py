"""The soak's driver (``bench.soak``): a person's request that meets a row lock held by a stopped
worker gives up after a bounded wait, so the driver's loop goes on to resume that worker."""
from __future__ import annotations

import threading
import time
from collections import Counter
from types import SimpleNamespace

import pytest
from django.db import connection, transaction

from bench.soak import DRIVER_LOCK_TIMEOUT_MS, Soak
from workflows import services
from workflows.models import Workflow

pytestmark = [
    pytest.mark.skipif(connection.vendor != "postgresql", reason="lock_timeout is PostgreSQL's"),
    pytest.mark.django_db(transaction=True),
]


def test_a_request_behind_a_held_row_lock_is_asked_again_next_tick_and_the_loop_goes_on() -> None:
    workflow = services.workflow_launch(kind="autonomous", goal="Prepare onboarding notes")
    held, release = threading.Event(), threading.Event()

    def stopped_worker() -> None:  # a transaction that keeps the workflow's row lock until released
        try:
            with transaction.atomic():
                Workflow.objects.select_for_update().get(pk=workflow.pk)
                held.set()
                release.wait(30)
        finally:
            connection.close()

    worker = threading.Thread(target=stopped_worker)
    worker.start()
    try:
        assert held.wait(10)
        driver = SimpleNamespace(decisions=Counter(), _drive=lambda: services.workflow_cancel(
            workflow_id=workflow.pk, reason="changed my mind", by="soak"))
        started = time.monotonic()
        Soak._drive_bounded(driver)  # type: ignore[arg-type]
        waited = time.monotonic() - started
        assert driver.decisions == {"waited for a row lock: asked again": 1}
        assert DRIVER_LOCK_TIMEOUT_MS / 1000 <= waited < DRIVER_LOCK_TIMEOUT_MS / 1000 + 5
        assert Workflow.objects.get(pk=workflow.pk).status != Workflow.Status.CANCELLING  # nothing half-done
        with connection.cursor() as cursor:
            cursor.execute("SHOW lock_timeout")
            assert cursor.fetchone()[0] == "0"  # the bound is the driver's alone, lifted after each tick
    finally:
        release.set()
        worker.join(30)
    Soak._drive_bounded(driver)  # type: ignore[arg-type]  # the lock is gone: the request goes through
    assert Workflow.objects.get(pk=workflow.pk).status in (Workflow.Status.CANCELLING, Workflow.Status.CANCELLED)
