"""Outbound webhooks: subscriptions, the scan that turns new events into delivery rows, and the
signed, retried POST of each delivery (docs/live.md, "Outbound webhooks").

Nothing here runs in a workflow's transaction: beat scans the event history after the fact, and
deliveries are sent by their own tasks on the I/O queue, so a slow or dead endpoint never slows a
workflow. At least once: a delivery is retried (backoff from the database, ``next_attempt_at``)
until the receiver answers 2xx. In order per workflow: a delivery is sent only when no earlier one
of the same workflow and subscription is still pending.
"""
from __future__ import annotations

import hashlib
import hmac
import json
import logging
import re
import time
import urllib.error
import urllib.request
import uuid
from collections.abc import Iterable
from datetime import datetime, timedelta
from typing import Any
from urllib.parse import unquote, urlsplit

from django.conf import settings
from django.db import transaction
from django.db.models import Exists, OuterRef, Q

from workflows import clock, doorbells
from workflows.errors import InvalidInput, NotFound
from workflows.features.webhooks.feed import EventFilter, GlobalCursor, event_json, latest_event_pk
from workflows.models import Workflow
from workflows.models.hooks import WebhookAttempt, WebhookDelivery, WebhookSubscription
from workflows.services import lifecycle
from workflows.services.steps import Outcome

logger = logging.getLogger("agentops.webhooks.outbound")

NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,99}$")
MIN_SECRET = 32
SCAN_PAGE = 500
DISPATCH_LIMIT = 200


# --- Subscriptions ---

def webhook_subscription_create(*, name: str, url: str, secret: str, event_kinds: Iterable[str] = (),
                                workflow_kinds: Iterable[str] = (), launchers: Iterable[str] = (),
                                user: Any = None) -> WebhookSubscription:
    """A new subscription, told of the events recorded from now on. Not idempotent: a second call
    with the same name is refused (unique constraint ``uniq_webhook_subscription_name``)."""
    fields = webhook_subscription_checked(name=name, url=url, secret=secret, event_kinds=event_kinds,
                                          workflow_kinds=workflow_kinds, launchers=launchers)
    with transaction.atomic():
        if WebhookSubscription.objects.filter(name=fields["name"]).exists():
            raise InvalidInput(f"A webhook named {fields['name']!r} exists already; remove it first or choose another "
                               "name. Nothing was changed.")
        return WebhookSubscription.objects.create(**fields, created_by=user if getattr(user, "pk", None) else None,
                                                  created_at=clock.now(), cursor=latest_event_pk())


def webhook_subscription_checked(*, name: str, url: str, secret: str, event_kinds: Iterable[str] = (),
                                 workflow_kinds: Iterable[str] = (), launchers: Iterable[str] = ()) -> dict[str, Any]:
    """A subscription's fields, checked and tidied; InvalidInput saying what is wrong."""
    name, url = name.strip(), url.strip()
    if not NAME.match(name):
        raise InvalidInput(f"A webhook's name is 1-100 letters, digits, '_', '.' or '-', starting with a letter or "
                           f"digit; {name[:40]!r} is not. Nothing was changed.")
    parts = urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.hostname or len(url) > 1000:
        raise InvalidInput(f"A webhook's URL must be an http or https URL with a host, at most 1000 characters; "
                           f"{url[:80]!r} is not. Nothing was changed.")
    if len(secret) < MIN_SECRET or len(secret) > 200:
        raise InvalidInput(f"A webhook's secret must be {MIN_SECRET}-200 characters (e.g. `python -c \"import secrets; "
                           "print(secrets.token_urlsafe(32))\"`). Nothing was changed.")
    return {"name": name, "url": url, "secret": secret, "event_kinds": _names(event_kinds, "event kinds"),
            "workflow_kinds": _names(workflow_kinds, "workflow kinds"), "launchers": _names(launchers, "launchers")}


def _names(values: Iterable[str], what: str) -> list[str]:
    names = [v.strip() for v in values if v.strip()]
    wrong = [v for v in names if len(v) > 150 or not v.isprintable()]
    if wrong:
        raise InvalidInput(f"The {what} {wrong[0][:40]!r} is not a name (printable, at most 150 characters). "
                           "Nothing was changed.")
    return names


def webhook_subscription_remove(*, subscription_id: int) -> None:
    """Remove a subscription and its deliveries (pending ones are never sent)."""
    deleted, _ = WebhookSubscription.objects.filter(pk=subscription_id).delete()
    if not deleted:
        raise NotFound(f"Webhook {subscription_id} does not exist; `manage.py agent webhook list` lists them.")


def subscription_json(subscription: WebhookSubscription) -> dict[str, Any]:
    """The JSON of one subscription (its secret never)."""
    counts = {s: subscription.deliveries.filter(status=s).count() for s in WebhookDelivery.Status.values}
    return {"id": subscription.pk, "name": subscription.name, "url": subscription.url,
            "event_kinds": subscription.event_kinds, "workflow_kinds": subscription.workflow_kinds,
            "launchers": subscription.launchers, "active": subscription.active,
            "created_at": subscription.created_at.isoformat(), "deliveries": counts}


def delivery_json(delivery: WebhookDelivery) -> dict[str, Any]:
    return {"id": delivery.pk, "delivery_id": delivery.delivery_id, "subscription_id": delivery.subscription_id,
            "workflow_id": delivery.workflow_id, "seq": delivery.seq, "kind": delivery.kind,
            "status": delivery.status, "attempts": delivery.attempts,
            "next_attempt_at": delivery.next_attempt_at.isoformat() if delivery.status == "pending" else None,
            "last_status_code": delivery.last_status_code, "last_error": delivery.last_error,
            "delivered_at": delivery.delivered_at.isoformat() if delivery.delivered_at else None}


# --- The scan: events → delivery rows ---

def webhook_deliveries_scan() -> int:
    """Make the deliveries of the events recorded since each active subscription's cursor; returns
    how many. Safe to run at once in several processes: each subscription is scanned under its row
    lock (``skip_locked``), and a delivery row is made at most once (``uniq_webhook_delivery_event``)."""
    made = 0
    for subscription_id in WebhookSubscription.objects.filter(active=True).values_list("pk", flat=True):
        made += _scan_one(subscription_id)
    return made


@transaction.atomic
def _scan_one(subscription_id: int) -> int:
    subscription = (WebhookSubscription.objects.select_for_update(skip_locked=True)
                    .filter(pk=subscription_id, active=True).first())
    if subscription is None:
        return 0
    now = clock.now()
    waits_on = subscription.cursor_hole_waits_on
    cursor = GlobalCursor(after=subscription.cursor, monotonic=lambda: clock.now().timestamp(),
                          hole_seen_at=subscription.cursor_hole_since.timestamp()
                          if subscription.cursor_hole_since else None,
                          hole_waits_on=frozenset(waits_on) if waits_on is not None else None)
    event_filter = EventFilter(kinds=tuple(subscription.workflow_kinds), launchers=tuple(subscription.launchers),
                               event_kinds=tuple(subscription.event_kinds))
    events = cursor.read(event_filter, limit=SCAN_PAGE)
    kinds = dict(Workflow.objects.filter(pk__in={e.workflow_id for e in events}).values_list("pk", "kind"))
    rows = []
    for event in events:
        delivery_id = f"whd_{uuid.uuid4().hex}"
        body = {"delivery_id": delivery_id, "webhook": subscription.name,
                "workflow": {"id": event.workflow_id, "kind": kinds.get(event.workflow_id, "")},
                "event": event_json(event)}
        rows.append(WebhookDelivery(subscription=subscription, delivery_id=delivery_id, event_id=event.pk,
                                    workflow_id=event.workflow_id, seq=event.seq, kind=event.kind,
                                    body=json.dumps(body, separators=(",", ":")), next_attempt_at=now,
                                    created_at=now))
    WebhookDelivery.objects.bulk_create(rows, ignore_conflicts=True)
    hole_since = (datetime.fromtimestamp(cursor.hole_seen_at, tz=now.tzinfo)
                  if cursor.hole_seen_at is not None else None)
    WebhookSubscription.objects.filter(pk=subscription.pk).update(
        cursor=cursor.after, cursor_hole_since=hole_since,
        cursor_hole_waits_on=sorted(cursor.hole_waits_on) if cursor.hole_waits_on is not None else None)
    return len(rows)


# --- Sending ---

def webhook_deliveries_dispatch_due(*, subscription_id: int | None = None, workflow_id: int | None = None) -> int:
    """Claim each due delivery that is the oldest pending one of its workflow and subscription, while
    no other delivery of theirs is in flight, and ring its task; returns how many. A claim is a
    conditional UPDATE of ``claimed_until`` (two beats claim a delivery once); a worker that died with
    one lets the claim lapse and beat claims it again. One in flight per workflow and subscription
    keeps them in order even for a redelivery of an old one while a later one is being sent."""
    now = clock.now()
    free = Q(claimed_until__isnull=True) | Q(claimed_until__lt=now)
    same_workflow = WebhookDelivery.objects.filter(subscription_id=OuterRef("subscription_id"),
                                                   workflow_id=OuterRef("workflow_id"),
                                                   status=WebhookDelivery.Status.PENDING)
    earlier = same_workflow.filter(seq__lt=OuterRef("seq"))
    in_flight = same_workflow.exclude(free).exclude(pk=OuterRef("pk"))
    due = WebhookDelivery.objects.filter(free, status=WebhookDelivery.Status.PENDING, next_attempt_at__lte=now,
                                         subscription__active=True).exclude(Exists(earlier)).exclude(Exists(in_flight))
    if subscription_id is not None and workflow_id is not None:
        due = due.filter(subscription_id=subscription_id, workflow_id=workflow_id)
    lease = timedelta(seconds=settings.AGENTOPS_OUTBOUND_WEBHOOK_TIMEOUT_SECONDS + 30)
    rung = 0
    for pk, attempts in due.order_by("next_attempt_at", "pk").values_list("pk", "attempts")[:DISPATCH_LIMIT]:
        with transaction.atomic():
            claimed = WebhookDelivery.objects.filter(free, pk=pk, status=WebhookDelivery.Status.PENDING,
                                                     attempts=attempts).update(claimed_until=now + lease)
            if claimed:
                doorbells.webhook_deliver(delivery_id=pk, attempt=attempts + 1)
                rung += 1
    return rung


def webhook_delivery_send_if_claimed(*, delivery_id: int, attempt: int) -> Outcome:
    """POST the delivery, signed, and record the answer; then ring the workflow's next one.

    A no-op unless the delivery is pending, claimed and at ``attempt - 1`` attempts (a duplicate
    doorbell finds it recorded); the record is a conditional UPDATE on the same, so a late
    finisher whose claim lapsed and was taken over records nothing. Sent outside any transaction.
    """
    delivery = WebhookDelivery.objects.select_related("subscription").filter(pk=delivery_id).first()
    if (delivery is None or delivery.status != WebhookDelivery.Status.PENDING or delivery.attempts != attempt - 1
            or delivery.claimed_until is None):
        return Outcome.NOT_RUNNABLE
    started, started_at = time.monotonic(), clock.now()
    status_code, error = post_signed(delivery.subscription, delivery)
    duration_ms = int((time.monotonic() - started) * 1000)
    ok = status_code is not None and 200 <= status_code < 300
    now = clock.now()
    answer = {"attempt": attempt, "status_code": status_code, "error": error}
    failed = not ok and attempt >= settings.AGENTOPS_OUTBOUND_WEBHOOK_MAX_ATTEMPTS
    this_attempt = WebhookDelivery.objects.filter(pk=delivery.pk, attempts=attempt - 1)
    with transaction.atomic():
        if ok:
            recorded = lifecycle.rows_move(this_attempt, "deliver", **answer, at=now)
        elif failed:
            recorded = lifecycle.rows_move(this_attempt, "fail", **answer)
        else:
            recorded = lifecycle.rows_move(this_attempt, "retry", **answer,
                                           next_attempt_at=now + timedelta(seconds=backoff_seconds(attempt)))
        if not recorded:
            return Outcome.ALREADY_APPLIED
        WebhookAttempt.objects.create(delivery=delivery, number=attempt, started_at=started_at,
                                      duration_ms=duration_ms, status_code=status_code, error=error[:500])
    log = logger.info if ok else logger.warning
    log("webhook.outbound." + ("delivered" if ok else "failed"),
        extra={"delivery": delivery.delivery_id, "webhook": delivery.subscription.name, "attempt": attempt,
               "status": status_code, "error": error[:200]})
    if ok or failed:
        # The next delivery of this workflow need not wait for beat's next tick.
        webhook_deliveries_dispatch_due(subscription_id=delivery.subscription_id, workflow_id=delivery.workflow_id)
    return Outcome.APPLIED


def backoff_seconds(attempt: int) -> float:
    """The wait after failed attempt ``attempt`` (1, 2, …): the base doubled each time, capped."""
    return float(min(settings.AGENTOPS_OUTBOUND_WEBHOOK_BACKOFF_SECONDS * 2 ** (attempt - 1),
                     settings.AGENTOPS_OUTBOUND_WEBHOOK_BACKOFF_MAX_SECONDS))


class _NoRedirects(urllib.request.HTTPRedirectHandler):
    def redirect_request(self, *args: Any, **kwargs: Any) -> None:
        return None  # a 3xx is an answer that is not 2xx: the delivery is retried, never re-aimed


_opener = urllib.request.build_opener(_NoRedirects)


def signature_headers(secret: str, *, delivery_id: str, url: str, body: bytes, timestamp: int) -> dict[str, str]:
    """The headers of signature scheme v2 (README, "Webhooks"), over the URL's percent-decoded path."""
    from workflows.features.webhooks.inbound import DELIVERY_HEADER, SIGNATURE_HEADER, TIMESTAMP_HEADER, signed_message

    path = unquote(urlsplit(url).path) or "/"
    message = signed_message(timestamp=str(timestamp), delivery=delivery_id, method="POST", path=path, body=body)
    signature = hmac.new(secret.encode(), message, hashlib.sha256).hexdigest()
    return {TIMESTAMP_HEADER: str(timestamp), DELIVERY_HEADER: delivery_id, SIGNATURE_HEADER: f"v2={signature}"}


def post_signed(subscription: WebhookSubscription, delivery: WebhookDelivery) -> tuple[int | None, str]:
    """POST one delivery; its HTTP status (None when no answer came) and what went wrong, if anything."""
    body = delivery.body.encode()
    headers = {"Content-Type": "application/json", "User-Agent": "agentops-webhooks/1",
               "X-Agentops-Event": delivery.kind, "X-Agentops-Redelivery": str(delivery.redeliveries),
               **signature_headers(subscription.secret, delivery_id=delivery.delivery_id, url=subscription.url,
                                   body=body, timestamp=int(clock.now().timestamp()))}
    request = urllib.request.Request(subscription.url, data=body, headers=headers, method="POST")
    try:
        with _opener.open(request, timeout=settings.AGENTOPS_OUTBOUND_WEBHOOK_TIMEOUT_SECONDS) as answer:
            return int(answer.status), ""
    except urllib.error.HTTPError as exc:
        return exc.code, f"HTTP {exc.code}: {exc.read(300).decode(errors='replace')}"
    except (OSError, ValueError) as exc:
        reason = exc.reason if isinstance(exc, urllib.error.URLError) else exc  # "Connection refused", not a wrapper
        return None, f"{type(reason).__name__}: {reason}"


def webhook_delivery_redeliver(*, delivery_id: int) -> Outcome:
    """Send a delivered or failed delivery again (same delivery id and body), at once, counted in its
    ``X-Agentops-Redelivery`` header: the workflow's later events may have gone before it, and the
    workflow's deliveries made from now on wait for it. ALREADY_APPLIED when it is pending anyway (a
    conditional UPDATE on its status)."""
    if not WebhookDelivery.objects.filter(pk=delivery_id).exists():
        raise NotFound(f"Webhook delivery {delivery_id} does not exist.")
    again = lifecycle.rows_move(WebhookDelivery.objects.filter(pk=delivery_id), "redeliver", at=clock.now())
    return Outcome.APPLIED if again else Outcome.ALREADY_APPLIED


def webhooks_deliver_due() -> int:
    """The beat job: scan for new events, then ring every due delivery."""
    webhook_deliveries_scan()
    return webhook_deliveries_dispatch_due()
