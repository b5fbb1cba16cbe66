"""One DBOS Transact process of the DBOS baseline: ``--workflows`` workflows of ``--steps`` no-op steps at once
(or, with ``--sequential``, one after another: the latency of one workflow).

Run by ``bench.throughput`` twice side by side (one process per core). It launches DBOS on the
given system database, warms up, prints ``ready``, waits for the go file, starts every workflow
at once, waits for all results and prints one JSON line with its start and end times.
"""
from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--database-url", required=True)
    parser.add_argument("--workflows", type=int, required=True)
    parser.add_argument("--steps", type=int, default=10)
    parser.add_argument("--executor", default="bench-0")
    parser.add_argument("--go-file", required=True)
    parser.add_argument("--sequential", action="store_true",
                        help="run the workflows one after another and report each one's duration (latency)")
    args = parser.parse_args(argv)

    from dbos import DBOS, DBOSConfig

    url = args.database_url.replace("postgres://", "postgresql://", 1)
    config: DBOSConfig = {
        "name": "agentops-bench", "system_database_url": url, "executor_id": args.executor,
        "application_version": "bench", "log_level": "WARNING",
    }
    DBOS(config=config)

    @DBOS.step()
    def noop_step(i: int) -> int:
        return i

    @DBOS.workflow()
    def steps_workflow(n: int) -> int:
        for i in range(n):
            noop_step(i)
        return n

    DBOS.launch()
    for handle in [DBOS.start_workflow(steps_workflow, args.steps) for _ in range(3)]:
        handle.get_result()
    print("ready", flush=True)
    go = Path(args.go_file)
    deadline = time.monotonic() + 120
    while not go.exists():
        if time.monotonic() > deadline:
            print("no go file after 120 s", file=sys.stderr)
            return 2
        time.sleep(0.01)
    started = time.time()
    durations = []
    if args.sequential:
        results = []
        for _ in range(args.workflows):
            began = time.time()
            results.append(DBOS.start_workflow(steps_workflow, args.steps).get_result())
            durations.append(time.time() - began)
    else:
        handles = [DBOS.start_workflow(steps_workflow, args.steps) for _ in range(args.workflows)]
        results = [h.get_result() for h in handles]
    finished = time.time()
    assert results == [args.steps] * args.workflows, results[:5]
    print(json.dumps({"started": started, "finished": finished, "workflows": args.workflows,
                      "steps": args.steps, "durations": durations}), flush=True)
    DBOS.destroy(workflow_completion_timeout_sec=0)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
