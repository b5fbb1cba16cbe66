"""What every benchmark gets: sizes for the mode, the database and broker, the cluster, a logger."""
from __future__ import annotations

import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from bench.infra import Broker, Cluster, Postgres


@dataclass(frozen=True)
class Sizes:
    """How big each benchmark is; ``--quick`` shrinks everything so the whole run takes about a quarter of an hour."""

    throughput_workflows: int = 200
    steps: int = 10
    warmup_workflows: int = 20
    parked: int = 100_000
    sweep_repeats: int = 30
    timers: int = 1000
    timer_window_s: float = 60.0
    recovery_runs: int = 20
    growth_concurrency: tuple[int, ...] = (10, 100, 1000)
    rss_activities: tuple[int, int] = (1000, 10_000)
    ablations: bool = True
    profile_seconds: float = 20.0
    latency_runs: int = 30
    # Agents in flight (7): agents launched at once, the fake API's answer time, tool calls per task.
    inflight_agents: tuple[int, ...] = (10, 100, 500)
    inflight_latency_s: float = 5.0
    inflight_tool_turns: int = 3
    # Long runs (8): harness projects of these many scripted features, autonomous runs of these many rounds.
    long_run_features: tuple[int, ...] = (10, 50, 200)
    long_run_rounds: tuple[int, ...] = (20,)
    # Shared rate limits (9): agents and calls against the fake API's organisation limit; the two
    # tenants' agents (900 and 10, scaled to 90 and 1 to keep the run to minutes).
    ratelimit_agents: int = 300
    ratelimit_calls: int = 3
    ratelimit_rpm: int = 600
    ratelimit_itpm: int = 200_000
    fairness_large: int = 90
    fairness_small: int = 1
    fairness_calls: int = 4
    # Concurrency keys for activities (10): a kind's cap, workflows of two tenants, 1 s activities
    # each; the pass's cost with these many activities waiting.
    slots_cap: int = 10
    slots_workflows: int = 60
    slots_steps: int = 3
    slots_pass_waiting: tuple[int, ...] = (100, 2000)

    @classmethod
    def quick(cls) -> Sizes:
        return cls(throughput_workflows=20, warmup_workflows=4, parked=2000, sweep_repeats=10, timers=50,
                   timer_window_s=10.0, recovery_runs=3, growth_concurrency=(5, 20, 50),
                   rss_activities=(100, 500), ablations=False, profile_seconds=3.0, latency_runs=15,
                   inflight_agents=(10, 100), inflight_tool_turns=1, long_run_features=(10,), long_run_rounds=(3,),
                   ratelimit_agents=30, ratelimit_calls=5, ratelimit_rpm=120, ratelimit_itpm=40_000,
                   fairness_large=45, fairness_small=1, fairness_calls=3, slots_cap=4, slots_workflows=20,
                   slots_steps=2, slots_pass_waiting=(50, 200))

    @classmethod
    def full(cls) -> Sizes:
        """The default sizes, 1,000 agents in flight too (a few minutes more), and the days-long
        autonomous run of 200 rounds."""
        return cls(inflight_agents=(10, 100, 500, 1000), long_run_rounds=(20, 200))


@dataclass
class Bench:
    sizes: Sizes
    quick: bool
    pg: Postgres
    db_name: str
    dbos_db_name: str
    database_url: str
    broker: Broker
    cluster: Cluster
    out_dir: Path
    results: dict[str, Any] = field(default_factory=dict)
    started: float = field(default_factory=time.monotonic)

    def log(self, message: str) -> None:
        print(f"[bench {time.monotonic() - self.started:6.1f}s] {message}", file=sys.stderr, flush=True)
