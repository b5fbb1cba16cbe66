"""Outbound webhooks in the admin: subscriptions (added through the service, the secret never shown
again), and their deliveries with every attempt and a Redeliver button (docs/live.md)."""
from __future__ import annotations

import json
from typing import Any

from django import forms
from django.contrib import admin, messages
from django.db.models import QuerySet
from django.http import HttpRequest, HttpResponse
from django.shortcuts import get_object_or_404
from django.urls import path, reverse
from django.views.decorators.http import require_POST

from workflows.admin.common import ReadOnlyAdmin, add_outcome_message, forbidden, pretty_json, redirect_with_outcome
from workflows.errors import InvalidInput
from workflows.features.webhooks import services as hooks
from workflows.models import WebhookAttempt, WebhookDelivery, WebhookSubscription
from workflows.services.steps import Outcome

REDELIVER_PERMISSION = "workflows.change_webhooksubscription"


def names(raw: str) -> list[str]:
    return [n.strip() for n in raw.replace("\n", ",").split(",") if n.strip()]


class WebhookSubscriptionForm(forms.ModelForm):
    url = forms.URLField(assume_scheme="https", max_length=1000, help_text="Where deliveries are POSTed.")
    secret = forms.CharField(widget=forms.PasswordInput(render_value=False), min_length=hooks.MIN_SECRET,
                             help_text="32+ characters; shown nowhere once saved.")
    event_kinds_text = forms.CharField(label="Event kinds", required=False,
                                       help_text="Comma-separated, e.g. workflow.completed, wait.opened; empty: all.")
    workflow_kinds_text = forms.CharField(label="Workflow kinds", required=False, help_text="Empty: all kinds.")
    launchers_text = forms.CharField(label="Launchers", required=False, help_text="Usernames; empty: all.")

    class Meta:
        model = WebhookSubscription
        fields = ("name", "url")

    def clean(self) -> dict[str, Any]:
        data = super().clean() or {}
        try:
            self.checked = hooks.webhook_subscription_checked(
                name=data.get("name") or "", url=data.get("url") or "", secret=data.get("secret") or "",
                event_kinds=names(data.get("event_kinds_text") or ""),
                workflow_kinds=names(data.get("workflow_kinds_text") or ""),
                launchers=names(data.get("launchers_text") or ""))
        except InvalidInput as exc:
            raise forms.ValidationError(str(exc)) from None
        return data


@admin.register(WebhookSubscription)
class WebhookSubscriptionAdmin(admin.ModelAdmin):
    list_display = ("id", "name", "url", "events_shown", "active", "pending", "failed", "created_at")
    list_filter = ("active",)
    search_fields = ("name", "url")
    actions = ("deactivate", "activate")

    @admin.display(description="events")
    def events_shown(self, sub: WebhookSubscription) -> str:
        return ", ".join(sub.event_kinds) or "all"

    @admin.display(description="pending")
    def pending(self, sub: WebhookSubscription) -> int:
        return sub.deliveries.filter(status=WebhookDelivery.Status.PENDING).count()

    @admin.display(description="failed")
    def failed(self, sub: WebhookSubscription) -> int:
        return sub.deliveries.filter(status=WebhookDelivery.Status.FAILED).count()

    def get_form(self, request: HttpRequest, obj: Any = None, change: bool = False, **kwargs: Any) -> Any:
        if obj is None:
            kwargs["form"] = WebhookSubscriptionForm
            kwargs["fields"] = ("name", "url", "secret", "event_kinds_text", "workflow_kinds_text", "launchers_text")
        return super().get_form(request, obj, change=change, **kwargs)

    def get_fields(self, request: HttpRequest, obj: Any = None) -> Any:
        if obj is None:
            return ("name", "url", "secret", "event_kinds_text", "workflow_kinds_text", "launchers_text")
        return ("name", "url", "event_kinds", "workflow_kinds", "launchers", "active", "created_by", "created_at",
                "cursor")

    def get_readonly_fields(self, request: HttpRequest, obj: Any = None) -> Any:
        return () if obj is None else ("name", "url", "event_kinds", "workflow_kinds", "launchers", "created_by",
                                       "created_at", "cursor")

    def save_model(self, request: HttpRequest, obj: WebhookSubscription, form: Any, change: bool) -> None:
        if change:
            obj.save(update_fields=["active"])  # the only field a saved subscription lets you change
            return
        created = hooks.webhook_subscription_create(**form.checked, user=request.user)
        obj.pk, obj.created_at = created.pk, created.created_at

    @admin.action(description="Stop making deliveries for the selected webhooks", permissions=["change"])
    def deactivate(self, request: HttpRequest, queryset: QuerySet[WebhookSubscription]) -> None:
        self.message_user(request, f"{queryset.update(active=False)} webhooks deactivated.", level=messages.SUCCESS)

    @admin.action(description="Make deliveries again for the selected webhooks", permissions=["change"])
    def activate(self, request: HttpRequest, queryset: QuerySet[WebhookSubscription]) -> None:
        self.message_user(request, f"{queryset.update(active=True)} webhooks activated; events recorded while they "
                                   "were inactive are delivered too.", level=messages.SUCCESS)


class WebhookAttemptInline(admin.TabularInline):
    model = WebhookAttempt
    extra = 0
    can_delete = False
    fields = ("number", "started_at", "status_code", "duration_ms", "error")
    readonly_fields = fields

    def has_add_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    def has_change_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    def has_view_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        # Attempts are part of their delivery: whoever may see the delivery sees them.
        return bool(request.user.has_perm("workflows.view_webhookdelivery"))


@admin.register(WebhookDelivery)
class WebhookDeliveryAdmin(ReadOnlyAdmin):
    list_display = ("delivery_id", "subscription", "workflow_id", "seq", "kind", "status", "attempts",
                    "last_status_code", "next_attempt_at", "delivered_at")
    list_filter = ("status", "subscription")
    list_select_related = ("subscription",)
    search_fields = ("=delivery_id", "=workflow_id", "kind")
    fields = ("delivery_id", "subscription", "workflow_id", "seq", "kind", "status", "attempts", "next_attempt_at",
              "last_status_code", "last_error", "created_at", "delivered_at", "body_shown")
    readonly_fields = fields
    inlines = (WebhookAttemptInline,)
    actions = ("redeliver",)

    @admin.display(description="body")
    def body_shown(self, delivery: WebhookDelivery) -> str:
        return pretty_json(json.loads(delivery.body))

    def get_urls(self) -> list[Any]:
        view = self.admin_site.admin_view(require_POST(self.redeliver_view))
        return [path("<int:pk>/redeliver/", view, name="workflows_webhookdelivery_redeliver"), *super().get_urls()]

    def change_view(self, request: HttpRequest, object_id: str, form_url: str = "",
                    extra_context: dict[str, Any] | None = None) -> HttpResponse:
        add_outcome_message(request)
        context = {**(extra_context or {}), "can_redeliver": request.user.has_perm(REDELIVER_PERMISSION)}
        return super().change_view(request, object_id, form_url, extra_context=context)

    def redeliver_view(self, request: HttpRequest, pk: int) -> HttpResponse:
        if not request.user.has_perm(REDELIVER_PERMISSION):
            return forbidden(request, self.admin_site, title="Redeliver",
                             reason=f"{request.user.get_username()} may not redeliver webhooks: that needs the "
                                    f"permission {REDELIVER_PERMISSION!r}.")
        delivery = get_object_or_404(WebhookDelivery, pk=pk)
        outcome = hooks.webhook_delivery_redeliver(delivery_id=delivery.pk)
        text = (f"Delivery {delivery.delivery_id} will be sent again at once." if outcome == Outcome.APPLIED else
                f"Delivery {delivery.delivery_id} is pending already; nothing changed.")
        url = reverse("admin:workflows_webhookdelivery_change", args=[delivery.pk])
        return redirect_with_outcome(url, text, messages.SUCCESS if outcome == Outcome.APPLIED else messages.INFO)

    @admin.action(description="Redeliver the selected deliveries")
    def redeliver(self, request: HttpRequest, queryset: QuerySet[WebhookDelivery]) -> None:
        if not request.user.has_perm(REDELIVER_PERMISSION):
            self.message_user(request, f"Redelivering needs the permission {REDELIVER_PERMISSION!r}.",
                              level=messages.ERROR)
            return
        outcomes = [hooks.webhook_delivery_redeliver(delivery_id=pk) for pk in queryset.values_list("pk", flat=True)]
        done = outcomes.count(Outcome.APPLIED)
        self.message_user(request, f"{done} deliveries will be sent again, {len(outcomes) - done} were pending "
                                   "already.", level=messages.SUCCESS)
