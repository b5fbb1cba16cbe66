"""Pieces every admin page shares: read-only ModelAdmins, JSON display, explained 403s, time left,
and the message of a POST's outcome carried by its redirect."""
from __future__ import annotations

import json
from datetime import datetime
from typing import Any

from django.contrib import admin, messages
from django.core import signing
from django.http import HttpRequest, HttpResponseRedirect
from django.template.response import TemplateResponse
from django.utils.html import format_html
from django.utils.http import urlencode
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


def pretty_json(value: Any, *, limit: int = 0, whole: str = "") -> str:
    """``value`` as indented JSON; past ``limit`` characters (0: no limit) cut, and a line after it
    saying how much is left out and where the whole is (``whole``)."""
    if value in (None, {}, []):
        return "—"
    text = json.dumps(value, indent=2, sort_keys=True, default=str)
    if not limit or len(text) <= limit:
        return format_html('<pre class="ao-json">{}</pre>', text)
    return format_html('<pre class="ao-json">{}\n…</pre><p class="ao-quiet">{} more characters not shown: {}.</p>',
                       text[:limit], f"{len(text) - limit:,}", whole)


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


# The query parameter of a redirect that carries the outcome of the POST before it, and the salt
# of its signature (only this admin can write a message that its pages will show).
OUTCOME_PARAM = "outcome"
_OUTCOME_SALT = "agentops.admin.outcome"
_LEVELS = {messages.SUCCESS, messages.WARNING, messages.ERROR, messages.INFO}


def redirect_with_outcome(url: str, text: str, level: int) -> HttpResponseRedirect:
    """Redirect to ``url`` (a path without a query) with this POST's outcome signed into the query string.

    Not through Django's message storage: that is one cookie (or session) per browser, so two POSTs
    in flight from one tab each rewrite it, and a page may show the other decision's message, or
    one message twice while the other is lost (Django's docs, "Behavior of parallel requests").
    Carried by its own redirect, each outcome reaches the page that POST leads to, and
    ``add_outcome_message`` hands it to the messages framework there.
    """
    token = signing.dumps([level, text], salt=_OUTCOME_SALT, compress=True)
    return HttpResponseRedirect(f"{url}?{urlencode({OUTCOME_PARAM: token})}")


def add_outcome_message(request: HttpRequest) -> None:
    """Show the outcome a redirect carried (see ``redirect_with_outcome``) as a message of this page.

    A link that was altered or cut short shows no message rather than failing the page.
    """
    token = request.GET.get(OUTCOME_PARAM, "")
    if not token:
        return
    try:
        level, text = signing.loads(token, salt=_OUTCOME_SALT)
    except (signing.BadSignature, ValueError, TypeError):
        return
    if level in _LEVELS and isinstance(text, str):
        messages.add_message(request, level, text)
