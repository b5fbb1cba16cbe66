"""API tokens in the admin: create one (its secret is shown once, on the page that answers the form),
list them, revoke them. The secret is never stored, so no page can show it again."""
from __future__ import annotations

from typing import Any

from django import forms
from django.contrib import admin, messages
from django.db.models import QuerySet
from django.http import HttpRequest, HttpResponse
from django.template.response import TemplateResponse

from workflows.features.access import tokens
from workflows.models import ApiToken
from workflows.services.steps import Outcome


class ApiTokenForm(forms.ModelForm):
    class Meta:
        model = ApiToken
        fields = ("user", "name")

    def clean_user(self) -> Any:
        user = self.cleaned_data["user"]
        if not user.is_active:
            raise forms.ValidationError(f"{user.username} is deactivated; reactivate them before giving them a token.")
        return user


@admin.register(ApiToken)
class ApiTokenAdmin(admin.ModelAdmin):
    form = ApiTokenForm
    list_display = ("id", "user", "name", "prefix_shown", "created_at", "last_used_at", "revoked_at")
    list_filter = (("revoked_at", admin.EmptyFieldListFilter),)
    list_select_related = ("user",)
    search_fields = ("=id", "user__username", "name", "prefix")
    ordering = ("-pk",)
    actions = ("revoke",)

    @admin.display(description="prefix")
    def prefix_shown(self, token: ApiToken) -> str:
        return f"{token.prefix}…"

    def get_fields(self, request: HttpRequest, obj: Any = None) -> Any:
        if obj is None:
            return ("user", "name")
        return ("user", "name", "prefix_shown", "created_at", "last_used_at", "revoked_at")

    def get_readonly_fields(self, request: HttpRequest, obj: Any = None) -> Any:
        return () if obj is None else self.get_fields(request, obj)

    def has_delete_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False  # revoke instead: the row keeps naming the token in lists and logs

    def save_model(self, request: HttpRequest, obj: ApiToken, form: Any, change: bool) -> None:
        if change:
            return  # every field of a saved token is read-only
        created = tokens.api_token_create(user=form.cleaned_data["user"], name=form.cleaned_data["name"])
        obj.pk, obj.prefix, obj.digest, obj.created_at = (created.token.pk, created.token.prefix,
                                                          created.token.digest, created.token.created_at)
        request._api_token_secret = created.secret  # type: ignore[attr-defined]  # for response_add, once

    def response_add(self, request: HttpRequest, obj: ApiToken, post_url_continue: str | None = None) -> HttpResponse:
        # Answer the form with the secret on the page itself: a redirect would carry it in a message cookie.
        context = {**self.admin_site.each_context(request), "title": "API token created", "opts": self.model._meta,
                   "token": obj, "secret": getattr(request, "_api_token_secret", "")}
        return TemplateResponse(request, "admin/workflows/apitoken/created.html", context)

    @admin.action(description="Revoke selected API tokens", permissions=["change"])
    def revoke(self, request: HttpRequest, queryset: QuerySet[ApiToken]) -> None:
        outcomes = [tokens.api_token_revoke_if_active(token_id=pk)[1] for pk in queryset.values_list("pk", flat=True)]
        done = outcomes.count(Outcome.APPLIED)
        self.message_user(request, f"{done} API token{'s' if done != 1 else ''} revoked, "
                                   f"{len(outcomes) - done} already revoked.", level=messages.SUCCESS)
