"""``python -m bench.against``: the in-flight run (section 7) of an earlier commit and of this tree,
alternating, and this tree's CPU per call as a ratio of the earlier one's.

A target stated in milliseconds on one machine means little on another: these shared 2-core
machines differ by a factor of two between days, and drift by a third within one. The figures
that judge a change are ratios against a baseline measured in the same run. The CPU targets ask
for ≤ 5 ms of worker CPU and ≤ 2 ms of PostgreSQL CPU per call where the baseline commit took 8.4 / 3.1 ms
at 500 agents: 0.595× and 0.645× of that commit's figures, which ``--commit`` (by default the
commit those figures were measured on) gives on this machine, in this run.

Each side runs its own tree's benchmark (``python -m bench --only inflight``) on the same
PostgreSQL, Redis and virtualenv: the earlier commit's harness is the one that measured its
figures. The earlier tree is checked out with ``git worktree`` under ``var/bench/against/`` and
removed at the end; the repository's history must hold the commit (a clone does).

    python -m bench.against --agents 500 --rounds 2
"""
from __future__ import annotations

import argparse
import json
import re
import statistics
import subprocess
import sys
from pathlib import Path
from typing import Any

from bench.infra import REPO_ROOT

# The baseline commit whose in-flight figures the CPU targets are stated against (8.4 / 3.1 ms at
# 500 agents), and those targets as ratios of its figures.
ISSUE_28_COMMIT = "d948bed"
TARGETS = {"worker": 5.0 / 8.4, "postgres": 2.0 / 3.1}

# What both harnesses print for an in-flight run: "... 89.26 calls/s (0.89x ideal), ... CPU ms per
# call workers 8.1, postgres 2.6, ..."
RUN_LINE = re.compile(r"\(([\d.]+)x ideal\).*?CPU ms per call workers ([\d.]+), postgres ([\d.]+)")


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m bench.against", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--commit", default=ISSUE_28_COMMIT,
                        help="the earlier commit (default %(default)s: where the baseline figures were measured)")
    parser.add_argument("--agents", type=int, default=500)
    parser.add_argument("--rounds", type=int, default=2, help="pairs of runs, each side once a round")
    parser.add_argument("--out", type=Path, default=REPO_ROOT / "var" / "bench" / "against")
    args = parser.parse_args(argv)
    if args.agents < 1 or args.rounds < 1:
        parser.error("--agents and --rounds must be at least 1")
    return args


def in_flight(tree: Path, agents: int, out: Path) -> dict[str, float]:
    """One in-flight run of ``tree``'s benchmark: its ratio to the ideal rate and CPU per call."""
    out.mkdir(parents=True, exist_ok=True)
    done = subprocess.run(
        [sys.executable, "-m", "bench", "--only", "inflight", "--agents", str(agents),
         "--max-wait-for-pytest", "0", "--out", str(out / "bench.json")],
        cwd=tree, capture_output=True, text=True)
    (out / "bench.log").write_text(done.stdout + done.stderr)
    found = RUN_LINE.search(done.stdout + done.stderr)
    if found is None:
        raise SystemExit(f"bench.against: the in-flight run of {tree} printed no figures "
                         f"(exit {done.returncode}); its output is in {out / 'bench.log'}")
    ratio, worker, postgres = (float(g) for g in found.groups())
    return {"ratio": ratio, "worker": worker, "postgres": postgres}


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    commit = subprocess.run(["git", "rev-parse", "--verify", "--short", f"{args.commit}^{{commit}}"], cwd=REPO_ROOT,
                            capture_output=True, text=True)
    if commit.returncode != 0:
        raise SystemExit(f"bench.against: {args.commit!r} is not a commit of this repository's history.")
    earlier = args.out / f"tree-{commit.stdout.strip()}"
    _worktree_remove(earlier)  # left by a run that was killed
    added = subprocess.run(["git", "worktree", "add", "--detach", str(earlier), commit.stdout.strip()],
                           cwd=REPO_ROOT, capture_output=True, text=True)
    if added.returncode != 0:
        raise SystemExit(f"bench.against: could not check {args.commit} out at {earlier}: {added.stderr.strip()}")
    runs: dict[str, list[dict[str, float]]] = {"earlier": [], "this": []}
    try:
        for n in range(1, args.rounds + 1):
            for side, tree in (("earlier", earlier), ("this", REPO_ROOT)):
                run = in_flight(tree, args.agents, args.out / f"{side}-{n}")
                runs[side].append(run)
                print(f"round {n} {side:7} {run['ratio']:.2f}x ideal, CPU ms per call workers {run['worker']}, "
                      f"postgres {run['postgres']}", flush=True)
    finally:
        _worktree_remove(earlier)
    report = summary(runs, commit=commit.stdout.strip(), agents=args.agents)
    (args.out / "against.json").write_text(json.dumps({"runs": runs, **report}, indent=2))
    for side in ("worker", "postgres"):
        print(f"{side}: {report[side]['this_ms']:.2f} / {report[side]['earlier_ms']:.2f} ms = "
              f"{report[side]['ratio']:.3f}x (target <= {TARGETS[side]:.3f}x) "
              f"{'met' if report[side]['met'] else 'NOT MET'}")


def _worktree_remove(path: Path) -> None:
    subprocess.run(["git", "worktree", "remove", "--force", str(path)], cwd=REPO_ROOT, capture_output=True)
    subprocess.run(["git", "worktree", "prune"], cwd=REPO_ROOT, capture_output=True)


def summary(runs: dict[str, list[dict[str, float]]], *, commit: str, agents: int) -> dict[str, Any]:
    """Each side's median CPU per call and this tree's over the earlier commit's, against the targets."""
    report: dict[str, Any] = {"commit": commit, "agents": agents}
    for side, target in TARGETS.items():
        earlier = statistics.median(run[side] for run in runs["earlier"])
        this = statistics.median(run[side] for run in runs["this"])
        report[side] = {"earlier_ms": earlier, "this_ms": this, "ratio": this / earlier, "target": target,
                        "met": this / earlier <= target}
    return report


if __name__ == "__main__":
    main()
