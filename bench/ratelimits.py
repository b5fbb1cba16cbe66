"""Shared rate limits (9): agents on two worker processes against a fake API that enforces an organisation limit.

The fake Messages API (``bench/fake_api.py``, its own process) enforces a limit like the API's:
token buckets of requests and input tokens per minute (refilled continuously, holding a minute's
limit, or 5 s of it as the API may enforce a limit over shorter intervals), a 429 with
``retry-after`` past them, ``anthropic-ratelimit-*`` headers on every answer. The agents are
``bench_model_calls`` workflows (``bench/workload.py``): a few model calls in a row, each through
the real SDK and the whole model-call path (lease, heartbeats, fence, budget reservation, charge,
``model.called``) and the shared limiter in the bench's Redis. Nothing is configured: the limiter
learns the limits from a warm-up's answers, as a fleet would.

- **limit**: N agents launched at once; 429s against all requests, and the rate of successful
  requests and input tokens once the buckets are drained (from 5 s after the fake API's buckets
  first fell below a tenth to the last request), against the organisation's limit; with buckets
  of 60 s and of 5 s;
- **another client**: the same with buckets of 5 s while another client takes 30 % of the limit:
  429s from 10 s after it started;
- **fairness**: a large and a small tenant (two launchers) at 90 : 1 agents, launched at once
  into the drained limit: each tenant's median wait for its share (``rate_wait_ms`` of its
  ``model.called`` events, 0 when it did not wait);
- **priority**: a priority-9 workflow launched while the fairness run saturates the limit: the
  wait of each of its calls against the mean gap between successful requests meanwhile;
- **without the limiter** (the baseline, last): the limit run again on a full organisation limit,
  the workers without the shared limiter (``AGENTOPS_RATE_LIMIT_REDIS_URL=""``): each call learns
  of the limit by a 429 and backs off by its retry-after, as before the shared limiter.
"""
from __future__ import annotations

import statistics
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from bench.context import Bench
from bench.inflight import MODEL, FakeAPI
from bench.infra import BenchError
from bench.timers import ensure_beat

IO_THREADS = 200  # each of the two I/O workers: a waiting call holds its thread, as an answer awaited does
LATENCY_S = 1.0
LAUNCHERS = 4
MAX_TOKENS = 64
SETTLE_S = 5.0


def _start_workers(bench: Bench, api: FakeAPI, *, limiter: bool = True) -> None:
    from django.conf import settings

    bench.cluster.stop(bench.cluster.workers())
    env = {"AGENTOPS_MODEL_PROVIDER": "anthropic", "ANTHROPIC_API_KEY": "sk-ant-bench-0000",
           "ANTHROPIC_BASE_URL": api.url, "AGENTOPS_MODEL": MODEL, "AGENTOPS_DB_POOL_SIZE": "10",
           **({} if limiter else {"AGENTOPS_RATE_LIMIT_REDIS_URL": ""})}
    procs = [bench.cluster.start_worker(f"io{i + 1}", pool="threads", concurrency=IO_THREADS,
                                        queues=(settings.AGENTOPS_IO_QUEUE,), ready=False, extra_env=env)
             for i in range(2)]
    procs.append(bench.cluster.start_worker("short", queues=(settings.CELERY_TASK_DEFAULT_QUEUE,), ready=False,
                                            extra_env=env))
    bench.cluster.wait_ready(*procs)


def _users() -> dict[str, Any]:
    from django.contrib.auth.models import User

    return {name: User.objects.get_or_create(username=f"bench-{name}")[0] for name in ("large", "small")}


def _launch(specs: list[dict[str, Any]], *, paused: Bench | None, kind: str = "bench_model_calls") -> list[int]:
    """Launch the workflows (``paused``: with the workers stopped, so every first call falls due at once)."""
    from django.db import connection

    from workflows import services

    def one(spec: dict[str, Any]) -> int:
        try:
            return services.workflow_launch(kind=kind, goal="bench", params=spec["params"], user=spec.get("user"),
                                            options=services.LaunchOptions(priority=spec.get("priority", 5))).pk
        finally:
            connection.close()

    workers = paused.cluster.workers() if paused is not None else []
    for proc in workers:
        proc.pause()
    try:
        with ThreadPoolExecutor(LAUNCHERS) as pool:
            return list(pool.map(one, specs))
    finally:
        for proc in workers:
            proc.resume()


def _wait_done(bench: Bench, ids: list[int], *, timeout: float) -> None:
    from workflows.models import Workflow

    deadline = time.monotonic() + timeout
    while Workflow.objects.filter(pk__in=ids, status__in=Workflow.TERMINAL).count() < len(ids):
        if time.monotonic() > deadline:
            done = Workflow.objects.filter(pk__in=ids, status__in=Workflow.TERMINAL).count()
            raise BenchError(f"only {done} of {len(ids)} workflows finished in {timeout:.0f} s\n{bench.cluster.logs()}")
        time.sleep(1.0)
    failed = Workflow.objects.filter(pk__in=ids).exclude(status=Workflow.Status.COMPLETED).count()
    if failed:
        raise BenchError(f"{failed} of {len(ids)} workflows did not complete\n{bench.cluster.logs()}")


def _waits(ids: list[int]) -> dict[int, list[float]]:
    """Each workflow's model calls' waits for the limiter, in seconds."""
    from workflows.models import Event

    waits: dict[int, list[float]] = {}
    for workflow_id, waited in Event.objects.filter(workflow_id__in=ids, kind="model.called").values_list(
            "workflow_id", "data__rate_wait_ms"):
        waits.setdefault(workflow_id, []).append((waited or 0) / 1000)
    return waits


def _sent_by_worker(ids: list[int]) -> dict[str, int]:
    from django.db.models import Count

    from workflows.models import ActivityAttempt

    rows = ActivityAttempt.objects.filter(activity__workflow_id__in=ids, activity__name="bench.model_call").values(
        "worker").annotate(n=Count("pk"))
    return {str(r["worker"]).split("@")[0]: r["n"] for r in rows}


def run_limit(bench: Bench, api: FakeAPI, *, agents: int, calls: int, rpm: int, itpm: int,
              bucket_seconds: float = 60, other_share: float = 0.0) -> dict[str, Any]:
    """The agents into the limit, its buckets holding ``bucket_seconds`` of their rate; with
    ``other_share``, another client takes that share of the limit from the launch on."""
    api.ask(f"limit {rpm} {itpm} 0 {bucket_seconds:g}")
    api.ask("reset")
    # Prompts of 100 to 600 tokens (mean about 350: the input-token limit binds near the request limit).
    specs = [{"params": {"calls": calls, "prompt_chars": 400 + (i * 37) % 2000, "max_tokens": MAX_TOKENS}}
             for i in range(agents)]
    started = time.time()
    other_at = None
    if other_share:
        other_at = float(api.ask(f"other {other_share:g} {2 * agents * calls * 60 / rpm:g}")["at"])
    ids = _launch(specs, paused=bench)
    _wait_done(bench, ids, timeout=120 + 3 * agents * calls * 60 / rpm)
    report = api.ask("report")
    requests = report["calls"]
    ok = sorted((c["at"], c["input_tokens"]) for c in requests if c["status"] == 200)
    limited = sum(1 for c in requests if c["status"] == 429)
    # The window starts 5 s after the fake API's buckets first fell below a tenth: by then the
    # burst a full bucket allows is spent, and what goes is what the refill allows.
    since = (report["limit_low_since"] or ok[0][0]) + SETTLE_S
    window = [(at, tokens) for at, tokens in ok if at >= since]
    seconds = max(1e-6, window[-1][0] - since) if window else 1e-6
    req_per_min = 60 * (len(window) - 1) / seconds if len(window) > 1 else 0.0
    tok_per_min = 60 * sum(tokens for _, tokens in window[1:]) / seconds
    adapted: dict[str, Any] = {}
    if other_at is not None:
        # From 10 s after the other client started: the fleet has adapted to the share left.
        later = [c for c in requests if c["at"] >= other_at + 10]
        refused = sum(1 for c in later if c["status"] == 429)
        adapted = {"other_share": other_share, "requests_after_10_s": len(later),
                   "rate_limited_after_10_s": refused,
                   "rate_limited_share_after_10_s": round(refused / max(1, len(later)), 4)}
    return {"agents": agents, "calls_per_agent": calls, "latency_s": LATENCY_S, "limit_rpm": rpm, "limit_itpm": itpm,
            "bucket_seconds": bucket_seconds, **adapted,
            "requests": len(requests), "ok": len(ok), "rate_limited": limited,
            "rate_limited_share": round(limited / max(1, len(requests)), 4),
            "saturated_window_s": round(seconds, 1), "saturated_after_s": round(since - started, 1),
            "ok_requests_per_min": round(req_per_min, 1), "input_tokens_per_min": round(tok_per_min),
            "requests_use": round(req_per_min / rpm, 3), "input_tokens_use": round(tok_per_min / itpm, 3),
            "use_of_binding_limit": round(max(req_per_min / rpm, tok_per_min / itpm), 3),
            "calls_by_worker": _sent_by_worker(ids), "seconds": round(time.time() - started, 1)}


def run_fairness(bench: Bench, api: FakeAPI, *, large: int, small: int, calls: int) -> dict[str, Any]:
    """The two tenants at once into the drained limit; a priority-9 workflow once it is saturated."""
    users = _users()
    api.ask("reset")
    spec = {"calls": calls, "prompt_chars": 1200, "max_tokens": MAX_TOKENS}
    tenants = [("large", users["large"])] * large + [("small", users["small"])] * small
    ids = _launch([{"params": spec, "user": user} for _, user in tenants], paused=bench)
    tenant_of = {wf: name for wf, (name, _) in zip(ids, tenants, strict=True)}
    time.sleep(max(5.0, 0.25 * (large + small) * calls / 10))  # well into the saturated run
    launched_at = time.time()
    urgent = _launch([{"params": spec, "user": users["large"], "priority": 9}], paused=None)
    _wait_done(bench, ids + urgent, timeout=120 + 3 * (large + small + 1) * calls)
    waits = _waits(ids)
    by_tenant: dict[str, list[float]] = {"large": [], "small": []}
    for wf, seconds in waits.items():
        by_tenant[tenant_of[wf]].extend(seconds)
    report = api.ask("report")
    ok = sorted(c["at"] for c in report["calls"] if c["status"] == 200)
    urgent_waits = _waits(urgent)[urgent[0]]
    from workflows.models import Event

    urgent_last = max(e.created_at.timestamp() for e in Event.objects.filter(workflow_id=urgent[0],
                                                                             kind="model.called"))
    during = [at for at in ok if launched_at - 5 <= at <= urgent_last]
    gap = (during[-1] - during[0]) / (len(during) - 1) if len(during) > 1 else float("nan")
    medians = {t: statistics.median(w) for t, w in by_tenant.items()}
    return {"large_agents": large, "small_agents": small, "calls_per_agent": calls,
            "rate_limited": sum(1 for c in report["calls"] if c["status"] == 429),
            "median_wait_s": {t: round(m, 3) for t, m in medians.items()},
            "p99_wait_s": {t: round(sorted(w)[max(0, int(0.99 * len(w)) - 1)], 3) for t, w in by_tenant.items()},
            "small_over_large_median": round(medians["small"] / max(1e-6, medians["large"]), 3),
            "priority9_waits_s": [round(w, 3) for w in urgent_waits], "mean_gap_s": round(gap, 4),
            "priority9_max_over_gap": round(max(urgent_waits) / gap, 2)}


def _said(bench: Bench, run: dict[str, Any]) -> None:
    bench.log(f"  429s {run['rate_limited']} of {run['requests']} ({100 * run['rate_limited_share']:.1f} %), "
              f"{run['ok_requests_per_min']} requests and {run['input_tokens_per_min']:,} input tokens a "
              f"minute once saturated ({run['use_of_binding_limit']:.2f}x the binding limit; targets: at most 2 % "
              f"429s, at least 0.85x), {run['seconds']} s")


def bench_ratelimits(bench: Bench) -> dict[str, Any]:
    sizes = bench.sizes
    rpm, itpm = sizes.ratelimit_rpm, sizes.ratelimit_itpm
    agents, calls = sizes.ratelimit_agents, sizes.ratelimit_calls
    api = FakeAPI(bench.out_dir)
    try:
        api.ask(f"answer {LATENCY_S}")
        api.ask(f"limit {rpm} {itpm} 0")
        _start_workers(bench, api)
        bench.log("rate limits: warm-up (the limiter learns the limits from the answers' headers)")
        warm = _launch([{"params": {"calls": 1, "prompt_chars": 400, "max_tokens": MAX_TOKENS}}] * 2, paused=None)
        _wait_done(bench, warm, timeout=120)
        buckets = {}
        for bucket in (60, 5):
            bench.log(f"rate limits: {agents} agents x {calls} calls against {rpm} requests and {itpm:,} input "
                      f"tokens a minute, enforced in buckets of {bucket} s of the rate, 2 worker processes")
            buckets[bucket] = run_limit(bench, api, agents=agents, calls=calls, rpm=rpm, itpm=itpm,
                                        bucket_seconds=bucket)
            _said(bench, buckets[bucket])
        limit = buckets[60]
        bench.log("rate limits: the same, buckets of 5 s, another client taking 30 % of the limit meanwhile")
        shared = run_limit(bench, api, agents=agents, calls=calls, rpm=rpm, itpm=itpm, bucket_seconds=5,
                           other_share=0.3)
        bench.log(f"  from 10 s after the other client started: 429s {shared['rate_limited_after_10_s']} of "
                  f"{shared['requests_after_10_s']} ({100 * shared['rate_limited_share_after_10_s']:.1f} %; target: "
                  f"at most 2 %); {shared['use_of_binding_limit']:.2f}x the binding limit, 0.7x left to share")
        bench.log(f"rate limits: two tenants, {sizes.fairness_large} and {sizes.fairness_small} agents, "
                  "then a priority-9 workflow")
        fairness = run_fairness(bench, api, large=sizes.fairness_large, small=sizes.fairness_small,
                                calls=sizes.fairness_calls)
        bench.log(f"  median wait large {fairness['median_wait_s']['large']} s, small "
                  f"{fairness['median_wait_s']['small']} s; priority 9 waits {fairness['priority9_waits_s']} s "
                  f"(mean gap {fairness['mean_gap_s']} s)")
        # The baseline: the same run without the shared limiter (each call learns of the limit by
        # a 429 and backs off by its retry-after), on a full organisation limit again.
        bench.log("rate limits: the same agents without the shared limiter (the baseline)")
        _start_workers(bench, api, limiter=False)
        ensure_beat(bench)  # the throttled attempts' retry windows are rung by its sweep
        without = run_limit(bench, api, agents=agents, calls=calls, rpm=rpm, itpm=itpm)
        bench.log(f"  429s {without['rate_limited']} of {without['requests']} "
                  f"({100 * without['rate_limited_share']:.1f} %), {without['use_of_binding_limit']:.2f}x the binding "
                  f"limit once saturated, {without['seconds']} s in all (with the limiter: {limit['seconds']} s)")
    finally:
        bench.cluster.stop(bench.cluster.workers())
        api.stop()
    targets = {"rate_limited_share": 0.02, "use_of_binding_limit": 0.85, "rate_limited_share_after_10_s": 0.02,
               "small_over_large_median": 2.0, "priority9_max_over_gap": 2.0}
    return {"limit": limit, "limit_5s_buckets": buckets[5], "other_client": shared, "fairness": fairness,
            "without_limiter": without, "targets": targets}
