"""Outbound webhooks in the admin: a subscription added through the service (its
secret never shown), deliveries with their attempts, and a Redeliver button that checks permission."""
from __future__ import annotations

from django.contrib.auth.models import User

from tests.admin.conftest import logged_in, make_staff
from workflows import clock
from workflows.features.webhooks import services as hooks
from workflows.models import WebhookAttempt, WebhookDelivery, WebhookSubscription

SECRET = "k" * 40


def delivery(status: str = "failed") -> WebhookDelivery:
    sub = hooks.webhook_subscription_create(name="ci", url="http://127.0.0.1:9/hook", secret=SECRET)
    row = WebhookDelivery.objects.create(subscription=sub, delivery_id="whd_1", event_id=1, workflow_id=1, seq=1,
                                         kind="workflow.completed", body='{"delivery_id":"whd_1"}', status=status,
                                         attempts=2, next_attempt_at=clock.now(), created_at=clock.now())
    WebhookAttempt.objects.create(delivery=row, number=1, started_at=clock.now(), error="ConnectionRefusedError: x")
    return row


def test_a_subscription_is_added_in_the_admin_and_its_secret_is_not_shown_again(db: None) -> None:
    admin = User.objects.create_superuser("root", password="pw")
    client = logged_in(admin)
    answer = client.post("/admin/workflows/webhooksubscription/add/", {
        "name": "ci", "url": "https://ci.example.com/hook", "secret": SECRET,
        "event_kinds_text": "workflow.completed, workflow.failed", "workflow_kinds_text": "", "launchers_text": "rita"})
    assert answer.status_code == 302, answer.content.decode()[:2000]
    sub = WebhookSubscription.objects.get()
    assert (sub.event_kinds, sub.launchers, sub.secret, sub.created_by) == (
        ["workflow.completed", "workflow.failed"], ["rita"], SECRET, admin)
    page = client.get(f"/admin/workflows/webhooksubscription/{sub.pk}/change/").content.decode()
    assert "https://ci.example.com/hook" in page and SECRET not in page


def test_a_bad_subscription_is_refused_on_the_form(db: None) -> None:
    client = logged_in(User.objects.create_superuser("root", password="pw"))
    answer = client.post("/admin/workflows/webhooksubscription/add/", {
        "name": "ci", "url": "ftp://example.com/x", "secret": SECRET})
    assert answer.status_code == 200
    assert "must be an http or https URL" in answer.content.decode()
    assert not WebhookSubscription.objects.exists()


def test_a_delivery_shows_its_attempts_and_the_redeliver_button_sends_it_again(db: None) -> None:
    row = delivery()
    client = logged_in(make_staff(User.objects.create_user("olga"), "workflows.view_webhookdelivery",
                                  "workflows.change_webhooksubscription"))
    page = client.get(f"/admin/workflows/webhookdelivery/{row.pk}/change/").content.decode()
    assert "ConnectionRefusedError: x" in page and 'id="ao-redeliver"' in page
    answer = client.post(f"/admin/workflows/webhookdelivery/{row.pk}/redeliver/", follow=True)
    assert "Delivery whd_1 will be sent again at once." in answer.content.decode()
    row.refresh_from_db()
    assert (row.status, row.attempts) == ("pending", 2)


def test_redeliver_needs_the_permission(db: None) -> None:
    row = delivery()
    client = logged_in(make_staff(User.objects.create_user("vera"), "workflows.view_webhookdelivery"))
    assert 'id="ao-redeliver"' not in client.get(f"/admin/workflows/webhookdelivery/{row.pk}/change/").content.decode()
    answer = client.post(f"/admin/workflows/webhookdelivery/{row.pk}/redeliver/")
    assert answer.status_code == 403 and "may not redeliver webhooks" in answer.content.decode()
    row.refresh_from_db()
    assert row.status == "failed"
