"""Autonomous agents under worker death (reliability.md 6.15): no hoarded work, no lost task list.

Model-calling activities hold 300 s leases, so after a kill these tests confirm the process is
dead and then move ``lease_expires_at`` into the past instead of waiting the lease out (as
test_worker_killed.py's 6.3 does); the beat's reaper then re-drives the attempt as it would later.
"""
from __future__ import annotations

import signal
import statistics
import time
from datetime import timedelta

import psutil
import pytest
from django.utils import timezone

from agentops.celery import app
from tests.process.harness import assert_event_seqs_contiguous, event_count, pool_kills_reported, wait_until_status
from workflows import services
from workflows.models import Activity, ActivityAttempt, Event, UsageEntry, Workflow

pytestmark = [pytest.mark.process, pytest.mark.django_db(transaction=True)]

SCRIPTED_TASKS = ["Write a brief", "Lay out the steps", "Record the outcome"]


@pytest.fixture(autouse=True)
def scripted_provider(monkeypatch):
    """The workers inherit this environment: without an API key they use the offline scripted provider."""
    monkeypatch.delenv("ANTHROPIC_API_KEY", raising=False)


def launch_autonomous(goal: str) -> int:
    return services.workflow_launch(kind="autonomous", goal=goal).pk


def expire_lease_now(operation_id: str, attempt: int) -> None:
    """Stand-in for waiting out a 300 s lease whose holder is confirmed dead."""
    moved = Activity.objects.filter(operation_id=operation_id, status="running", attempt=attempt).update(
        lease_expires_at=timezone.now() - timedelta(seconds=1))
    assert moved == 1, f"{operation_id} attempt {attempt} is not running any more"


def process_gone(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return True


def worker_name(attempt: ActivityAttempt) -> str:
    return attempt.worker.split("@")[0]


def test_short_activities_are_not_stuck_behind_a_long_one_and_survive_its_workers_death(cluster, figures):
    """6.15 with our settings (2 workers `-c 1`, prefetch 1, acks_late): while one worker is held
    by a long activity, short work queued after it all runs on the other worker; then the holder
    is SIGKILLed and nothing is lost: the long activity is re-run and every workflow completes."""
    long_wf = launch_autonomous("A long analysis")
    long_op = f"wf-{long_wf}/PLANNING.1/i1/0"
    hold = {"point": "activity.after_claim", "when": {"operation_id": long_op, "attempt": 1}, "action": "sleep",
            "seconds": 30}
    workers = cluster.start(workers=("wa", "wb"), beats=("beat",), faults=[hold])[:2]

    def long_running() -> ActivityAttempt | None:
        fired = any(f["operation_id"] == long_op for f in cluster.faults_fired())
        return ActivityAttempt.objects.filter(activity__operation_id=long_op, number=1).first() if fired else None

    long_attempt = cluster.wait_for(long_running, timeout=30, what="the long activity to start")
    holder = next(w for w in workers if w.name == worker_name(long_attempt))
    free = next(w for w in workers if w is not holder)
    held_since = time.time()

    short_ids = [launch_autonomous(f"Short errand {n}") for n in range(4)]
    wait_until_status(cluster, short_ids, "completed", timeout=25)
    shorts_done_s = time.time() - held_since
    assert Activity.objects.filter(operation_id=long_op, status="running", attempt=1).exists(), \
        "the long activity finished first: the timing this test relies on did not hold"
    short_attempts = list(ActivityAttempt.objects.filter(activity__workflow_id__in=short_ids)
                          .select_related("activity"))
    assert {worker_name(a) for a in short_attempts} == {free.name}, "the busy worker must not take short work"
    waits = sorted(a.started_at.timestamp() - a.activity.created_at.timestamp() for a in short_attempts)
    # Nothing is reserved behind the running activity on the busy worker (prefetch 1 with acks_late).
    replies = app.control.inspect(destination=[long_attempt.worker.rsplit(":", 1)[0]],
                                  timeout=2.0).reserved() or {}
    reserved_on_holder = sum(len(v) for v in replies.values()) if replies else None
    assert reserved_on_holder in (0, None), replies

    # More work arrives just before the holder dies; then kill the holder's whole process group.
    late_ids = [launch_autonomous(f"Late errand {n}") for n in range(2)]
    killed_at = time.time()
    assert holder.kill_group(signal.SIGKILL) == -signal.SIGKILL and not holder.group_members()
    expire_lease_now(long_op, 1)
    wait_until_status(cluster, [long_wf, *short_ids, *late_ids], "completed", timeout=40)

    attempts = list(ActivityAttempt.objects.filter(activity__operation_id=long_op).order_by("number"))
    assert [(a.number, a.status) for a in attempts] == [(1, "lost"), (2, "succeeded")]
    assert worker_name(attempts[0]) == holder.name and worker_name(attempts[1]) == free.name
    assert [f["operation_id"] for f in cluster.faults_fired()] == [long_op]
    everything = [long_wf, *short_ids, *late_ids]
    assert not Activity.objects.filter(workflow_id__in=everything).exclude(status="succeeded").exists()
    assert_event_seqs_contiguous(everything)
    figures("6.15 prefetch 1 + acks_late", workers=2, concurrency=1, long_activity_hold_s=30,
            short_workflows=len(short_ids), short_activities=len(short_attempts),
            short_done_while_long_held_s=f"{shorts_done_s:.1f}",
            queue_wait_s_p50=f"{statistics.median(waits):.3f}",
            queue_wait_s_p95=f"{waits[max(0, round(0.95 * len(waits)) - 1)]:.3f}",
            queue_wait_s_max=f"{waits[-1]:.3f}", reserved_on_busy_worker=reserved_on_holder,
            late_workflows_after_kill=len(late_ids), lost_after_kill=0,
            long_recovered_s=f"{attempts[1].started_at.timestamp() - killed_at:.2f}")


def test_autonomous_agent_survives_a_sigkill_mid_task_with_its_task_list_intact(cluster, tmp_path, figures):
    """SIGKILL the pool process during the second `execute_task` (before its model call);
    attempt 1 is lost, attempt 2 runs the task, and the workflow completes with the same three
    tasks in order, every call charged once and every task's tool calls in the history."""
    wf = launch_autonomous("Prepare onboarding notes")
    second_task_op = f"wf-{wf}/EXECUTION.3/i1/0"
    kill = {"point": "activity.before_external_call", "when": {"operation_id": second_task_op, "attempt": 1},
            "action": "sigkill_self"}
    cluster.start(workers=("wa", "wb"), beats=("beat",), faults=[kill])

    fired = cluster.wait_for(cluster.faults_fired, timeout=40, what="the second task's attempt to be SIGKILLed")
    assert [(f["operation_id"], f["attempt"], f["action"]) for f in fired] == [(second_task_op, 1, "sigkill_self")]
    cluster.wait_for(lambda: fired[0]["pid"] in pool_kills_reported(cluster), timeout=15,
                     what=f"a worker to report its pool process {fired[0]['pid']} killed")
    assert process_gone(fired[0]["pid"]), f"pool process {fired[0]['pid']} is still alive"
    at_kill = Workflow.objects.get(pk=wf).state["tasks"]
    assert [(t["id"], t["title"], t["status"]) for t in at_kill] == [
        (1, SCRIPTED_TASKS[0], "done"), (2, SCRIPTED_TASKS[1], "pending"), (3, SCRIPTED_TASKS[2], "pending")]
    expire_lease_now(second_task_op, 1)
    wait_until_status(cluster, [wf], "completed", timeout=40)

    workflow = Workflow.objects.get(pk=wf)
    tasks = workflow.state["tasks"]
    assert [(t["id"], t["title"], t["status"]) for t in tasks] == [(n, title, "done") for n, title in
                                                                   enumerate(SCRIPTED_TASKS, start=1)]
    assert [t["instructions"] for t in tasks] == [t["instructions"] for t in at_kill]
    assert workflow.state["round"] == 1 and workflow.state["history"] == []
    assert workflow.result["tasks_done"] == 3 and workflow.result["tasks_skipped"] == 0

    killed = Activity.objects.get(operation_id=second_task_op)
    attempts = list(killed.attempts.order_by("number"))
    assert [(a.number, a.status) for a in attempts] == [(1, "lost"), (2, "succeeded")]
    assert event_count("activity.lease_expired", workflow_id=wf, data__operation_id=second_task_op) == 1
    executes = list(Activity.objects.filter(workflow_id=wf, name="execute_task").order_by("pk"))
    assert [a.input["task"]["title"] for a in executes] == SCRIPTED_TASKS
    assert all(a.status == "succeeded" for a in executes)
    for activity in executes:
        tools = Event.objects.filter(workflow_id=wf, kind="tool.called", data__operation_id=activity.operation_id)
        assert [(e.data["tool"], e.data["attempt"], e.data["ok"]) for e in tools.order_by("seq")] == [
            ("write_file", activity.attempt, True), ("list_files", activity.attempt, True)], activity.operation_id

    # The usage ledger: one row per request, each charged once; the killed attempt made no call.
    entries = list(UsageEntry.objects.filter(workflow_id=wf))
    keys = [e.key for e in entries]
    assert len(keys) == len(set(keys)) == 11, keys  # plan 1 + 3 tasks x 3 turns + verify 1
    assert all(e.status == "charged" and e.cost_usd is not None for e in entries)
    assert sorted(k for k in keys if k.startswith(second_task_op)) == [f"{second_task_op}#{n}@2.0" for n in range(3)]
    notes = sorted(p.name for p in (tmp_path / "workspaces" / f"wf-{wf}" / "notes").iterdir())
    assert notes == ["lay-out-the-steps.md", "record-the-outcome.md", "write-a-brief.md"]
    assert_event_seqs_contiguous([wf])
    figures("autonomous SIGKILL mid-task", faults_injected=1, killed_task=2,
            attempts_of_killed_task=len(attempts), tasks_done=3, tasks_in_order=True,
            usage_entries=len(entries), usage_keys_unique=True, charged_twice=0,
            tool_calls=event_count("tool.called", workflow_id=wf),
            recover_s=f"{attempts[1].started_at.timestamp() - fired[0]['at']:.2f}", lease_moved_to_past=True)


def test_a_task_killed_after_a_checkpoint_resumes_from_it_on_the_other_worker(cluster, figures):
    """Checkpoints at an interval (0 s here: after every turn): SIGKILL the pool process
    before the third model call of the second task; attempt 2 resumes from the saved turn, so the
    task's two tool calls happen once, both in attempt 1."""
    wf = launch_autonomous("Prepare onboarding notes")
    second_task_op = f"wf-{wf}/EXECUTION.3/i1/0"
    kill = {"point": "activity.before_external_call", "when": {"operation_id": second_task_op, "attempt": 1,
                                                                "turn": 2}, "action": "sigkill_self"}
    cluster.start(workers=("wa", "wb"), beats=("beat",), faults=[kill])

    fired = cluster.wait_for(cluster.faults_fired, timeout=40, what="the second task's attempt to be SIGKILLed")
    assert [(f["operation_id"], f["attempt"], f["turn"]) for f in fired] == [(second_task_op, 1, 2)]
    cluster.wait_for(lambda: fired[0]["pid"] in pool_kills_reported(cluster), timeout=15,
                     what=f"a worker to report its pool process {fired[0]['pid']} killed")
    assert process_gone(fired[0]["pid"]), f"pool process {fired[0]['pid']} is still alive"
    saved = Activity.objects.get(operation_id=second_task_op)
    assert saved.checkpoint is not None and saved.checkpoint["turn"] == 2
    expire_lease_now(second_task_op, 1)
    wait_until_status(cluster, [wf], "completed", timeout=40)

    killed = Activity.objects.get(operation_id=second_task_op)
    assert [(a.number, a.status) for a in killed.attempts.order_by("number")] == [(1, "lost"), (2, "succeeded")]
    assert killed.checkpoint is None
    tools = Event.objects.filter(workflow_id=wf, kind="tool.called", data__operation_id=second_task_op)
    assert [(e.data["tool"], e.data["attempt"]) for e in tools.order_by("seq")] == [
        ("write_file", 1), ("list_files", 1)]
    resumed = Event.objects.get(workflow_id=wf, kind="task.resumed")
    assert (resumed.data["operation_id"], resumed.data["attempt"], resumed.data["turn"]) == (second_task_op, 2, 2)
    keys = list(UsageEntry.objects.filter(workflow_id=wf).values_list("key", flat=True))
    assert len(keys) == len(set(keys)) == 11, keys
    assert_event_seqs_contiguous([wf])
    figures("autonomous SIGKILL after a checkpoint", faults_injected=1, resumed_at_turn=2,
            tool_calls_of_killed_task=tools.count(), tool_calls_redone=0, usage_entries=len(keys))
