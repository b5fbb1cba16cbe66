"""Concurrency keys for activities on real workers and beat: two threads workers
with room for 12 attempts at once, a kind capped at 2 by AGENTOPS_ACTIVITY_CONCURRENCY; 7 workflows
of it run 2 at a time, each waiting activity is rung when a slot frees (not at its 60 s recheck),
and every workflow completes."""
from __future__ import annotations

import time
from typing import Any

import pytest
from django.conf import settings

import tests.child_kinds  # noqa: F401  (registers the kinds in this process too)
from tests.process.harness import Cluster, wait_until_status
from workflows import services
from workflows.models import ActivityAttempt, Event

pytestmark = [pytest.mark.process, pytest.mark.django_db(transaction=True)]

MODULES = ",".join([*settings.AGENTOPS_AGENT_MODULES, "tests.child_kinds"])
CAP = 2
WORKFLOWS = 7
SECONDS = 1.5


def test_a_kind_capped_at_two_runs_two_at_a_time_and_hands_each_freed_slot_on(cluster: Cluster, figures: Any) -> None:
    cluster.extra_env.update({"AGENTOPS_AGENT_MODULES": MODULES,
                              "AGENTOPS_ACTIVITY_CONCURRENCY": f'{{"kind:test-square": {CAP}}}'})
    for name in ("wa", "wb"):
        cluster.start_worker(name, ready=False, pool="threads", concurrency=6)
    cluster.start_beat(ready=False)
    cluster.wait_ready(*cluster.live())

    started = time.monotonic()
    ids = [services.workflow_launch(kind="test-square", goal=f"Square {n}", params={"n": n, "seconds": SECONDS}).pk
           for n in range(WORKFLOWS)]
    wait_until_status(cluster, ids, "completed", timeout=60)
    elapsed = time.monotonic() - started

    attempts = list(ActivityAttempt.objects.filter(activity__workflow_id__in=ids))
    assert len(attempts) == WORKFLOWS and all(a.status == "succeeded" for a in attempts)
    edges = sorted([(a.started_at, 1) for a in attempts] + [(a.finished_at, -1) for a in attempts],
                   key=lambda e: (e[0], e[1]))
    running, most = 0, 0
    for _, step in edges:
        running += step
        most = max(most, running)
    assert most == CAP, f"{most} attempts of the capped kind ran at once"
    waited = Event.objects.filter(workflow_id__in=ids, kind="activity.waiting_for_slot").count()
    assert waited >= WORKFLOWS - CAP
    waits = sorted(e.data["slot_waited_ms"] / 1000 for e in Event.objects.filter(
        workflow_id__in=ids, kind="activity.started", data__has_key="slot_waited_ms"))
    assert len(waits) == waited
    # Rung as slots free, in turns of SECONDS: never left for the 60 s recheck.
    assert waits[-1] < (WORKFLOWS / CAP) * SECONDS + 10, waits
    assert len({a.worker for a in attempts}) == 2, "both workers took capped work"
    figures("activity concurrency key", cap=CAP, workflows=WORKFLOWS, work_seconds=SECONDS,
            most_at_once=most, waited=waited, longest_wait_s=round(waits[-1], 2), elapsed_s=round(elapsed, 2))
