"""Recovery time (5): SIGKILL the worker running a heartbeating activity; time until the survivor starts
the next attempt. The lease runs out ``lease`` seconds after the last heartbeat; the reaper runs
every beat interval and rings the next attempt at once."""
from __future__ import annotations

import random
import statistics
import time
from typing import Any

from bench.context import Bench
from bench.infra import BenchError, wait_for
from bench.throughput import ensure_workers
from bench.timers import ensure_beat
from bench.workload import (
    SLEEP,
    SLEEP_HEARTBEAT_SECONDS,
    SLEEP_LEASE_SECONDS,
    SLEEP_SHORT,
    SLEEP_SHORT_HEARTBEAT_SECONDS,
    SLEEP_SHORT_LEASE_SECONDS,
)


def bench_recovery(bench: Bench) -> dict[str, Any]:
    from django.conf import settings

    from workflows import services
    from workflows.models import ActivityAttempt, Workflow

    if bench.quick:
        activity, lease, heartbeat = SLEEP_SHORT, SLEEP_SHORT_LEASE_SECONDS, SLEEP_SHORT_HEARTBEAT_SECONDS
    else:
        activity, lease, heartbeat = SLEEP, SLEEP_LEASE_SECONDS, SLEEP_HEARTBEAT_SECONDS
    interval = settings.AGENTOPS_BEAT_INTERVAL_SECONDS
    rng = random.Random(5)
    ensure_workers(bench, 2)
    ensure_beat(bench)
    samples = []
    for run in range(bench.sizes.recovery_runs):
        wf = services.workflow_launch(kind="bench_steps", goal=f"recovery {run}",
                                      params={"steps": 1, "activity": activity, "seconds": 300}).pk

        def attempt(number: int, wf: int = wf) -> ActivityAttempt | None:
            return ActivityAttempt.objects.filter(activity__workflow_id=wf, number=number).first()

        first = wait_for(lambda: attempt(1), timeout=60, what=f"attempt 1 of workflow {wf}", interval=0.05,
                         dump=bench.cluster.logs)
        by_name = {p.name: p for p in bench.cluster.workers()}
        victim = by_name.get(first.worker.split("@")[0])
        if victim is None:
            raise BenchError(f"attempt 1 ran on {first.worker}, not on a worker of this run")
        time.sleep(rng.uniform(0.2, heartbeat + 0.2))  # anywhere in the heartbeat cycle
        killed_at = time.time()
        victim.kill_group()
        second = wait_for(lambda: attempt(2), timeout=lease + 60, what=f"attempt 2 of workflow {wf}", interval=0.05,
                          dump=bench.cluster.logs)
        recovered = second.started_at.timestamp() - killed_at
        if second.worker.split("@")[0] == victim.name:
            raise BenchError(f"attempt 2 ran on the killed worker {second.worker}")
        samples.append(recovered)
        bench.log(f"recovery {run + 1}/{bench.sizes.recovery_runs}: {recovered:.2f} s")
        wait_for(lambda wf=wf: Workflow.objects.filter(pk=wf, status="completed").exists(), timeout=60,
                 what=f"workflow {wf} to complete after recovery", interval=0.1, dump=bench.cluster.logs)
        ensure_workers(bench, 2)  # a fresh worker replaces the killed one
    lost = ActivityAttempt.objects.filter(activity__name=activity, status="lost").count()
    return {
        "runs": len(samples), "activity": activity, "lease_s": lease, "heartbeat_every_s": heartbeat,
        "beat_interval_s": interval, "bound_s": lease + interval,
        "p50_s": round(statistics.median(samples), 2), "max_s": round(max(samples), 2),
        "min_s": round(min(samples), 2), "samples_s": [round(s, 2) for s in samples], "attempts_lost": lost,
    }
