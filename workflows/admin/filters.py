"""The workflow list's filters: what a workflow waits on, quiet ones, those that need a person, labels."""
from __future__ import annotations

import re
from datetime import timedelta
from typing import Any

from django.contrib import admin
from django.db.models import Count, Exists, OuterRef, Q, QuerySet
from django.http import HttpRequest

from workflows import clock, selectors
from workflows.models import Wait, Workflow, WorkflowLabel
from workflows.services.labels import LABEL_KEY, LABEL_VALUE


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
