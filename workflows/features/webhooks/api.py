"""Outbound webhook subscriptions over the API (docs/live.md, "Outbound webhooks"): the same
services as the admin and `manage.py agent webhook`; a subscription's secret is never shown."""
from __future__ import annotations

from typing import Annotated, Any

from django.http import HttpRequest
from ninja import Field, Path, Query, Router, Schema, Status

from workflows.api.auth import require
from workflows.api.schemas import Body, ErrorOut
from workflows.errors import InvalidInput, NotFound
from workflows.features.webhooks import services as hooks
from workflows.models import WebhookDelivery, WebhookSubscription
from workflows.selectors import MAX_ID

router = Router(tags=["webhooks"])
# A name in a filter: printable, 1-150 characters, no surrounding spaces.
NameText = Annotated[str, Field(pattern=r"^[^\s\x00-\x1f\x7f](?:[^\x00-\x1f\x7f]{0,148}[^\s\x00-\x1f\x7f])?$")]
Json = dict[str, Any]
ERRORS: dict[int, Any] = {400: ErrorOut, 401: ErrorOut, 403: ErrorOut, 404: ErrorOut, 409: ErrorOut}


class WebhookIn(Body):
    name: str = Field(pattern=r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,99}$", description="1-100 letters, digits, '_', '.', "
                      "'-', starting with a letter or digit; unique", examples=["ci-notify"])
    url: str = Field(pattern=r"^https?://[^\s/?#]+[^\s]*$", max_length=1000,
                     description="where deliveries are POSTed (http or https, with a host)",
                     examples=["https://ci.example.com/agentops"])
    secret: str = Field(min_length=32, max_length=200, description="the signing secret, 32-200 characters")
    event_kinds: list[NameText] = Field(default_factory=list, max_length=100,
                                        description="event kinds delivered; empty: all")
    workflow_kinds: list[NameText] = Field(default_factory=list, max_length=100,
                                           description="only workflows of these kinds; empty: all")
    launchers: list[NameText] = Field(default_factory=list, max_length=100,
                                      description="only workflows these users launched; empty: all")


class WebhookOut(Schema):
    id: int
    name: str
    url: str
    event_kinds: list[str]
    workflow_kinds: list[str]
    launchers: list[str]
    active: bool
    created_at: str
    deliveries: dict[str, int] = Field(description="deliveries by status: pending, delivered, failed")


class WebhookList(Schema):
    items: list[WebhookOut]


class DeliveryOut(Schema):
    id: int
    delivery_id: str
    subscription_id: int
    workflow_id: int
    seq: int
    kind: str
    status: str
    attempts: int
    next_attempt_at: str | None
    last_status_code: int | None
    last_error: str
    delivered_at: str | None


class DeliveryList(Schema):
    items: list[DeliveryOut] = Field(description="the newest 100, newest first")


class OutcomeOut(Schema):
    id: int
    outcome: str = Field(description="removed; or for a redelivery applied or already_applied")


SUBSCRIPTION_ID = Path(..., ge=1, le=MAX_ID, description="the webhook's id")
DELIVERY_STATUS = Query("", pattern=f"^({'|'.join(WebhookDelivery.Status.values)})?$",
                        description="only deliveries of this status")


def subscription_by_id(subscription_id: int) -> WebhookSubscription:
    found = WebhookSubscription.objects.filter(pk=subscription_id).first()
    if found is None:
        raise NotFound(f"Webhook {subscription_id} does not exist; GET /api/webhooks lists them.")
    return found


@router.get("/webhooks", response={200: WebhookList, **ERRORS}, summary="List outbound webhooks")
def webhook_list(request: HttpRequest) -> Json:
    """Each subscription with its counts of deliveries. Needs `workflows.view_webhooksubscription`."""
    require(request.auth, ("workflows.view_webhooksubscription", "workflows.change_webhooksubscription"),  # type: ignore[attr-defined]
            to="see webhooks")
    return {"items": [hooks.subscription_json(s) for s in WebhookSubscription.objects.order_by("pk")]}


@router.post("/webhooks", response={201: WebhookOut, **ERRORS}, summary="Add an outbound webhook")
def webhook_add(request: HttpRequest, payload: WebhookIn) -> Status[Json]:
    """Told of the matching events recorded from now on. Needs `workflows.add_webhooksubscription`."""
    require(request.auth, "workflows.add_webhooksubscription", to="add webhooks")  # type: ignore[attr-defined]
    sub = hooks.webhook_subscription_create(name=payload.name, url=payload.url, secret=payload.secret,
                                            event_kinds=payload.event_kinds, workflow_kinds=payload.workflow_kinds,
                                            launchers=payload.launchers, user=request.auth)  # type: ignore[attr-defined]
    return Status(201, hooks.subscription_json(sub))


@router.delete("/webhooks/{subscription_id}", response={200: OutcomeOut, **ERRORS},
               summary="Remove an outbound webhook")
def webhook_remove(request: HttpRequest, subscription_id: int) -> Json:
    """With its deliveries (pending ones are never sent). Needs `workflows.delete_webhooksubscription`."""
    require(request.auth, "workflows.delete_webhooksubscription", to="remove webhooks")  # type: ignore[attr-defined]
    hooks.webhook_subscription_remove(subscription_id=subscription_by_id(subscription_id).pk)
    return {"id": subscription_id, "outcome": "removed"}


@router.get("/webhooks/{subscription_id}/deliveries", response={200: DeliveryList, **ERRORS},
            summary="List a webhook's deliveries")
def webhook_deliveries(request: HttpRequest, subscription_id: int = SUBSCRIPTION_ID,
                       status: str = DELIVERY_STATUS) -> Json:
    """The newest 100, optionally of one status (pending, delivered, failed)."""
    require(request.auth, ("workflows.view_webhooksubscription", "workflows.change_webhooksubscription"),  # type: ignore[attr-defined]
            to="see webhooks")
    if status and status not in WebhookDelivery.Status.values:
        raise InvalidInput(f"status {status[:30]!r} is not one of {', '.join(WebhookDelivery.Status.values)}.")
    qs = subscription_by_id(subscription_id).deliveries.order_by("-pk")
    return {"items": [hooks.delivery_json(d) for d in (qs.filter(status=status) if status else qs)[:100]]}


@router.post("/webhooks/deliveries/{delivery_pk}/redeliver", response={200: OutcomeOut, **ERRORS},
             summary="Send a delivery again")
def webhook_redeliver(request: HttpRequest, delivery_pk: int) -> Json:
    """Same delivery id and body, at once; `already_applied` when it is pending anyway.
    Needs `workflows.change_webhooksubscription`."""
    require(request.auth, "workflows.change_webhooksubscription", to="redeliver webhooks")  # type: ignore[attr-defined]
    return {"id": delivery_pk, "outcome": hooks.webhook_delivery_redeliver(delivery_id=delivery_pk).value}
