"""Where each commit and each publish of the happy path goes (2): one workflow driven in-process.

The task bodies are called in the order the workers would call them, with the connection handling
of agentops/celery.py between tasks (close_old_connections: the connection is kept and
health-checked before its next use, with the product's settings). Every server
transaction is attributed client-side: a statement outside ``atomic`` is a transaction of its own
(PostgreSQL counts read-only ones too), an outermost ``atomic`` is one, and so is the ``SET TIME
ZONE`` Django sends on a new connection when the server's zone name differs from settings.TIME_ZONE,
and so is the start-up of every new connection (the backend reads the catalogs in a transaction).
"""
from __future__ import annotations

import sys
from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any
from unittest import mock

from bench.context import Bench


def _caller() -> str:
    """The innermost agentops service (or selector) function on the stack."""
    frame = sys._getframe(2)
    fallback = ""
    while frame is not None:
        path = frame.f_code.co_filename
        if frame.f_code.co_name == "inner" and path.endswith("contextlib.py"):
            wrapped = frame.f_locals.get("func")  # a function decorated with @transaction.atomic
            if wrapped is not None and "/workflows/" in getattr(wrapped, "__code__", frame.f_code).co_filename:
                return str(wrapped.__name__)
        if "/workflows/services/" in path or "/workflows/selectors" in path:
            return frame.f_code.co_name
        if "/bench/" not in path and "/django/" not in path and not fallback:
            fallback = frame.f_code.co_name
        frame = frame.f_back
    return fallback or "?"


@contextmanager
def _counting(tally: list[str]) -> Iterator[None]:
    from django.db import connection, connections
    from django.db.backends.signals import connection_created

    wrapper = type(connections["default"])

    def on_statement(execute: Any, sql: str, params: Any, many: bool, context: Any) -> Any:
        if not connection.in_atomic_block:
            tally.append(f"{_caller()}: {sql.split()[0].upper()} outside a transaction")
        return execute(sql, params, many, context)

    real_commit = wrapper.commit

    def commit(self: Any) -> None:
        tally.append(f"{_caller()}: transaction")
        real_commit(self)

    real_tz = wrapper._configure_timezone

    def configure_timezone(self: Any, conn: Any) -> bool:
        sent = real_tz(self, conn)
        if sent:
            tally.append("new connection: SET TIME ZONE (server zone name differs from settings.TIME_ZONE)")
        return sent

    def on_connect(**_: Any) -> None:
        tally.append("new connection: the server's start-up transaction (PostgreSQL counts it)")

    real_is_usable = wrapper.is_usable

    def is_usable(self: Any) -> bool:
        tally.append("health check of a kept connection: SELECT 1 (CONN_HEALTH_CHECKS)")
        return bool(real_is_usable(self))

    connection_created.connect(on_connect)
    try:
        with (connection.execute_wrapper(on_statement), mock.patch.object(wrapper, "commit", commit),
              mock.patch.object(wrapper, "_configure_timezone", configure_timezone),
              mock.patch.object(wrapper, "is_usable", is_usable)):
            yield
    finally:
        connection_created.disconnect(on_connect)


def trace_happy_path(bench: Bench, steps: int = 3) -> dict[str, Any]:
    """Launch one bench_steps workflow and run its tasks in-process; attribute commits and doorbells."""
    from django.db import close_old_connections

    from workflows import services

    rung: list[tuple[str, dict[str, Any]]] = []
    per_task: list[tuple[str, list[str], list[str]]] = []

    def publish(task_name: str, queue: str | None = None, **kwargs: Any) -> None:
        rung.append((task_name, kwargs))

    def run(label: str, fn: Any, **kwargs: Any) -> None:
        tally: list[str] = []
        before = len(rung)
        with _counting(tally):
            close_old_connections()  # what agentops.celery.recycle_db_connections does around a task
            fn(**kwargs)
        per_task.append((label, tally, [name for name, _ in rung[before:]]))

    with mock.patch("workflows.doorbells._publish_on_commit", publish):
        run("launch (the caller)", lambda: services.workflow_launch(kind="bench_steps", goal="trace",
                                                                    params={"steps": steps}))
        while rung:
            name, kwargs = rung.pop(0)
            fn = (services.workflow_advance_if_runnable if name == "agentops.workflow.advance"
                  else services.activity_run_if_runnable)
            run(f"task {name}", fn, **kwargs)
    activity_tasks = [t for t in per_task if t[0] == "task agentops.activity.run"]
    per_activity = Counter(item for _, tally, _ in activity_tasks for item in tally)
    # With chaining, one activity task runs several activities: count per activity, not per task.
    return {
        "steps": steps,
        "tasks": [{"task": label, "commits": len(tally), "what": tally, "publishes": published}
                  for label, tally, published in per_task],
        "activity_tasks": len(activity_tasks),
        "per_activity": {k: round(v / steps, 2) for k, v in per_activity.items()},
        "commits_per_activity_all_in": round(sum(len(t) for _, t, _ in per_task) / steps, 2),
        "publishes_per_activity_all_in": round(sum(len(p) for _, _, p in per_task) / steps, 2),
    }
