"""The Celery app the bench workers run (``-A bench.celery_app``): agentops's own app, settings and
tasks, plus the bench-only workflow definitions, activities and chain tasks.

``BENCH_TASK_EVENTS=0`` turns Celery's monitoring events off (an ablation; the product sends them
for Flower).
``BENCH_READY_FILE`` is touched when the worker is ready, so workers can log at WARNING.
"""
from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from celery.signals import worker_ready

from agentops.celery import app
from bench import tasks, workload  # noqa: F401  (registers the bench tasks, definitions and activities)

if os.environ.get("BENCH_TASK_EVENTS") == "0":
    app.conf.update(worker_send_task_events=False, task_send_sent_event=False)


@worker_ready.connect
def _touch_ready_file(**_: Any) -> None:
    path = os.environ.get("BENCH_READY_FILE")
    if path:
        Path(path).touch()


__all__ = ["app"]
