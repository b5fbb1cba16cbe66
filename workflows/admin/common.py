"""Pieces every admin page shares: read-only ModelAdmins, JSON display, explained 403s, time left."""
from __future__ import annotations

import json
from datetime import datetime
from typing import Any

from django.contrib import admin
from django.http import HttpRequest
from django.template.response import TemplateResponse
from django.utils.html import format_html
from django.utils.timesince import timeuntil

from workflows.presentation import CandidateView, candidate_as_json
from workflows.selectors import definition_of


class ReadOnlyAdmin(admin.ModelAdmin):
    """Durable rows change only through the services, never through generic admin forms.

    Those writes would skip the row lock, the event history and the doorbell.
    """

    def has_add_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    def has_change_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    def has_delete_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False


def pretty_json(value: Any) -> str:
    if value in (None, {}, []):
        return "—"
    return format_html('<pre class="ao-json">{}</pre>', json.dumps(value, indent=2, sort_keys=True, default=str))


def time_left(expires_at: datetime | None, now: datetime) -> str:
    if expires_at is None:
        return "no expiry"
    return f"{timeuntil(expires_at, now)} left"


def forbidden(
    request: HttpRequest, site: admin.AdminSite, *, title: str, reason: str, status: int = 403
) -> TemplateResponse:
    """A 403 that explains itself in the admin's look (Django's bare 403 says only "Forbidden")."""
    context = {**site.each_context(request), "title": title, "reason": reason}
    return TemplateResponse(request, "admin/workflows/forbidden.html", context, status=status)


def candidate_view(workflow: Any, candidate: Any) -> CandidateView:
    """A candidate as its kind describes it (all of it as JSON when the kind is not registered here)."""
    definition = definition_of(workflow)
    return definition.describe_candidate(candidate) if definition else candidate_as_json(candidate)
