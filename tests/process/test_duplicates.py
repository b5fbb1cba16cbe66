"""Duplicates on purpose (reliability.md 6.12, 6.14): two beats, and the same doorbell rung several times."""
from __future__ import annotations

import re
from datetime import timedelta

import psycopg
import pytest
from django.conf import settings
from django.db import connection
from django.utils import timezone
from django_celery_beat.models import PeriodicTask

from agentops.celery import app
from agentops.deploytarget.server import Fault
from tests.process.harness import (
    approve,
    assert_event_seqs_contiguous,
    assert_one_effect_per_key,
    event_count,
    launch_release,
    subprocess_database_url,
    wait_until_status,
)
from workflows.models import Activity, Timer, Wait, Workflow

pytestmark = [pytest.mark.process, pytest.mark.django_db(transaction=True)]

FIRE_TIMERS_RESULT = re.compile(r"Task agentops\.beat\.fire_timers\[[0-9a-f-]+\] succeeded in [\d.]+s: (\d+)")


def test_two_beats_fire_each_due_timer_exactly_once(cluster, git_repo, deploy_target, requester, figures):
    """Two beat processes sweep the same timers: ten approval expiries due at the same moment each
    fire once, and each workflow fails once."""
    *workers, first = cluster.start(workers=("wa", "wb"), beats=("beat1",))
    # The second beat starts once the first has written the schedule rows both share.
    expected = {entry["task"] for entry in settings.CELERY_BEAT_SCHEDULE.values()}
    cluster.wait_for(lambda: set(PeriodicTask.objects.values_list("task", flat=True)) >= expected,
                     timeout=10, what="the beat schedule in the database")
    second = cluster.start_beat("beat2", ready=False)
    ids = [launch_release(git_repo, requester, f"Ship release notes {n}") for n in range(10)]
    wait_until_status(cluster, ids, "waiting", node="WAIT_FOR_APPROVAL", timeout=120)
    cluster.wait_ready(second)

    beat_marks = {b.name: len(b.log()) for b in (first, second)}
    worker_marks = {w.name: len(w.log()) for w in workers}
    # Hold the ten workflow rows while the timers come due, so that a sweep from each worker
    # stops on the same rows and both then race over the same ten timers.
    holder = psycopg.connect(subprocess_database_url())
    try:
        holder.execute(f"SELECT id FROM {Workflow._meta.db_table} WHERE id = ANY(%s) FOR UPDATE", [ids])
        past = timezone.now() - timedelta(seconds=1)
        assert Timer.objects.filter(workflow_id__in=ids, purpose="expire", status="pending").update(
            fire_at=past) == 10
        Wait.objects.filter(workflow_id__in=ids, kind="approval", status="open").update(expires_at=past)
        blocked = cluster.wait_for(lambda: _backends_waiting_on_locks(at_least=2), timeout=20,
                                   what="a timer sweep on each worker to wait for the workflow rows")
    finally:
        holder.close()  # rolls back: the sweeps go on together
    wait_until_status(cluster, ids, "failed", timeout=60)

    # Both beats sweep the same timers: each sends fire_timers after the timers came due. The sweeps
    # queued before may fire them all within a second, before either beat's next tick, so wait for the
    # ticks; what they send must fire nothing a second time.
    def sends() -> dict[str, int]:
        return {b.name: b.log()[beat_marks[b.name]:].count("Sending due task fire_timers") for b in (first, second)}
    cluster.wait_for(lambda: all(n >= 1 for n in sends().values()), timeout=20,
                     what="each beat to send fire_timers while the timers were due")

    for pk in ids:
        assert event_count("timer.fired", workflow_id=pk) == 1, pk
        assert event_count("workflow.failed", workflow_id=pk) == 1, pk
        assert "expired" in Workflow.objects.get(pk=pk).reason
    assert Timer.objects.filter(workflow_id__in=ids, status="fired").count() == 10
    assert_event_seqs_contiguous(ids)
    fired_per_worker = {w.name: [int(n) for n in FIRE_TIMERS_RESULT.findall(w.log()[worker_marks[w.name]:])]
                        for w in workers}
    assert sum(sum(runs) for runs in fired_per_worker.values()) == 10, fired_per_worker
    figures("6.12 two beats", timers=10, beats=2, fire_timers_sent_per_beat=sends(), sweeps_blocked_together=blocked,
            timers_fired_per_sweep=fired_per_worker, fires_per_timer_max=1, workflows_failed_once=10)


def test_duplicate_doorbells_are_ignored_and_deploy_once(
    cluster, git_repo, deploy_target, approver, requester, figures,
):
    """The same `agentops.activity.run` doorbell rung three more times while the deploy runs, and again
    after the workflow completed, plus duplicate advances: every duplicate is ignored, one deployment."""
    *workers, _ = cluster.start(workers=("wa", "wb"), beats=("beat",))
    wf = launch_release(git_repo, requester, "Ship the release notes")
    wait_until_status(cluster, [wf], "waiting", node="WAIT_FOR_APPROVAL", timeout=60)
    # The deploy request takes 1.5 s (well under the 4 s lease), so the duplicates meet a running attempt.
    deploy_target.store.set_fault(Fault.build("slow", count=1, seconds=1.5))
    approve(wf, approver)
    deploy = cluster.wait_for(lambda: Activity.objects.filter(workflow_id=wf, name="deploy").first(), timeout=30,
                              what="the deploy activity to be scheduled")

    def ring() -> list[str]:
        ids = [app.send_task("agentops.activity.run", kwargs={"activity_id": deploy.pk}).id for _ in range(3)]
        return ids + [app.send_task("agentops.workflow.advance", kwargs={"workflow_id": wf}).id]

    during = ring()
    wait_until_status(cluster, [wf], "completed", timeout=60)
    ignored_during = event_count("activity.doorbell_ignored", data__operation_id=deploy.operation_id)
    assert ignored_during >= 3, ignored_during
    deploy.refresh_from_db()
    assert (deploy.status, deploy.attempt, deploy.attempts.count()) == ("succeeded", 1, 1)

    before = Workflow.objects.values("status", "updated_at", "state", "result").get(pk=wf)
    after = ring()
    cluster.wait_for(lambda: event_count("activity.doorbell_ignored", data__operation_id=deploy.operation_id)
                     == ignored_during + 3, timeout=20, what="the three late duplicates to be ignored")
    def all_consumed() -> dict[str, str] | None:
        found = _task_outcomes(workers, during + after)
        return found if len(found) == 8 else None

    outcomes = cluster.wait_for(all_consumed, timeout=10, what="the workers to report all eight duplicate messages")
    assert [outcomes[t] for t in after] == ["'skipped'"] * 3 + ["'not_runnable'"], outcomes
    assert Workflow.objects.values("status", "updated_at", "state", "result").get(pk=wf) == before
    assert event_count("workflow.completed", workflow_id=wf) == 1
    assert_one_effect_per_key(deploy_target, {deploy.sent_key})
    assert_event_seqs_contiguous([wf])
    figures("6.14 forced duplicates", duplicate_messages_published=len(during) + len(after),
            duplicate_deliveries_seen=ignored_during + 3, doorbell_ignored_while_running=ignored_during,
            outcomes_during=[outcomes[t] for t in during], deploy_attempts=1, deploy_effects=1,
            duplicate_effects=0)


def _task_outcomes(workers, task_ids: list[str]) -> dict[str, str]:
    """Task id -> returned value, from the workers' `Task …[id] succeeded in …s: value` lines."""
    found = {}
    text = "\n".join(w.log() for w in workers)
    for task_id in task_ids:
        match = re.search(rf"\[{task_id}\] succeeded in [\d.]+s: (\S+)", text)
        if match:
            found[task_id] = match.group(1)
    return found


def _backends_waiting_on_locks(*, at_least: int) -> int:
    """How many other sessions on the test database wait for a lock; 0 while fewer than ``at_least``."""
    with connection.cursor() as cursor:
        cursor.execute("SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() "
                       "AND wait_event_type = 'Lock' AND pid <> pg_backend_pid()")
        waiting = cursor.fetchone()[0]
    return waiting if waiting >= at_least else 0
