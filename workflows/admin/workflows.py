"""Workflows: the list with its filters, the inspection page and the operator actions."""
from __future__ import annotations

import re
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from datetime import timedelta
from decimal import Decimal
from typing import Any

from django import forms
from django.contrib import admin, messages
from django.db.models import Count, Exists, OuterRef, Prefetch, Q, QuerySet, Subquery
from django.http import Http404, HttpRequest, HttpResponse, HttpResponseRedirect, JsonResponse
from django.http.response import HttpResponseBase
from django.shortcuts import get_object_or_404
from django.template.response import TemplateResponse
from django.urls import path, reverse
from django.utils.html import format_html, format_html_join

from workflows import clock, registry, selectors, services, statestore
from workflows.admin.common import ReadOnlyAdmin, add_outcome_message, forbidden, pretty_json, redirect_with_outcome
from workflows.admin.display import usd, when
from workflows.admin.inspection import EVENTS_PAGE_PARAM, inspect_workflow
from workflows.admin.reasoning import is_budget_paused, reasoning_panel
from workflows.api import streams
from workflows.errors import InvalidInput, Refused
from workflows.models import (
    Activity,
    Checkpoint,
    Commitment,
    Intent,
    ProgressSample,
    UsageEntry,
    Wait,
    Workflow,
    WorkflowLabel,
)
from workflows.models.steering import MAX_STEER_CHARS
from workflows.selectors import definition_of, fork_relation, spend_summary, spent_usd, steering_of
from workflows.services.labels import LABEL_KEY, LABEL_VALUE, MAX_LABELS, label_pairs_parsed
from workflows.services.steps import MAX_BUDGET_USD, MAX_GOAL_CHARS

# The permission that lets an operator cancel, resume, re-goal or re-budget a workflow. Generic
# change forms stay disabled whoever holds it: the services are the only writers.
OPERATE_PERMISSION = "workflows.change_workflow"
LAUNCH_PERMISSION = "workflows.add_workflow"
# The result and the durable state on the workflow page: their first 8,000 characters (a
# 200-feature harness result is 48 KB of JSON; agent show --json and the checkpoints have them whole).
JSON_FIELD_CHARS = 8_000


class WaitingOnFilter(admin.SimpleListFilter):
    title = "waiting on"
    parameter_name = "waiting_on"

    def lookups(self, request: HttpRequest, model_admin: Any) -> list[tuple[str, str]]:
        return [(kind.value, f"an open {kind.label.lower()} wait") for kind in Wait.Kind]

    def queryset(self, request: HttpRequest, queryset: QuerySet[Workflow]) -> QuerySet[Workflow]:
        if not self.value():
            return queryset
        open_wait = Wait.objects.filter(workflow=OuterRef("pk"), kind=self.value(), status=Wait.Status.OPEN)
        return queryset.filter(Exists(open_wait))


class QuietFilter(admin.SimpleListFilter):
    """Unfinished workflows whose row has not changed for a while: stuck, or just waiting long."""

    title = "unchanged for"
    parameter_name = "quiet"
    HOURS = {"1h": 1, "24h": 24, "7d": 24 * 7}

    def lookups(self, request: HttpRequest, model_admin: Any) -> list[tuple[str, str]]:
        return [("1h", "over an hour (unfinished)"), ("24h", "over a day (unfinished)"),
                ("7d", "over a week (unfinished)")]

    def queryset(self, request: HttpRequest, queryset: QuerySet[Workflow]) -> QuerySet[Workflow]:
        hours = self.HOURS.get(self.value() or "")
        if hours is None:
            return queryset
        cutoff = clock.now() - timedelta(hours=hours)
        return queryset.exclude(status__in=Workflow.TERMINAL).filter(updated_at__lt=cutoff)


class AttentionFilter(admin.SimpleListFilter):
    """Workflows that beat found stagnating, workflows paused because their budget ran out or by an
    operator, and workflows whose advances raise (backing off, or paused for a person)."""

    title = "needs attention"
    parameter_name = "attention"

    def lookups(self, request: HttpRequest, model_admin: Any) -> list[tuple[str, str]]:
        return [("stagnating", "stagnating (flagged within its window)"), ("budget", "paused for budget"),
                ("handler_failed", "advancing fails (retrying, or paused)"), ("operator", "paused by an operator")]

    def queryset(self, request: HttpRequest, queryset: QuerySet[Workflow]) -> QuerySet[Workflow]:
        if self.value() in ("budget", "operator"):
            return queryset.filter(status=Workflow.Status.PAUSED, pause_cause=self.value())
        if self.value() == "handler_failed":
            return queryset.filter(
                Q(status=Workflow.Status.PAUSED, pause_cause=Workflow.PauseCause.HANDLER_FAILED)
                | Q(handler_failures__gt=0)
            )
        if self.value() != "stagnating":
            return queryset
        # Each workflow has its own window, so "recent" is decided here rather than in SQL
        # (portable to SQLite); few unfinished workflows carry a flag at all.
        now = clock.now()
        flagged = (Workflow.objects.exclude(status__in=Workflow.TERMINAL).filter(stagnation_flagged_at__isnull=False)
                   .values_list("pk", "stagnation_flagged_at", "stagnation_window_hours"))
        recent = [pk for pk, at, hours in flagged if at > now - timedelta(hours=hours)]
        paused = Q(status=Workflow.Status.PAUSED, pause_cause=Workflow.PauseCause.STAGNATION)
        return queryset.filter(Q(pk__in=recent) | paused)


LABEL_PAIR = re.compile(f"{LABEL_KEY}={LABEL_VALUE}")


class LabelFilter(admin.SimpleListFilter):
    """Workflows carrying one label (key=value); the choices are the most used labels. The
    search box takes several (``team=infra env=prod``: all of them)."""

    title = "label"
    parameter_name = "label"
    CHOICES = 30

    def lookups(self, request: HttpRequest, model_admin: Any) -> list[tuple[str, str]]:
        common = (WorkflowLabel.objects.values("key", "value").annotate(n=Count("pk"))
                  .order_by("-n", "key", "value")[: self.CHOICES])
        return [(f"{row['key']}={row['value']}", f"{row['key']}={row['value']} ({row['n']})") for row in common]

    def queryset(self, request: HttpRequest, queryset: QuerySet[Workflow]) -> QuerySet[Workflow]:
        value = self.value() or ""
        if not value:
            return queryset
        if not LABEL_PAIR.fullmatch(value):
            return queryset.none()  # no workflow carries a label that could not be given
        key, _, label = value.partition("=")
        return selectors.labels_filtered(queryset, [(key, label)])


def reason_field(help_text: str) -> forms.CharField:
    """An optional reason, recorded on the workflow and in its history (cancel, pause)."""
    return forms.CharField(required=False, max_length=2000, widget=forms.Textarea(attrs={"rows": 3, "cols": 80}),
                           help_text=help_text)


class CancelForm(forms.Form):
    reason = reason_field("Recorded on the workflow and in its history; say why, for whoever reads it later.")


class SupersedeForm(forms.Form):
    goal = forms.CharField(
        max_length=MAX_GOAL_CHARS, widget=forms.Textarea(attrs={"rows": 5, "cols": 80}),
        help_text="The new goal, in the requester's words. It becomes the next intent version.",
    )
    # Made when the page is shown: the form sent twice (a double click, a resent POST) is one supersede.
    request_key = forms.CharField(required=False, max_length=200, widget=forms.HiddenInput)


class ResumeForm(forms.Form):
    pass


class PauseForm(forms.Form):
    reason = reason_field("Recorded on the workflow and in its history with your name; say why, for whoever "
                          "resumes it.")


class SteerForm(forms.Form):
    message = forms.CharField(
        max_length=MAX_STEER_CHARS, widget=forms.Textarea(attrs={"rows": 4, "cols": 80}),
        help_text="What to tell the agent. Its next model call receives it as a user turn; the goal stays.",
    )
    # Made when the page is shown: the form sent twice (a double click, a resent POST) is one message.
    request_key = forms.CharField(required=False, max_length=200, widget=forms.HiddenInput)


def _positive_usd(value: Decimal) -> None:
    if value <= 0:
        raise forms.ValidationError("A budget must be a positive amount of USD, such as 2.50.")


class BudgetForm(forms.Form):
    total_usd = forms.DecimalField(
        label="Total budget (USD)", required=False, max_digits=12, decimal_places=4, validators=[_positive_usd],
        max_value=MAX_BUDGET_USD - Decimal("0.0001"),
        help_text="Model spend allowed over the whole run. Over it, the workflow pauses for a person. "
                  "Empty keeps the current value.",
    )
    hourly_usd = forms.DecimalField(
        label="Hourly budget (USD)", required=False, max_digits=12, decimal_places=4, validators=[_positive_usd],
        max_value=MAX_BUDGET_USD - Decimal("0.0001"),
        help_text="Model spend allowed in any hour. Over it, work waits until the last hour's spend falls under "
                  "it. Empty keeps the current value.",
    )

    def clean(self) -> dict[str, Any]:
        data = super().clean() or {}
        if not self.errors and data.get("total_usd") is None and data.get("hourly_usd") is None:
            raise forms.ValidationError("Give a total budget, an hourly budget or both.")
        return data


@dataclass(frozen=True)
class OperatorAction:
    name: str
    label: str
    form: type[forms.Form]
    statuses: tuple[str, ...]

    def refusal(self, workflow: Workflow) -> str:
        """Why this action does not apply to ``workflow`` now; empty when it does (the page offers it)."""
        if workflow.status not in self.statuses:
            return f"Workflow {workflow.pk} is {workflow.status}; “{self.label}” does not apply to it."
        definition = definition_of(workflow) if self.name == "steer" else None
        if self.name == "steer" and (definition is None or not definition.reads_steering):
            return (f"Workflow {workflow.pk} is a {workflow.kind} workflow, whose model calls do not read steer "
                    "messages.")
        if self.name == "resume" and is_budget_paused(workflow):
            return (f"Workflow {workflow.pk} is paused because its budget ran out; resuming would pause it again. "
                    "Change its budget instead: that resumes it.")
        return ""


ACTIONS = {
    "cancel": OperatorAction("cancel", "Cancel workflow", CancelForm,
                             ("created", "running", "waiting", "paused")),
    "pause": OperatorAction("pause", "Pause workflow", PauseForm, ("running", "waiting")),
    "resume": OperatorAction("resume", "Resume workflow", ResumeForm, ("paused", "running", "cancelling")),
    "supersede": OperatorAction("supersede", "Change the goal", SupersedeForm,
                                ("created", "running", "waiting", "paused")),
    "budget": OperatorAction("budget", "Change budget", BudgetForm, ("created", "running", "waiting", "paused")),
    "steer": OperatorAction("steer", "Steer the agent", SteerForm, ("created", "running", "waiting", "paused")),
}


def _help(field: str) -> str:
    return str(Workflow._meta.get_field(field).help_text)


class WorkflowForm(forms.ModelForm):
    """Only here to lend the model's help text to the page's computed fields (Meta.help_texts)."""

    class Meta:
        model = Workflow
        fields = ["kind"]  # the admin passes its own field list (from fieldsets) to modelform_factory
        help_texts = {
            "status_badge": _help("status"),
            "goal_full": "The goal of the current intent version; every version is under “Goal history” below.",
            "params_pretty": _help("params"), "result_pretty": _help("result"), "state_pretty": _help("state"),
        }


@admin.register(Workflow)
class WorkflowAdmin(ReadOnlyAdmin):
    form = WorkflowForm
    list_display = ("id", "kind", "status_badge", "current_node", "goal_short", "waiting_on", "launched_by",
                    "updated")
    list_display_links = ("id", "goal_short")
    list_filter = ("status", "kind", "current_node", WaitingOnFilter, AttentionFilter, QuietFilter, LabelFilter)
    list_select_related = ("launched_by",)
    search_fields = ("intents__goal",)
    search_help_text = ("Search by workflow id (a number), by labels (key=value, several separated by spaces: all of "
                        "them) or by words of any of its goals.")
    ordering = ("-pk",)
    readonly_fields = ("status_badge", "goal_full", "params_pretty", "result_pretty", "state_pretty", "labels_short",
                       "fork_relation", "steering")
    fieldsets = (
        ("Where it is", {"fields": ("status_badge", "current_node", "node_visit", "intent_version", "goal_full",
                                    "reason", "pause_cause", "handler_failures", "advance_retry_at")}),
        ("What it runs", {"fields": ("kind", "definition_version", "release", "release_policy", "params_pretty",
                                     "labels_short")}),
        ("Who and when", {"fields": ("launched_by", "created_at", "updated_at", "deadline", "history_archived_at",
                                     "history_archive_path", "fork_relation")}),
        ("Steering", {"fields": ("steering",)}),
        ("Outcome and durable state", {"fields": ("result_pretty", "state_pretty", "event_seq"),
                                       "classes": ("collapse",)}),
    )

    def get_queryset(self, request: HttpRequest) -> QuerySet[Workflow]:
        goal = Intent.objects.filter(workflow=OuterRef("pk"), version=OuterRef("intent_version")).values("goal")
        open_waits = Wait.objects.filter(status=Wait.Status.OPEN).order_by("pk")
        return (super().get_queryset(request).annotate(goal=Subquery(goal[:1]))
                .prefetch_related(Prefetch("waits", queryset=open_waits, to_attr="open_waits"), "labels"))

    def get_search_results(
        self, request: HttpRequest, queryset: QuerySet[Workflow], search_term: str
    ) -> tuple[QuerySet[Workflow], bool]:
        term = search_term.strip()
        if term.isdigit() and queryset.filter(pk=int(term)).exists():
            return queryset.filter(pk=int(term)), False  # an id names one workflow (the goals are words)
        words = term.split()
        if words and all(LABEL_PAIR.fullmatch(word) for word in words):
            return selectors.labels_filtered(queryset, [(k, v) for k, _, v in (w.partition("=") for w in words)]), False
        return super().get_search_results(request, queryset, search_term)

    @admin.display(description="status", ordering="status")
    def status_badge(self, workflow: Workflow) -> str:
        return format_html('<span class="ao-badge ao-{}">{}</span>', workflow.status, workflow.status)

    @admin.display(description="goal")
    def goal_short(self, workflow: Workflow) -> str:
        """One line: the list's CSS cuts it at the column's width; the full goal is the cell's title.
        The launch labels, if any, on a second line (as text: the cell is the page's link; the
        "By label" filter lists them as links), so they take no column of their own."""
        goal = getattr(workflow, "goal", None) or ""
        line = format_html('<span class="ao-one-line" title="{}">{}</span>', goal, goal)
        labels = " ".join(str(label) for label in sorted(workflow.labels.all(), key=lambda label: label.key))
        if not labels:
            return line
        return format_html('{}<br><span class="ao-one-line ao-labels" title="{}">{}</span>', line, labels, labels)

    @admin.display(description="updated", ordering="updated_at")
    def updated(self, workflow: Workflow) -> str:
        return when(workflow.updated_at)

    @admin.display(description="current goal")
    def goal_full(self, workflow: Workflow) -> str:
        return getattr(workflow, "goal", None) or ""

    @admin.display(description="waiting on")
    def waiting_on(self, workflow: Workflow) -> str:
        waits = getattr(workflow, "open_waits", [])
        if not waits:
            return "—"
        queue = reverse("admin:workflows_wait_approvals")
        return format_html_join(", ", "{}", (
            (format_html('<a href="{}#wait-{}" title="approval by {}">approval</a>', queue, w.pk, w.required_role)
             if w.kind == Wait.Kind.APPROVAL else f"{w.kind} {w.event_name}".strip(),) for w in waits
        ))

    @admin.display(description="labels")
    def labels_short(self, workflow: Workflow) -> str:
        """Its launch labels on the workflow page; each links to the list of workflows that carry it."""
        changelist = reverse("admin:workflows_workflow_changelist")
        return format_html_join(", ", '<a href="{}?{}={}">{}={}</a>', (
            (changelist, LabelFilter.parameter_name, f"{label.key}={label.value}", label.key, label.value)
            for label in sorted(workflow.labels.all(), key=lambda label: label.key)
        )) or "—"

    @admin.display(description="Fork")
    def fork_relation(self, workflow: Workflow) -> str:
        relation = fork_relation(workflow)
        parts = []
        if relation["forked_from"]:
            url = reverse("admin:workflows_workflow_change", args=[relation["forked_from"]])
            parts.append(format_html("Forked from <a href=\"{}\">workflow {}</a>: reused its visits 1–{}.", url,
                                     relation["forked_from"], relation["forked_from_visit"]))
        if relation["forks"]:
            links = format_html_join(", ", "<a href=\"{}\">workflow {}</a> (from visit {}, {})", (
                (reverse("admin:workflows_workflow_change", args=[f["id"]]), f["id"], f["from_visit"], f["status"])
                for f in relation["forks"]))
            parts.append(format_html("Forks: {}.", links))
        return format_html_join(" ", "{}", ((p,) for p in parts)) if parts else "Not a fork; no forks."

    @admin.display(description="Steer messages")
    def steering(self, workflow: Workflow) -> str:
        rows = steering_of(workflow)
        if not rows:
            return "None. “Steer the agent” (above) sends one to its next model call."
        return format_html("<ol>{}</ol>", format_html_join("", "<li><strong>{}</strong> by {} at {}: {}{}</li>", (
            (m["status"].replace("_", " "), m["sender"], m["sent_at"][:19].replace("T", " "), m["text"][:500],
             f" — taken by {m['operation_id']} call {m['call']}" if m["operation_id"] else "")
            for m in rows)))

    @admin.display(description="parameters")
    def params_pretty(self, workflow: Workflow) -> str:
        return pretty_json(workflow.params)

    @admin.display(description="result")
    def result_pretty(self, workflow: Workflow) -> str:
        return pretty_json(workflow.result, limit=JSON_FIELD_CHARS, whole=f"manage.py agent show {workflow.pk} --json")

    @admin.display(description="durable state")
    def state_pretty(self, workflow: Workflow) -> str:
        return pretty_json(workflow.state, limit=JSON_FIELD_CHARS,
                           whole="each checkpoint's page, below, has the state at that visit")

    def get_urls(self) -> list[Any]:
        # One path per action: a generic "<id>/<action>/" would shadow the admin's own "<id>/change/".
        view = self.admin_site.admin_view(self.action_view)
        return [
            *(path(f"<int:workflow_id>/{name}/", view, {"action": name}, name=f"workflows_workflow_{name}")
              for name in ACTIONS),
            path("<int:workflow_id>/checkpoints/<int:checkpoint_id>/", self.admin_site.admin_view(self.checkpoint_view),
                 name="workflows_workflow_checkpoint"),
            path("launch/", self.admin_site.admin_view(self.launch_view), name="workflows_workflow_launch"),
            path("rate-limits/", self.admin_site.admin_view(self.rate_limits_view),
                 name="workflows_workflow_rate_limits"),
            path("<int:workflow_id>/events/stream/", self.admin_site.admin_view(self.events_stream_view),
                 name="workflows_workflow_events_stream"),
            path("<int:workflow_id>/live/", self.admin_site.admin_view(self.live_view),
                 name="workflows_workflow_live"),
            *super().get_urls(),
        ]

    def change_view(
        self, request: HttpRequest, object_id: str, form_url: str = "", extra_context: dict[str, Any] | None = None
    ) -> HttpResponse:
        add_outcome_message(request)
        workflow = self.get_object(request, object_id)
        extra = dict(extra_context or {})
        if workflow is not None:
            now = clock.now()
            extra["inspection"] = inspect_workflow(workflow, now=now,
                                                   events_page=request.GET.get(EVENTS_PAGE_PARAM, ""))
            extra["reasoning"] = reasoning_panel(workflow, now=now)
            definition = definition_of(workflow)
            extra["kind_panels"] = definition.admin_panels(workflow, request.GET) if definition else []
            may_operate = request.user.has_perm(OPERATE_PERMISSION)
            extra["operator_actions"] = [
                {"label": a.label, "url": reverse(f"admin:workflows_workflow_{a.name}", args=[workflow.pk])}
                for a in ACTIONS.values() if may_operate and not a.refusal(workflow)
            ]
            if may_operate and workflow.status in ACTIONS["budget"].statuses:
                extra["budget_url"] = reverse("admin:workflows_workflow_budget", args=[workflow.pk])
        return super().change_view(request, object_id, form_url, extra)

    def history_view(self, request: HttpRequest, object_id: str, extra_context: dict[str, Any] | None = None
                     ) -> HttpResponse:
        """A workflow's history is its event timeline, not the admin's log of form edits (there are none)."""
        return HttpResponseRedirect(reverse("admin:workflows_workflow_change", args=[object_id]) + "#timeline")

    def events_stream_view(self, request: HttpRequest, workflow_id: int) -> HttpResponseBase:
        """The page's live timeline: the API's event stream, for the admin's session (docs/live.md)."""
        if not self.has_view_permission(request):
            return forbidden(request, self.admin_site, title="Live events",
                             reason=f"{request.user.get_username()} may not see workflows.")
        workflow = get_object_or_404(Workflow, pk=workflow_id)
        try:
            seq = streams.cursor_from(request.headers.get("Last-Event-ID", ""), request.GET.get("after", ""),
                                      default=lambda: 0)
        except InvalidInput as exc:
            return HttpResponse(str(exc), status=400, content_type="text/plain")
        return streams.workflow_stream(workflow.pk, seq)

    def live_view(self, request: HttpRequest, workflow_id: int) -> HttpResponse:
        """Where the workflow is, what it spent and its latest progress reading: what the open page
        reads again when the stream brings an event, so those lines follow without a reload."""
        if not self.has_view_permission(request):
            return forbidden(request, self.admin_site, title="Live summary",
                             reason=f"{request.user.get_username()} may not see workflows.")
        workflow = get_object_or_404(Workflow, pk=workflow_id)
        latest = ProgressSample.objects.filter(workflow=workflow).order_by("-created_at", "-pk").first()
        return JsonResponse({
            "status": workflow.status, "current_node": workflow.current_node, "node_visit": workflow.node_visit,
            "reason": workflow.reason, "event_seq": workflow.event_seq,
            "spent": usd(spent_usd(workflow)), "model_calls": UsageEntry.objects.filter(workflow=workflow).count(),
            "progress": None if latest is None else {"percent": latest.percent, "at": when(latest.created_at)},
        })

    def checkpoint_view(self, request: HttpRequest, workflow_id: int, checkpoint_id: int) -> HttpResponse:
        """One checkpoint's durable state (the workflow page lists checkpoints without their states)."""
        workflow = self.get_object(request, str(workflow_id))
        if workflow is None or not self.has_view_permission(request, workflow):
            raise Http404(f"Workflow {workflow_id} does not exist, or you may not view it.")
        checkpoint = Checkpoint.objects.filter(workflow=workflow, pk=checkpoint_id).first()
        if checkpoint is None:
            raise Http404(f"Workflow {workflow_id} has no checkpoint {checkpoint_id}.")
        context = {
            **self.admin_site.each_context(request), "opts": self.model._meta, "original": workflow,
            "title": f"Workflow {workflow.pk}: state on entering {checkpoint.node} (visit {checkpoint.node_visit})",
            "checkpoint": checkpoint, "state": pretty_json(statestore.state_at(workflow, checkpoint.node_visit)),
            "change_url": reverse("admin:workflows_workflow_change", args=[workflow.pk]),
        }
        return TemplateResponse(request, "admin/workflows/workflow/checkpoint.html", context)

    def action_view(self, request: HttpRequest, workflow_id: int, action: str) -> HttpResponse:
        """Confirm (GET) and perform (POST) cancel, resume, supersede or a budget change through the services."""
        spec = ACTIONS.get(action)
        workflow = self.get_object(request, str(workflow_id))
        if spec is None or workflow is None:
            raise Http404(f"Workflow {workflow_id} does not exist, or {action!r} is not an operator action.")
        if not request.user.has_perm(OPERATE_PERMISSION):
            return forbidden(request, self.admin_site, title=f"You may not {action} workflows",
                             reason=f"{spec.label} needs the permission {OPERATE_PERMISSION!r} "
                                    "(“Can change workflow”); ask an administrator to grant it to you or your group.")
        change_url = reverse("admin:workflows_workflow_change", args=[workflow.pk])
        refusal = spec.refusal(workflow) if request.method == "GET" else ""  # a POST: the service decides
        if refusal:  # a page reached by an old link or a typed URL: say what applies instead of promising it
            return redirect_with_outcome(change_url, refusal, messages.WARNING)
        initial = {
            "supersede": {"goal": workflow.goal, "request_key": f"admin-{uuid.uuid4().hex}"},
            "steer": {"request_key": f"admin-{uuid.uuid4().hex}"},
            "budget": {"total_usd": workflow.budget_total_usd, "hourly_usd": workflow.budget_hourly_usd},
        }.get(action, {})
        form = spec.form(request.POST if request.method == "POST" else None, initial=initial)
        if request.method == "POST" and form.is_valid():
            try:
                text, level = perform_action(action, workflow.pk, form.cleaned_data, request.user)
            except Refused as exc:
                text, level = str(exc), messages.ERROR
            return redirect_with_outcome(change_url, text, level)
        context = {
            **self.admin_site.each_context(request), "opts": self.model._meta, "original": workflow,
            "title": f"{spec.label} {workflow.pk}?", "action": action, "spec": spec, "form": form,
            "change_url": change_url,
            "open_waits": list(workflow.waits.filter(status=Wait.Status.OPEN).order_by("pk")),
            "active_commitments": list(workflow.commitments.filter(status=Commitment.Status.ACTIVE)
                                       .select_related("activity").order_by("-created_at", "-pk")),
            "spend": spend_summary(workflow) if action == "budget" else None,
            "running_activities": list(workflow.activities.filter(status=Activity.Status.RUNNING).order_by("pk"))
            if action == "pause" else [],
            "budget_paused": is_budget_paused(workflow),
            "revalidate_node": definition.revalidate_node if (definition := definition_of(workflow)) else "",
        }
        return TemplateResponse(request, "admin/workflows/workflow/action_confirm.html", context)


    def launch_view(self, request: HttpRequest) -> HttpResponse:
        """Launch an agent (``?kind=K``): the goal, and one field per launch parameter the kind
        declares (``launch_params``: its description, default and range as the help), checked by
        the same ``workflow_launch`` as `agent launch` and the API; a refusal is shown on the form."""
        if not request.user.has_perm(LAUNCH_PERMISSION):
            return forbidden(request, self.admin_site, title="You may not launch workflows",
                             reason=f"Launching needs the permission {LAUNCH_PERMISSION!r} (“Can add workflow”); "
                                    "ask an administrator to grant it to you or your group.")
        kinds = registry.definition_kinds()
        kind = (request.POST if request.method == "POST" else request.GET).get("kind", "")
        kind = kind if kind in kinds else (kinds[0] if kinds else "")
        form_class = launch_form(kind)
        form = form_class(request.POST if request.method == "POST" else None, initial={"kind": kind})
        if request.method == "POST" and form.is_valid():
            params = {name: value for name, value in form.cleaned_data.items()
                      if name.startswith(PARAM_PREFIX) and value not in ("", None)}
            try:
                workflow = services.workflow_launch(
                    kind=kind, goal=form.cleaned_data["goal"], user=request.user,
                    params={name.removeprefix(PARAM_PREFIX): value for name, value in params.items()},
                    labels=label_pairs_parsed(form.cleaned_data["labels"].replace(",", " ").split(), what="label"))
            except Refused as exc:
                form.add_error(None, str(exc))
            else:
                return redirect_with_outcome(reverse("admin:workflows_workflow_change", args=[workflow.pk]),
                                             f"Launched {kind} workflow {workflow.pk}.", messages.SUCCESS)
        context = {**self.admin_site.each_context(request), "opts": self.model._meta, "title": "Launch an agent",
                   "form": form, "kind": kind, "kinds": kinds, "params_schema": registry.launch_params_schema(kind)
                   if kind else None}
        return TemplateResponse(request, "admin/workflows/workflow/launch.html", context)

    def rate_limits_view(self, request: HttpRequest) -> HttpResponse:
        """The shared rate limits now (docs/operators.md, "Rate limits"): each model's limits by
        source, what is used and left, a 429's hold, the calls waiting by tenant and priority, and
        the concurrency slots; read from the limiter's Redis, changing nothing."""
        if not self.has_view_permission(request):
            return forbidden(request, self.admin_site, title="Rate limits",
                             reason=f"{request.user.get_username()} may not see workflows.")
        context = {**self.admin_site.each_context(request), "opts": self.model._meta, "title": "Rate limits",
                   **rate_limits_panel()}
        return TemplateResponse(request, "admin/workflows/workflow/rate_limits.html", context)


def rate_limits_panel() -> dict[str, Any]:
    """The rate-limits page's rows: per scope and dimension its limits and use; waiting calls by
    tenant (the launcher's name for ``user:<id>``) and priority, highest first; slots and caps;
    and the activities' concurrency keys (the database's, shown whatever the limiter's state)."""
    from workflows import ratelimits
    from workflows.ratelimits.limiter import DIMENSIONS
    from workflows.services import slots

    activity_keys = slots.overview()
    now = ratelimits.overview()
    tenants = {tenant for row in (activity_keys or {"keys": []})["keys"] for tenant, _ in row["waiting"]}
    if now is not None and now["up"]:
        tenants |= {tenant for state in now["scopes"] for tenant, _ in state["waiting"]}
    who = tenant_names(tenants)

    def waiting(rows: dict[tuple[str, int], int]) -> list[dict[str, Any]]:
        return [{"tenant": who(tenant), "priority": priority, "n": n}
                for (tenant, priority), n in sorted(rows.items(), key=lambda i: (-i[0][1], i[0][0]))]

    panel: dict[str, Any] = {"activity_keys": None if activity_keys is None else [
        {"key": row["key"], "running": row["running"], "cap": row["cap"], "waiting": waiting(row["waiting"])}
        for row in activity_keys["keys"]]}
    if now is None or not now["up"]:
        return {**panel, "limiter": "off" if now is None else "down"}
    scopes = [{
        "scope": state["scope"], "blocked_seconds": state["blocked_seconds"],
        "dimensions": [{"name": d, "configured": state["configured"][d], "learned": state["learned"].get(d, 0),
                        "effective": state["effective"][d], "available": state["available"][d],
                        "used": state["effective"][d] - state["available"][d]} for d in DIMENSIONS],
        "waiting": waiting(state["waiting"]),
    } for state in now["scopes"]]
    keys = sorted(set(now["slots"]) | set(now["caps"]))
    return {**panel, "limiter": "up", "scopes": scopes,
            "slots": [{"key": k, "held": now["slots"].get(k, 0), "cap": now["caps"].get(k)} for k in keys]}


def tenant_names(tenants: set[str]) -> Callable[[str], str]:
    """How a page shows a tenant: ``alice (user:3)`` for a launcher who exists, else as it is."""
    from django.contrib.auth import get_user_model

    user_ids = {int(t.removeprefix("user:")) for t in tenants if t.startswith("user:") and t[5:].isdigit()}
    names = dict(get_user_model().objects.filter(pk__in=user_ids).values_list("pk", "username"))

    def who(tenant: str) -> str:
        suffix = tenant.removeprefix("user:")
        return f"{names[int(suffix)]} ({tenant})" if suffix.isdigit() and int(suffix) in names else tenant

    return who


PARAM_PREFIX = "param_"


def launch_form(kind: str) -> type[forms.Form]:
    """The launch form of ``kind``: its goal, and a text field per declared launch parameter
    (text, as `--param KEY=VALUE` gives it: the kind's declaration reads it), its description and
    default as the help."""
    fields: dict[str, forms.Field] = {
        "kind": forms.CharField(widget=forms.HiddenInput),
        "goal": forms.CharField(widget=forms.Textarea(attrs={"rows": 3}), max_length=MAX_GOAL_CHARS,
                                help_text="What the agent should achieve."),
        "labels": forms.CharField(
            required=False, max_length=MAX_LABELS * 193,
            help_text=f"Labels to find it by: key=value, separated by spaces or commas, at most {MAX_LABELS} (e.g. "
                      "team=infra env=prod). A key: lowercase letters, digits, _ and -, starting with a letter; a "
                      "value: letters, digits and . _ - : / @ +."),
    }
    model = registry.definition(kind).launch_params if kind else None
    for name, info in (model.model_fields.items() if model is not None else ()):
        default = "" if info.is_required() else f" Default: {info.default}."
        fields[f"{PARAM_PREFIX}{name}"] = forms.CharField(
            label=name, required=info.is_required(), max_length=10_000,
            help_text=f"{info.description or ''}{default}".strip())
    return type("LaunchForm", (forms.Form,), fields)


def perform_action(action: str, workflow_id: int, data: dict[str, Any], user: Any) -> tuple[str, int]:
    """Call the service for ``action``; return the message for the operator and its level."""
    if action == "cancel":
        result = services.workflow_cancel(workflow_id=workflow_id, reason=data["reason"], user=user)
        already = result.outcome == services.Outcome.ALREADY_APPLIED
        return result.message, messages.WARNING if already else messages.SUCCESS
    if action == "budget":
        was_paused = is_budget_paused(Workflow.objects.get(pk=workflow_id))
        workflow = services.workflow_budget_set(
            workflow_id=workflow_id, user=user, total_usd=data["total_usd"], hourly_usd=data["hourly_usd"])
        total, hourly = workflow.budget_total_usd, workflow.budget_hourly_usd
        text = (f"Budget of workflow {workflow_id}: total {usd(total) if total is not None else 'unlimited'}, "
                f"hourly {usd(hourly) if hourly is not None else 'unlimited'}.")
        if was_paused and workflow.status == Workflow.Status.RUNNING:
            text += " It was paused for budget and goes on now."
        return text, messages.SUCCESS
    if action == "pause":
        result = services.workflow_pause(workflow_id=workflow_id, reason=data["reason"], user=user)
        return result.message, messages.WARNING if result.outcome == services.Outcome.ALREADY_APPLIED else \
            messages.SUCCESS
    if action == "steer":
        steered = services.workflow_steer(workflow_id=workflow_id, message=data["message"], user=user,
                                          dedupe_key=data.get("request_key", ""))
        return steered.message, (messages.WARNING if steered.outcome == services.Outcome.ALREADY_APPLIED
                                 else messages.SUCCESS)
    if action == "resume":
        result = services.workflow_resume(workflow_id=workflow_id, user=user)
        level = {services.Outcome.APPLIED: messages.SUCCESS, services.Outcome.HANDLER_FAILED: messages.ERROR}
        return result.message, level.get(result.outcome, messages.WARNING)
    result = services.workflow_supersede(workflow_id=workflow_id, goal=data["goal"], user=user,
                                         idempotency_key=data.get("request_key", ""))
    return result.message, messages.WARNING if result.outcome == services.Outcome.ALREADY_APPLIED else messages.SUCCESS
