"""On a threads-pool worker, one task follows its workflow's model calls (AGENTOPS_IO_ACTIVITY_CHAIN_SECONDS).

Real workers and beat, the real SDK, the fake Messages API on loopback answering every call after
SLOW_SECONDS, longer than the default queue's one-second chain window. Every model-calling
activity of an agent (plan, task, verdict) runs under the task that ran its plan: the next one
is claimed in the transaction that records the one before, with no doorbell; the worker that
starts them is the threads worker's own. A warm shutdown (SIGTERM) lets the running activity
finish and starts no chain: the next activity goes to the broker, and another worker runs it.
"""
from __future__ import annotations

import signal
from typing import Any

import pytest
from django.conf import settings

from tests.fakes import anthropic_api as fake
from tests.fakes.anthropic_api import Answer, FakeAnthropicAPI
from tests.fakes.claude_agent import TASKS, ClaudeForAutonomous, structured, task_of, tool_results
from tests.process.harness import assert_event_seqs_contiguous, wait_until_status
from workflows import services
from workflows.models import Activity, ActivityAttempt, Event

pytestmark = [pytest.mark.process, pytest.mark.django_db(transaction=True)]

AGENTS = 3
SLOW_SECONDS = 1.5


class SlowAgent(ClaudeForAutonomous):
    """One task per agent (write a note, then report), every answer after SLOW_SECONDS; the plan's
    after ``plan_seconds``."""

    def __init__(self, *, plan_seconds: float = SLOW_SECONDS) -> None:
        super().__init__()
        self.plan_seconds = plan_seconds

    def __call__(self, body: dict[str, Any]) -> Answer:
        planning = task_of(body) == "plan_tasks"
        answer = structured(body, {"tasks": TASKS[:1]}, preamble="Here is the plan:") if planning else super().__call__(
            body)
        answer.delay_seconds = self.plan_seconds if planning else SLOW_SECONDS
        return answer

    def work(self, body: dict[str, Any]) -> Answer:
        if tool_results(body) == 0:
            return fake.tool_use("write_file", {"path": "notes/note.md", "content": "a note\n"}, say="Writing.")
        return fake.text("Wrote notes/note.md.")


def start(cluster: Any, claude_api: FakeAnthropicAPI, agents: int, *, plan_seconds: float = SLOW_SECONDS) -> list[int]:
    """Launch ``agents`` slow agents; start a threads worker "io" on the I/O queue, a prefork one and the beat."""
    claude_api.responder = SlowAgent(plan_seconds=plan_seconds)
    cluster.extra_env.update({
        "AGENTOPS_MODEL_PROVIDER": "anthropic", "ANTHROPIC_API_KEY": "sk-ant-test-0000-secret",
        "ANTHROPIC_BASE_URL": claude_api.url, "AGENTOPS_MODEL": "claude-sonnet-5-5",
    })
    ids = [services.workflow_launch(kind="autonomous", goal=f"Write note {n}", params={"max_rounds": 1}).pk
           for n in range(agents)]
    io_worker("io", cluster, ready=False)
    cluster.start_worker("short", queues=(settings.CELERY_TASK_DEFAULT_QUEUE,), ready=False)
    cluster.start_beat(ready=False)
    cluster.wait_ready(*cluster.live())
    return ids


def io_worker(name: str, cluster: Any, *, ready: bool = True) -> Any:
    return cluster.start_worker(name, pool="threads", concurrency=20, queues=(settings.AGENTOPS_IO_QUEUE,),
                                ready=ready, extra_env={"AGENTOPS_DB_POOL_SIZE": "4"})


def test_a_threads_worker_runs_each_agents_model_calls_in_one_task(cluster: Any, claude_api: FakeAnthropicAPI) -> None:
    ids = start(cluster, claude_api, AGENTS)
    wait_until_status(cluster, ids, "completed", timeout=90)

    for workflow_id in ids:
        attempts = list(ActivityAttempt.objects.filter(activity__workflow_id=workflow_id).order_by(
            "started_at").values_list("activity__name", "task_id", "worker"))
        assert [name for name, _, _ in attempts] == ["plan_tasks", "execute_task", "verify_goal"], attempts
        assert len({task_id for _, task_id, _ in attempts}) == 1, attempts
        assert all(worker.startswith("io@") for _, _, worker in attempts), attempts
        # Each call took longer than the default queue's window: only the I/O window chained them.
        calls = Event.objects.filter(workflow_id=workflow_id, kind="model.called")
        assert calls.count() == 4 and all(c.data["latency_ms"] >= SLOW_SECONDS * 1000 for c in calls)
    assert settings.AGENTOPS_ACTIVITY_CHAIN_SECONDS < SLOW_SECONDS
    assert_event_seqs_contiguous(ids)


def test_a_warm_shutdown_finishes_the_running_activity_and_hands_the_next_to_the_broker(
        cluster: Any, claude_api: FakeAnthropicAPI) -> None:
    # The plan's answer takes long enough for the SIGTERM to arrive while it is awaited, however
    # slowly a loaded machine notices the plan running and delivers the signal.
    [workflow_id] = start(cluster, claude_api, 1, plan_seconds=8.0)
    io = next(p for p in cluster.live() if p.name == "io")
    cluster.wait_for(lambda: Activity.objects.filter(workflow_id=workflow_id, name="plan_tasks",
                                                     status="running").exists(), timeout=30, what="the plan running")
    assert io.kill_group(signal.SIGTERM, timeout=30) == 0  # warm: it waited for the plan's answer
    io_worker("io2", cluster)
    wait_until_status(cluster, [workflow_id], "completed", timeout=90)

    attempts = list(ActivityAttempt.objects.filter(activity__workflow_id=workflow_id).order_by(
        "started_at").values_list("activity__name", "number", "status", "worker", "task_id"))
    assert [(name, number, status) for name, number, status, _, _ in attempts] == [
        ("plan_tasks", 1, "succeeded"), ("execute_task", 1, "succeeded"), ("verify_goal", 1, "succeeded")], attempts
    (_, _, _, plan_worker, plan_task), (_, _, _, task_worker, task_task) = attempts[:2]
    assert plan_worker.startswith("io@") and task_worker.startswith("io2@"), attempts
    assert plan_task != task_task  # the task was rung, not chained
    assert not Event.objects.filter(workflow_id=workflow_id, kind="activity.lease_expired").exists()
