"""CPU per model call in one process, without Celery: a steadier measure than the in-flight run.

Under load (section 7) the worker's CPU per call scatters by about ±15 % between runs of the same
code, more than most changes it is asked to judge. This drives the same agents through the same
path a threads worker runs (``services.activity_run_if_runnable``, chained as on a threads pool,
pooled connections, the real ``anthropic`` SDK against ``bench.fake_api`` in a process of its own)
from T threads of this process, each running its share of the agents one call at a time: with the
fake API's latency, T calls are in flight. Reported: this process's CPU per call (user / system),
the bench database's PostgreSQL backends' CPU per call, and transactions per call; ``--profile``
writes a cProfile of one thread's run (``--threads 1``) and prints where its time goes.

    python -m bench.percall --agents 150 --threads 1 --latency 0
    python -m bench.percall --agents 500 --threads 250 --latency 2
    python -m bench.percall --agents 150 --threads 1 --latency 0 --profile var/bench/percall.prof
"""
from __future__ import annotations

import argparse
import json
import os
import pstats
import resource
import sys
import threading
import time
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import psutil  # type: ignore[import-untyped]

from bench.infra import REPO_ROOT, Broker, Postgres, database_backends


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m bench.percall", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--agents", type=int, default=150)
    parser.add_argument("--threads", type=int, default=1, help="threads driving the agents at once")
    parser.add_argument("--latency", type=float, default=0.0, help="seconds the fake API takes per answer")
    parser.add_argument("--tool-turns", type=int, default=3, help="tool calls per task (calls per agent: this + 3)")
    parser.add_argument("--pool", type=int, default=10, help="AGENTOPS_DB_POOL_SIZE (0: no pool)")
    parser.add_argument("--lane", type=int, default=None,
                        help="AGENTOPS_IO_ENGINE_THREADS: threads running the engine's bookkeeping at once "
                             "(0: no limit; default: the setting's)")
    parser.add_argument("--runs", type=int, default=1, help="measured runs, each on fresh agents")
    parser.add_argument("--profile", type=Path, help="write a cProfile of the run here (with --threads 1)")
    parser.add_argument("--postgres-url", default=os.environ.get("BENCH_POSTGRES_URL",
                                                                 "postgres://postgres@127.0.0.1:5432"))
    parser.add_argument("--database", default="agentops_percall")
    parser.add_argument("--broker-url", default=os.environ.get("BENCH_BROKER_URL", "redis://127.0.0.1:6379/14"))
    args = parser.parse_args(argv)
    if args.profile and args.threads != 1:
        parser.error("--profile profiles one thread: use --threads 1")
    return args


def _setup(args: argparse.Namespace, api_url: str) -> None:
    from bench.run import _migrate

    database_url = Postgres(args.postgres_url).recreate(args.database)
    _migrate(database_url)
    os.environ.update({
        "DATABASE_URL": database_url, "CELERY_BROKER_URL": args.broker_url,
        "DJANGO_SETTINGS_MODULE": "agentops.settings", "AGENTOPS_LOG_LEVEL": "WARNING",
        "AGENTOPS_MODEL_PROVIDER": "anthropic", "ANTHROPIC_API_KEY": "sk-ant-bench-0000",
        "ANTHROPIC_BASE_URL": api_url, "AGENTOPS_MODEL": "claude-sonnet-5-5",
        "AGENTOPS_VAR_DIR": str(REPO_ROOT / "var" / "bench" / "percall")})
    if args.pool:
        os.environ["AGENTOPS_DB_POOL_SIZE"] = str(args.pool)
    if args.lane is not None:
        os.environ["AGENTOPS_IO_ENGINE_THREADS"] = str(args.lane)
    import django

    django.setup()
    from agentops.celery import mark_worker_process, settle_the_heap

    # A threads worker's start (worker_init, then worker_ready): marked a worker, its agents' model
    # calls chained, the engine lane, the SDK imported; what it holds frozen out of the collector's passes.
    mark_worker_process(sender=SimpleNamespace(pool_cls="threads"))
    settle_the_heap()


def _backends_cpu(database: str) -> tuple[float, float]:
    """User and system CPU seconds of the database's PostgreSQL backends."""
    user = system = 0.0
    for proc in database_backends(database):
        try:
            times = proc.cpu_times()
        except psutil.Error:
            continue
        user, system = user + times.user, system + times.system
    return user, system


def _run(args: argparse.Namespace, api: Any) -> dict[str, Any]:
    """Launch the agents, then drive them from ``args.threads`` threads; CPU and transactions per call."""
    from django.db import connection, connections

    from workflows import lane, services
    from workflows.models import Event, Workflow
    from workflows.testing.inprocess import drive

    api.ask(f"play {args.latency} {args.tool_turns}")
    api.ask("reset")
    ids = [services.workflow_launch(kind="autonomous", goal=f"Prepare onboarding notes {n}",
                                    params={"max_rounds": 1}).pk for n in range(args.agents)]
    connection.close()
    shares = [ids[i::args.threads] for i in range(args.threads)]
    profiler = None
    if args.profile:
        import cProfile

        profiler = cProfile.Profile(time.thread_time)  # CPU, not waits

    def work(share: list[int]) -> None:
        if profiler is not None:
            profiler.enable()
        try:
            for pk in share:
                drive(pk, max_rounds=200)
        finally:
            if profiler is not None:
                profiler.disable()
            connections.close_all()

    pg_server = Postgres(args.postgres_url)
    commits_before = pg_server.xact_commit(args.database)
    pg_before, before, wall = _backends_cpu(args.database), resource.getrusage(resource.RUSAGE_SELF), time.monotonic()
    threads = [threading.Thread(target=work, args=(share,)) for share in shares]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    after, wall = resource.getrusage(resource.RUSAGE_SELF), time.monotonic() - wall
    pg_user, pg_system = (a - b for a, b in zip(_backends_cpu(args.database), pg_before, strict=True))
    pg = pg_user + pg_system
    time.sleep(1.1)  # PostgreSQL publishes a backend's statistics at most once a second
    commits = pg_server.xact_commit(args.database) - commits_before
    not_done = Workflow.objects.filter(pk__in=ids).exclude(status=Workflow.Status.COMPLETED).count()
    calls = Event.objects.filter(workflow_id__in=ids, kind="model.called").count()
    connection.close()
    user, system = after.ru_utime - before.ru_utime, after.ru_stime - before.ru_stime
    if profiler is not None:
        profiler.dump_stats(str(args.profile))
    return {"agents": args.agents, "threads": args.threads, "latency_s": args.latency, "pool": args.pool,
            "lane": lane.size(),
            "calls": calls, "not_completed": not_done, "wall_s": round(wall, 2),
            "worker_ms_per_call": round(1000 * (user + system) / calls, 2),
            "worker_user_ms": round(1000 * user / calls, 2), "worker_system_ms": round(1000 * system / calls, 2),
            "context_switches_per_call": round((after.ru_nvcsw + after.ru_nivcsw
                                                - before.ru_nvcsw - before.ru_nivcsw) / calls, 1),
            "postgres_ms_per_call": round(1000 * pg / calls, 2),
            "postgres_user_ms": round(1000 * pg_user / calls, 2),
            "postgres_system_ms": round(1000 * pg_system / calls, 2),
            "transactions_per_call": round(commits / calls, 2)}


def main(argv: list[str] | None = None) -> int:
    from bench.inflight import FakeAPI

    args = parse_args(argv)
    out_dir = REPO_ROOT / "var" / "bench" / "percall"
    out_dir.mkdir(parents=True, exist_ok=True)
    broker = Broker(args.broker_url)
    broker.flushdb()
    api = FakeAPI(out_dir)
    try:
        _setup(args, api.url)
        rows = []
        for _ in range(args.runs):
            row = _run(args, api)
            rows.append(row)
            print(json.dumps(row), flush=True)
    finally:
        api.stop()
        broker.flushdb()
        from django.db import connections

        connections.close_all()
        Postgres(args.postgres_url).drop(args.database)
    if args.profile:
        stats = pstats.Stats(str(args.profile))
        stats.sort_stats("tottime").print_stats(40)
        stats.sort_stats("cumulative").print_stats(60)
    return 1 if any(r["not_completed"] for r in rows) else 0


if __name__ == "__main__":
    sys.exit(main())
