"""The approval queue: who may decide a wait, what approvers see, and the decide endpoint."""
from __future__ import annotations

import logging
from datetime import datetime
from typing import Any

from django.contrib import admin, messages
from django.db.models import OuterRef, Q, QuerySet, Subquery
from django.http import HttpRequest, HttpResponse
from django.shortcuts import get_object_or_404
from django.template.response import TemplateResponse
from django.urls import path, reverse
from django.utils.html import format_html
from django.utils.timesince import timeuntil
from django.views.decorators.http import require_POST

from workflows import clock, services
from workflows.admin.common import (
    ReadOnlyAdmin,
    add_outcome_message,
    candidate_view,
    forbidden,
    pretty_json,
    redirect_with_outcome,
    time_left,
)
from workflows.authority import wait_authority_refusal
from workflows.errors import Refused
from workflows.models import Intent, Wait
from workflows.services.waits import MAX_COMMENT_CHARS

logger = logging.getLogger("agentops.admin")


def decide_refusal(user: Any, wait: Wait, *, groups: set[str] | None = None) -> str:
    """Why ``user`` may not decide ``wait`` from the queue, or "" when they may."""
    if wait.kind != Wait.Kind.APPROVAL:
        return f"Wait {wait.pk} is a {wait.kind} wait, not an approval; nobody decides it here."
    return wait_authority_refusal(wait=wait, user=user, groups=groups)


def open_approvals(now: datetime) -> QuerySet[Wait]:
    """Approval waits that are open and not yet past their expiry, soonest expiry first.

    Each carries the goal it serves and who set it (``intent_created_by_id``, read by the
    self-approval check) from its intent version.
    """
    intent = Intent.objects.filter(workflow=OuterRef("workflow_id"), version=OuterRef("intent_version"))
    return (
        Wait.objects.filter(kind=Wait.Kind.APPROVAL, status=Wait.Status.OPEN)
        .filter(Q(expires_at__isnull=True) | Q(expires_at__gt=now))
        .select_related("workflow", "workflow__launched_by")
        .annotate(goal=Subquery(intent.values("goal")[:1]),
                  intent_created_by_id=Subquery(intent.values("created_by")[:1]))
        .order_by("expires_at", "pk")
    )


def approval_queue(user: Any, now: datetime) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """(waits ``user`` may decide, open approvals waiting for someone else and why)."""
    mine, others = [], []
    groups = set(user.groups.values_list("name", flat=True))
    for wait in open_approvals(now):
        refusal = decide_refusal(user, wait, groups=groups)
        item = {
            # "goal" is annotated onto each wait by open_approvals.
            "wait": wait, "workflow": wait.workflow, "goal": wait.__dict__.get("goal", ""),
            "time_left": time_left(wait.expires_at, now),
            "expires_in": timeuntil(wait.expires_at, now) if wait.expires_at else "never",
            "decide_url": reverse("admin:workflows_wait_decide", args=[wait.pk]),
            "workflow_url": reverse("admin:workflows_workflow_change", args=[wait.workflow_id]),
        }
        if refusal:
            others.append({**item, "why_not": refusal})
        else:
            mine.append({**item, "candidate": candidate_view(wait.workflow, wait.candidate)})
    return mine, others


@admin.register(Wait)
class WaitAdmin(ReadOnlyAdmin):
    list_display = ("id", "workflow_link", "kind", "status", "node", "required_role", "expires_at", "decision",
                    "decided_by", "decided_at")
    list_filter = ("kind", "status", "required_role")
    list_select_related = ("workflow", "decided_by")
    search_fields = ("=id", "=workflow__id", "candidate_hash")
    ordering = ("-pk",)
    readonly_fields = ("candidate_pretty",)
    exclude = ("candidate",)

    @admin.display(description="workflow", ordering="workflow_id")
    def workflow_link(self, wait: Wait) -> str:
        url = reverse("admin:workflows_workflow_change", args=[wait.workflow_id])
        return format_html('<a href="{}">workflow {}</a>', url, wait.workflow_id)

    @admin.display(description="candidate")
    def candidate_pretty(self, wait: Wait) -> str:
        return pretty_json(wait.candidate)

    def get_urls(self) -> list[Any]:
        view = self.admin_site.admin_view
        return [
            path("approvals/", view(self.approvals_view), name="workflows_wait_approvals"),
            path("<int:wait_id>/decide/", view(require_POST(self.decide_view)), name="workflows_wait_decide"),
            *super().get_urls(),
        ]

    def approvals_view(self, request: HttpRequest) -> TemplateResponse:
        """Every open approval the current user may decide, with the candidate in full."""
        add_outcome_message(request)
        now = clock.now()
        mine, others = approval_queue(request.user, now)
        context = {
            **self.admin_site.each_context(request), "title": "Approval queue", "opts": self.model._meta,
            "mine": mine, "others": others, "now": now, "comment_max": MAX_COMMENT_CHARS,
        }
        return TemplateResponse(request, "admin/workflows/wait/approvals.html", context)

    def decide_view(self, request: HttpRequest, wait_id: int) -> HttpResponse:
        """Approve or reject one wait through the same service as `manage.py agent approve`."""
        wait = get_object_or_404(Wait.objects.select_related("workflow"), pk=wait_id)
        decision = request.POST.get("decision", "")
        if decision not in ("approve", "reject"):
            return forbidden(request, self.admin_site, title="Unknown decision", status=400,
                             reason=f"A decision must be approve or reject, not {decision[:20]!r}.")
        refusal = decide_refusal(request.user, wait)
        if refusal:
            logger.warning("approval.forbidden",
                           extra={"wait_id": wait.pk, "workflow_id": wait.workflow_id, "user": request.user.username})
            return forbidden(request, self.admin_site, title=f"You may not decide wait {wait.pk}", reason=refusal)
        comment = request.POST.get("comment", "")
        queue = reverse("admin:workflows_wait_approvals")
        try:
            if decision == "approve":
                result = services.wait_approve(wait_id=wait.pk, user=request.user, comment=comment,
                                               candidate_hash=request.POST.get("candidate_hash", ""))
            else:
                result = services.wait_reject(wait_id=wait.pk, user=request.user, comment=comment)
        except Refused as exc:
            return redirect_with_outcome(queue, str(exc), messages.ERROR)
        applied = result.outcome == services.Decision.APPLIED
        return redirect_with_outcome(queue, result.message, messages.SUCCESS if applied else messages.WARNING)
