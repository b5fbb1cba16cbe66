"""A worker's garbage collector (``agentops.celery.settle_the_heap``, AGENTOPS_WORKER_GC_THRESHOLD):
what the process started with is frozen out of the collector's passes, and young objects are
collected less often. Each case runs in a process of its own: the collector's state is the process's."""
from __future__ import annotations

import pytest

from tests.test_deploy_settings import settings_read

# A worker process's start, as Celery signals it in a prefork pool's child (the main process of a
# threads worker gets the same from worker_ready).
STARTED = """
import gc
from celery import signals
import agentops.celery
before = gc.get_threshold()
signals.worker_process_init.send(sender=None)
print(before[0], gc.get_threshold()[0], gc.get_freeze_count() > 0, gc.get_threshold()[1:] == before[1:])
"""


@pytest.mark.parametrize(("threshold", "expected"), [
    ("", "700 10000 True True"),  # unset: the default
    ("50000", "700 50000 True True"),
    ("0", "700 700 False True"),
])
def test_a_worker_freezes_what_it_started_with_and_collects_young_objects_less_often(
        threshold: str, expected: str) -> None:
    done = settings_read(STARTED, AGENTOPS_WORKER_GC_THRESHOLD=threshold)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == expected


def test_a_negative_threshold_refuses_to_start() -> None:
    done = settings_read("pass", AGENTOPS_WORKER_GC_THRESHOLD="-1")
    assert done.returncode != 0
    assert "AGENTOPS_WORKER_GC_THRESHOLD=-1 must be 0 (Python's defaults) or more." in done.stderr
