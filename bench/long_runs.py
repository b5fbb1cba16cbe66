"""``python -m bench.long_runs``: what a step costs on day three against minute one.

Runs the shipped kinds at and past their limits, in this process, through the real services on a
PostgreSQL database of its own (created, migrated, dropped at the end unless ``--keep-db``):

- ``autonomous`` R rounds × 12 tasks (20 by default; ``--rounds 200`` for the days-long case): a
  scripted model that plans 12 tasks with 4,000-character instructions, answers each with a
  2,000-character summary after two tool calls, and meets the goal only in round R;
- ``harness`` at N scripted features (10, 50, 200; ``--features``): a project whose check prints a
  2,000-character failure tail until its feature's file says ok, where every third feature's first
  session is wrong (so it takes a second session), every other one is right first time.

Printed per run: node visits, stored bytes per visit (mean of the first 10 % of visits against the
last 10 %), total stored bytes, database growth, the median and p95 of an advance early (first 10 %
of advances) against late (last 10 %), check runs per accepted pass (harness), the admin page's
bytes and time and ``agent show --json``'s bytes and time. "Stored bytes" of a visit are the JSON
text of what it added: its checkpoint row, its activities' input and result, its events, the blob
rows it stored first (where that table exists) and the state the workflow row held on entering it
(rewritten at every node entry). Results also go to ``var/bench/long_runs.json``.

Doorbells are not rung (nothing else runs the workflows); an advance is timed around
``advance_locked`` (the replay of the node's handler and what it persists), wherever it is called.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections import defaultdict
from pathlib import Path
from typing import Any

from bench.infra import REPO_ROOT, Postgres

CHECK_SH = r"""f="done/$1"
if [ -f "$f" ] && grep -q '^ok$' "$f"; then echo "ok $1"; exit 0; fi
i=0
while [ $i -lt 25 ]; do
  echo "FAIL $1 line $i: expected $f to say ok (pid $$); the end-to-end check saw nothing yet"
  i=$((i+1))
done
exit 1
"""
INSTRUCTIONS_CHARS = 4000
SUMMARY_CHARS = 2000
TASKS_PER_ROUND = 12


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m bench.long_runs", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--features", default="10,50,200", help="harness sizes, comma-separated (default %(default)s)")
    parser.add_argument("--rounds", type=int, action="append",
                        help="autonomous rounds (repeatable; default 20); 0 skips the autonomous runs")
    parser.add_argument("--postgres-url", default=os.environ.get("BENCH_POSTGRES_URL",
                                                                 "postgres://postgres@127.0.0.1:5432"))
    parser.add_argument("--database", default="agentops_bench_long")
    parser.add_argument("--out", type=Path, default=REPO_ROOT / "var" / "bench" / "long_runs.json")
    parser.add_argument("--keep-db", action="store_true")
    return parser.parse_args(argv)


# --- the scripted model of the autonomous runs ------------------------------------------------

def _text(seed: str, chars: int) -> str:
    line = f"{seed}: do the work carefully, note what changed, and check it against the goal. "
    return (line * (chars // len(line) + 1))[:chars]


def _patch_autonomous_model(rounds: int) -> None:
    """The scripted provider's autonomous answers, at the kind's limits: 12 tasks per plan with 4 KB
    instructions, 2 KB summaries, the goal met in round ``rounds`` (titles carry the round)."""
    import re

    from agentops.providers import scripted
    from workflows.provider import ModelResponse

    def tasks(round_: int) -> str:
        return json.dumps({"tasks": [{"title": f"Round {round_} task {i}",
                                      "instructions": _text(f"round {round_} task {i}", INSTRUCTIONS_CHARS)}
                                     for i in range(1, TASKS_PER_ROUND + 1)]})

    def rounds_in(prompt: str) -> list[int]:
        return [int(n) for n in re.findall(r"Round (\d+) task", prompt)]

    def plan(self: Any, prompt: str) -> str:
        return tasks(1)

    def replan(self: Any, prompt: str) -> str:
        return tasks(max(rounds_in(prompt), default=0) + 1)

    def verify(self: Any, prompt: str) -> str:
        current = max(rounds_in(prompt), default=0)
        met = current >= rounds
        return json.dumps({"goal_met": met, "reason": f"round {current} of {rounds}" + (" met" if met else ""),
                           "progress": {"percent": min(100, round(100 * current / rounds)), "achievements": [],
                                        "remaining": [], "confidence": 0.8}})

    original = scripted.ScriptedProvider._execute_turn

    def execute(self: Any, prompt: str, messages: list[dict[str, Any]], system: str) -> ModelResponse:
        response = original(self, prompt, messages, system)
        if not response.tool_calls:
            title = scripted._between(prompt, "<task_title>", "</task_title>")
            response = ModelResponse(text=_text(f"summary of {title}", SUMMARY_CHARS), stop_reason="end_turn",
                                     usage=response.usage)
        return response

    scripted.ScriptedProvider._answer_plan_tasks = plan  # type: ignore[method-assign]
    scripted.ScriptedProvider._answer_replan = replan  # type: ignore[method-assign]
    scripted.ScriptedProvider._answer_verify_goal = verify  # type: ignore[method-assign]
    scripted.ScriptedProvider._execute_turn = execute  # type: ignore[method-assign]


# --- the harness project ----------------------------------------------------------------------

def harness_schedule(path: Path, n: int) -> Path:
    """Sessions for an N-feature project: the initializer, then one (or, every third feature, two) per feature."""
    ids = [f"F{i:03d}" for i in range(1, n + 1)]
    features = [{"id": fid, "description": f"Feature {fid}: the program handles case {i}", "steps": [f"run {fid}"],
                 "priority": i, "check": f"sh checks/check.sh {fid}", "passes": False}
                for i, fid in enumerate(ids, start=1)]

    def write(p: str, content: str) -> dict[str, Any]:
        return {"tool": "write_file", "input": {"path": p, "content": content}}

    sessions: dict[str, list[dict[str, Any]]] = {"INIT/1": [
        write("features.json", json.dumps(features, indent=1)), write("checks/check.sh", CHECK_SH),
        write("checks/smoke.sh", "exit 0\n"), write("init.sh", "true\n"), write("progress.md", "# Progress\n"),
        {"tool": "git_commit", "input": {"message": "scaffold"}},
        {"tool": "end_session", "input": {"summary": "scaffold"}}]}
    for i, fid in enumerate(ids, start=1):
        for attempt in (1, 2, 3):
            right = attempt > 1 or i % 3 != 0
            sessions[f"{fid}/{attempt}"] = [
                write(f"done/{fid}", "ok\n" if right else "not yet\n"),
                {"tool": "git_commit", "input": {"message": f"{fid}: attempt {attempt}"}},
                {"tool": "request_pass", "input": {"feature_id": fid}}]
    path.write_text(json.dumps({"sessions": sessions}))
    return path


# --- driving and measuring --------------------------------------------------------------------

class AdvanceTimer:
    """Times every ``advance_locked`` call (the services import it by name: patched in each)."""

    def __init__(self) -> None:
        from workflows.services import activities, workflows

        self.modules = (workflows, activities)
        self.original = workflows.advance_locked
        self.times: list[float] = []

        def timed(*args: Any, **kwargs: Any) -> Any:
            started = time.perf_counter()
            try:
                return self.original(*args, **kwargs)
            finally:
                self.times.append(time.perf_counter() - started)

        for module in self.modules:
            module.advance_locked = timed  # type: ignore[attr-defined]

    def close(self) -> None:
        for module in self.modules:
            module.advance_locked = self.original  # type: ignore[attr-defined]


# A run is driven to its end in this process; backoffs are not waited out.
DRIVE = {"max_rounds": 100_000, "worker": "bench-long-runs", "retries_now": True}


def database_bytes(name: str) -> int:
    from django.db import connection

    with connection.cursor() as cursor:
        cursor.execute("SELECT pg_database_size(%s)", [name])
        return int(cursor.fetchone()[0])


def _table_exists(table: str) -> bool:
    from django.db import connection

    return table in connection.introspection.table_names()


def stored_per_visit(workflow_id: int, sources: dict[str, int] | None = None) -> dict[int, int]:
    """Bytes of JSON text each node visit added (see the module docstring); ``sources`` gets the
    totals by where they went."""
    from django.db import connection

    per: dict[int, int] = defaultdict(int)
    sources = sources if sources is not None else {}

    def add(source: str, visit: int, size: int) -> None:
        per[visit] += size
        sources[source] = sources.get(source, 0) + size

    with connection.cursor() as cursor:
        cursor.execute("SELECT node_visit, COALESCE(octet_length(input::text), 0), COALESCE(octet_length("
                       "result::text), 0) + octet_length(error) FROM workflows_activity WHERE workflow_id = %s",
                       [workflow_id])
        for visit, input_size, result_size in cursor.fetchall():
            add("activity inputs", visit, input_size)
            add("activity results", visit, result_size)
        # Events belong to the visit of the last node.entered before them.
        cursor.execute("SELECT kind, data, octet_length(data::text) FROM workflows_event WHERE workflow_id = %s "
                       "ORDER BY seq", [workflow_id])
        visit = 1
        for kind, data, size in cursor.fetchall():
            if kind == "node.entered":
                data = json.loads(data) if isinstance(data, str) else data
                visit = int(data.get("visit", visit))
            add("events", visit, size)
        if _table_exists("workflows_stateblob"):
            cursor.execute("SELECT node_visit, octet_length(data) FROM workflows_stateblob WHERE workflow_id = %s",
                           [workflow_id])
            for visit, size in cursor.fetchall():
                add("blobs", visit, size)
    for visit, (checkpoint, row) in checkpoint_and_row_bytes(workflow_id).items():
        add("checkpoints", visit, checkpoint)
        add("workflow row state", visit, row)
    return dict(per)


def checkpoint_and_row_bytes(workflow_id: int) -> dict[int, tuple[int, int]]:
    """Per visit: the checkpoint row's JSON, plus the workflow row's state as written when entering it."""
    from django.db import connection

    out: dict[int, tuple[int, int]] = {}
    with connection.cursor() as cursor:
        if not _table_exists("workflows_stateblob"):  # no blobs: every checkpoint is the whole state, as the row
            cursor.execute("SELECT node_visit, octet_length(state::text) FROM workflows_checkpoint "
                           "WHERE workflow_id = %s", [workflow_id])
            for visit, size in cursor.fetchall():
                out[visit] = (size, size)
            return out
    from workflows import statestore

    for visit, checkpoint_bytes, row_bytes in statestore.stored_sizes(workflow_id):
        out[visit] = (checkpoint_bytes, row_bytes)
    return out


def _split(values: list[float]) -> tuple[list[float], list[float]]:
    tenth = max(1, len(values) // 10)
    return values[:tenth], values[-tenth:]


def _p95(values: list[float]) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(0.95 * len(ordered)))] if ordered else 0.0


def history_reads(workflow_id: int, scratch: Path) -> dict[str, Any]:
    """``agent export-history`` of the run (bytes, seconds, peak memory: a child process under
    /usr/bin/time) and ``agent replay-check --fixtures`` of what it wrote (seconds, and whether
    every visit replays)."""
    from bench.history_export import measured

    path = scratch / f"history-{workflow_id}.jsonl"
    export = measured(["manage.py", "agent", "export-history", str(workflow_id)], out=path)
    check = measured(["manage.py", "agent", "replay-check", "--fixtures", str(path)],
                     out=scratch / f"replay-check-{workflow_id}.txt")
    path.unlink(missing_ok=True)
    return {"export_bytes": export["bytes"], "export_s": export["seconds"], "export_peak_mb": export["peak_mb"],
            "export_rc": export["rc"], "replay_check_s": check["seconds"], "replay_check_peak_mb": check["peak_mb"],
            "replay_check_rc": check["rc"], "replay_check_said": check["stderr"][-300:]}


def reads(workflow_id: int) -> dict[str, Any]:
    """The admin workflow page and ``agent show --json``: bytes and seconds."""
    import io

    from django.contrib.auth.models import User
    from django.core.management import call_command
    from django.test import Client

    admin = User.objects.filter(username="bench-admin").first() or User.objects.create_superuser(
        "bench-admin", "bench@example.invalid", "bench-admin-password")
    client = Client(HTTP_HOST="127.0.0.1")
    client.force_login(admin)
    started = time.perf_counter()
    page = client.get(f"/admin/workflows/workflow/{workflow_id}/change/")
    page_s = time.perf_counter() - started
    out = io.StringIO()
    started = time.perf_counter()
    call_command("agent", "show", str(workflow_id), "--json", stdout=out)
    show_s = time.perf_counter() - started
    return {"admin_page_bytes": len(page.content), "admin_page_status": page.status_code, "admin_page_s": page_s,
            "show_json_bytes": len(out.getvalue()), "show_s": show_s}


def measure(label: str, workflow: Any, timer: AdvanceTimer, db_before: int, db_name: str, wall: float,
            extra: dict[str, Any], scratch: Path) -> dict[str, Any]:
    sources: dict[str, int] = {}
    per = stored_per_visit(workflow.pk, sources)
    visits = [per.get(v, 0) for v in range(1, workflow.node_visit + 1)]
    first, last = _split([float(v) for v in visits])
    early, late = _split(timer.times)
    row = {
        "run": label, "status": workflow.status, "node": workflow.current_node, "reason": workflow.reason[:200],
        "visits": workflow.node_visit, "wall_s": round(wall, 1),
        "bytes_per_visit_first": statistics.mean(first), "bytes_per_visit_last": statistics.mean(last),
        "bytes_per_visit_mean": statistics.mean(visits), "bytes_total": sum(visits), "bytes_by_source": sources,
        "db_growth_bytes": database_bytes(db_name) - db_before,
        "advances": len(timer.times),
        "advance_median_early_ms": 1000 * statistics.median(early),
        "advance_median_late_ms": 1000 * statistics.median(late),
        "advance_p95_early_ms": 1000 * _p95(early), "advance_p95_late_ms": 1000 * _p95(late),
        **extra, **reads(workflow.pk), **history_reads(workflow.pk, scratch),
    }
    return row


def run_autonomous(rounds: int, db_name: str, scratch: Path) -> dict[str, Any]:
    from workflows import services
    from workflows.testing.inprocess import drive

    _patch_autonomous_model(rounds)
    db_before = database_bytes(db_name)
    timer = AdvanceTimer()
    started = time.perf_counter()
    try:
        wf = services.workflow_launch(kind="autonomous", goal=f"Reach round {rounds}",
                                      params={"max_rounds": str(rounds)})
        workflow = drive(wf.pk, **DRIVE)
    finally:
        timer.close()
    return measure(f"autonomous {rounds}x{TASKS_PER_ROUND}", workflow, timer, db_before, db_name,
                   time.perf_counter() - started, {}, scratch)


def run_harness(n: int, db_name: str, scratch: Path) -> dict[str, Any]:
    from django.conf import settings
    from django.contrib.auth.models import Group, User

    from agentops.agents.harness import script
    from workflows import services
    from workflows.models import Event, Wait
    from workflows.testing.inprocess import drive

    settings.AGENTOPS_HARNESS_SCHEDULE_FILE = str(harness_schedule(scratch / f"schedule-{n}.json", n))
    script._load.cache_clear()
    approver = User.objects.filter(username="bench-approver").first()
    if approver is None:
        approver = User.objects.create_user("bench-approver", password="bench-approver-password")
        approver.groups.add(Group.objects.get_or_create(name="harness-approvers")[0])
    db_before = database_bytes(db_name)
    timer = AdvanceTimer()
    started = time.perf_counter()
    try:
        wf = services.workflow_launch(kind="harness", goal=f"Build the {n}-feature project", params={
            "workspace": str(scratch / f"ws-{n}"), "isolation": "none", "max_sessions": str(min(1000, 2 * n + 10)),
            "stagnation_sessions": "1000", "check_timeout_seconds": "30"})
        drive(wf.pk, **DRIVE)
        wait = Wait.objects.filter(workflow_id=wf.pk, kind=Wait.Kind.APPROVAL, status=Wait.Status.OPEN).first()
        if wait is not None:
            services.wait_approve(wait_id=wait.pk, user=approver, candidate_hash=wait.candidate_hash)
        workflow = drive(wf.pk, **DRIVE)
    finally:
        timer.close()
    checks = Event.objects.filter(workflow_id=wf.pk, kind="harness.check_ran")
    passes = checks.filter(data__purpose="verify", data__passed=True).count()
    extra = {"check_runs": checks.count(), "regression_runs": checks.filter(data__purpose="regression").count(),
             "accepted_passes": passes,
             "check_runs_per_pass": round(checks.exclude(data__purpose="scaffold").count() / max(1, passes), 1)}
    return measure(f"harness {n} features", workflow, timer, db_before, db_name, time.perf_counter() - started, extra,
                   scratch)


def _kb(value: float) -> str:
    return f"{value / 1024:,.1f} KB"


def _mb(value: float) -> str:
    return f"{value / 1024 / 1024:,.1f} MB"


def print_table(rows: list[dict[str, Any]]) -> None:
    head = ("run", "status", "visits", "B/visit first 10%", "last 10%", "ratio", "total", "db growth",
            "adv med early/late ms", "ratio", "p95 early/late ms", "checks/pass", "admin page", "show --json")
    print(" | ".join(head))
    for r in rows:
        print(" | ".join(str(x) for x in (
            r["run"], r["status"] + ("" if r["status"] == "completed" else f" at {r['node']}"), r["visits"],
            _kb(r["bytes_per_visit_first"]), _kb(r["bytes_per_visit_last"]),
            f"{r['bytes_per_visit_last'] / max(1.0, r['bytes_per_visit_first']):.2f}x", _mb(r["bytes_total"]),
            _mb(r["db_growth_bytes"]),
            f"{r['advance_median_early_ms']:.1f}/{r['advance_median_late_ms']:.1f}",
            f"{r['advance_median_late_ms'] / max(1e-6, r['advance_median_early_ms']):.2f}x",
            f"{r['advance_p95_early_ms']:.1f}/{r['advance_p95_late_ms']:.1f}", r.get("check_runs_per_pass", "-"),
            f"{_kb(r['admin_page_bytes'])} {r['admin_page_s']:.2f}s",
            f"{_kb(r['show_json_bytes'])} {r['show_s']:.2f}s")))
        if r["status"] != "completed":
            print(f"    {r['run']}: {r['reason']}")
        print("    where the bytes went: " + ", ".join(f"{k} {_mb(v)}" for k, v in sorted(
            r.get("bytes_by_source", {}).items(), key=lambda kv: -kv[1])))
    if ratio := summary(rows).get("harness_bytes_per_visit_ratio"):
        print(f"stored bytes per visit, harness N={ratio['high']} / N={ratio['low']}: {ratio['ratio']:.2f}x "
              "(target <= 2x)")


def bench_long_runs(bench: Any) -> dict[str, Any]:
    """The "long runs" section of ``python -m bench``: this module in a child process of its own
    (it drives the workflows in process, on a database of its own, with the doorbells off), at the
    suite's sizes; its rows and the ratios the targets are about."""
    bench.cluster.stop(bench.cluster.workers())  # nothing else on the machine's two cores
    out = bench.out_dir / "long_runs.json"
    command = [sys.executable, "-m", "bench.long_runs", "--features", ",".join(map(str, bench.sizes.long_run_features)),
               "--postgres-url", bench.pg.server_url, "--database", f"{bench.db_name}_long", "--out", str(out)]
    for rounds in bench.sizes.long_run_rounds:
        command += ["--rounds", str(rounds)]
    env = {k: v for k, v in os.environ.items() if k not in ("DATABASE_URL", "DJANGO_SETTINGS_MODULE")}
    done = subprocess.run(command, cwd=REPO_ROOT, env=env, capture_output=True, text=True, check=False)
    if done.returncode != 0:
        raise RuntimeError(f"bench.long_runs exited {done.returncode}: {done.stderr[-1500:]}")
    rows = json.loads(out.read_text())["rows"]
    return {"rows": rows, **summary(rows)}


def summary(rows: list[dict[str, Any]]) -> dict[str, Any]:
    """The figures the long-run targets are about: per-visit bytes of the largest harness run against
    the smallest, and each run's late/early ratios."""
    harness = {int(r["run"].split()[1]): r for r in rows if r["run"].startswith("harness")}
    out: dict[str, Any] = {}
    if len(harness) > 1:
        low, high = min(harness), max(harness)
        out["harness_bytes_per_visit_ratio"] = {
            "low": low, "high": high,
            "ratio": harness[high]["bytes_per_visit_mean"] / max(1.0, harness[low]["bytes_per_visit_mean"])}
    return out


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    postgres = Postgres(args.postgres_url)
    url = postgres.recreate(args.database)
    os.environ.update({"DATABASE_URL": url, "DJANGO_SETTINGS_MODULE": "agentops.settings",
                       "AGENTOPS_MODEL_PROVIDER": "scripted", "AGENTOPS_SANDBOX": "none",
                       "AGENTOPS_ACTIVITY_CHAIN_SECONDS": "0", "AGENTOPS_LOG_LEVEL": "WARNING"})
    done = subprocess.run([sys.executable, "manage.py", "migrate", "--verbosity", "0"], cwd=Path.cwd(),
                          env=os.environ, capture_output=True, text=True, check=False)
    if done.returncode != 0:
        raise SystemExit(f"manage.py migrate failed:\n{done.stdout}{done.stderr}")
    scratch = Path(tempfile.mkdtemp(prefix="agentops-long-runs-"))
    os.environ["AGENTOPS_WORKSPACE_DIR"] = str(scratch / "workspaces")
    import django

    django.setup()
    from django.conf import settings

    from workflows import doorbells

    settings.EMAIL_BACKEND = "django.core.mail.backends.locmem.EmailBackend"  # approvers' mail: not printed

    # Nothing else runs these workflows: this process drives them (workflows.testing.inprocess.drive).
    doorbells.activity_run = lambda **kwargs: None  # type: ignore[assignment]
    doorbells.workflow_advance = lambda **kwargs: None  # type: ignore[assignment]
    rows: list[dict[str, Any]] = []
    try:
        for rounds in args.rounds if args.rounds is not None else [20]:
            if rounds > 0:
                rows.append(run_autonomous(rounds, args.database, scratch))
                print(json.dumps(rows[-1]), flush=True)
        for n in [int(x) for x in args.features.split(",") if x.strip()]:
            rows.append(run_harness(n, args.database, scratch))
            print(json.dumps(rows[-1]), flush=True)
    finally:
        from django.db import connections

        connections.close_all()
        if not args.keep_db:
            postgres.drop(args.database)
    print_table(rows)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps({"rows": rows}, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
