"""A worker's garbage collector (``agentops.celery.settle_the_heap``, AGENTOPS_WORKER_GC_THRESHOLD):
what the process started with is frozen out of the collector's passes, and young objects are
collected less often. Each case runs in a process of its own: the collector's state is the process's."""
from __future__ import annotations

import os
import subprocess
import sys

import pytest

# A worker process's start, as Celery signals it in a prefork pool's child (the main process of a
# threads worker gets the same from worker_ready).
STARTED = """
import gc
import django
django.setup()
from celery import signals
import agentops.celery
before = gc.get_threshold()
signals.worker_process_init.send(sender=None)
print(before[0], gc.get_threshold()[0], gc.get_freeze_count() > 0, gc.get_threshold()[1:] == before[1:])
"""


def started(**env: str) -> str:
    done = subprocess.run([sys.executable, "-c", STARTED], capture_output=True, text=True, timeout=60, check=False,
                          env={**{k: v for k, v in os.environ.items() if k != "AGENTOPS_WORKER_GC_THRESHOLD"},
                               "DJANGO_SETTINGS_MODULE": "agentops.settings", **env})
    assert done.returncode == 0, done.stderr
    return done.stdout.strip()


@pytest.mark.parametrize(("env", "expected"), [
    ({}, "700 10000 True True"),
    ({"AGENTOPS_WORKER_GC_THRESHOLD": "50000"}, "700 50000 True True"),
    ({"AGENTOPS_WORKER_GC_THRESHOLD": "0"}, "700 700 False True"),
])
def test_a_worker_freezes_what_it_started_with_and_collects_young_objects_less_often(
        env: dict[str, str], expected: str) -> None:
    assert started(**env) == expected


def test_a_negative_threshold_refuses_to_start() -> None:
    done = subprocess.run([sys.executable, "-c", "import django; django.setup()"], capture_output=True, text=True,
                          timeout=60, check=False,
                          env={**os.environ, "DJANGO_SETTINGS_MODULE": "agentops.settings",
                               "AGENTOPS_WORKER_GC_THRESHOLD": "-1"})
    assert done.returncode != 0
    assert "AGENTOPS_WORKER_GC_THRESHOLD=-1 must be 0 (Python's defaults) or more." in done.stderr
