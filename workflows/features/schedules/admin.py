"""Schedules in the admin: add one (checked as `agent schedule add` checks it), see its occurrences
and what each did, pause, resume, trigger or remove it. Every change goes through
``workflows.features.schedules.services``, which keeps the schedule's beat entry in step."""
from __future__ import annotations

import json
from typing import Any

from django import forms
from django.contrib import admin, messages
from django.db.models import QuerySet
from django.http import HttpRequest

from workflows.errors import AgentOpsError
from workflows.features.schedules import services as schedules
from workflows.models import Schedule, ScheduleOccurrence


class OccurrenceInline(admin.TabularInline):
    model = ScheduleOccurrence
    extra = 0
    can_delete = False
    fields = ("at", "outcome", "workflow", "triggered_by", "reason", "recorded_at")
    readonly_fields = fields
    ordering = ("-at",)
    max_num = 0

    def get_queryset(self, request: HttpRequest) -> QuerySet[ScheduleOccurrence]:
        return super().get_queryset(request).select_related("workflow", "triggered_by")

    def has_add_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False


class ScheduleForm(forms.ModelForm):
    """The add form: the values ``schedule_add`` takes, with durations as people write them."""

    every = forms.CharField(required=False, help_text="An interval such as 6h, 30m or 1h30m; or give a cron.")
    catch_up = forms.CharField(initial="0", help_text="Missed occurrences up to this long ago still launch: 0, 1h…")
    jitter = forms.CharField(initial="0", help_text="Launch each occurrence up to this long after its time: 0, 5m…")
    params_json = forms.CharField(required=False, initial="{}", widget=forms.Textarea(attrs={"rows": 3}),
                                  label="parameters", help_text="Launch parameters as a JSON object.")

    class Meta:
        model = Schedule
        fields = ("name", "kind", "goal", "cron", "overlap")

    def clean(self) -> dict[str, Any]:
        data = super().clean() or {}
        try:
            params = json.loads(data.get("params_json") or "{}")
        except ValueError as exc:
            raise forms.ValidationError(f"The parameters are not JSON: {exc}.") from None
        if not isinstance(params, dict):
            raise forms.ValidationError("The parameters must be a JSON object.")
        data["params"] = params
        if not self.errors:
            try:
                schedules.schedule_checked(name=data["name"], kind=data["kind"], goal=data["goal"], params=params,
                                           cron=data.get("cron", ""), every=data.get("every", ""),
                                           overlap=data["overlap"], catch_up=data.get("catch_up", "0"),
                                           jitter=data.get("jitter", "0"))
            except AgentOpsError as exc:
                raise forms.ValidationError(str(exc)) from None
        return data


@admin.register(Schedule)
class ScheduleAdmin(admin.ModelAdmin):
    form = ScheduleForm
    list_display = ("name", "kind", "when", "overlap", "paused", "declared", "next_due_at", "created_by")
    list_filter = ("paused", "declared", "kind", "overlap")
    search_fields = ("name", "kind", "goal")
    ordering = ("name",)
    actions = ("pause", "resume", "trigger")
    inlines = (OccurrenceInline,)
    shown = ("name", "kind", "goal", "params", "when", "overlap", "catch_up_seconds", "jitter_seconds", "paused",
             "declared", "next_due_at", "buffered_at", "created_by", "created_at", "periodic_task")

    def get_fields(self, request: HttpRequest, obj: Any = None) -> Any:
        if obj is None:
            return ("name", "kind", "goal", "params_json", "cron", "every", "overlap", "catch_up", "jitter")
        return self.shown

    def get_readonly_fields(self, request: HttpRequest, obj: Any = None) -> Any:
        return () if obj is None else self.shown

    def get_inlines(self, request: HttpRequest, obj: Any = None) -> Any:
        return self.inlines if obj is not None else ()

    def save_model(self, request: HttpRequest, obj: Schedule, form: Any, change: bool) -> None:
        if change:
            return  # a saved schedule's fields are read-only: remove it and add another
        data = form.cleaned_data
        added = schedules.schedule_add(name=data["name"], kind=data["kind"], goal=data["goal"], params=data["params"],
                                       cron=data["cron"], every=data["every"], overlap=data["overlap"],
                                       catch_up=data["catch_up"], jitter=data["jitter"], user=request.user)
        obj.pk = added.pk

    def delete_model(self, request: HttpRequest, obj: Schedule) -> None:
        schedules.schedule_remove(name=obj.name)

    def delete_queryset(self, request: HttpRequest, queryset: QuerySet[Schedule]) -> None:
        for name in queryset.values_list("name", flat=True):
            schedules.schedule_remove(name=name)

    def _each(self, request: HttpRequest, queryset: QuerySet[Schedule], what: str, fn: Any) -> None:
        said = []
        for name in queryset.values_list("name", flat=True):
            try:
                said.append(fn(name))
            except AgentOpsError as exc:
                self.message_user(request, f"{name}: {exc}", level=messages.ERROR)
        if said:
            self.message_user(request, f"{what}: " + "; ".join(said), level=messages.SUCCESS)

    @admin.action(description="Pause selected schedules", permissions=["change"])
    def pause(self, request: HttpRequest, queryset: QuerySet[Schedule]) -> None:
        self._each(request, queryset, "Paused", lambda name: schedules.schedule_pause(name=name).name)

    @admin.action(description="Resume selected schedules (from their next occurrence)", permissions=["change"])
    def resume(self, request: HttpRequest, queryset: QuerySet[Schedule]) -> None:
        self._each(request, queryset, "Resumed", lambda name: schedules.schedule_resume(name=name).name)

    @admin.action(description="Trigger selected schedules now", permissions=["change"])
    def trigger(self, request: HttpRequest, queryset: QuerySet[Schedule]) -> None:
        def one(name: str) -> str:
            occurrence = schedules.schedule_trigger(name=name, user=request.user)
            return f"{name} {occurrence.outcome}" + (f" workflow {occurrence.workflow_id}"
                                                     if occurrence.workflow_id else f" ({occurrence.reason})")
        self._each(request, queryset, "Triggered", one)
