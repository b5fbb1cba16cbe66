"""Agents in flight (7): N autonomous agents launched at once, each model call answered after a fixed latency.

The fake Messages API (``tests/fakes/anthropic_api.py``, a real HTTP server on loopback, in a
process of its own: ``bench/fake_api.py``) plays Claude for the ``autonomous`` kind; the workers reach it through
the real ``anthropic`` SDK, so the whole model-call path is measured: lease and heartbeats, the
fence, the budget reservation under the workflow's row lock, the charge, the ``model.called``
event, the turn's checkpoint. The workers are the README's shape for model-heavy agents: threads
pools on the I/O queue (``AGENTOPS_DB_POOL_SIZE`` connections each), one prefork worker on the
default queue, and beat.

The agents are launched while the workers are stopped (SIGSTOP), and continue together: every
first call falls due at that instant, so the launches' own cost (reported apart) does not spread
the agents out. Measured on the server's clock: calls in flight (answers being waited for), when
each call arrived and when its answer left. A call is *due* when the answer before it in the same
agent left (its first call: when the workers continued); due -> sent is what the engine adds
between two calls (record the answer, charge it, checkpoint, run the tool, advance, claim, reserve).
"""
from __future__ import annotations

import json
import os
import re
import statistics
import subprocess
import sys
import threading
import time
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import psutil  # type: ignore[import-untyped]
import psycopg

from bench.context import Bench
from bench.infra import REPO_ROOT, BenchError, database_backends, percentile, with_database
from bench.timers import ensure_beat

MODEL = "claude-sonnet-5-5"
# Threads-pool workers on the I/O queue: how many processes, threads each, database connections each.
IO_PROCESSES = int(os.environ.get("BENCH_IO_PROCESSES", "2"))
IO_THREADS = int(os.environ.get("BENCH_IO_THREADS", "500"))
# BENCH_IO_POOL=prefork measures the shape before the I/O queue had threads workers (BENCH_IO_THREADS
# prefork processes, one connection each): what `celery -A agentops worker` gives on this host.
IO_POOL = os.environ.get("BENCH_IO_POOL", "threads")
DB_POOL_SIZE = int(os.environ.get("BENCH_DB_POOL_SIZE", "10"))
SAMPLE_SECONDS = 0.5
LAUNCHERS = 4  # threads of the bench that launch the agents, each on a connection of its own
WORKFLOW_ID = re.compile(r"^wf-(\d+)/")


class FakeAPI:
    """``bench.fake_api`` in a process of its own, driven over its stdin and stdout."""

    def __init__(self, log_dir: Path) -> None:
        self.log = open(log_dir / "fake-api.log", "wb")  # noqa: SIM115 - closed by stop()
        self.proc = subprocess.Popen([sys.executable, "-m", "bench.fake_api"], cwd=REPO_ROOT, stdin=subprocess.PIPE,
                                     stdout=subprocess.PIPE, stderr=self.log, text=True)
        self.url = str(self._answer()["url"])

    def _answer(self) -> dict[str, Any]:
        assert self.proc.stdout is not None
        line = self.proc.stdout.readline()
        if not line:
            raise BenchError(f"the fake API exited with {self.proc.wait(10)}; see {self.log.name}")
        answer: dict[str, Any] = json.loads(line)
        return answer

    def ask(self, command: str) -> dict[str, Any]:
        assert self.proc.stdin is not None
        self.proc.stdin.write(command + "\n")
        self.proc.stdin.flush()
        return self._answer()

    def stop(self) -> None:
        if self.proc.stdin is not None:
            self.proc.stdin.close()
        try:
            self.proc.wait(15)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        self.log.close()


class Sampler(threading.Thread):
    """Every half second: the bench database's connections, all workers' memory."""

    def __init__(self, bench: Bench, api: FakeAPI) -> None:
        super().__init__(daemon=True)
        self.bench, self.api = bench, api
        self.halt = threading.Event()
        self.max_connections = 0
        self.max_rss = 0
        self.rss_by_worker: dict[str, int] = {}

    def cpu_seconds(self) -> dict[str, dict[int, float]]:
        """CPU time so far of every worker process (also by worker: its pool processes included),
        of every PostgreSQL backend of the bench database and of the fake API (on this host too,
        unlike the real one)."""
        out: dict[str, dict[int, float]] = {"workers": {}, "postgres": {}, "fake_api": {}}
        by_worker = {p.name: [psutil.Process(p.pid), *psutil.Process(p.pid).children(recursive=True)]
                     for p in self.bench.cluster.workers()}
        procs = [q for group in by_worker.values() for q in group]
        backends = database_backends(self.bench.db_name)
        api = [psutil.Process(self.api.proc.pid)]
        groups = [("workers", procs), ("postgres", backends), ("fake_api", api),
                  *((f"worker {name}", group) for name, group in by_worker.items())]
        for kind, group in groups:
            out.setdefault(kind, {})
            for proc in group:
                try:
                    times = proc.cpu_times()
                    out[kind][proc.pid] = times.user + times.system
                except psutil.Error:
                    continue
        return out

    def run(self) -> None:
        url = with_database(self.bench.pg.server_url, "postgres")
        with psycopg.connect(url, autocommit=True) as conn:
            while not self.halt.wait(SAMPLE_SECONDS):
                row = conn.execute("SELECT count(*) FROM pg_stat_activity WHERE datname = %s",
                                   [self.bench.db_name]).fetchone()
                self.max_connections = max(self.max_connections, int(row[0]) if row else 0)
                rss = {p.name: p.total_rss_bytes() for p in self.bench.cluster.workers()}
                if sum(rss.values()) > self.max_rss:
                    self.max_rss, self.rss_by_worker = sum(rss.values()), rss


def start_workers(bench: Bench, api: FakeAPI) -> dict[str, Any]:
    """The README's workers for model-heavy agents, pointed at the fake API."""
    from django.conf import settings

    bench.cluster.stop(bench.cluster.workers())
    env = {"AGENTOPS_MODEL_PROVIDER": "anthropic", "ANTHROPIC_API_KEY": "sk-ant-bench-0000",
           "ANTHROPIC_BASE_URL": api.url, "AGENTOPS_MODEL": MODEL}
    pooled = {"AGENTOPS_DB_POOL_SIZE": str(DB_POOL_SIZE)} if IO_POOL == "threads" else {}
    procs = [bench.cluster.start_worker(f"io{i + 1}", pool=IO_POOL, concurrency=IO_THREADS,
                                        queues=(settings.AGENTOPS_IO_QUEUE,), ready=False, extra_env={**env, **pooled})
             for i in range(IO_PROCESSES)]
    procs.append(bench.cluster.start_worker("short", queues=(settings.CELERY_TASK_DEFAULT_QUEUE,), ready=False,
                                            extra_env=env))
    bench.cluster.wait_ready(*procs)
    # As deployed: an attempt that failed (a dropped connection) is retried when its window is rung by beat's sweep.
    ensure_beat(bench)
    return {"io_pool": IO_POOL, "io_workers": IO_PROCESSES, "io_threads_each": IO_THREADS,
            "db_pool_size_each": DB_POOL_SIZE,
            "prefork_workers": 1, "connection_bound": IO_PROCESSES * (DB_POOL_SIZE if IO_POOL == "threads" else
                                                                      IO_THREADS) + 1 + LAUNCHERS,
            "connection_bound_how": (f"{IO_PROCESSES} threads workers x AGENTOPS_DB_POOL_SIZE={DB_POOL_SIZE}"
                                     if IO_POOL == "threads" else f"{IO_PROCESSES * IO_THREADS} prefork processes")
                                    + f", 1 prefork process, {LAUNCHERS} of the bench's launching threads"}


def workers_rss(bench: Bench) -> int:
    """Bytes resident in every worker process now (pool processes included)."""
    return sum(p.total_rss_bytes() for p in bench.cluster.workers())


def run_agents(bench: Bench, api: FakeAPI, *, agents: int, latency: float, tool_turns: int) -> dict[str, Any]:
    """Launch ``agents`` autonomous workflows at once and wait for all to complete."""
    from workflows import services
    from workflows.models import ActivityAttempt, Workflow

    api.ask(f"play {latency} {tool_turns}")
    api.ask("reset")
    calls_per_agent = tool_turns + 3  # plan, the task's turns, verify
    sampler = Sampler(bench, api)
    sampler.start()
    cpu_before = sampler.cpu_seconds()
    launched: dict[int, float] = {}

    def launch(share: range) -> None:
        from django.db import connection

        for n in share:
            wf = services.workflow_launch(kind="autonomous", goal=f"Prepare onboarding notes {n}",
                                          params={"max_rounds": 1}).pk
            launched[wf] = time.time()
        connection.close()

    # Launched at once: with the workers stopped (SIGSTOP) while the bench writes the workflows, so
    # every agent's first call falls due when they continue, whatever the launches cost.
    workers = bench.cluster.workers()
    for proc in workers:
        proc.pause()
    t0 = time.time()
    try:
        with ThreadPoolExecutor(LAUNCHERS) as pool:
            list(pool.map(launch, [range(i, agents, LAUNCHERS) for i in range(LAUNCHERS)]))
    finally:
        launch_s = time.time() - t0
        due = time.time()
        for proc in workers:
            proc.resume()
    launched = dict.fromkeys(launched, due)
    deadline = time.monotonic() + 120 + 3 * calls_per_agent * latency + agents * 0.2
    try:
        while Workflow.objects.filter(pk__in=launched, status__in=Workflow.TERMINAL).count() < agents:
            if time.monotonic() > deadline:
                done = Workflow.objects.filter(pk__in=launched, status__in=Workflow.TERMINAL).count()
                raise BenchError(f"only {done} of {agents} agents finished in time; where the others are:\n"
                                 f"{_unfinished(launched)}\n{bench.cluster.logs()}")
            time.sleep(1.0)
    finally:
        sampler.halt.set()
        sampler.join()
    statuses = dict(Workflow.objects.filter(pk__in=launched).values_list("pk", "status"))
    failed = sorted(pk for pk, status in statuses.items() if status != Workflow.Status.COMPLETED)
    if failed:
        raise BenchError(f"{len(failed)} of {agents} agents did not complete (e.g. {failed[:5]})\n"
                         f"{bench.cluster.logs()}")
    cpu_after = sampler.cpu_seconds()
    cpu = {kind: sum(t - cpu_before[kind].get(pid, 0.0) for pid, t in cpu_after[kind].items())
           for kind in cpu_after}
    report = api.ask("report")
    failed_attempts = Counter(error.split("(")[0][:120] for error in ActivityAttempt.objects.filter(
        activity__workflow_id__in=launched).exclude(status="succeeded").values_list("error", flat=True))
    if report["unexpected"]:
        raise BenchError(f"the fake API had nothing to answer: {report['unexpected']}")
    return {"agents": agents, "calls_per_agent": calls_per_agent, "launch_s": round(launch_s, 2),
            **_timings(report["calls"], launched, latency=latency, expected_calls=agents * calls_per_agent),
            "peak_in_flight": report["peak_in_flight"], "max_db_connections": sampler.max_connections,
            "cpu_ms_per_call": {kind: round(1000 * t / (agents * calls_per_agent), 1) for kind, t in cpu.items()},
            "failed_attempts": sum(failed_attempts.values()), "failed_attempt_errors": dict(failed_attempts),
            "max_worker_rss_mb": round(sampler.max_rss / 2**20, 1),
            "worker_rss_mb": {k: round(v / 2**20, 1) for k, v in sampler.rss_by_worker.items()}}


def _unfinished(launched: dict[int, float]) -> str:
    """The activities of the agents that have not finished, and their attempts' errors: what a stall is waiting on."""
    from workflows.models import Activity, Workflow

    lines = []
    for wf in Workflow.objects.filter(pk__in=launched).exclude(status__in=Workflow.TERMINAL)[:10]:
        lines.append(f"workflow {wf.pk}: {wf.status} at {wf.current_node}")
        for act in Activity.objects.filter(workflow=wf).exclude(status="succeeded"):
            errors = [a.error[:200] for a in act.attempts.all() if a.error]
            lines.append(f"  {act.name} {act.status} attempt {act.attempt}, due {act.next_attempt_at}, "
                         f"dispatched {act.dispatched_at}, doing {act.heartbeat_detail!r}; errors {errors}")
    return "\n".join(lines)


def _timings(calls: list[dict[str, Any]], launched: dict[int, float], *, latency: float,
             expected_calls: int) -> dict[str, Any]:
    """Due -> sent of every call; and the pace: each agent's calls over its own time from launch to
    its last answer, summed over the agents (the rate N agents keep up together), against N / latency."""
    by_agent: dict[int, list[tuple[float, float]]] = {}
    for call in calls:
        match = WORKFLOW_ID.match(call["key"])
        if match is None or call["answered_at"] is None:
            continue
        by_agent.setdefault(int(match.group(1)), []).append((call["at"], call["answered_at"]))
    due_to_sent: list[float] = []
    pace = 0.0
    for wf, timed in by_agent.items():
        timed.sort()
        due = launched[wf]
        for sent, answered in timed:
            due_to_sent.append(sent - due)
            due = answered
        pace += len(timed) / (timed[-1][1] - launched[wf])
    answered_all = [a for timed in by_agent.values() for _, a in timed]
    makespan = max(answered_all) - min(launched.values())
    ideal = len(launched) / latency
    return {"calls": len(answered_all), "expected_calls": expected_calls, "latency_s": latency,
            "calls_per_s": round(pace, 2), "ideal_calls_per_s": round(ideal, 2),
            "ratio_vs_ideal": round(pace / ideal, 3),
            "makespan_s": round(makespan, 1), "calls_per_s_over_makespan": round(len(answered_all) / makespan, 2),
            "due_to_sent_p50_s": round(statistics.median(due_to_sent), 3),
            "due_to_sent_p99_s": round(percentile(due_to_sent, 99), 3),
            "due_to_sent_max_s": round(max(due_to_sent), 3)}


# A worker SIGKILLed while its threads wait for answers; calls slower than the model-call
# lease (20 s), so only the heartbeats kept the attempts, and a first heartbeat has been written.
KILL_AGENTS = 8
KILL_LATENCY_S = 25.0
RECOVERY_TARGET_S = 30.0


def kill_during_model_calls(bench: Bench, api: FakeAPI) -> dict[str, Any]:
    """SIGKILL the I/O worker holding model calls in flight: the seconds from the kill to each
    call's next attempt (on the other I/O worker), and how many tool calls ran twice."""
    from workflows import services
    from workflows.models import ActivityAttempt, Event, Workflow

    # Beat, started with the workers, sweeps the dead worker's leases once they run out.
    api.ask(f"play {KILL_LATENCY_S} 1")
    api.ask("reset")
    ids = [services.workflow_launch(kind="autonomous", goal=f"Recovery notes {n}", params={"max_rounds": 1}).pk
           for n in range(KILL_AGENTS)]
    held = ActivityAttempt.objects.filter(activity__workflow_id__in=ids, status="running",
                                          activity__heartbeat_detail__startswith="waiting for model call")
    deadline = time.monotonic() + 120
    while not held.exists():
        if time.monotonic() > deadline:
            raise BenchError(f"no model call was in flight within 120 s\n{bench.cluster.logs()}")
        time.sleep(0.2)
    time.sleep(2.0)  # the other agents' calls reach the worker too
    holder = held.first()
    assert holder is not None
    victim = next(p for p in bench.cluster.workers() if p.name == holder.worker.split("@")[0])
    lost = list(held.filter(worker=holder.worker).values_list("activity_id", "number"))
    killed_at = time.time()
    victim.kill_group()
    deadline = time.monotonic() + 180 + 6 * KILL_LATENCY_S
    while Workflow.objects.filter(pk__in=ids, status__in=Workflow.TERMINAL).count() < len(ids):
        if time.monotonic() > deadline:
            raise BenchError(f"the agents did not finish after the kill\n{bench.cluster.logs()}")
        time.sleep(1.0)
    failed = Workflow.objects.filter(pk__in=ids).exclude(status=Workflow.Status.COMPLETED).count()
    recovery = [ActivityAttempt.objects.get(activity_id=activity, number=number + 1).started_at.timestamp()
                - killed_at for activity, number in lost]
    tools = list(Event.objects.filter(workflow_id__in=ids, kind="tool.called").values_list(
        "workflow_id", "data__operation_id", "data__tool", "data__input"))
    return {"agents": KILL_AGENTS, "latency_s": KILL_LATENCY_S, "calls_killed": len(lost),
            "recovery_s_max": round(max(recovery), 2), "recovery_s_median": round(statistics.median(recovery), 2),
            "tool_calls": len(tools), "tool_calls_redone": len(tools) - len(set(tools)), "not_completed": failed,
            "target_s": RECOVERY_TARGET_S}


def bench_inflight(bench: Bench) -> dict[str, Any]:
    latency, tool_turns = bench.sizes.inflight_latency_s, bench.sizes.inflight_tool_turns
    api = FakeAPI(bench.out_dir)
    try:
        rows = []
        for n in bench.sizes.inflight_agents:
            # Fresh workers for each size, so what a size holds is not what a larger one left behind
            # (threads a pool started stay, and freed memory mostly stays with the process).
            setup = start_workers(bench, api)
            bench.log("in flight: warm-up, 4 agents")
            run_agents(bench, api, agents=4, latency=0.5, tool_turns=1)
            idle = workers_rss(bench)
            bench.log(f"in flight: {n} agents, {tool_turns + 3} calls each, {latency:g} s per call "
                      f"(workers idle: {idle / 2**20:.0f} MB)")
            row = run_agents(bench, api, agents=n, latency=latency, tool_turns=tool_turns)
            row["idle_worker_rss_mb"] = round(idle / 2**20, 1)
            row["mb_per_agent"] = round((row["max_worker_rss_mb"] - row["idle_worker_rss_mb"]) / n, 3)
            bench.log(f"  peak {row['peak_in_flight']} in flight, {row['calls_per_s']} calls/s "
                      f"({row['ratio_vs_ideal']:.2f}x ideal), due->sent p99 {row['due_to_sent_p99_s']} s, "
                      f"{row['max_worker_rss_mb']} MB ({row['mb_per_agent']} MB an agent over idle), "
                      f"{row['max_db_connections']} connections, "
                      f"{row['failed_attempts']} failed attempts; CPU ms per call "
                      + ", ".join(f"{kind} {ms}" for kind, ms in row["cpu_ms_per_call"].items()))
            rows.append(row)
        bench.log(f"in flight: SIGKILL of a worker holding {KILL_AGENTS} agents' model calls ({KILL_LATENCY_S:g} s)")
        killed = kill_during_model_calls(bench, api)
        bench.log(f"  next attempts after {killed['recovery_s_median']} s (median), {killed['recovery_s_max']} s "
                  f"(max); {killed['tool_calls_redone']} tool calls redone")
    finally:
        bench.cluster.stop(bench.cluster.workers())
        api.stop()
    # 500 agents, and 1,000 on one 2-core host, at >= 0.8x the ideal rate; 100 agents within 1 GiB
    # of workers; each agent waiting on its model call holds at most half a megabyte over idle workers.
    targets = {"peak_in_flight": 500, "ratio_vs_ideal": 0.8, "ratio_vs_ideal_at": [500, 1000], "worker_rss_mb": 1024,
               "worker_rss_mb_at": 100, "mb_per_agent": 0.5, "mb_per_agent_from": 100}
    return {**setup, "rows": rows, "kill_during_model_calls": killed, "targets": targets}
