"""Prometheus metrics at ``/metrics``, read from the database when scraped.

The database is the only truth, and workers come and go: so every figure is an aggregate over
the durable rows at scrape time (a few grouped queries), the same for every worker and beat,
with no per-process counters to lose on a restart. Counters and histograms count every row ever
recorded (docs/operators.md, "Metrics"): a history archived by retention takes its model.called
events out of ``agentops_model_call_seconds``, which Prometheus reads as a counter reset. Protected by a bearer token
(AGENTOPS_METRICS_TOKEN); without one the endpoint is off (404).
"""
from __future__ import annotations

import hmac
from collections.abc import Iterator
from datetime import timedelta
from typing import Any

from django.conf import settings
from django.db.models import Count, DurationField, ExpressionWrapper, F, FloatField, Min, OuterRef, Q, Subquery, Sum
from django.db.models.fields.json import KeyTextTransform
from django.db.models.functions import Cast
from django.http import HttpRequest, HttpResponse
from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily, Metric

from workflows import clock, registry
from workflows.models import Activity, ActivityAttempt, Event, UsageEntry, Wait, Workflow, WorkflowLabel

# Upper bounds (seconds) of the latency histograms: an activity attempt (a tool run, a model turn, a
# test suite: up to the hour) and one model call.
ATTEMPT_BUCKETS = (0.1, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300, 600, 1800, 3600)
MODEL_CALL_BUCKETS = (0.25, 0.5, 1, 2, 5, 10, 20, 30, 60, 120, 300)
FINISHED_ATTEMPT = [s for s in ActivityAttempt.Status.values if s != ActivityAttempt.Status.RUNNING]
# A model request's ledger row ends charged, released (an error: not billed) or uncertain (no answer
# seen: counted at its estimate until settled, when it becomes charged or released).
SETTLED_CALL = [UsageEntry.Status.CHARGED, UsageEntry.Status.RELEASED, UsageEntry.Status.UNCERTAIN]
# The value of a metrics label for a launch label's less used values (past AGENTOPS_METRICS_LABEL_VALUES_MAX).
OTHER_VALUE = "_other"
TOKEN_FIELDS = {"input": "input_tokens", "output": "output_tokens", "cache_read": "cache_read_tokens",
                "cache_write": "cache_write_tokens"}


class DatabaseCollector:
    """Collects every agentops metric from the durable rows.

    Counters (``_total``) and histograms count every row ever recorded, so ``rate()`` and
    ``increase()`` read them as Prometheus means: they only grow, whichever process scrapes. Each
    label set a counter or gauge can take is present, at 0 when nothing has happened yet (every kind
    and activity this host registers, every status), so an alert on a series sees 0, not "no data".
    """

    def collect(self) -> Iterator[Metric]:
        now = clock.now()
        kinds = sorted(set(registry.definition_kinds()) | set(Workflow.objects.values_list("kind", flat=True)
                                                              .distinct()))
        yield self._workflows(kinds)

        failing = Workflow.objects.filter(handler_failures__gt=0).exclude(status__in=Workflow.TERMINAL).count()
        yield GaugeMetricFamily("agentops_workflows_advance_failing",
                                "Unfinished workflows whose advance is failing (handler_failures > 0).", value=failing)
        window = timedelta(hours=settings.AGENTOPS_STAGNATION_WINDOW_HOURS)
        stagnating = Workflow.objects.filter(stagnation_flagged_at__gt=now - window).exclude(
            status__in=Workflow.TERMINAL).count()
        yield GaugeMetricFamily("agentops_workflows_stagnating",
                                "Unfinished workflows flagged as stagnating within the stagnation window.",
                                value=stagnating)

        names = sorted({a.name for a in registry.activity_types()}
                       | set(Activity.objects.values_list("name", flat=True).distinct()))
        activities = GaugeMetricFamily("agentops_activities", "Activities by name and status.",
                                       labels=["name", "status"])
        counted = {(r["name"], r["status"]): r["n"] for r in Activity.objects.values("name", "status").annotate(
            n=Count("pk"))}
        for name in names:
            for status in Activity.Status.values:
                activities.add_metric([name, status], counted.get((name, status), 0))
        yield activities

        yield from self._attempts(names)
        yield from self._model_calls()
        yield from self._waits(now)
        yield from self._rate_limits()

    def _workflows(self, kinds: list[str]) -> Metric:
        """``agentops_workflows`` by kind and status, and by the launch labels AGENTOPS_METRICS_LABELS
        names (``label_<key>``: "" for a workflow without it; past AGENTOPS_METRICS_LABEL_VALUES_MAX
        values of a key, the less used ones are counted as OTHER_VALUE). Every status is present for
        each kind, with no label values and with each combination some workflow of that kind carries."""
        keys = settings.AGENTOPS_METRICS_LABELS
        workflows = GaugeMetricFamily("agentops_workflows", "Workflows by kind and status"
                                      + (" and the labels AGENTOPS_METRICS_LABELS names." if keys else "."),
                                      labels=["kind", "status", *(f"label_{k.replace('-', '_')}" for k in keys)])
        values = {f"l{i}": Subquery(WorkflowLabel.objects.filter(workflow=OuterRef("pk"), key=key).values("value")[:1])
                  for i, key in enumerate(keys)}
        kept = [self._label_values_kept(key) for key in keys]
        counted: dict[tuple[str, ...], int] = {}
        for row in Workflow.objects.annotate(**values).values("kind", "status", *values).annotate(n=Count("pk")):
            shown = tuple(self._shown(row[f"l{i}"], kept[i]) for i in range(len(keys)))
            at = (row["kind"], row["status"], *shown)
            counted[at] = counted.get(at, 0) + row["n"]
        # Each kind has the series of its workflows without those labels (at 0 too), as it has without keys.
        combinations: dict[str, set[tuple[str, ...]]] = {kind: {("",) * len(keys)} for kind in kinds}
        for at in counted:
            combinations.setdefault(at[0], set()).add(at[2:])
        for kind in kinds:
            for shown in sorted(combinations[kind]):
                for status in Workflow.Status.values:
                    workflows.add_metric([kind, status, *shown], counted.get((kind, status, *shown), 0))
        return workflows

    @staticmethod
    def _label_values_kept(key: str) -> set[str]:
        """The values of ``key`` reported as themselves: the most used ones."""
        cap = settings.AGENTOPS_METRICS_LABEL_VALUES_MAX
        return set(WorkflowLabel.objects.filter(key=key).values("value").annotate(n=Count("pk"))
                   .order_by("-n", "value").values_list("value", flat=True)[:cap])

    @staticmethod
    def _shown(value: str | None, kept: set[str]) -> str:
        if value is None:
            return ""
        return value if value in kept else OTHER_VALUE

    def _attempts(self, names: list[str]) -> Iterator[Metric]:
        attempts = CounterMetricFamily("agentops_activity_attempts", "Finished activity attempts by name and outcome "
                                       "(succeeded, failed, lost, stale, cancelled); attempts beyond an activity's "
                                       "first are retries.", labels=["name", "status"])
        running = GaugeMetricFamily("agentops_activity_attempts_running", "Activity attempts running now, by name.",
                                    labels=["name"])
        counted = {(r["activity__name"], r["status"]): r["n"]
                   for r in ActivityAttempt.objects.values("activity__name", "status").annotate(n=Count("pk"))}
        for name in names:
            for status in FINISHED_ATTEMPT:
                attempts.add_metric([name, status], counted.get((name, status), 0))
            running.add_metric([name], counted.get((name, ActivityAttempt.Status.RUNNING), 0))
        yield attempts
        yield running

        duration = ExpressionWrapper(F("finished_at") - F("started_at"), output_field=DurationField())
        finished = ActivityAttempt.objects.filter(finished_at__isnull=False).annotate(duration=duration)
        histogram = HistogramMetricFamily("agentops_activity_attempt_seconds", "Duration of finished activity "
                                          "attempts.", labels=["name"])
        rows = {r["activity__name"]: r for r in finished.values("activity__name").annotate(
            n=Count("pk"), total=Sum("duration"),
            **{f"le{i}": Count("pk", filter=Q(duration__lte=timedelta(seconds=b)))
               for i, b in enumerate(ATTEMPT_BUCKETS)})}
        for name in names:
            row = rows.get(name, {})
            total = row.get("total")
            histogram.add_metric([name], buckets=self._buckets(row, ATTEMPT_BUCKETS),
                                 sum_value=total.total_seconds() if total is not None else 0.0)
        yield histogram

    def _model_calls(self) -> Iterator[Metric]:
        models = sorted(set(UsageEntry.objects.values_list("model", flat=True).distinct()))
        calls = CounterMetricFamily("agentops_model_calls", "Model requests by model and ledger outcome (charged; "
                                    "released: answered with an error or never sent; uncertain: no answer seen, until "
                                    "settled).", labels=["model", "status"])
        tokens = CounterMetricFamily("agentops_model_tokens", "Tokens of charged model requests, by model and type.",
                                     labels=["model", "type"])
        spend = CounterMetricFamily("agentops_model_spend_usd", "Model spend in the usage ledger, by status (charged: "
                                    "billed; uncertain: outcome unknown, counted at its estimate).", labels=["status"])
        in_flight = GaugeMetricFamily("agentops_model_spend_reserved_usd",
                                      "Estimates held for model requests in flight.")
        rows = {(r["model"], r["status"]): r for r in UsageEntry.objects.values("model", "status").annotate(
            n=Count("pk"), cost=Sum("cost_usd"), held=Sum("reserved_usd"),
            **{kind: Sum(field) for kind, field in TOKEN_FIELDS.items()})}
        for model in models:
            for status in SETTLED_CALL:
                calls.add_metric([model, status], rows.get((model, status), {}).get("n", 0))
            charged = rows.get((model, UsageEntry.Status.CHARGED), {})
            for kind in TOKEN_FIELDS:
                tokens.add_metric([model, kind], charged.get(kind) or 0)
        by_status = {status: sum(float((r["cost"] if status == UsageEntry.Status.CHARGED else r["held"]) or 0)
                                 for (_, s), r in rows.items() if s == status)
                     for status in (UsageEntry.Status.CHARGED, UsageEntry.Status.UNCERTAIN)}
        for status, amount in by_status.items():
            spend.add_metric([status], amount)
        in_flight.add_metric([], sum(float(r["held"] or 0) for (_, s), r in rows.items()
                                     if s == UsageEntry.Status.RESERVED))
        yield calls
        yield tokens
        yield spend
        yield in_flight
        yield self._model_call_latency()

    def _model_call_latency(self) -> Metric:
        histogram = HistogramMetricFamily("agentops_model_call_seconds", "Latency of answered model calls "
                                          "(model.called events; those of archived histories leave it).",
                                          labels=["model"])
        latency = Cast(KeyTextTransform("latency_ms", "data"), FloatField())
        calls = Event.objects.filter(kind="model.called").annotate(model=KeyTextTransform("model", "data"),
                                                                   latency=latency)
        for row in calls.values("model").annotate(
                n=Count("pk"), total=Sum("latency"),
                **{f"le{i}": Count("pk", filter=Q(latency__lte=b * 1000)) for i, b in enumerate(MODEL_CALL_BUCKETS)}):
            histogram.add_metric([row["model"] or ""], buckets=self._buckets(row, MODEL_CALL_BUCKETS),
                                 sum_value=(row["total"] or 0) / 1000)
        return histogram

    @staticmethod
    def _buckets(row: dict[str, Any], bounds: tuple[float, ...]) -> list[tuple[str, float]]:
        """Cumulative counts per upper bound, then +Inf: the row's ``le<i>`` counts and its ``n``."""
        return [(str(float(b)), row.get(f"le{i}", 0)) for i, b in enumerate(bounds)] + [("+Inf", row.get("n", 0))]

    def _waits(self, now: Any) -> Iterator[Metric]:
        open_waits = GaugeMetricFamily("agentops_waits_open", "Open waits by kind.", labels=["kind"])
        oldest = GaugeMetricFamily("agentops_wait_oldest_age_seconds",
                                   "Age of the oldest open wait of each kind (0 when none is open).", labels=["kind"])
        rows = {r["kind"]: r for r in Wait.objects.filter(status=Wait.Status.OPEN).values("kind").annotate(
            n=Count("pk"), first=Min("created_at"))}
        for kind in Wait.Kind.values:
            row = rows.get(kind)
            open_waits.add_metric([kind], row["n"] if row else 0)
            oldest.add_metric([kind], (now - row["first"]).total_seconds() if row else 0.0)
        yield open_waits
        yield oldest


    def _rate_limits(self) -> Iterator[Metric]:
        """The 429s received (ledger rows, durable) and the shared limiter's state (Redis, now)."""
        limited = CounterMetricFamily("agentops_model_rate_limited", "Model requests the provider answered 429 "
                                      "(rate limited), by model; never charged (ledger rows released).",
                                      labels=["model"])
        models = set(UsageEntry.objects.values_list("model", flat=True).distinct())
        counted = dict(UsageEntry.objects.filter(http_status=429).values("model").annotate(n=Count("pk"))
                       .values_list("model", "n"))
        for model in sorted(models):
            limited.add_metric([model], counted.get(model, 0))
        yield limited
        yield from rate_limit_metrics()
        yield from activity_slot_metrics()


def activity_slot_metrics() -> Iterator[Metric]:
    """Each concurrency key of AGENTOPS_ACTIVITY_CONCURRENCY in use: its cap, the slots held and the
    activities waiting for one by tenant and priority (the database: nothing when no key is set)."""
    from workflows.services import slots

    now = slots.overview()
    if now is None:
        return
    held = GaugeMetricFamily("agentops_activity_slots", "Activity attempts running (or a slot handed to one a "
                             "moment ago) by concurrency key (tenant:<tenant>, kind:<kind>) with a cap.",
                             labels=["key"])
    caps = GaugeMetricFamily("agentops_activity_slots_limit", "Each concurrency key's cap "
                             "(AGENTOPS_ACTIVITY_CONCURRENCY).", labels=["key"])
    waiting = GaugeMetricFamily("agentops_activity_slot_waiting", "Activities waiting for a concurrency slot, by "
                                "key, tenant and priority.", labels=["key", "tenant", "priority"])
    for row in now["keys"]:
        held.add_metric([row["key"]], row["running"])
        caps.add_metric([row["key"]], row["cap"])
        for (tenant, priority), n in sorted(row["waiting"].items()):
            waiting.add_metric([row["key"], tenant, str(priority)], n)
    yield from (held, caps, waiting)


def rate_limit_metrics() -> Iterator[Metric]:
    """Each scope's limits (configured, learned, effective), what is left of them, the calls waiting
    by tenant and priority, and the concurrency slots held; ``agentops_rate_limiter_up`` 0 when
    the limiter's Redis does not answer (and nothing else of it)."""
    from workflows import ratelimits
    from workflows.ratelimits.limiter import DIMENSIONS

    now = ratelimits.overview()
    if now is None:
        return
    up = GaugeMetricFamily("agentops_rate_limiter_up", "1 when the shared rate limiter's Redis answers.")
    up.add_metric([], 1 if now["up"] else 0)
    yield up
    if not now["up"]:
        return
    per_minute = GaugeMetricFamily("agentops_rate_limit_per_minute", "Rate limits per minute by provider, model "
                                   "and dimension; source configured (AGENTOPS_RATE_LIMITS), learned (the answers' "
                                   "headers) or effective (what the limiter holds: the lower, learned times the "
                                   "headroom); 0 for none.", labels=["provider", "model", "dimension", "source"])
    available = GaugeMetricFamily("agentops_rate_limit_available", "What is left of each effective limit's bucket "
                                  "now (below 0 after a request larger than the bucket, a 429 or a correction).",
                                  labels=["provider", "model", "dimension"])
    burst = GaugeMetricFamily("agentops_rate_limit_burst", "What each limit's bucket holds when full at the pace "
                              "now: AGENTOPS_RATE_LIMIT_BURST_SECONDS of the effective rate, or less when the "
                              "provider's own bucket holds less.", labels=["provider", "model", "dimension"])
    used = GaugeMetricFamily("agentops_rate_limit_used", "How much of each limit's bucket is taken (burst minus "
                             "available).", labels=["provider", "model", "dimension"])
    provider_bucket = GaugeMetricFamily("agentops_rate_limit_provider_bucket", "The provider's bucket per "
                                        "dimension as its answers' remaining and reset headers show it.",
                                        labels=["provider", "model", "dimension"])
    pace = GaugeMetricFamily("agentops_rate_limit_pace", "The share of the effective rate the limiter sends at: "
                             "1, lowered by each 429 and recovering.", labels=["provider", "model"])
    blocked = GaugeMetricFamily("agentops_rate_limit_blocked_seconds", "Seconds every call of the scope still "
                                "waits after a 429's retry-after.", labels=["provider", "model"])
    waiting = GaugeMetricFamily("agentops_rate_limit_waiting", "Model requests waiting for their share, by tenant "
                                "and priority.", labels=["provider", "model", "tenant", "priority"])
    for state in now["scopes"]:
        provider, model = state["provider"], state["model"]
        for dimension in DIMENSIONS:
            for source, value in (("configured", state["configured"][dimension]),
                                  ("learned", state["learned"].get(dimension, 0)),
                                  ("effective", state["effective"][dimension])):
                per_minute.add_metric([provider, model, dimension, source], value)
            if state["effective"][dimension]:
                available.add_metric([provider, model, dimension], state["available"][dimension])
                burst.add_metric([provider, model, dimension], state["burst"][dimension])
                used.add_metric([provider, model, dimension], state["burst"][dimension] - state["available"][dimension])
            if dimension in state["provider_bucket"]:
                provider_bucket.add_metric([provider, model, dimension], state["provider_bucket"][dimension])
        blocked.add_metric([provider, model], state["blocked_seconds"])
        pace.add_metric([provider, model], state["pace"])
        for (tenant, priority), n in sorted(state["waiting"].items()):
            waiting.add_metric([provider, model, tenant, str(priority)], n)
    yield from (per_minute, available, burst, used, provider_bucket, pace, blocked, waiting)
    held = GaugeMetricFamily("agentops_model_call_slots", "Concurrent model requests by concurrency key "
                             "(tenant:<tenant>, kind:<kind>) with a cap.", labels=["key"])
    caps = GaugeMetricFamily("agentops_model_call_slots_limit", "Each concurrency key's cap "
                             "(AGENTOPS_MODEL_CALL_CONCURRENCY).", labels=["key"])
    for key, n in sorted(now["slots"].items()):
        held.add_metric([key], n)
    for key, cap in sorted(now["caps"].items()):
        caps.add_metric([key], cap)
    yield held
    yield caps


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
