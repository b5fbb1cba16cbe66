"""Prometheus metrics at ``/metrics``, read from the database when scraped.

The database is the only truth, and workers come and go: so every figure is an aggregate over
the durable rows at scrape time (a few grouped queries), the same for every worker and beat,
with no per-process counters to lose on a restart. Protected by a bearer token
(AGENTOPS_METRICS_TOKEN); without one the endpoint is off (404).
"""
from __future__ import annotations

import hmac
from collections.abc import Iterator
from datetime import timedelta
from typing import Any

from django.conf import settings
from django.db.models import Count, DurationField, ExpressionWrapper, F, FloatField, Min, Sum
from django.db.models.fields.json import KeyTextTransform
from django.db.models.functions import Cast
from django.http import HttpRequest, HttpResponse
from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest
from prometheus_client.core import GaugeMetricFamily, Metric, SummaryMetricFamily

from workflows import clock
from workflows.models import Activity, ActivityAttempt, Event, UsageEntry, Wait, Workflow

RECENT = timedelta(hours=1)  # the window of the latency summaries


class DatabaseCollector:
    """Collects every agentops metric from the durable rows."""

    def collect(self) -> Iterator[Metric]:
        now = clock.now()
        workflows = GaugeMetricFamily("agentops_workflows", "Workflows by kind and status.", labels=["kind", "status"])
        for row in Workflow.objects.values("kind", "status").annotate(n=Count("pk")):
            workflows.add_metric([row["kind"], row["status"]], row["n"])
        yield workflows

        failing = Workflow.objects.filter(handler_failures__gt=0).exclude(status__in=Workflow.TERMINAL).count()
        yield GaugeMetricFamily("agentops_workflows_advance_failing",
                                "Unfinished workflows whose advance is failing (handler_failures > 0).", value=failing)
        window = timedelta(hours=settings.AGENTOPS_STAGNATION_WINDOW_HOURS)
        stagnating = Workflow.objects.filter(stagnation_flagged_at__gt=now - window).exclude(
            status__in=Workflow.TERMINAL).count()
        yield GaugeMetricFamily("agentops_workflows_stagnating",
                                "Unfinished workflows flagged as stagnating within the stagnation window.",
                                value=stagnating)

        activities = GaugeMetricFamily("agentops_activities", "Activities by name and status.",
                                       labels=["name", "status"])
        for row in Activity.objects.values("name", "status").annotate(n=Count("pk")):
            activities.add_metric([row["name"], row["status"]], row["n"])
        yield activities

        attempts = GaugeMetricFamily("agentops_activity_attempts", "Activity attempts by name and outcome "
                                     "(running, succeeded, failed, lost, stale, cancelled); attempts beyond the "
                                     "first are retries.", labels=["name", "status"])
        for row in ActivityAttempt.objects.values("activity__name", "status").annotate(n=Count("pk")):
            attempts.add_metric([row["activity__name"], row["status"]], row["n"])
        yield attempts

        yield self._attempt_durations(now)
        yield self._model_call_latency(now)
        yield from self._waits(now)

        spend = GaugeMetricFamily("agentops_model_spend_usd", "Model spend in the usage ledger, by ledger status "
                                  "(charged: billed; reserved: held for a call in flight; uncertain: outcome unknown, "
                                  "counted at its estimate).", labels=["status"])
        for row in UsageEntry.objects.values("status").annotate(charged=Sum("cost_usd"), held=Sum("reserved_usd")):
            amount = row["charged"] if row["status"] == UsageEntry.Status.CHARGED else row["held"]
            spend.add_metric([row["status"]], float(amount or 0))
        yield spend

    def _attempt_durations(self, now: Any) -> Metric:
        summary = SummaryMetricFamily("agentops_activity_attempt_seconds",
                                      "Duration of activity attempts finished in the last hour.", labels=["name"])
        duration = ExpressionWrapper(F("finished_at") - F("started_at"), output_field=DurationField())
        recent = ActivityAttempt.objects.filter(finished_at__gt=now - RECENT)
        for row in recent.values("activity__name").annotate(n=Count("pk"), total=Sum(duration)):
            total = row["total"].total_seconds() if row["total"] is not None else 0.0
            summary.add_metric([row["activity__name"]], count_value=row["n"], sum_value=total)
        return summary

    def _model_call_latency(self, now: Any) -> Metric:
        summary = SummaryMetricFamily("agentops_model_call_seconds",
                                      "Latency of model calls answered in the last hour (model.called events).",
                                      labels=["model"])
        latency = Cast(KeyTextTransform("latency_ms", "data"), FloatField())
        recent = Event.objects.filter(kind="model.called", created_at__gt=now - RECENT).annotate(
            model=KeyTextTransform("model", "data"), latency=latency)
        for row in recent.values("model").annotate(n=Count("pk"), total=Sum("latency")):
            summary.add_metric([row["model"] or ""], count_value=row["n"], sum_value=(row["total"] or 0) / 1000)
        return summary

    def _waits(self, now: Any) -> Iterator[Metric]:
        open_waits = GaugeMetricFamily("agentops_waits_open", "Open waits by kind.", labels=["kind"])
        oldest = GaugeMetricFamily("agentops_wait_oldest_age_seconds",
                                   "Age of the oldest open wait of each kind.", labels=["kind"])
        for row in Wait.objects.filter(status=Wait.Status.OPEN).values("kind").annotate(
                n=Count("pk"), first=Min("created_at")):
            open_waits.add_metric([row["kind"]], row["n"])
            oldest.add_metric([row["kind"]], (now - row["first"]).total_seconds())
        yield open_waits
        yield oldest


def metrics_view(request: HttpRequest) -> HttpResponse:
    """The Prometheus exposition; 404 while AGENTOPS_METRICS_TOKEN is unset, 401 without the token."""
    token = settings.AGENTOPS_METRICS_TOKEN
    if not token:
        return HttpResponse("Metrics are off: set AGENTOPS_METRICS_TOKEN.\n", status=404, content_type="text/plain")
    given = request.headers.get("Authorization", "").removeprefix("Bearer ")
    if not hmac.compare_digest(given.encode(), token.encode()):
        return HttpResponse("Send Authorization: Bearer <AGENTOPS_METRICS_TOKEN>.\n", status=401,
                            content_type="text/plain")
    registry = CollectorRegistry(auto_describe=False)
    registry.register(DatabaseCollector())
    return HttpResponse(generate_latest(registry), content_type=CONTENT_TYPE_LATEST)
