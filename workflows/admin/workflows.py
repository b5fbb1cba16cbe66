"""Workflows: the list with its filters, the inspection page and the operator actions."""
from __future__ import annotations

import uuid
from typing import Any

from django import forms
from django.contrib import admin, messages
from django.db.models import OuterRef, Prefetch, QuerySet, Subquery
from django.http import Http404, HttpRequest, HttpResponse, HttpResponseRedirect, JsonResponse
from django.http.response import HttpResponseBase
from django.shortcuts import get_object_or_404
from django.template.response import TemplateResponse
from django.urls import path, reverse
from django.utils.html import format_html, format_html_join

from workflows import clock, registry, selectors, services, statestore
from workflows.admin.actions import ACTIONS, PARAM_PREFIX, launch_form, perform_action
from workflows.admin.common import ReadOnlyAdmin, add_outcome_message, forbidden, pretty_json, redirect_with_outcome
from workflows.admin.display import usd, when
from workflows.admin.filters import LABEL_PAIR, AttentionFilter, LabelFilter, QuietFilter, WaitingOnFilter
from workflows.admin.inspection import EVENTS_PAGE_PARAM, inspect_workflow
from workflows.admin.ratelimits import rate_limits_panel
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
)
from workflows.selectors import definition_of, fork_relation, spend_summary, spent_usd, steering_of
from workflows.services.labels import label_pairs_parsed

# The permission that lets an operator cancel, resume, re-goal or re-budget a workflow. Generic
# change forms stay disabled whoever holds it: the services are the only writers.
OPERATE_PERMISSION = "workflows.change_workflow"
LAUNCH_PERMISSION = "workflows.add_workflow"
# The result and the durable state on the workflow page: their first 8,000 characters (a
# 200-feature harness result is 48 KB of JSON; agent show --json and the checkpoints have them whole).
JSON_FIELD_CHARS = 8_000


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
                labels = label_pairs_parsed(form.cleaned_data["labels"].replace(",", " ").split(), what="label")
                chosen = {name: value for name, value in form.cleaned_data.items()
                          if name in form.option_names and value not in ("", None)}
                workflow = services.workflow_launch(
                    kind=kind, goal=form.cleaned_data["goal"], user=request.user,
                    params={name.removeprefix(PARAM_PREFIX): value for name, value in params.items()},
                    options=services.LaunchOptions.of({**chosen, "labels": labels}))
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


