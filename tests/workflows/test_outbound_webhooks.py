"""Outbound webhooks, in-process against a receiver written from docs/live.md:
each subscribed event once, signed, in order per workflow, retried with backoff, failed after the
last attempt, redelivered on request; bad subscriptions refused."""
from __future__ import annotations

import re
from collections.abc import Iterator
from datetime import timedelta
from typing import Any

import pytest
from django.contrib.auth.models import User
from django.db import transaction

from tests.conftest import one_event_kind
from tests.fakes.webhook_receiver import Receiver
from workflows import clock, doorbells, services
from workflows.errors import InvalidInput
from workflows.features.webhooks import services as hooks
from workflows.models import WebhookAttempt, WebhookDelivery, Workflow
from workflows.services.common import event_record, workflow_lock
from workflows.services.steps import Outcome
from workflows.testing import registered

pytestmark = [pytest.mark.django_db, pytest.mark.usefixtures("rung")]

SECRET = "s" * 40
KIND, OTHER_KIND = "test-hooks", "test-hooks-other"


@pytest.fixture(autouse=True)
def kinds(settings: Any) -> Iterator[None]:
    # Rolled-back tests leave holes in the event numbers; test_streams.py tests the wait for holes.
    settings.AGENTOPS_STREAM_GAP_SECONDS = 0
    with registered(one_event_kind(KIND)), registered(one_event_kind(OTHER_KIND)):
        yield


@pytest.fixture
def receiver() -> Iterator[Receiver]:
    r = Receiver(SECRET).start()
    yield r
    r.stop()


@pytest.fixture
def deliveries_rung(monkeypatch: pytest.MonkeyPatch) -> list[tuple[int, int]]:
    calls: list[tuple[int, int]] = []
    monkeypatch.setattr(doorbells, "webhook_deliver", lambda *, delivery_id, attempt: calls.append((delivery_id,
                                                                                                     attempt)))
    return calls


def pump(rung: list[tuple[int, int]]) -> list[Outcome]:
    """What beat and the I/O workers do, until nothing is due."""
    outcomes = []
    for _ in range(100):
        hooks.webhooks_deliver_due()
        if not rung:
            break
        while rung:
            delivery_id, attempt = rung.pop(0)
            outcomes.append(hooks.webhook_delivery_send_if_claimed(delivery_id=delivery_id, attempt=attempt))
    return outcomes


def record(workflow_id: int, kind: str, count: int = 1) -> None:
    for n in range(count):
        with transaction.atomic():
            event_record(workflow=workflow_lock(workflow_id), kind=kind, at=clock.now(), n=n)


def subscribe(receiver: Receiver, **filters: Any) -> Any:
    return hooks.webhook_subscription_create(name="ci", url=receiver.url, secret=SECRET, **filters)


def test_each_subscribed_event_arrives_once_signed_and_in_order(receiver: Receiver,
                                                                 deliveries_rung: list[tuple[int, int]]) -> None:
    rita = User.objects.create_user("rita")
    before = services.workflow_launch(kind=KIND, goal="old", user=rita).pk
    subscribe(receiver, event_kinds=["test.tick", "workflow.launched"], workflow_kinds=[KIND], launchers=["rita"])
    record(before, "test.tick", 2)
    mine = services.workflow_launch(kind=KIND, goal="mine", user=rita).pk
    services.workflow_launch(kind=OTHER_KIND, goal="other kind", user=rita)
    services.workflow_launch(kind=KIND, goal="nobody's")
    record(mine, "test.tick", 3)
    record(mine, "test.ignored")
    pump(deliveries_rung)

    def of(workflow_id: int) -> list[tuple[str, int | None]]:
        return [(e["kind"], e["data"].get("n")) for e in receiver.events() if e["workflow_id"] == workflow_id]

    assert of(before) == [("test.tick", 0), ("test.tick", 1)]
    assert of(mine) == [("workflow.launched", None), ("test.tick", 0), ("test.tick", 1), ("test.tick", 2)]
    seqs = [e["seq"] for e in receiver.events() if e["workflow_id"] == mine]
    assert seqs == sorted(seqs)
    assert receiver.bad_signatures == receiver.repeats == 0 and receiver.requests == 6
    body = next(iter(receiver.handled.values()))
    assert body["webhook"] == "ci" and body["workflow"] == {"id": before, "kind": KIND}
    assert set(WebhookDelivery.objects.values_list("status", flat=True)) == {"delivered"}
    assert pump(deliveries_rung) == [] and WebhookDelivery.objects.count() == 6  # scanned again: nothing new


def test_a_receiver_that_fails_gets_retries_with_backoff_and_the_workflow_order_holds(
    receiver: Receiver, deliveries_rung: list[tuple[int, int]], settings: Any
) -> None:
    settings.AGENTOPS_OUTBOUND_WEBHOOK_BACKOFF_SECONDS = 5
    subscribe(receiver, event_kinds=["test.tick"])
    workflow_id = services.workflow_launch(kind=KIND, goal="g").pk
    receiver.answer_status = 503
    record(workflow_id, "test.tick", 2)
    started = clock.now()
    pump(deliveries_rung)

    first, second = WebhookDelivery.objects.order_by("seq")
    assert (first.status, first.attempts, first.last_status_code) == ("pending", 1, 503)
    assert 5 <= (first.next_attempt_at - started).total_seconds() < 7
    assert second.attempts == 0  # waits behind the first: in order per workflow
    [attempt] = WebhookAttempt.objects.filter(delivery=first)
    assert (attempt.number, attempt.status_code) == (1, 503) and "HTTP 503" in attempt.error

    WebhookDelivery.objects.filter(pk=first.pk).update(next_attempt_at=started)  # the backoff has passed
    pump(deliveries_rung)
    first.refresh_from_db()
    assert (first.attempts, first.next_attempt_at > clock.now() + timedelta(seconds=9)) == (2, True)  # 5 s, then 10

    receiver.answer_status = 200
    WebhookDelivery.objects.filter(pk=first.pk).update(next_attempt_at=started)
    pump(deliveries_rung)
    assert [e["data"]["n"] for e in receiver.events()] == [0, 1]
    assert list(WebhookDelivery.objects.order_by("seq").values_list("status", "attempts")) == [
        ("delivered", 3), ("delivered", 1)]


def test_a_refused_connection_is_retried_and_the_last_attempt_fails_the_delivery_then_redeliver_sends_it(
    receiver: Receiver, deliveries_rung: list[tuple[int, int]], settings: Any
) -> None:
    settings.AGENTOPS_OUTBOUND_WEBHOOK_MAX_ATTEMPTS = 2
    subscribe(receiver, event_kinds=["test.tick"])
    workflow_id = services.workflow_launch(kind=KIND, goal="g").pk
    receiver.stop()
    record(workflow_id, "test.tick", 2)
    for _ in range(2):
        pump(deliveries_rung)
        WebhookDelivery.objects.filter(status="pending").update(next_attempt_at=clock.now() - timedelta(seconds=1))
    first, second = WebhookDelivery.objects.order_by("seq")
    assert (first.status, first.attempts, first.last_status_code) == ("failed", 2, None)
    assert "ConnectionRefusedError" in first.last_error
    assert second.attempts >= 1  # the failed one no longer holds the workflow's next

    receiver.start()
    WebhookDelivery.objects.filter(status="pending").update(next_attempt_at=clock.now() - timedelta(seconds=1))
    assert hooks.webhook_delivery_redeliver(delivery_id=first.pk) == Outcome.APPLIED
    assert hooks.webhook_delivery_redeliver(delivery_id=first.pk) == Outcome.ALREADY_APPLIED
    pump(deliveries_rung)
    assert sorted(e["data"]["n"] for e in receiver.events()) == [0, 1]
    first.refresh_from_db()
    assert (first.status, first.attempts) == ("delivered", 3)


def test_a_redelivery_says_so_and_the_workflows_deliveries_from_then_on_wait_for_it(
    receiver: Receiver, deliveries_rung: list[tuple[int, int]], settings: Any
) -> None:
    """An old delivery sent again comes after the workflow's later events: it carries
    X-Agentops-Redelivery, is never in flight beside another of its workflow, and what the workflow
    records after the redelivery was asked for comes after it."""
    settings.AGENTOPS_OUTBOUND_WEBHOOK_MAX_ATTEMPTS = 1
    subscribe(receiver, event_kinds=["test.tick"])
    workflow_id = services.workflow_launch(kind=KIND, goal="g").pk
    receiver.answer_status = 500
    record(workflow_id, "test.tick")
    pump(deliveries_rung)
    receiver.answer_status = 200
    record(workflow_id, "test.tick")
    pump(deliveries_rung)
    first, second = WebhookDelivery.objects.order_by("seq")
    assert (first.status, second.status) == ("failed", "delivered")

    # The later one is sent again and is in flight when the old one is redelivered: the old one waits.
    hooks.webhook_delivery_redeliver(delivery_id=second.pk)
    hooks.webhook_deliveries_dispatch_due()
    [(in_flight, attempt)] = deliveries_rung
    deliveries_rung.clear()
    hooks.webhook_delivery_redeliver(delivery_id=first.pk)
    record(workflow_id, "test.tick")
    hooks.webhooks_deliver_due()
    assert deliveries_rung == []
    assert hooks.webhook_delivery_send_if_claimed(delivery_id=in_flight, attempt=attempt) == Outcome.APPLIED
    pump(deliveries_rung)

    seqs = [seq for _, seq, _ in receiver.arrivals]
    assert seqs == [second.seq, second.seq, first.seq, second.seq + 1]
    assert [redelivery for _, _, redelivery in receiver.arrivals] == ["0", "1", "1", "0"]


def test_a_duplicate_doorbell_sends_nothing_twice(receiver: Receiver, deliveries_rung: list[tuple[int, int]]) -> None:
    subscribe(receiver, event_kinds=["test.tick"])
    record(services.workflow_launch(kind=KIND, goal="g").pk, "test.tick")
    hooks.webhooks_deliver_due()
    assert hooks.webhooks_deliver_due() == 0  # claimed: not rung again
    [(delivery_id, attempt)] = deliveries_rung
    assert hooks.webhook_delivery_send_if_claimed(delivery_id=delivery_id, attempt=attempt) == Outcome.APPLIED
    assert hooks.webhook_delivery_send_if_claimed(delivery_id=delivery_id, attempt=attempt) == Outcome.NOT_RUNNABLE
    assert receiver.requests == 1


@pytest.mark.parametrize(("fields", "error"), [
    ({"name": "bad name"}, "A webhook's name is 1-100 letters"),
    ({"url": "ftp://example.com/x"}, "must be an http or https URL"),
    ({"secret": "short"}, "secret must be 32-200 characters"),
    ({"event_kinds": ["ok", "bad\nkind"]}, "The event kinds 'bad\\nkind' is not a name (printable"),
])
def test_a_bad_subscription_is_refused_and_nothing_is_made(fields: dict[str, Any], error: str) -> None:
    with pytest.raises(InvalidInput, match=re.escape(error)):
        hooks.webhook_subscription_create(**{"name": "ci", "url": "https://example.com/h", "secret": SECRET, **fields})
    assert not hooks.WebhookSubscription.objects.exists()


def test_a_second_subscription_of_the_same_name_is_refused() -> None:
    hooks.webhook_subscription_create(name="ci", url="https://example.com/h", secret=SECRET)
    with pytest.raises(InvalidInput, match="A webhook named 'ci' exists already"):
        hooks.webhook_subscription_create(name="ci", url="https://example.com/other", secret=SECRET)
    assert Workflow.objects.count() == 0


def test_a_sender_that_died_lets_its_claim_lapse_and_the_delivery_is_sent_again(
    receiver: Receiver, deliveries_rung: list[tuple[int, int]]
) -> None:
    """The worker that claimed it never answered: after the claim lapses beat rings it again, and the
    late first sender, if it comes back, records nothing (the attempts count moved on)."""
    subscribe(receiver, event_kinds=["test.tick"])
    record(services.workflow_launch(kind=KIND, goal="g").pk, "test.tick")
    hooks.webhooks_deliver_due()
    [(delivery_id, attempt)] = deliveries_rung  # the worker that took this doorbell dies
    deliveries_rung.clear()
    assert hooks.webhooks_deliver_due() == 0
    WebhookDelivery.objects.filter(pk=delivery_id).update(claimed_until=clock.now() - timedelta(seconds=1))
    hooks.webhooks_deliver_due()
    assert deliveries_rung == [(delivery_id, attempt)]
    assert hooks.webhook_delivery_send_if_claimed(delivery_id=delivery_id, attempt=attempt) == Outcome.APPLIED
    assert hooks.webhook_delivery_send_if_claimed(delivery_id=delivery_id, attempt=attempt) == Outcome.NOT_RUNNABLE
    assert receiver.requests == 1 and WebhookDelivery.objects.get(pk=delivery_id).status == "delivered"
