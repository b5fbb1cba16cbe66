"""Chained activities: a worker that records a result runs the workflow's next activity itself,
claimed in the same transaction, within AGENTOPS_ACTIVITY_CHAIN_SECONDS; a crash in between
leaves a lease for the sweep, never a lost or repeated step."""
from __future__ import annotations

import os
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from datetime import timedelta
from types import SimpleNamespace
from typing import Any

import pytest

from tests.conftest import drive
from workflows import clock, engine, services
from workflows.activity_context import ActivityContext
from workflows.errors import Retryable
from workflows.models import Activity, ActivityAttempt, Event, Workflow
from workflows.registry import activity
from workflows.services import RunOutcome
from workflows.services.activities import activity_claim_if_runnable
from workflows.services.steps import ChainSlot
from workflows.testing import registered

CHAIN_KIND = "test-chain"
STEP = "test_chain_step"


@activity(STEP)
def chain_step(ctx: ActivityContext, input: dict[str, Any]) -> dict[str, Any]:
    time.sleep(input["sleep"])
    if input["fail_first"] and ctx.attempt == 1:
        raise Retryable("first attempt fails")
    return {"i": input["i"]}


# One node that asks for ``steps`` activities in turn; each may sleep or fail its first attempt.
class Chain(engine.WorkflowDefinition):
    kind = CHAIN_KIND
    start_node = "STEPS"
    revalidate_node = "STEPS"

    def validate_params(self, params: dict[str, Any]) -> dict[str, Any]:
        return params

    @engine.node("STEPS")
    def steps(self, ctx: engine.NodeContext) -> engine.Decision:
        params = ctx.params
        outputs = [ctx.activity(chain_step, {"i": i, "sleep": params.get("sleep", 0),
                                             "fail_first": params.get("fail_at") == i})
                   for i in range(params["steps"])]
        return engine.Goto("DONE", {"outputs": outputs})

    @engine.node("DONE")
    def done(self, ctx: engine.NodeContext) -> engine.Decision:
        return engine.Complete()


@pytest.fixture(autouse=True)
def chain_registered() -> Iterator[None]:
    with registered(Chain, chain_step):
        yield


pytestmark = pytest.mark.usefixtures("rung")


def launched(**params: Any) -> tuple[Workflow, Activity]:
    workflow = services.workflow_launch(kind=CHAIN_KIND, goal="Count", params=params)
    services.workflow_advance_if_runnable(workflow_id=workflow.pk)
    return workflow, Activity.objects.get(workflow=workflow)


@pytest.mark.django_db(transaction=True)
def test_one_task_runs_every_step_with_one_doorbell(settings: Any, rung: list[tuple[str, int]]) -> None:
    settings.AGENTOPS_ACTIVITY_CHAIN_SECONDS = 60
    workflow, first = launched(steps=5)

    outcome = services.activity_run_if_runnable(activity_id=first.pk, worker="w1", task_id="task-1")

    workflow.refresh_from_db()
    assert (outcome, workflow.status) == (RunOutcome.RECORDED, Workflow.Status.COMPLETED)
    assert workflow.state["outputs"] == [{"i": i} for i in range(5)]
    attempts = ActivityAttempt.objects.filter(activity__workflow=workflow).order_by("activity_id")
    assert [(a.number, a.status, a.worker, a.task_id) for a in attempts] == [
        (1, ActivityAttempt.Status.SUCCEEDED, "w1", "task-1")] * 5
    assert [r for r in rung if r[0] == "activity"] == [("activity", first.pk)]
    kinds = list(Event.objects.filter(workflow=workflow, kind__startswith="activity.").values_list("kind", flat=True))
    assert kinds == ["activity.scheduled", "activity.started", "activity.succeeded"] * 5
    seqs = list(Event.objects.filter(workflow=workflow).order_by("seq").values_list("seq", flat=True))
    assert seqs == list(range(1, len(seqs) + 1))


@pytest.mark.django_db(transaction=True)
def test_the_chain_hands_over_to_the_broker_when_its_time_is_up(settings: Any, rung: list[tuple[str, int]]) -> None:
    settings.AGENTOPS_ACTIVITY_CHAIN_SECONDS = 0.5
    workflow, first = launched(steps=4, sleep=0.3)

    services.activity_run_if_runnable(activity_id=first.pk, worker="w1", task_id="task-1")

    statuses = list(Activity.objects.filter(workflow=workflow).order_by("pk").values_list("status", flat=True))
    # Step 0 ends at 0.3 s (< 0.5: step 1 chained), step 1 at 0.6 s (step 2 gets a doorbell).
    assert statuses == [Activity.Status.SUCCEEDED, Activity.Status.SUCCEEDED, Activity.Status.SCHEDULED]
    third = Activity.objects.filter(workflow=workflow).order_by("pk").last()
    assert third is not None and ("activity", third.pk) in rung


@pytest.mark.django_db(transaction=True)
def test_a_failed_step_ends_the_chain_and_retries_through_the_broker(settings: Any) -> None:
    settings.AGENTOPS_ACTIVITY_CHAIN_SECONDS = 60
    workflow, first = launched(steps=3, fail_at=1)

    outcome = services.activity_run_if_runnable(activity_id=first.pk, worker="w1", task_id="task-1")

    assert outcome == RunOutcome.RETRY_SCHEDULED
    second = Activity.objects.filter(workflow=workflow).order_by("pk")[1]
    assert (second.status, second.attempt) == (Activity.Status.SCHEDULED, 1)
    Activity.objects.filter(pk=second.pk).update(next_attempt_at=clock.now())
    assert drive(workflow.pk).status == Workflow.Status.COMPLETED


@pytest.mark.django_db(transaction=True)
def test_a_worker_that_dies_after_a_chained_claim_leaves_a_lease_for_the_sweep(
    settings: Any, rung: list[tuple[str, int]]
) -> None:
    workflow, first = launched(steps=2)
    claim = activity_claim_if_runnable(activity_id=first.pk, worker="w1", task_id="task-1")
    assert claim is not None
    chain = ChainSlot(worker="w1", task_id="task-1")
    services.activity_result_record_if_current(claim=claim, result={"i": 0}, chain=chain)
    # The process dies here: the next activity is claimed, committed, and never run.
    assert chain.claim is not None
    second = Activity.objects.get(pk=chain.claim.activity_id)
    assert (second.status, second.attempt) == (Activity.Status.RUNNING, 1)
    assert ("activity", second.pk) not in rung
    # A duplicate doorbell for it finds nothing to claim.
    assert services.activity_run_if_runnable(activity_id=second.pk, worker="w2") == RunOutcome.SKIPPED

    Activity.objects.filter(pk=second.pk).update(lease_expires_at=clock.now() - timedelta(seconds=1))
    assert services.leases_reap_expired() == 1
    assert ("activity", second.pk) in rung
    assert services.activity_run_if_runnable(activity_id=second.pk, worker="w2") == RunOutcome.RECORDED

    workflow.refresh_from_db()
    assert workflow.status == Workflow.Status.COMPLETED
    attempts = list(second.attempts.order_by("number").values_list("number", "status", "worker"))
    assert attempts == [(1, ActivityAttempt.Status.LOST, "w1"), (2, ActivityAttempt.Status.SUCCEEDED, "w2")]


WAIT = "test_chain_wait"
MIXED_KIND = "test-chain-mixed"


@activity(WAIT, io_bound=True)
def chain_wait(ctx: ActivityContext, input: dict[str, Any]) -> dict[str, Any]:
    return {"i": input["i"]}


# A short step, two steps that wait (the I/O queue), a short step.
class Mixed(engine.WorkflowDefinition):
    kind = MIXED_KIND
    start_node = "STEPS"
    revalidate_node = "STEPS"

    def validate_params(self, params: dict[str, Any]) -> dict[str, Any]:
        return params

    @engine.node("STEPS")
    def steps(self, ctx: engine.NodeContext) -> engine.Decision:
        for i, step in enumerate((chain_step, chain_wait, chain_wait, chain_step)):
            ctx.activity(step, {"i": i, "sleep": 0, "fail_first": False})
        return engine.Complete()


@pytest.mark.django_db(transaction=True)
def test_the_chain_stays_on_its_queue(settings: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    """A result chains the next activity only when both are on the same queue; the others get a
    doorbell on their own queue: an I/O-bound one on AGENTOPS_IO_QUEUE, a short one on the default."""
    from workflows import doorbells

    settings.AGENTOPS_ACTIVITY_CHAIN_SECONDS = 60
    rung: list[tuple[int, str]] = []
    monkeypatch.setattr(doorbells, "activity_run",
                        lambda *, activity_id, name: rung.append((activity_id, doorbells.activity_queue(name))))
    with registered(Mixed, chain_wait):
        workflow = services.workflow_launch(kind=MIXED_KIND, goal="Mix", params={})
        for expected in range(1, 4):
            activity_id, _ = rung[-1]
            services.activity_run_if_runnable(activity_id=activity_id, worker="w1", task_id=f"task-{expected}")
        workflow.refresh_from_db()

    names = list(Activity.objects.filter(workflow=workflow).order_by("pk").values_list("pk", "name"))
    assert workflow.status == Workflow.Status.COMPLETED
    assert rung == [(names[0][0], settings.CELERY_TASK_DEFAULT_QUEUE), (names[1][0], settings.AGENTOPS_IO_QUEUE),
                    (names[3][0], settings.CELERY_TASK_DEFAULT_QUEUE)]
    workers = list(ActivityAttempt.objects.filter(activity__workflow=workflow).order_by("activity_id").values_list(
        "task_id", flat=True))
    assert workers == ["task-1", "task-2", "task-2", "task-3"]  # the second wait rode on the first's task


def run_mixed(settings: Any, monkeypatch: pytest.MonkeyPatch, *, io_chain_seconds: float | None,
              shutting_down: bool = False) -> list[str]:
    """Run the Mixed workflow with chaining off for the default queue; the task id of each attempt."""
    from workflows import doorbells
    from workflows.services import activities

    settings.AGENTOPS_ACTIVITY_CHAIN_SECONDS = 0
    monkeypatch.setattr(activities, "io_chain_seconds", io_chain_seconds)
    if shutting_down:
        monkeypatch.setattr(activities, "shutting_down", threading.Event())
        activities.shutting_down.set()
    rung: list[int] = []
    monkeypatch.setattr(doorbells, "activity_run", lambda *, activity_id, name: rung.append(activity_id))
    with registered(Mixed, chain_wait):
        workflow = services.workflow_launch(kind=MIXED_KIND, goal="Mix", params={})
        task = 0
        while rung:
            task += 1
            services.activity_run_if_runnable(activity_id=rung.pop(0), worker="w1", task_id=f"task-{task}")
        workflow.refresh_from_db()
    assert workflow.status == Workflow.Status.COMPLETED
    return list(ActivityAttempt.objects.filter(activity__workflow=workflow).order_by("activity_id").values_list(
        "task_id", flat=True))


@pytest.mark.django_db(transaction=True)
def test_on_a_threads_worker_io_bound_steps_chain_for_their_own_window(settings: Any,
                                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    """AGENTOPS_IO_ACTIVITY_CHAIN_SECONDS (set on a threads-pool worker) chains the I/O-bound steps
    when the default queue's window is 0; without it (a prefork worker) each step is a task of its own."""
    assert run_mixed(settings, monkeypatch, io_chain_seconds=60) == ["task-1", "task-2", "task-2", "task-3"]
    assert run_mixed(settings, monkeypatch, io_chain_seconds=None) == ["task-1", "task-2", "task-3", "task-4"]


@pytest.mark.django_db(transaction=True)
def test_a_worker_shutting_down_starts_no_new_chain(settings: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    """A warm shutdown waits for running tasks: each finishes the activity it runs and hands the next to the broker."""
    tasks = run_mixed(settings, monkeypatch, io_chain_seconds=60, shutting_down=True)
    assert tasks == ["task-1", "task-2", "task-3", "task-4"]


def test_a_threads_worker_chains_io_bound_activities_and_a_prefork_one_does_not(
        settings: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    """What the worker's start (``worker_init``) decides from its pool: a threads pool chains
    I/O-bound activities and runs the engine's bookkeeping in a lane of AGENTOPS_IO_ENGINE_THREADS;
    the shutdown signal stops chaining."""
    from celery.concurrency.prefork import TaskPool as PreforkPool

    from agentops.celery import mark_worker_process, stop_chaining
    from workflows import lane
    from workflows.services import activities, common

    monkeypatch.setattr(common, "in_worker", False)
    monkeypatch.setattr(activities, "shutting_down", threading.Event())
    settings.AGENTOPS_IO_ENGINE_THREADS = 3
    try:
        for pool, chain, turns in (("threads", settings.AGENTOPS_IO_ACTIVITY_CHAIN_SECONDS, 3), ("prefork", None, 0),
                                   (PreforkPool, None, 0), ("solo", None, 0)):
            monkeypatch.setattr(activities, "io_chain_seconds", None)
            lane.configure(0)
            mark_worker_process(sender=SimpleNamespace(pool_cls=pool))
            assert (activities.io_chain_seconds, lane.size()) == (chain, turns), pool
    finally:
        lane.configure(0)
    stop_chaining()
    assert activities.shutting_down.is_set()


def test_a_negative_engine_lane_refuses_to_start() -> None:
    env = {**os.environ, "AGENTOPS_IO_ENGINE_THREADS": "-1", "DJANGO_SETTINGS_MODULE": "agentops.settings"}
    done = subprocess.run([sys.executable, "-c", "import django; django.setup()"], env=env, capture_output=True,
                          text=True, timeout=60, check=False)
    assert done.returncode != 0
    assert "AGENTOPS_IO_ENGINE_THREADS=-1 must be 0 (no limit) or more." in done.stderr


@pytest.mark.parametrize("seconds", ["3600", "-1"])
def test_an_io_chain_window_past_the_visibility_timeout_refuses_to_start(seconds: str) -> None:
    """Redis would deliver a chaining task's message again: the settings refuse such a window."""
    env = {**os.environ, "CELERY_BROKER_URL": "redis://127.0.0.1:6379/0", "AGENTOPS_VISIBILITY_TIMEOUT_SECONDS": "3600",
           "AGENTOPS_IO_ACTIVITY_CHAIN_SECONDS": seconds, "DJANGO_SETTINGS_MODULE": "agentops.settings"}
    done = subprocess.run([sys.executable, "-c", "import django; django.setup()"], env=env, capture_output=True,
                          text=True, timeout=60, check=False)
    assert done.returncode != 0
    assert f"AGENTOPS_IO_ACTIVITY_CHAIN_SECONDS={float(seconds):g} must be 0 or more and under" in done.stderr


def test_an_unknown_activity_rings_the_default_queue(settings: Any) -> None:
    """A doorbell for an activity this host does not know goes where its workers report why."""
    from workflows import doorbells

    assert doorbells.activity_queue("no_such_activity") == settings.CELERY_TASK_DEFAULT_QUEUE
