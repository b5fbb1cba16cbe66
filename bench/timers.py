"""Timer lateness (4): timers falling due over a minute, fired by a real beat and real workers."""
from __future__ import annotations

import time
from collections import Counter
from datetime import timedelta
from typing import Any

from bench.context import Bench
from bench.infra import BenchError, percentile
from bench.parked import clone_parked, make_template
from bench.throughput import ensure_workers


def ensure_beat(bench: Bench) -> None:
    if not bench.cluster.beats():
        bench.cluster.start_beat()


def _stats(values: list[float]) -> dict[str, float]:
    return {"p50_s": round(percentile(values, 50), 3), "p99_s": round(percentile(values, 99), 3),
            "max_s": round(max(values), 3)}


def bench_timers(bench: Bench) -> dict[str, Any]:
    from django.conf import settings

    from workflows import clock
    from workflows.models import Event, Timer, Workflow

    n, window = bench.sizes.timers, bench.sizes.timer_window_s
    ensure_workers(bench, 2)
    ensure_beat(bench)
    template = make_template(wait="timer", seconds=3600)
    # Copies are written first, so the first one falls due once they all are in place.
    lead = 3.0 + n / 400
    start = clock.now() + timedelta(seconds=lead)
    bench.log(f"timers: {n} timers due from {lead:.0f} s to {lead + window:.0f} s from now")
    ids = clone_parked(template, start, [window * i / n for i in range(n)])
    Workflow.objects.filter(pk=template).delete()
    deadline = time.monotonic() + lead + window + 120

    def finished() -> int:
        return Workflow.objects.filter(pk__in=ids, status__in=Workflow.TERMINAL).count()

    while finished() < n:
        if time.monotonic() > deadline:
            raise BenchError(f"timers: only {finished()} of {n} woke and completed\n{bench.cluster.logs()}")
        time.sleep(0.5)
    timers = list(Timer.objects.filter(workflow_id__in=ids).values_list("pk", "status", "fire_at", "fired_at"))
    not_fired = [t for t in timers if t[1] != Timer.Status.FIRED]
    if not_fired:
        raise BenchError(f"timers: {len(not_fired)} timers were not fired, e.g. {not_fired[:3]}")
    lateness = [(fired - fire_at).total_seconds() for _, _, fire_at, fired in timers]
    completed = dict(Workflow.objects.filter(pk__in=ids, status="completed").values_list("pk", "updated_at"))
    fire_at_by_wf = dict(Timer.objects.filter(workflow_id__in=ids).values_list("workflow_id", "fire_at"))
    wake_to_done = [(completed[w] - fire_at_by_wf[w]).total_seconds() for w in completed]
    fired_events = Counter(Event.objects.filter(workflow_id__in=ids, kind="timer.fired")
                           .values_list("data__timer_id", flat=True))
    woken = Counter(Event.objects.filter(workflow_id__in=ids, kind="workflow.woken").values_list("workflow_id",
                                                                                               flat=True))
    interval = settings.AGENTOPS_BEAT_INTERVAL_SECONDS
    return {
        "timers": n, "window_s": window, "beat_interval_s": interval,
        "lateness": _stats(lateness),
        "due_to_workflow_completed": _stats(wake_to_done),
        "early_fires": sum(1 for x in lateness if x < 0),
        "duplicate_fires": sum(c - 1 for c in fired_events.values() if c > 1)
        + sum(c - 1 for c in woken.values() if c > 1),
        "workflows_completed": len(completed),
        "target_p99_s": interval + 1,
    }
