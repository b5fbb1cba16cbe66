"""Step throughput and cost per activity: agentops vs a plain Celery chain vs DBOS Transact (1, 2 and 6).

Every run is timed from the first launch to the last completion (the workflows' ``updated_at``,
the chains' own finishing times, the DBOS processes' clocks), and counted on the servers:
``pg_stat_database.xact_commit`` of the database the run writes to, and Redis ``INFO commandstats``.
"""
from __future__ import annotations

import json
import signal
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from bench.context import Bench
from bench.infra import PUBLISH_COMMANDS, REPO_ROOT, BenchError, Proc, command_deltas, wait_for
from bench.tasks import CHAIN_DONE_KEY
from bench.workload import NOOP

# Our own polling and bookkeeping, left out of the per-activity command counts.
READ_ONLY_COMMANDS = ("info", "llen", "lrange", "ping", "select", "hello", "client|setname", "client|setinfo")
# A closed backend flushes its counters at exit; an idle one (the workers keep theirs) within 1 s,
# or 10 s later when another backend held the shared counters' lock at that moment (PostgreSQL 15).
STATS_SETTLE_SECONDS = 11.0


def ensure_workers(bench: Bench, count: int, env: dict[str, str] | None = None) -> list[Proc]:
    """Exactly ``count`` live workers started with ``env`` (others are stopped first)."""
    env = env or {}
    live = bench.cluster.workers()
    wrong = [p for p in live if getattr(p, "bench_env", None) != env]
    if wrong:
        bench.cluster.stop(wrong)
    live = bench.cluster.workers()
    if len(live) > count:
        bench.cluster.stop(live[count:])
        live = live[:count]
    new = []
    for _ in range(count - len(live)):
        proc = bench.cluster.start_worker(f"w{len(bench.cluster.procs) + 1}", extra_env=env, ready=False)
        proc.bench_env = env  # type: ignore[attr-defined]
        new.append(proc)
    bench.cluster.wait_ready(*new)
    return bench.cluster.workers()


def set_task_events(enabled: bool) -> None:
    """The orchestrator publishes too: its task-sent events follow the same switch as the workers'."""
    from agentops.celery import app

    app.conf.task_send_sent_event = enabled


def _counters(bench: Bench, db: str) -> tuple[int, dict[str, int]]:
    from django.db import connection

    connection.close()  # our backend exits and flushes its own counters
    time.sleep(STATS_SETTLE_SECONDS)
    return bench.pg.xact_commit(db), bench.broker.commandstats()


def _costs(commits: int, redis_delta: dict[str, int], activities: int) -> dict[str, Any]:
    publishes = {k: v for k, v in redis_delta.items() if k in PUBLISH_COMMANDS}
    return {
        "commits": commits,
        "commits_per_activity": round(commits / activities, 3),
        "publishes_per_activity": round(sum(publishes.values()) / activities, 3),
        "task_messages_per_activity": round((publishes.get("lpush", 0) + publishes.get("rpush", 0)) / activities, 3),
        "event_publishes_per_activity": round(publishes.get("publish", 0) / activities, 3),
        "redis_commands_per_activity": {k: round(v / activities, 3) for k, v in sorted(redis_delta.items())
                                        if k not in READ_ONLY_COMMANDS},
    }


def run_agentops(bench: Bench, *, workflows: int, steps: int = 10, activity: str = NOOP,
                 label: str = "agentops", measure_rss: tuple[int, ...] = ()) -> dict[str, Any]:
    """Launch ``workflows`` bench_steps workflows at once; wait for all to complete."""
    from django.db import connection

    from workflows import services
    from workflows.models import Activity, Workflow

    c0, r0 = _counters(bench, bench.db_name)
    t0 = time.time()
    ids = [services.workflow_launch(kind="bench_steps", goal=f"bench {n}", params={"steps": steps,
                                                                                  "activity": activity}).pk
           for n in range(workflows)]
    launched = time.time() - t0
    queries = 0  # our own transactions while waiting, subtracted from the count
    rss: dict[str, dict[str, int]] = {}
    pending_rss = sorted(measure_rss)
    deadline = time.monotonic() + max(120.0, workflows * steps / 5)
    while True:
        done = Workflow.objects.filter(pk__in=ids, status__in=Workflow.TERMINAL).count()
        queries += 1
        if pending_rss:
            succeeded = Activity.objects.filter(workflow_id__in=ids, status="succeeded").count()
            queries += 1
            while pending_rss and succeeded >= pending_rss[0]:
                rss[str(pending_rss.pop(0))] = {p.name: p.rss_bytes().get("pool", 0) for p in bench.cluster.workers()}
        if done == len(ids):
            break
        if time.monotonic() > deadline:
            raise BenchError(f"{label}: only {done} of {len(ids)} workflows finished in time\n{bench.cluster.logs()}")
        time.sleep(0.25)
    rows = Workflow.objects.filter(pk__in=ids).values_list("status", "updated_at")
    queries += 1
    failed = sum(1 for status, _ in rows if status != Workflow.Status.COMPLETED)
    if failed:
        raise BenchError(f"{label}: {failed} workflows did not complete\n{bench.cluster.logs()}")
    elapsed = max(at for _, at in rows).timestamp() - t0
    connection.close()
    c1, r1 = _counters(bench, bench.db_name)
    activities = workflows * steps
    result = {
        "label": label, "workflows": workflows, "steps": steps, "activities": activities,
        "workers": len(bench.cluster.workers()), "elapsed_s": round(elapsed, 3), "launch_s": round(launched, 3),
        "steps_per_s": round(activities / elapsed, 1),
        **_costs(c1 - c0 - queries, command_deltas(r0, r1), activities),
    }
    if rss:
        result["pool_rss_bytes_after_activities"] = rss
    return result


def run_chain(bench: Bench, *, chains: int, steps: int = 10, label: str = "celery chain") -> dict[str, Any]:
    """``chains`` chains of ``steps`` no-op tasks at once on the same workers and settings."""
    from celery import chain

    from bench.tasks import chain_last, chain_step

    bench.broker.client.delete(CHAIN_DONE_KEY)
    c0, r0 = _counters(bench, bench.db_name)
    t0 = time.time()
    for n in range(chains):
        chain(*[chain_step.si(n, k) for k in range(steps - 1)], chain_last.si(n, steps - 1)).apply_async()
    wait_for(lambda: bench.broker.client.llen(CHAIN_DONE_KEY) >= chains, timeout=max(120.0, chains * steps / 5),
             what=f"{chains} Celery chains", interval=0.05, dump=bench.cluster.logs)
    finished = max(float(x) for x in bench.broker.client.lrange(CHAIN_DONE_KEY, 0, -1))
    c1, r1 = _counters(bench, bench.db_name)
    elapsed = finished - t0
    activities = chains * steps
    deltas = command_deltas(r0, r1)
    deltas["rpush"] = deltas.get("rpush", 0) - chains  # our own completion marks
    return {"label": label, "workflows": chains, "steps": steps, "activities": activities,
            "workers": len(bench.cluster.workers()), "elapsed_s": round(elapsed, 3),
            "steps_per_s": round(activities / elapsed, 1), **_costs(c1 - c0, deltas, activities)}


def run_dbos(bench: Bench, *, workflows: int, steps: int = 10, processes: int = 2,
             sequential: bool = False) -> dict[str, Any]:
    """DBOS Transact: ``processes`` processes, each starting its share of the workflows at once
    (``sequential``: one after another, each one's duration reported)."""
    try:
        import dbos  # noqa: F401
    except ImportError as exc:
        return {"label": "dbos", "skipped": f"the dbos package is not installed ({exc}); "
                                           "`pip install -e '.[bench]'` installs it"}
    url = bench.pg.recreate(bench.dbos_db_name)
    go = bench.out_dir / "dbos-go"
    go.unlink(missing_ok=True)
    share = [workflows // processes + (1 if i < workflows % processes else 0) for i in range(processes)]
    procs = []
    for i, n in enumerate(share):
        log = open(bench.out_dir / f"dbos-{i}.log", "w+b")  # noqa: SIM115 - closed below
        procs.append((subprocess.Popen(
            [sys.executable, "-m", "bench.dbos_runner", "--database-url", url, "--workflows", str(n),
             "--steps", str(steps), "--executor", f"bench-{i}", "--go-file", str(go),
             *(["--sequential"] if sequential else [])],
            cwd=REPO_ROOT, stdout=subprocess.PIPE, stderr=log, text=True), log))
    try:
        for proc, log in procs:
            line = proc.stdout.readline() if proc.stdout else ""
            if line.strip() != "ready":
                proc.wait(30)
                log.seek(0)
                raise BenchError(f"DBOS process did not start: {line!r}\n{log.read().decode()[-3000:]}")
        c0 = 0 if sequential else _counters(bench, bench.dbos_db_name)[0]
        go.touch()
        reports = []
        for proc, log in procs:
            out, _ = proc.communicate(timeout=max(120.0, workflows * steps / 5))
            if proc.returncode != 0:
                log.seek(0)
                raise BenchError(f"DBOS process exited with {proc.returncode}\n{log.read().decode()[-3000:]}")
            reports.append(json.loads(out.strip().splitlines()[-1]))
        c1 = 0 if sequential else _counters(bench, bench.dbos_db_name)[0]
    finally:
        for proc, log in procs:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
            log.close()
        go.unlink(missing_ok=True)
    elapsed = max(r["finished"] for r in reports) - min(r["started"] for r in reports)
    activities = workflows * steps
    if sequential:
        durations = [d for r in reports for d in r["durations"]]
        return {"label": "dbos, one workflow at a time", "runs": len(durations), "steps": steps,
                "median_s": round(statistics.median(durations), 4), "samples_s": [round(d, 4) for d in durations]}
    return {"label": f"dbos ({processes} processes)", "workflows": workflows, "steps": steps,
            "activities": activities, "processes": processes, "elapsed_s": round(elapsed, 3),
            "steps_per_s": round(activities / elapsed, 1), "commits": c1 - c0,
            "commits_per_activity": round((c1 - c0) / activities, 3),
            "note": "commits include DBOS's own background queries during the run"}


def run_latency(bench: Bench, *, runs: int, steps: int = 10) -> dict[str, Any]:
    """One workflow of ``steps`` no-op activities at a time, ``runs`` times: launch -> completed
    (``updated_at``), what one interactive agent feels."""
    from workflows import services
    from workflows.models import Workflow

    samples = []
    for n in range(runs):
        t0 = time.time()
        wf = services.workflow_launch(kind="bench_steps", goal=f"latency {n}", params={"steps": steps}).pk
        status, at = wait_for(
            lambda wf=wf: Workflow.objects.filter(pk=wf, status__in=Workflow.TERMINAL).values_list(
                "status", "updated_at").first(), timeout=60, what=f"workflow {wf}", interval=0.01,
            dump=bench.cluster.logs)
        if status != Workflow.Status.COMPLETED:
            raise BenchError(f"latency run {n}: workflow {wf} ended {status}\n{bench.cluster.logs()}")
        samples.append(at.timestamp() - t0)
    return {"label": "agentops, one workflow at a time", "runs": runs, "steps": steps,
            "median_s": round(statistics.median(samples), 4), "samples_s": [round(s, 4) for s in samples]}


def warm_up(bench: Bench) -> None:
    """Import every lazily imported module in the workers and fill their caches, off the clock."""
    run_agentops(bench, workflows=bench.sizes.warmup_workflows, steps=2, label="warm-up")
    run_chain(bench, chains=bench.sizes.warmup_workflows, steps=2, label="warm-up")


def bench_throughput(bench: Bench) -> dict[str, Any]:
    """Benchmarks 1 and 2: 200 workflows x 10 steps on 2 workers vs the Celery chain and DBOS."""
    n, steps = bench.sizes.throughput_workflows, bench.sizes.steps
    ensure_workers(bench, 2)
    warm_up(bench)
    bench.log(f"throughput: agentops {n} x {steps}")
    agentops = run_agentops(bench, workflows=n, steps=steps)
    bench.log(f"  {agentops['steps_per_s']} steps/s; chain {n} x {steps}")
    chain = run_chain(bench, chains=n, steps=steps)
    bench.log(f"  {chain['steps_per_s']} steps/s; one {steps}-step workflow at a time")
    latency = run_latency(bench, runs=bench.sizes.latency_runs, steps=steps)
    bench.log(f"  {latency['median_s']} s; DBOS {n} x {steps} in 2 processes")
    bench.cluster.stop(bench.cluster.workers())  # DBOS gets the machine to itself, as the workers did
    dbos = run_dbos(bench, workflows=n, steps=steps)
    bench.log(f"  {dbos.get('steps_per_s', dbos.get('skipped'))}; DBOS one workflow at a time")
    dbos_latency = run_dbos(bench, workflows=bench.sizes.latency_runs, steps=steps, processes=1, sequential=True)
    from bench.trace import trace_happy_path

    out: dict[str, Any] = {"agentops": agentops, "celery_chain": chain, "dbos": dbos,
                           "latency": {"agentops": latency, "dbos": dbos_latency},
                           "trace": trace_happy_path(bench),
                           "ratio_vs_chain": round(agentops["steps_per_s"] / chain["steps_per_s"], 3)}
    if "steps_per_s" in dbos:
        out["ratio_vs_dbos"] = round(agentops["steps_per_s"] / dbos["steps_per_s"], 3)
    if "median_s" in dbos_latency:
        out["latency"]["ratio_vs_dbos"] = round(latency["median_s"] / dbos_latency["median_s"], 2)
    if bench.sizes.ablations:
        out["ablations"] = ablations(bench, n, steps)
    return out


def ablations(bench: Bench, n: int, steps: int) -> list[dict[str, Any]]:
    """The same run with settings changed by environment only: what each would buy."""
    variants = [
        ("without chaining (AGENTOPS_ACTIVITY_CHAIN_SECONDS=0)", {"AGENTOPS_ACTIVITY_CHAIN_SECONDS": "0"}, True),
        ("without chaining or kept connections (also AGENTOPS_DB_CONN_MAX_AGE_SECONDS=0)",
         {"AGENTOPS_ACTIVITY_CHAIN_SECONDS": "0", "AGENTOPS_DB_CONN_MAX_AGE_SECONDS": "0"}, True),
        ("Celery task events off", {"BENCH_TASK_EVENTS": "0"}, False),
    ]
    rows = []
    for label, env, events in variants:
        ensure_workers(bench, 2, env)
        set_task_events(events)
        try:
            warm_up(bench)
            bench.log(f"ablation: {label}")
            row = run_agentops(bench, workflows=n, steps=steps, label=f"agentops, {label}")
            if not events:
                chain = run_chain(bench, chains=n, steps=steps, label=f"celery chain, {label}")
                row["chain_steps_per_s"] = chain["steps_per_s"]
                row["ratio_vs_chain"] = round(row["steps_per_s"] / chain["steps_per_s"], 3)
            rows.append(row)
        finally:
            set_task_events(True)
    ensure_workers(bench, 2)
    return rows


def run_ablations(bench: Bench) -> dict[str, Any]:
    """The ablations on their own, after a baseline run with the product's settings."""
    n, steps = bench.sizes.throughput_workflows, bench.sizes.steps
    ensure_workers(bench, 2)
    warm_up(bench)
    baseline = run_agentops(bench, workflows=n, steps=steps)
    return {"baseline": baseline, "rows": ablations(bench, n, steps)}


def bench_growth(bench: Bench) -> dict[str, Any]:
    """Benchmark 6: throughput and cost at 10/100/1000 workflows on 2 fresh workers (their memory read
    after 1,000 and after 10,000 activities of the largest run), then 1 worker vs 2."""
    steps = bench.sizes.steps
    low, high = bench.sizes.rss_activities
    rows = []
    bench.cluster.stop(bench.cluster.workers())  # fresh workers: the memory figures are this run's own
    ensure_workers(bench, 2)
    warm_up(bench)
    for n in bench.sizes.growth_concurrency:
        bench.log(f"growth: {n} workflows on 2 workers")
        rss = (low, high) if n * steps >= high else ()
        rows.append(run_agentops(bench, workflows=n, steps=steps, label=f"{n} workflows, 2 workers", measure_rss=rss))
    memory: dict[str, Any] = {}
    after = rows[-1].get("pool_rss_bytes_after_activities", {})
    if str(low) in after and str(high) in after:
        memory = {name: {f"rss_after_{low}_mb": round(first / 2**20, 1),
                         f"rss_after_{high}_mb": round(after[str(high)][name] / 2**20, 1),
                         "growth_ratio": round(after[str(high)][name] / first, 3)}
                  for name, first in after[str(low)].items() if first and after[str(high)].get(name)}
    n1 = bench.sizes.growth_concurrency[1]
    ensure_workers(bench, 1)
    bench.log(f"growth: {n1} workflows on 1 worker")
    one = run_agentops(bench, workflows=n1, steps=steps, label=f"{n1} workflows, 1 worker")
    two = next(r for r in rows if r["workflows"] == n1)
    rows.append(one)
    ensure_workers(bench, 2)
    return {"rows": rows, "one_vs_two_workers": round(one["steps_per_s"] / two["steps_per_s"], 3),
            "memory_activities_in_all": [low, high], "memory": memory,
            "max_memory_growth_ratio": max((m["growth_ratio"] for m in memory.values()), default=None)}


def profile_worker(bench: Bench, path: Path) -> dict[str, Any]:
    """py-spy on one worker's pool process during a throughput run: where a step's wall time goes."""
    from bench.profiling import summarize

    spy = Path(sys.executable).with_name("py-spy")
    if not spy.exists():
        return {"skipped": "py-spy is not installed (`pip install -e '.[bench]'`)"}
    workers = ensure_workers(bench, 2)
    warm_up(bench)
    pool = workers[0].pool_children()[0].pid
    raw = path.with_suffix(".raw.txt")
    raw.unlink(missing_ok=True)
    # Recorded from before the first launch to after the last completion; SIGINT makes py-spy write out.
    recorder = subprocess.Popen(
        [str(spy), "record", "--pid", str(pool), "--rate", "250", "--idle", "--format", "raw", "--output", str(raw),
         "--nonblocking"], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    time.sleep(1.0)
    n = max(bench.sizes.throughput_workflows, int(bench.sizes.profile_seconds * 15))
    run_agentops(bench, workflows=n, steps=bench.sizes.steps, label="profiled")
    recorder.send_signal(signal.SIGINT)
    _, err = recorder.communicate(timeout=60)
    if not raw.exists():
        return {"skipped": f"py-spy failed: {err.strip()[-500:]}"}
    summary = summarize(raw.read_text())
    path.write_text(summary.pop("text"))
    return {"file": str(path.relative_to(REPO_ROOT)) if path.is_relative_to(REPO_ROOT) else str(path), **summary}
