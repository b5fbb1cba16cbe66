"""Memory of `agent export-history` and `agent replay-check` by history length.

Builds synthetic finished workflows of N node visits (each visit: a checkpoint whose state grows
with the run, as today's kinds' do, one activity with a result, a few events), then runs
`manage.py agent export-history` and `replay-check --fixtures` on each in a child process of
its own and prints N, visits, output bytes, wall time and peak RSS:

    DATABASE_URL=postgres://… python -m bench.history_export --visits 100 400 1600

Memory must not grow with N (it holds one visit at a time); time grows linearly with the bytes.
"""
from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time
from datetime import timedelta
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]


def long_history(*, visits: int, state_growth_bytes: int = 470, state_bytes: int = 0, result_bytes: int = 2_000,
                 events_per_visit: int = 3, kind: str = "autonomous") -> int:
    """A completed workflow of ``visits`` node visits written with ``bulk_create``: visit v's
    checkpoint state holds ``state_bytes`` plus v notes of ``state_growth_bytes`` (the
    whole-state copies of today's kinds: the run's total is quadratic in visits; the default
    makes 1,600 visits about the 610 MB of the 200-feature harness run before state stopped growing), one
    succeeded activity of ``result_bytes``, ``events_per_visit`` events. Returns its id. Its
    nodes are not its kind's: it is for sizes, not for replaying."""
    from workflows import clock
    from workflows.models import Activity, BehavioralRelease, Checkpoint, Event, Intent, Workflow

    now = clock.now()
    release, _ = BehavioralRelease.objects.get_or_create(
        fingerprint="bench-history-export".ljust(64, "0"),
        defaults={"provider": "scripted", "model": "bench", "prompt_version": "1", "created_at": now})
    start = now - timedelta(seconds=visits)
    workflow = Workflow.objects.create(
        kind=kind, current_node="COMPLETE", node_visit=visits, release=release, created_at=start, updated_at=now,
        event_seq=visits * events_per_visit, params={"bench": True}, state={"notes": visits})
    Workflow.objects.filter(pk=workflow.pk).update(status=Workflow.Status.COMPLETED)
    Intent.objects.create(workflow=workflow, version=1, goal="a long synthetic run", created_at=start)
    note = "n" * state_growth_bytes
    batch = 200
    for low in range(1, visits + 1, batch):
        numbers = range(low, min(low + batch, visits + 1))
        Checkpoint.objects.bulk_create([
            Checkpoint(workflow=workflow, node=f"NODE_{v % 7}", node_visit=v, intent_version=1,
                       state={"fixed": "s" * state_bytes, "notes": [f"{i}:{note}" for i in range(v)]},
                       created_at=start + timedelta(seconds=v))
            for v in numbers if v > 1])
        Activity.objects.bulk_create([
            Activity(workflow=workflow, operation_id=f"wf-{workflow.pk}/NODE_{v % 7}.{v}/i1/0", name="bench_step",
                     node=f"NODE_{v % 7}", node_visit=v, intent_version=1, input={"v": v}, status="succeeded",
                     attempt=1, result={"output": "r" * result_bytes}, next_attempt_at=start, created_at=start)
            for v in numbers])
        Event.objects.bulk_create([
            Event(workflow=workflow, seq=(v - 1) * events_per_visit + e + 1, kind="bench.step", data={"v": v, "e": e},
                  created_at=start + timedelta(seconds=v))
            for v in numbers for e in range(events_per_visit)])
    return workflow.pk


def measured(command: list[str], *, out: Path) -> dict[str, Any]:
    """Run ``command`` (a Python module or script and its arguments) in a child process, stdout to
    ``out``: its exit status, seconds, peak resident memory (the child's own, from wait4) and bytes."""
    began = time.perf_counter()
    with out.open("w") as stdout, tempfile.TemporaryFile("w+") as stderr:
        child = subprocess.Popen([sys.executable, *command], cwd=ROOT, stdout=stdout, stderr=stderr,
                                 env=os.environ.copy())
        _, status, usage = os.wait4(child.pid, 0)
        child.returncode = os.waitstatus_to_exitcode(status)
        seconds = time.perf_counter() - began
        stderr.seek(0)
        said = stderr.read()
    return {"rc": child.returncode, "seconds": seconds, "peak_mb": usage.ru_maxrss / 1024,  # ru_maxrss: KB on Linux
            "bytes": out.stat().st_size, "stderr": said[-600:] if child.returncode else ""}


def read_all(path: Path) -> None:
    """What replay-check does to a file, without the handlers: stream every visit."""
    from workflows import histories

    with histories.opened(path) as (_, visits):
        count = sum(1 for _ in visits)
    print(f"{count} visits read")


def legacy_export(pk: int) -> None:
    """The export before JSON Lines (ddaf9a3): the whole history as one object, then one dumps."""
    import json

    from workflows import replay
    from workflows.models import Workflow

    history = replay.history_of(Workflow.objects.select_related("release").get(pk=pk))
    sys.stdout.write(json.dumps(history.to_json(), indent=1, sort_keys=True, default=str))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--visits", type=int, nargs="+", default=[100, 400, 1600])
    parser.add_argument("--state-growth-bytes", type=int, default=470, help="bytes a visit's state grows by")
    parser.add_argument("--state-bytes", type=int, default=0, help="bytes of every visit's state besides")
    parser.add_argument("--legacy", action="store_true",
                        help="also time the export as it was (one JSON object built in memory)")
    parser.add_argument("--legacy-export", metavar="ID", type=int, help=argparse.SUPPRESS)
    parser.add_argument("--read", metavar="PATH", help=argparse.SUPPRESS)  # the child process that reads a file
    options = parser.parse_args()
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "agentops.settings")
    import django

    django.setup()
    if options.read:
        read_all(Path(options.read))
        return
    if options.legacy_export:
        legacy_export(options.legacy_export)
        return
    from workflows.models import Workflow

    print(f"{'visits':>7} {'file MB':>9} {'export s':>9} {'export peak RSS MB':>19} {'read s':>7} "
          f"{'read peak RSS MB':>17}")
    with tempfile.TemporaryDirectory() as scratch:
        for visits in options.visits:
            pk = long_history(visits=visits, state_growth_bytes=options.state_growth_bytes,
                              state_bytes=options.state_bytes)
            try:
                path = Path(scratch) / f"workflow-{pk}.jsonl"
                export = measured(["manage.py", "agent", "export-history", str(pk)], out=path)
                read = measured(["-m", "bench.history_export", "--read", str(path)], out=Path(scratch) / "read.txt")
                legacy = measured(["-m", "bench.history_export", "--legacy-export", str(pk)],
                                  out=Path(scratch) / "legacy.json") if options.legacy else None
                print(f"{visits:>7} {export['bytes'] / 1e6:>9.1f} {export['seconds']:>9.2f} {export['peak_mb']:>19.1f} "
                      f"{read['seconds']:>7.2f} {read['peak_mb']:>17.1f}"
                      + (f"   as before: {legacy['seconds']:.2f} s, peak RSS {legacy['peak_mb']:.1f} MB"
                         if legacy else "")
                      + "".join(f"  {name} failed: {r['stderr']}" for name, r in (("export", export), ("read", read))
                                if r["rc"]))
            finally:
                Workflow.objects.filter(pk=pk).delete()


if __name__ == "__main__":
    main()
