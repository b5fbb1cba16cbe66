"""Outbound webhook subscriptions over the API and the command line."""
from __future__ import annotations

import json
from io import StringIO

import pytest
from django.contrib.auth.models import User
from django.core.management import call_command
from django.core.management.base import CommandError

from tests.api.conftest import Http, grant, token_for
from workflows import clock
from workflows.models import WebhookDelivery, WebhookSubscription

pytestmark = pytest.mark.django_db(transaction=True)

SECRET = "k" * 40


def test_a_webhook_is_added_listed_redelivered_and_removed_over_http(http: Http) -> None:
    token = token_for(grant(User.objects.create_user("wendy"), "add_webhooksubscription", "view_webhooksubscription",
                            "change_webhooksubscription", "delete_webhooksubscription").username)
    added = http.post("/webhooks", {"name": "ci", "url": "https://ci.example.com/hook", "secret": SECRET,
                                    "event_kinds": ["workflow.completed"]}, token=token)
    assert added.status == 201, added.body
    assert "secret" not in added.body and added.body["event_kinds"] == ["workflow.completed"]
    assert added.body["deliveries"] == {"pending": 0, "delivered": 0, "failed": 0}
    assert http.get("/webhooks", token=token).body == {"items": [added.body]}

    sub = WebhookSubscription.objects.get()
    row = WebhookDelivery.objects.create(subscription=sub, delivery_id="whd_9", event_id=1, workflow_id=1, seq=1,
                                         kind="workflow.completed", body="{}", status="failed", attempts=20,
                                         next_attempt_at=clock.now(), created_at=clock.now())
    [listed] = http.get(f"/webhooks/{sub.pk}/deliveries?status=failed", token=token).body["items"]
    assert (listed["delivery_id"], listed["status"], listed["attempts"]) == ("whd_9", "failed", 20)
    again = http.post(f"/webhooks/deliveries/{row.pk}/redeliver", token=token)
    assert again.body == {"id": row.pk, "outcome": "applied"}
    assert http.post(f"/webhooks/deliveries/{row.pk}/redeliver", token=token).body["outcome"] == "already_applied"

    assert http.request("DELETE", f"/webhooks/{sub.pk}", token=token).body == {"id": sub.pk, "outcome": "removed"}
    assert not WebhookSubscription.objects.exists() and not WebhookDelivery.objects.exists()


def test_bad_webhook_requests_get_the_error_shape_and_change_nothing(http: Http) -> None:
    token = token_for(grant(User.objects.create_user("wendy"), "add_webhooksubscription").username)
    short = http.post("/webhooks", {"name": "ci", "url": "https://x.example/h", "secret": "short"}, token=token)
    assert short.status == 400 and short.body["error"] == (
        "Bad input, nothing was changed: secret: String should have at least 32 characters.")
    extra = http.post("/webhooks", {"name": "ci", "url": "https://x.example/h", "secret": SECRET, "evnts": []},
                      token=token)
    assert extra.status == 400 and "evnts" in extra.body["error"]
    nobody = token_for(User.objects.create_user("nobody").username)
    assert http.get("/webhooks", token=nobody).status == 403
    assert http.request("DELETE", "/webhooks/999", token=nobody).status == 403
    assert not WebhookSubscription.objects.exists()


def agent(*args: str) -> str:
    out = StringIO()
    call_command("agent", "webhook", *args, stdout=out)
    return out.getvalue()


def test_the_command_line_adds_lists_and_removes_webhooks(db: None) -> None:
    added = json.loads(agent("add", "--name", "ci", "--url", "https://ci.example.com/h", "--secret", SECRET,
                             "--event", "workflow.completed", "--event", "workflow.failed", "--kind", "release",
                             "--json"))
    assert (added["name"], added["event_kinds"], added["workflow_kinds"]) == (
        "ci", ["workflow.completed", "workflow.failed"], ["release"])
    assert [w["name"] for w in json.loads(agent("list", "--json"))] == ["ci"]
    assert json.loads(agent("deliveries", "ci", "--json")) == []
    with pytest.raises(CommandError, match="A webhook named 'ci' exists already") as refused:
        agent("add", "--name", "ci", "--url", "https://ci.example.com/h", "--secret", SECRET)
    assert refused.value.returncode == 2
    with pytest.raises(CommandError, match="No webhook is named 'cd'"):
        agent("remove", "cd")
    assert "Webhook ci removed." in agent("remove", "ci")
    assert not WebhookSubscription.objects.exists()
