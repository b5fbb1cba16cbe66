"""Agents in flight (7): N autonomous agents launched at once, each model call answered after a fixed latency.

The fake Messages API (``tests/fakes/anthropic_api.py``, a real HTTP server on loopback, here in
the orchestrator's process) plays Claude for the ``autonomous`` kind; the workers reach it through
the real ``anthropic`` SDK, so the whole model-call path is measured: lease and heartbeats, the
fence, the budget reservation under the workflow's row lock, the charge, the ``model.called``
event, the turn's checkpoint. The workers are the README's shape for model-heavy agents: threads
pools on the I/O queue (``AGENTOPS_DB_POOL_SIZE`` connections each) and one prefork worker on the
default queue.

Measured on the server's one clock: calls in flight (answers being waited for), when each call
arrived and when its answer left. A call is *due* when the answer before it in the same agent left
(its first call: when the agent was launched); due -> sent is what the engine adds between two
calls (record the answer, charge it, checkpoint, run the tool, advance, claim, reserve).
"""
from __future__ import annotations

import re
import statistics
import threading
import time
from typing import Any

import psycopg

from bench.context import Bench
from bench.infra import BenchError, percentile, with_database
from tests.fakes import anthropic_api as fake
from tests.fakes.anthropic_api import Answer, FakeAnthropicAPI
from tests.fakes.claude_agent import TASKS, ClaudeForAutonomous, first_text, structured, task_of, tool_results

MODEL = "claude-sonnet-5-5"
# Threads-pool workers on the I/O queue: how many processes, threads each, database connections each.
IO_PROCESSES = 2
IO_THREADS = 500
DB_POOL_SIZE = 10
SAMPLE_SECONDS = 0.5
WORKFLOW_ID = re.compile(r"^wf-(\d+)/")


class LatencyAPI(FakeAnthropicAPI):
    """The fake API, counting the calls it holds (in flight) and noting when each answer leaves."""

    def __init__(self) -> None:
        super().__init__()
        self.in_flight = 0
        self.peak_in_flight = 0
        self.answered_at: dict[str, float] = {}  # request id -> when its answer left
        self._count_lock = threading.Lock()

    def took(self) -> None:
        with self._count_lock:
            self.in_flight += 1
            self.peak_in_flight = max(self.peak_in_flight, self.in_flight)

    def message_for(self, body: dict[str, Any], answer: Answer, request_id: str) -> dict[str, Any]:
        message = super().message_for(body, answer, request_id)  # after the latency, right before sending
        with self._count_lock:
            self.in_flight -= 1
            self.answered_at[request_id] = time.time()
        return message

    def reset(self) -> None:
        with self._count_lock:
            self.peak_in_flight = self.in_flight
            self.requests.clear()
            self.answered_at.clear()


class BenchClaude(ClaudeForAutonomous):
    """One task; the task takes ``tool_turns`` tool calls (write a note, then read it back), then
    reports; every answer after ``latency`` seconds. Calls per agent: plan, tool_turns + 1, verify."""

    def __init__(self, api: LatencyAPI, *, latency: float, tool_turns: int) -> None:
        super().__init__()
        self.api, self.latency, self.tool_turns = api, latency, tool_turns

    def __call__(self, body: dict[str, Any]) -> Answer:
        self.api.took()
        if task_of(body) in ("plan_tasks", "replan"):
            answer = structured(body, {"tasks": TASKS[:1]}, preamble="Here is the plan:")
        else:
            answer = super().__call__(body)
        answer.delay_seconds = self.latency
        return answer

    def work(self, body: dict[str, Any]) -> Answer:
        step = tool_results(body)
        if step >= self.tool_turns:
            return fake.text("Wrote notes/task.md with what a newcomer needs and checked it.")
        if step == 0:
            return fake.tool_use("write_file", {"path": "notes/task.md", "content": first_text(body)[:400]},
                                 say="Writing the note.")
        return fake.tool_use("read_file", {"path": "notes/task.md"}, say="Checking what I wrote.")

    @property
    def calls_per_agent(self) -> int:
        return self.tool_turns + 3


class Sampler(threading.Thread):
    """Every half second: calls in flight, the bench database's connections, all workers' memory."""

    def __init__(self, bench: Bench, api: LatencyAPI) -> None:
        super().__init__(daemon=True)
        self.bench, self.api = bench, api
        self.halt = threading.Event()
        self.max_connections = 0
        self.max_rss = 0
        self.rss_by_worker: dict[str, int] = {}

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


def start_workers(bench: Bench, api: LatencyAPI) -> dict[str, Any]:
    """The README's workers for model-heavy agents, pointed at the fake API."""
    from django.conf import settings

    bench.cluster.stop(bench.cluster.workers())
    env = {"AGENTOPS_MODEL_PROVIDER": "anthropic", "ANTHROPIC_API_KEY": "sk-ant-bench-0000",
           "ANTHROPIC_BASE_URL": api.url, "AGENTOPS_MODEL": MODEL}
    procs = [bench.cluster.start_worker(f"io{i + 1}", pool="threads", concurrency=IO_THREADS,
                                        queues=(settings.AGENTOPS_IO_QUEUE,), ready=False,
                                        extra_env={**env, "AGENTOPS_DB_POOL_SIZE": str(DB_POOL_SIZE)})
             for i in range(IO_PROCESSES)]
    procs.append(bench.cluster.start_worker("short", queues=(settings.CELERY_TASK_DEFAULT_QUEUE,), ready=False,
                                            extra_env=env))
    bench.cluster.wait_ready(*procs)
    return {"io_workers": IO_PROCESSES, "io_threads_each": IO_THREADS, "db_pool_size_each": DB_POOL_SIZE,
            "prefork_workers": 1, "connection_bound": IO_PROCESSES * DB_POOL_SIZE + 1 + 1,
            "connection_bound_how": f"{IO_PROCESSES} threads workers x AGENTOPS_DB_POOL_SIZE={DB_POOL_SIZE}, "
                                    "1 prefork process, 1 for the bench itself"}


def run_agents(bench: Bench, api: LatencyAPI, claude: BenchClaude, *, agents: int) -> dict[str, Any]:
    """Launch ``agents`` autonomous workflows at once and wait for all to complete."""
    from workflows import services
    from workflows.models import Workflow

    api.reset()
    sampler = Sampler(bench, api)
    sampler.start()
    launched: dict[int, float] = {}
    t0 = time.time()
    for n in range(agents):
        wf = services.workflow_launch(kind="autonomous", goal=f"Prepare onboarding notes {n}",
                                      params={"max_rounds": 1}).pk
        launched[wf] = time.time()
    launch_s = time.time() - t0
    calls = agents * claude.calls_per_agent
    deadline = time.monotonic() + 120 + 3 * claude.calls_per_agent * claude.latency + agents * 0.2
    try:
        while Workflow.objects.filter(pk__in=launched, status__in=Workflow.TERMINAL).count() < agents:
            if time.monotonic() > deadline:
                done = Workflow.objects.filter(pk__in=launched, status__in=Workflow.TERMINAL).count()
                raise BenchError(f"only {done} of {agents} agents finished in time\n{bench.cluster.logs()}")
            time.sleep(1.0)
    finally:
        sampler.halt.set()
        sampler.join()
    statuses = dict(Workflow.objects.filter(pk__in=launched).values_list("pk", "status"))
    failed = sorted(pk for pk, status in statuses.items() if status != Workflow.Status.COMPLETED)
    if failed:
        raise BenchError(f"{len(failed)} of {agents} agents did not complete (e.g. {failed[:5]})\n"
                         f"{bench.cluster.logs()}")
    if api.unexpected:
        raise BenchError(f"the fake API had nothing to answer: {api.unexpected[:3]}")
    return {"agents": agents, "calls_per_agent": claude.calls_per_agent, "launch_s": round(launch_s, 2),
            **_timings(api, launched, latency=claude.latency, expected_calls=calls),
            "peak_in_flight": api.peak_in_flight, "max_db_connections": sampler.max_connections,
            "max_worker_rss_mb": round(sampler.max_rss / 2**20, 1),
            "worker_rss_mb": {k: round(v / 2**20, 1) for k, v in sampler.rss_by_worker.items()}}


def _timings(api: LatencyAPI, launched: dict[int, float], *, latency: float, expected_calls: int) -> dict[str, Any]:
    by_agent: dict[int, list[tuple[float, float]]] = {}
    for r in api.requests:
        match = WORKFLOW_ID.match(r.headers.get("x-agentops-usage-key", ""))
        if match is None or r.request_id not in api.answered_at:
            continue
        by_agent.setdefault(int(match.group(1)), []).append((r.at, api.answered_at[r.request_id]))
    due_to_sent: list[float] = []
    for wf, calls in by_agent.items():
        calls.sort()
        due = launched[wf]
        for sent, answered in calls:
            due_to_sent.append(sent - due)
            due = answered
    sent_all = [s for calls in by_agent.values() for s, _ in calls]
    answered_all = sorted(a for calls in by_agent.values() for _, a in calls)
    # The steady stretch: every agent has sent its first call, none has had its last answer.
    start = max(calls[0][0] for calls in by_agent.values())
    end = min(calls[-1][1] for calls in by_agent.values())
    steady = [a for a in answered_all if start <= a <= end]
    overall = len(answered_all) / (answered_all[-1] - min(sent_all))
    rate = len(steady) / (end - start) if end - start >= latency else overall
    ideal = len(launched) / latency
    return {"calls": len(answered_all), "expected_calls": expected_calls, "latency_s": latency,
            "calls_per_s": round(rate, 2), "calls_per_s_overall": round(overall, 2),
            "steady_window_s": round(max(0.0, end - start), 1), "ideal_calls_per_s": round(ideal, 2),
            "ratio_vs_ideal": round(rate / ideal, 3),
            "due_to_sent_p50_s": round(statistics.median(due_to_sent), 3),
            "due_to_sent_p99_s": round(percentile(due_to_sent, 99), 3),
            "due_to_sent_max_s": round(max(due_to_sent), 3)}


def bench_inflight(bench: Bench) -> dict[str, Any]:
    latency, tool_turns = bench.sizes.inflight_latency_s, bench.sizes.inflight_tool_turns
    api = LatencyAPI().start()
    claude = BenchClaude(api, latency=latency, tool_turns=tool_turns)
    api.responder = claude
    try:
        setup = start_workers(bench, api)
        bench.log("in flight: warm-up, 4 agents")
        warm = BenchClaude(api, latency=0.5, tool_turns=1)
        api.responder = warm
        run_agents(bench, api, warm, agents=4)
        api.responder = claude
        rows = []
        for n in bench.sizes.inflight_agents:
            bench.log(f"in flight: {n} agents, {claude.calls_per_agent} calls each, {latency:g} s per call")
            row = run_agents(bench, api, claude, agents=n)
            bench.log(f"  peak {row['peak_in_flight']} in flight, {row['calls_per_s']} calls/s "
                      f"({row['ratio_vs_ideal']:.2f}x ideal), due->sent p99 {row['due_to_sent_p99_s']} s, "
                      f"{row['max_worker_rss_mb']} MB, {row['max_db_connections']} connections")
            rows.append(row)
    finally:
        bench.cluster.stop(bench.cluster.workers())
        api.stop()
    return {**setup, "rows": rows, "targets": {"peak_in_flight": 500, "ratio_vs_ideal_at_500": 0.8,
                                               "worker_rss_mb": 1024}}
