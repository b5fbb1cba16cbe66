"""Outbound webhooks with a real worker and beat: a receiver written from
docs/live.md gets every event of the workflows once, verified and in order per workflow, though it
is down for a minute in the middle; the workflows never wait for it."""
from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import pytest
from django.db import connection, transaction

from tests.fakes.webhook_receiver import Receiver
from tests.process.harness import approve, launch_release, wait_until_status
from workflows import clock
from workflows.features.webhooks import services as hooks
from workflows.models import Event, WebhookAttempt, WebhookDelivery
from workflows.services.common import event_record, workflow_lock
from workflows.testing.cluster import wait_for

pytestmark = [pytest.mark.process, pytest.mark.django_db(transaction=True)]

SECRET = "r" * 40
DOWN_SECONDS = 60  # a receiver "down for a minute"


def record(workflow_ids: list[int], count: int) -> None:
    for n in range(count):
        for workflow_id in workflow_ids:
            with transaction.atomic():
                event_record(workflow=workflow_lock(workflow_id), kind="test.tick", at=clock.now(), n=n)
    connection.close()


def test_a_receiver_down_for_a_while_loses_nothing(cluster: Any, git_repo: Path, requester: Any, approver: Any,
                                                   figures: Any) -> None:
    cluster.extra_env.update({
        "AGENTOPS_OUTBOUND_WEBHOOK_TICK_SECONDS": "1", "AGENTOPS_OUTBOUND_WEBHOOK_BACKOFF_SECONDS": "1",
        "AGENTOPS_OUTBOUND_WEBHOOK_BACKOFF_MAX_SECONDS": "4", "AGENTOPS_OUTBOUND_WEBHOOK_TIMEOUT_SECONDS": "2",
        # The test database was flushed, not renumbered: the first event's number follows a hole.
        "AGENTOPS_STREAM_GAP_SECONDS": "2"})
    receiver = Receiver(SECRET).start()
    hooks.webhook_subscription_create(name="all", url=receiver.url, secret=SECRET)
    cluster.start(workers=("w",), beats=("beat",))
    ids = [launch_release(git_repo, requester, f"Ship release notes {n}") for n in range(2)]
    record(ids, 5)

    def received_all() -> bool:
        expected = set(Event.objects.filter(workflow_id__in=ids).values_list("workflow_id", "seq"))
        return {(e["workflow_id"], e["seq"]) for e in receiver.events()} == expected

    wait_until_status(cluster, ids, "waiting", node="WAIT_FOR_APPROVAL", timeout=60)
    cluster.wait_for(received_all, timeout=60, what="the first events at the receiver")

    receiver.stop()
    down_at = time.monotonic()
    record(ids, 10)
    wait_for(lambda: WebhookAttempt.objects.filter(status_code__isnull=True).count() >= 4, timeout=30,
             what="failed attempts while the receiver is down")
    approve(ids[0], approver)  # a workflow goes on to the end meanwhile: nothing waits for the receiver
    wait_until_status(cluster, ids[:1], "completed", timeout=DOWN_SECONDS)
    completed_while_down = time.monotonic() - down_at
    time.sleep(max(0.0, DOWN_SECONDS - (time.monotonic() - down_at)))
    pending = WebhookDelivery.objects.filter(status="pending").count()
    receiver.start()
    up_at = time.monotonic()
    cluster.wait_for(received_all, timeout=60, what="every event after the receiver came back")
    drained = time.monotonic() - up_at
    # The receiver holds the last batch before the worker commits its delivery as delivered.
    wait_for(lambda: not WebhookDelivery.objects.exclude(status="delivered").exists(), timeout=10,
             what="the last delivery recorded as delivered")

    for workflow_id in ids:
        seqs = [e["seq"] for e in receiver.events() if e["workflow_id"] == workflow_id]
        assert seqs == sorted(seqs) == list(range(seqs[0], seqs[-1] + 1))
    assert receiver.bad_signatures == 0
    assert set(WebhookDelivery.objects.values_list("status", flat=True)) == {"delivered"}
    deliveries, attempts = WebhookDelivery.objects.count(), WebhookAttempt.objects.count()
    assert deliveries == len(receiver.handled) and pending >= 20 and attempts > deliveries
    figures("outbound webhooks, receiver down", deliveries=deliveries, attempts=attempts, repeats=receiver.repeats,
            down_s=DOWN_SECONDS, pending_when_back=pending, drained_s=round(drained, 1),
            completed_while_down_s=round(completed_while_down, 1))
    receiver.stop()
