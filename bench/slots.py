"""Concurrency keys for activities (10): tenants sharing a kind's cap on real workers, and what a pass costs.

The workflows are ``bench_steps`` runs of the heartbeating sleep (``bench.heartbeat_sleep_short``,
1 s an activity), their kind capped by ``AGENTOPS_ACTIVITY_CONCURRENCY``; one threads worker on
the default queue has room for far more attempts than the cap, so the cap is what binds.
Launched with the worker paused, so every first activity falls due at once.

- **equal demand**: two tenants (launchers) with as many workflows each: each tenant's median and
  p99 wait for a slot (``slot_waited_ms`` of its ``activity.started`` events, 0 when it did not
  wait); the most attempts running at once (from the attempts' start and end) against the cap;
  the cap's use (attempt-seconds over cap × the run's span).
- **unequal demand**: 9 : 1 workflows: each tenant's median wait (the small one is never behind
  the large one's queue: it holds fewer slots, so it goes first).
- **pass cost** (in this process, on the bench database): the time of the pass that hands a
  freed slot on, with 100 and with 2,000 activities waiting under the key, each in a rolled-back
  transaction.
"""
from __future__ import annotations

import json
import statistics
import time
from typing import Any

from bench.context import Bench
from bench.ratelimits import _launch, _users, _wait_done
from bench.workload import SLEEP_SHORT

KIND = "bench_steps"
THREADS = 60
# Enough connections that the cap binds, not the pool: an attempt holds one while it sleeps.
POOL = 30
PASS_REPEATS = 20


def _start_worker(bench: Bench, cap: int) -> None:
    from django.conf import settings

    bench.cluster.stop(bench.cluster.workers())
    env = {"AGENTOPS_ACTIVITY_CONCURRENCY": json.dumps({f"kind:{KIND}": cap}), "AGENTOPS_DB_POOL_SIZE": str(POOL)}
    proc = bench.cluster.start_worker("slots", pool="threads", concurrency=THREADS,
                                      queues=(settings.CELERY_TASK_DEFAULT_QUEUE,), ready=False, extra_env=env)
    bench.cluster.wait_ready(proc)


def _percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[max(0, round(q / 100 * len(ordered)) - 1)] if ordered else 0.0


def run_tenants(bench: Bench, *, counts: dict[str, int], steps: int, cap: int) -> dict[str, Any]:
    """Launch ``counts`` workflows per tenant at once; each tenant's waits, and the cap's use."""
    from workflows.models import ActivityAttempt, Event

    users = _users()
    tenants = [name for name, n in counts.items() for _ in range(n)]
    params = {"steps": steps, "activity": SLEEP_SHORT, "seconds": 1}
    started = time.monotonic()
    ids = _launch([{"params": params, "user": users[name]} for name in tenants], paused=bench, kind=KIND)
    _wait_done(bench, ids, timeout=120 + 3 * len(ids) * steps / cap)
    seconds = time.monotonic() - started
    tenant_of = dict(zip(ids, tenants, strict=True))
    waits: dict[str, list[float]] = {name: [] for name in counts}
    for workflow_id, waited in Event.objects.filter(workflow_id__in=ids, kind="activity.started").values_list(
            "workflow_id", "data__slot_waited_ms"):
        waits[tenant_of[workflow_id]].append((waited or 0) / 1000)
    spans = list(ActivityAttempt.objects.filter(activity__workflow_id__in=ids).values_list("started_at",
                                                                                          "finished_at"))
    edges = sorted([(s, 1) for s, _ in spans] + [(f, -1) for _, f in spans])
    running = most = 0
    for _, step in edges:
        running += step
        most = max(most, running)
    busy = sum((f - s).total_seconds() for s, f in spans)
    span = (max(f for _, f in spans) - min(s for s, _ in spans)).total_seconds()
    medians = {name: statistics.median(w) for name, w in waits.items()}
    p99 = {name: _percentile(w, 99) for name, w in waits.items()}
    return {"workflows": counts, "steps": steps, "cap": cap, "activities": len(spans),
            "median_wait_s": {n: round(m, 3) for n, m in medians.items()},
            "p99_wait_s": {n: round(p, 3) for n, p in p99.items()},
            "most_at_once": most, "cap_use": round(busy / (cap * span), 3), "seconds": round(seconds, 1)}


def pass_cost(bench: Bench, *, waiting: int, cap: int) -> dict[str, Any]:
    """Median time of the pass that hands one freed slot on, with ``waiting`` activities waiting
    under a kind's cap of ``cap`` (all but one of them running), in rolled-back transactions."""
    from unittest import mock

    from django.db import transaction
    from django.test import override_settings

    from workflows import clock, doorbells, services
    from workflows.models import Activity, Workflow
    from workflows.services import slots

    # No worker runs these: their doorbells are not sent.
    with override_settings(AGENTOPS_ACTIVITY_CONCURRENCY={}), mock.patch.object(doorbells, "activity_run"):
        ids = [services.workflow_launch(kind=KIND, goal="pass cost", params={"steps": 1}).pk
               for _ in range(waiting + cap)]
    acts = list(Activity.objects.filter(workflow_id__in=ids).order_by("pk").values_list("pk", flat=True))
    now = clock.now()
    Activity.objects.filter(pk__in=acts[:cap]).update(status=Activity.Status.RUNNING, tenant="user:1", attempt=1)
    Activity.objects.filter(pk__in=acts[cap:]).update(slot_waiting_since=now, tenant="user:1")
    times = []
    with override_settings(AGENTOPS_ACTIVITY_CONCURRENCY={f"kind:{KIND}": cap}):
        for _ in range(PASS_REPEATS):
            with transaction.atomic():
                Activity.objects.filter(pk=acts[0]).update(status=Activity.Status.SUCCEEDED)
                began = time.perf_counter()
                slots.freed("user:1", KIND, now=clock.now())
                times.append(time.perf_counter() - began)
                granted = Activity.objects.filter(pk__in=acts[cap:], slot_granted_at__isnull=False).count()
                transaction.set_rollback(True)
            if granted != 1:
                raise RuntimeError(f"the pass handed out {granted} slots, not 1")
    Workflow.objects.filter(pk__in=ids).delete()
    return {"waiting": waiting, "cap": cap, "median_ms": round(1000 * statistics.median(times), 2),
            "max_ms": round(1000 * max(times), 2)}


def bench_slots(bench: Bench) -> dict[str, Any]:
    sizes = bench.sizes
    cap, steps = sizes.slots_cap, sizes.slots_steps
    try:
        _start_worker(bench, cap)
        each = sizes.slots_workflows // 2
        bench.log(f"concurrency keys: two tenants of {each} workflows x {steps} activities of 1 s, a cap of {cap}")
        equal = run_tenants(bench, counts={"large": each, "small": each}, steps=steps, cap=cap)
        bench.log(f"  median wait {equal['median_wait_s']}, p99 {equal['p99_wait_s']}; at most "
                  f"{equal['most_at_once']} at once, cap used {equal['cap_use']:.2f}x")
        large, small = sizes.slots_workflows * 9 // 10, sizes.slots_workflows // 10
        bench.log(f"concurrency keys: tenants of {large} and {small} workflows")
        unequal = run_tenants(bench, counts={"large": large, "small": small}, steps=steps, cap=cap)
        bench.log(f"  median wait {unequal['median_wait_s']}, p99 {unequal['p99_wait_s']}")
    finally:
        bench.cluster.stop(bench.cluster.workers())
    costs = []
    for waiting in sizes.slots_pass_waiting:
        bench.log(f"concurrency keys: the pass with {waiting} waiting")
        costs.append(pass_cost(bench, waiting=waiting, cap=cap))
        bench.log(f"  {costs[-1]['median_ms']} ms (max {costs[-1]['max_ms']} ms)")
    p99 = equal["p99_wait_s"]
    med = unequal["median_wait_s"]
    return {"equal": equal, "unequal": unequal, "pass": costs,
            "p99_ratio_equal": round(max(p99.values()) / max(1e-3, min(p99.values())), 2),
            "small_over_large_median": round(med["small"] / max(1e-3, med["large"]), 3),
            "targets": {"p99_ratio_equal": 2.0, "small_over_large_median": 2.0, "cap_use": 0.9}}
