"""Parked workflows (3): one beat tick of every sweep with 100,000 workflows parked vs none.

A parked workflow is made once by the real services (launch, advance, run its one activity, park
on an approval or a durable sleep); the rest are copies of its rows written with ``bulk_create``
(each with its own ids and operation ids), so they have the history and shape the engine leaves.
"""
from __future__ import annotations

import statistics
import time
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import datetime
from typing import Any
from unittest import mock

from bench.context import Bench
from bench.workload import SLEEP

SWEEPS = ("timers_fire_due", "activities_redrive_due", "leases_reap_expired", "workflows_redrive_idle",
          "deadlines_enforce", "stagnation_check")
TABLES = ("workflow", "intent", "activity", "activityattempt", "wait", "timer", "checkpoint", "event")


@contextmanager
def doorbells_silenced() -> Iterator[None]:
    """Templates are driven in-process: their doorbells must not reach (or wait in) the broker."""
    with mock.patch("workflows.doorbells._publish_on_commit", lambda *a, **k: None):
        yield


def make_template(*, wait: str, seconds: int, max_hours: float | None = None) -> int:
    """A workflow parked by the real services: launched, advanced, its activity run, parked."""
    from workflows import services
    from workflows.models import Activity, Workflow

    with doorbells_silenced():
        wf = services.workflow_launch(kind="bench_park", goal="parked for the bench",
                                      params={"wait": wait, "seconds": seconds},
                                      options=services.LaunchOptions(max_hours=max_hours))
        services.workflow_advance_if_runnable(workflow_id=wf.pk)
        activity = Activity.objects.get(workflow=wf)
        services.activity_run_if_runnable(activity_id=activity.pk, worker="bench-template")
    status = Workflow.objects.values_list("status", flat=True).get(pk=wf.pk)
    assert status == Workflow.Status.WAITING, f"template workflow {wf.pk} is {status}, not waiting"
    return wf.pk


def _columns(model: Any) -> list[str]:
    return [f.column for f in model._meta.concrete_fields if f.column != "id"]


def _select(model: Any, overrides: dict[str, str]) -> tuple[str, str]:
    """The column list of ``model`` and the matching SELECT expressions: ``r.<col>`` unless overridden."""
    cols = _columns(model)
    return ", ".join(cols), ", ".join(overrides.get(c, f"r.{c}") for c in cols)


def clone_parked(template_id: int, base: datetime, offsets: list[float], *, batch: int = 20_000) -> list[int]:
    """Copies of the template's rows, written by INSERT ... SELECT; copy ``i`` parks until ``base + offsets[i]`` s.

    Operation ids (``wf-<id>/…``) are rewritten for each copy, as the engine replays by them.
    """
    from django.db import connection, transaction

    from workflows.models import Activity, ActivityAttempt, Checkpoint, Event, Intent, Timer, Wait, Workflow

    op = f"'wf-{int(template_id)}/'"
    ids: list[int] = []
    for start in range(0, len(offsets), batch):
        chunk = offsets[start:start + batch]
        with transaction.atomic(), connection.cursor() as cur:
            cur.execute(
                "CREATE TEMP TABLE bench_wf ON COMMIT DROP AS SELECT o.idx, "
                "nextval(pg_get_serial_sequence('workflows_workflow', 'id')) AS id, "
                "%s::timestamptz + make_interval(secs => o.off) AS fire_at "
                "FROM unnest(%s::float8[]) WITH ORDINALITY AS o(off, idx)", [base, chunk])
            cur.execute("ANALYZE bench_wf")
            cols, exprs = _select(Workflow, {"checkpoint_id": "NULL"})
            cur.execute(f"INSERT INTO workflows_workflow (id, {cols}) SELECT m.id, {exprs} "
                        "FROM bench_wf m, workflows_workflow r WHERE r.id = %s", [template_id])
            for model in (Intent, Checkpoint, Event):
                cols, exprs = _select(model, {
                    "workflow_id": "m.id", "data": f"replace(r.data::text, {op}, 'wf-' || m.id || '/')::jsonb"})
                cur.execute(f"INSERT INTO {model._meta.db_table} ({cols}) SELECT {exprs} "
                            f"FROM bench_wf m, {model._meta.db_table} r WHERE r.workflow_id = %s", [template_id])
            renamed = f"replace(r.operation_id, {op}, 'wf-' || m.wf_id || '/')"
            for model, name in ((Activity, "act"), (Wait, "wait")):
                table = model._meta.db_table
                cur.execute(
                    f"CREATE TEMP TABLE bench_{name} ON COMMIT DROP AS SELECT m.id AS wf_id, m.fire_at, "
                    f"r.id AS old_id, nextval(pg_get_serial_sequence('{table}', 'id')) AS id "
                    f"FROM bench_wf m, {table} r WHERE r.workflow_id = %s", [template_id])
                cur.execute(f"ANALYZE bench_{name}")  # else the joins below may loop over the growing table
                cols, exprs = _select(model, {
                    "workflow_id": "m.wf_id", "operation_id": renamed,
                    "idempotency_key": renamed.replace("r.operation_id", "r.idempotency_key"),  # activities only
                    "expires_at": "CASE WHEN r.expires_at IS NULL THEN NULL ELSE m.fire_at END"})
                cur.execute(f"INSERT INTO {table} (id, {cols}) SELECT m.id, {exprs} "
                            f"FROM bench_{name} m JOIN {table} r ON r.id = m.old_id")
            cols, exprs = _select(ActivityAttempt, {"activity_id": "m.id"})
            cur.execute(f"INSERT INTO workflows_activityattempt ({cols}) SELECT {exprs} "
                        "FROM bench_act m JOIN workflows_activityattempt r ON r.activity_id = m.old_id")
            cols, exprs = _select(Timer, {"workflow_id": "m.wf_id", "wait_id": "m.id", "fire_at": "m.fire_at"})
            cur.execute(f"INSERT INTO workflows_timer ({cols}) SELECT {exprs} "
                        "FROM bench_wait m JOIN workflows_timer r ON r.wait_id = m.old_id")
            cur.execute("UPDATE workflows_workflow w SET checkpoint_id = (SELECT max(c.id) FROM workflows_checkpoint c "
                        "WHERE c.workflow_id = w.id) WHERE w.id IN (SELECT id FROM bench_wf)")
            cur.execute("SELECT id FROM bench_wf ORDER BY idx")
            ids += [row[0] for row in cur.fetchall()]
    return ids


def make_busy_workflow() -> int:
    """A workflow running a long activity, idle since a minute ago: what a live system always has.

    ``workflows_redrive_idle`` looks at it on every tick (its candidates are idle running workflows).
    """
    from datetime import timedelta

    from workflows import clock, services
    from workflows.models import Activity, Workflow

    with doorbells_silenced():
        wf = services.workflow_launch(kind="bench_steps", goal="busy", params={"steps": 1, "activity": SLEEP})
        services.workflow_advance_if_runnable(workflow_id=wf.pk)
        activity = Activity.objects.get(workflow=wf)
        assert services.activity_claim_if_runnable(activity_id=activity.pk, worker="bench-busy", task_id="")
    now = clock.now()
    Activity.objects.filter(pk=activity.pk).update(lease_expires_at=now + timedelta(days=1))
    Workflow.objects.filter(pk=wf.pk).update(updated_at=now - timedelta(minutes=1))
    return wf.pk


APPLIED_INDEX = ("CREATE INDEX act_live_workflow_idx ON workflows_activity (workflow_id) "
                 "WHERE status IN ('scheduled', 'running')")
PROPOSED_INDEX = ("CREATE INDEX bench_act_live_workflow_idx ON workflows_activity (workflow_id) "
                  "WHERE status IN ('scheduled', 'running')")


def _vacuum_analyze() -> None:
    from django.db import connection

    with connection.cursor() as cursor:
        for table in TABLES:
            cursor.execute(f"VACUUM ANALYZE workflows_{table}")


def _table_sizes() -> dict[str, int]:
    from django.db import connection

    with connection.cursor() as cursor:
        cursor.execute("SELECT relname, pg_total_relation_size(oid) FROM pg_class WHERE relkind = 'r' "
                       "AND relname LIKE 'workflows_%%'")
        return {name.removeprefix("workflows_"): size for name, size in cursor.fetchall()}


def time_sweeps(repeats: int, only: tuple[str, ...] = SWEEPS) -> dict[str, dict[str, float]]:
    """Median and max milliseconds of one call of each sweep service, in-process."""
    from workflows import services

    out = {}
    for name in only:
        fn = getattr(services, name)
        fn()  # warm the plan cache and the buffer pool
        times = []
        for _ in range(repeats):
            t = time.perf_counter()
            fn()
            times.append((time.perf_counter() - t) * 1000)
        out[name] = {"median_ms": round(statistics.median(times), 3), "max_ms": round(max(times), 3)}
    return out


def explain_sweeps(only: tuple[str, ...] = SWEEPS) -> dict[str, list[str]]:
    """EXPLAIN (ANALYZE, BUFFERS) of every SELECT one tick of each sweep runs, captured as it runs."""
    from django.db import connection

    from workflows import services

    plans: dict[str, list[str]] = {}
    for name in only:
        captured: list[tuple[str, Any]] = []

        def capture(execute: Any, sql: str, params: Any, many: bool, context: Any,
                    captured: list[tuple[str, Any]] = captured) -> Any:
            captured.append((sql, params))
            return execute(sql, params, many, context)

        with connection.execute_wrapper(capture):
            getattr(services, name)()
        texts = []
        with connection.cursor() as cursor:
            for sql, params in captured:
                if not sql.lstrip().upper().startswith("SELECT"):
                    continue
                cursor.execute("EXPLAIN (ANALYZE, BUFFERS, COSTS OFF) " + sql, params)
                plan = "\n".join(row[0] for row in cursor.fetchall())
                texts.append(f"{cursor.mogrify(sql, params) if hasattr(cursor, 'mogrify') else sql}\n{plan}")
        plans[name] = texts
    return plans


def purge_workflows() -> None:
    from django.db import connection

    with connection.cursor() as cursor:
        cursor.execute("TRUNCATE " + ", ".join(f"workflows_{t}" for t in TABLES) + " CASCADE")


def bench_parked(bench: Bench) -> dict[str, Any]:
    n = bench.sizes.parked
    repeats = bench.sizes.sweep_repeats
    purge_workflows()
    make_busy_workflow()
    _vacuum_analyze()
    bench.log("parked: sweep ticks with nothing parked")
    baseline = time_sweeps(repeats)
    size0, tables0 = bench.pg.database_size(bench.db_name), _table_sizes()
    far = 3 * 86400
    templates = [make_template(wait="approval", seconds=far), make_template(wait="timer", seconds=far,
                                                                               max_hours=30 * 24)]
    from workflows import clock

    now = clock.now()
    bench.log(f"parked: writing {n} parked workflows")
    t = time.monotonic()
    half = n // 2
    # Wake times spread over days 2 to 5 from now: nothing is due during the run.
    spread = [float(2 * 86400 + (i * 7919) % (3 * 86400)) for i in range(n)]
    clone_parked(templates[0], now, spread[:half - 1])
    clone_parked(templates[1], now, spread[half:n - 1])
    write_s = time.monotonic() - t
    _vacuum_analyze()
    size1, tables1 = bench.pg.database_size(bench.db_name), _table_sizes()
    bench.log(f"parked: wrote them in {write_s:.0f} s; sweep ticks with {n} parked")
    parked = time_sweeps(repeats)
    plans = explain_sweeps()
    (bench.out_dir / "explain.txt").write_text("\n\n".join(
        f"## {name}\n\n" + "\n\n".join(texts) for name, texts in plans.items()) + "\n")
    # What the partial index on live activities buys workflows_redrive_idle: measured without it
    # (dropped in the bench database only) now that the product has it, with it before that.
    from django.db import connection

    with connection.cursor() as cursor:
        cursor.execute("SELECT 1 FROM pg_indexes WHERE indexname = 'act_live_workflow_idx'")
        applied = cursor.fetchone() is not None
        cursor.execute("DROP INDEX act_live_workflow_idx" if applied else PROPOSED_INDEX)
        cursor.execute("ANALYZE workflows_activity")
    variant = time_sweeps(repeats, only=("workflows_redrive_idle",))["workflows_redrive_idle"]
    variant_plan = explain_sweeps(only=("workflows_redrive_idle",))["workflows_redrive_idle"]
    with connection.cursor() as cursor:
        cursor.execute(APPLIED_INDEX if applied else "DROP INDEX bench_act_live_workflow_idx")
    label = "without_act_live_workflow_idx" if applied else "with_proposed_index"
    (bench.out_dir / f"explain-{label}.txt").write_text("\n\n".join(variant_plan) + "\n")
    tick0 = sum(v["median_ms"] for v in baseline.values())
    tick1 = sum(v["median_ms"] for v in parked.values())
    purge_workflows()
    return {
        "parked": n, "write_s": round(write_s, 1),
        "tick_ms_none": round(tick0, 3), "tick_ms_parked": round(tick1, 3), "ratio": round(tick1 / tick0, 3),
        "per_sweep": {name: {"none": baseline[name], "parked": parked[name],
                             "ratio": round(parked[name]["median_ms"] / baseline[name]["median_ms"], 2)}
                      for name in SWEEPS},
        "bytes_per_parked_workflow": round((size1 - size0) / n),
        "table_bytes_per_parked_workflow": {t: round((tables1.get(t, 0) - tables0.get(t, 0)) / n)
                                            for t in TABLES},
        "explain_file": "var/bench/explain.txt",
        f"workflows_redrive_idle_{label}": variant,
    }
