"""Run the benchmark suite against local PostgreSQL and Redis; print a table, write var/bench/latest.json.

Every figure that matters is a ratio against a baseline measured in the same run, on the same
PostgreSQL, Redis and worker settings: these shared 2-core machines are too noisy for absolute
times. The suite creates its own databases (dropped at the end) and flushes its own Redis DB.
"""
from __future__ import annotations

import argparse
import dataclasses
import json
import os
import platform
import signal
import subprocess
import sys
import threading
import time
import traceback
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from bench.context import Bench, Sizes
from bench.infra import REPO_ROOT, Broker, Cluster, Postgres, pytest_running, wait_while_pytest_runs

BENCHMARKS = ("throughput", "parked", "timers", "recovery", "profile", "growth", "inflight", "long_runs",
              "ratelimits", "slots")


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="python -m bench", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog="Benchmarks: " + ", ".join(BENCHMARKS) + ". See bench/README.md for what each measures.")
    parser.add_argument("--quick", action="store_true",
                        help="shrink every benchmark (about 15 minutes in all): checks the suite, not the figures")
    parser.add_argument("--full", action="store_true", help="also run 1,000 agents in flight (a few minutes more)")
    parser.add_argument("--agents", type=int, action="append", metavar="N",
                        help="agents in flight: run with N agents (repeatable) instead of the mode's sizes")
    parser.add_argument("--only", action="append", choices=(*BENCHMARKS, "ablations"), metavar="NAME",
                        help="run only this benchmark (repeatable): " + ", ".join(BENCHMARKS))
    parser.add_argument("--postgres-url", default=os.environ.get("BENCH_POSTGRES_URL",
                                                                 "postgres://postgres@127.0.0.1:5432"),
                        help="server to create the bench databases on (default: %(default)s)")
    parser.add_argument("--database", default="agentops_bench", help="database the suite creates and drops")
    parser.add_argument("--broker-url", default=os.environ.get("BENCH_BROKER_URL", "redis://127.0.0.1:6379/13"),
                        help="Redis DB of the bench, flushed first (default: %(default)s)")
    parser.add_argument("--out", type=Path, default=REPO_ROOT / "var" / "bench" / "latest.json")
    parser.add_argument("--keep-db", action="store_true", help="keep the bench databases after the run")
    parser.add_argument("--max-wait-for-pytest", type=float, default=900.0,
                        help="seconds to wait for running pytest processes to finish first (0: do not wait)")
    return parser.parse_args(argv)


def _migrate(database_url: str) -> None:
    env = {**os.environ, "DATABASE_URL": database_url}
    done = subprocess.run([sys.executable, "manage.py", "migrate", "--verbosity", "0"], cwd=REPO_ROOT, env=env,
                          capture_output=True, text=True, check=False)
    if done.returncode != 0:
        raise SystemExit(f"manage.py migrate failed on {database_url}:\n{done.stdout}{done.stderr}")


def _setup_django(database_url: str, broker_url: str, run_dir: Path) -> None:
    """Point this process at the bench database and broker, then start Django (settings read the env once)."""
    os.environ.update({"DATABASE_URL": database_url, "CELERY_BROKER_URL": broker_url,
                       "DJANGO_SETTINGS_MODULE": "agentops.settings"})
    os.environ.setdefault("AGENTOPS_VAR_DIR", str(run_dir / "var"))
    os.environ.setdefault("AGENTOPS_LOG_LEVEL", "WARNING")
    os.environ.setdefault("AGENTOPS_MODEL_PROVIDER", "scripted")
    import django

    django.setup()
    from bench import tasks, workload  # noqa: F401  (the bench definitions and tasks, here as in the workers)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    sizes = Sizes.quick() if args.quick else Sizes.full() if args.full else Sizes()
    if args.agents:
        sizes = dataclasses.replace(sizes, inflight_agents=tuple(args.agents))
    selected = [b for b in BENCHMARKS if not args.only or b in args.only]
    out_dir = args.out.parent
    out_dir.mkdir(parents=True, exist_ok=True)
    run_dir = out_dir / "run"
    pg, broker = Postgres(args.postgres_url), Broker(args.broker_url)
    if not pg.ping():
        print(f"PostgreSQL at {args.postgres_url} does not answer; start it (see .ci/run).", file=sys.stderr)
        return 2
    if not broker.ping():
        print(f"Redis at {args.broker_url} does not answer; start it (see .ci/run).", file=sys.stderr)
        return 2
    if args.max_wait_for_pytest > 0:
        wait_while_pytest_runs(max_wait=args.max_wait_for_pytest,
                               log=lambda m: print(f"[bench] {m}", file=sys.stderr, flush=True))
    database_url = pg.recreate(args.database)
    _migrate(database_url)
    broker.flushdb()
    _setup_django(database_url, args.broker_url, run_dir)
    cluster = Cluster(run_dir=run_dir, database_url=database_url, broker_url=args.broker_url)
    bench = Bench(sizes=sizes, quick=args.quick, pg=pg, db_name=args.database, dbos_db_name=f"{args.database}_dbos",
                  database_url=database_url, broker=broker, cluster=cluster, out_dir=out_dir)
    bench.results = {"date": datetime.now(UTC).strftime("%Y-%m-%d"), "started_at": datetime.now(UTC).isoformat(),
                     "quick": args.quick, "machine": _machine(), "sizes": sizes.__dict__, "benchmarks": {}}
    failures = 0
    signal.signal(signal.SIGTERM, _exit_on_sigterm)  # stop the workers and drop the databases on the way out
    try:
        for name in selected:
            failures += _run_one(bench, name, _runner(name, bench))
            args.out.write_text(json.dumps(bench.results, indent=2, default=str) + "\n")  # so far
    finally:
        cluster.stop_all()
        if not args.keep_db:
            from django.db import connection

            connection.close()
            pg.drop(args.database)
            pg.drop(bench.dbos_db_name)
        broker.flushdb()
    bench.results["finished_at"] = datetime.now(UTC).isoformat()
    args.out.write_text(json.dumps(bench.results, indent=2, default=str) + "\n")
    from bench.report import table

    print(table(bench.results))
    print(f"\nwrote {args.out}")
    return 1 if failures else 0


def _exit_on_sigterm(signum: int, frame: Any) -> None:
    raise SystemExit(f"stopped by signal {signum}")


def _runner(name: str, bench: Bench) -> Callable[[Bench], dict[str, Any]]:
    if name == "throughput":
        from bench.throughput import bench_throughput
        return bench_throughput
    if name == "ablations":  # also part of "throughput" in a full run
        from bench.throughput import run_ablations
        return run_ablations
    if name == "growth":
        from bench.throughput import bench_growth
        return bench_growth
    if name == "profile":
        from bench.throughput import profile_worker
        return lambda b: profile_worker(b, b.out_dir / "profile-worker.txt")
    if name == "parked":
        from bench.parked import bench_parked

        def parked(b: Bench) -> dict[str, Any]:
            b.cluster.stop(b.cluster.workers())  # in-process only: nothing else on the database
            return bench_parked(b)
        return parked
    if name == "timers":
        from bench.timers import bench_timers
        return bench_timers
    if name == "inflight":
        from bench.inflight import bench_inflight
        return bench_inflight
    if name == "long_runs":
        from bench.long_runs import bench_long_runs
        return bench_long_runs
    if name == "ratelimits":
        from bench.ratelimits import bench_ratelimits
        return bench_ratelimits
    if name == "slots":
        from bench.slots import bench_slots
        return bench_slots
    from bench.recovery import bench_recovery
    return bench_recovery


class Watch(threading.Thread):
    """Notes, every few seconds, pytest runs and Redis restarts that may disturb the figures."""

    def __init__(self, broker: Broker) -> None:
        super().__init__(daemon=True)
        self.broker = broker
        self.seen: list[str] = []
        self.halt = threading.Event()

    def _run_id(self) -> str:
        try:
            return str(self.broker.client.info("server")["run_id"])
        except Exception:
            return "unreachable"

    def run(self) -> None:
        run_id = self._run_id()
        while not self.halt.wait(5.0):
            running = pytest_running()
            if running:
                self.seen.append(f"pytest running: {running[0]}")
            now = self._run_id()
            if now != run_id:
                self.seen.append(f"Redis restarted or unreachable ({now})")
                run_id = now


def _run_one(bench: Bench, name: str, fn: Callable[[Bench], dict[str, Any]]) -> int:
    bench.log(f"== {name}")
    if name not in ("timers", "recovery"):
        bench.cluster.stop(bench.cluster.beats())  # its sweeps would add work and commits to the counts
    started = time.monotonic()
    watch = Watch(bench.broker)
    watch.start()
    try:
        result = fn(bench)
    except Exception as exc:  # one broken benchmark must not hide the figures of the others
        bench.log(f"{name} failed: {exc}")
        result = {"error": f"{type(exc).__name__}: {exc}", "traceback": traceback.format_exc()[-4000:]}
    finally:
        watch.halt.set()
        watch.join()
    if watch.seen:
        result["disturbed_by"] = sorted(set(watch.seen))[:5]
        bench.log(f"{name} was disturbed: {result['disturbed_by'][0]}")
    result["seconds"] = round(time.monotonic() - started, 1)
    bench.results["benchmarks"][name] = result
    return 1 if "error" in result else 0


def _machine() -> dict[str, Any]:
    import psutil

    return {"python": platform.python_version(), "cpus": os.cpu_count(),
            "memory_gb": round(psutil.virtual_memory().total / 2**30, 1), "platform": platform.platform()}
