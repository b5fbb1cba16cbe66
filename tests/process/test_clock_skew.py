"""Workers whose wall clocks are five minutes off (libfaketime): leases and timers keep the database's time.

Durable times come from the PostgreSQL server's clock (workflows/clock.py, docs/architecture.md
"Time"). Beat's sweeps run on whichever worker takes their message, so a sweep may compare a time
written by a skewed worker with an on-time clock: this process plays that on-time host, running
the lease and timer sweeps between its polls while real beat and workers run theirs. It watches
every moment on the server's clock (``statement_timestamp()`` of its own queries), never
through the code under test.
"""
from __future__ import annotations

import re
import signal
import time
from collections.abc import Callable
from datetime import timedelta
from pathlib import Path
from typing import Any, TypeVar

import pytest
from django.conf import settings

from examples.reminder.activities import send_reminder
from examples.reminder.definition import Reminder
from tests.conftest import make_git_repo
from tests.process.faketime import faketime_env
from tests.process.harness import (
    BEAT_INTERVAL_SECONDS,
    Cluster,
    Proc,
    assert_event_seqs_contiguous,
    event_count,
    launch_release,
)
from tests.workflows.test_clock import server_now
from workflows import registry, services
from workflows.models import ActivityAttempt, Timer, Wait, Workflow
from workflows.testing import registered

pytestmark = [pytest.mark.process, pytest.mark.django_db(transaction=True)]

SKEW_SECONDS = 300
TIMER_SECONDS = 10.0
# How far this process's view of a moment may trail it: one poll (0.05 s), a sweep and a query.
POLL_SLACK_SECONDS = 1.0
MODULES = ",".join([*settings.AGENTOPS_AGENT_MODULES, "examples.reminder"])
CELERY_READY_LINE = re.compile(r"^\[(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d),(\d{3}): INFO/MainProcess\] .* ready\.$", re.M)

T = TypeVar("T")


def start_skewed_worker(cluster: Cluster, name: str, offset_seconds: int) -> Proc:
    """A worker whose wall clock (and its pool's, and its commands') is ``offset_seconds`` off."""
    skew = faketime_env(offset_seconds)
    saved = dict(cluster.extra_env)
    cluster.extra_env.update(skew)
    try:
        return cluster.start_worker(name, ready=False)
    finally:
        cluster.extra_env.clear()
        cluster.extra_env.update(saved)


def wall_clock_offset(cluster: Cluster, worker: Proc) -> float:
    """Seconds by which the worker's wall clock differs from this process's: the time Celery
    stamped on its "ready." line against when this process saw the line (polled every 0.2 s)."""
    cluster.wait_ready(worker)
    seen = time.time()
    match = CELERY_READY_LINE.search(worker.log())
    assert match, worker.log_tail()
    stamped = time.mktime(time.strptime(match.group(1), "%Y-%m-%d %H:%M:%S")) + int(match.group(2)) / 1000
    return stamped - seen


def sweeping(cluster: Cluster, predicate: Callable[[], T], *, timeout: float, what: str) -> T:
    """Wait for ``predicate``, running the lease and timer sweeps here, on time, before each poll."""
    def swept() -> T:
        services.leases_reap_expired()
        services.timers_fire_due()
        return predicate()

    return cluster.wait_for(swept, timeout=timeout, what=what, interval=0.05)


def reached(cluster: Cluster, wf: int, status: str, node: str | None = None) -> Callable[[], bool]:
    def check() -> bool:
        row = Workflow.objects.get(pk=wf)
        if row.status in Workflow.TERMINAL and row.status != status:
            raise AssertionError(f"workflow {wf} ended {row.status}: {row.reason}\n{cluster.dump()}")
        return row.status == status and (node is None or row.current_node == node)
    return check


def slow_repo(tmp_path: Path) -> Path:
    """A repository whose test command sleeps 6 s on its first run: run_tests outlives many sweeps."""
    marker = str(tmp_path / "first-test-run.marker")
    script = (f"import os, time\nif not os.path.exists({marker!r}):\n    open({marker!r}, 'w').close()\n"
              "    time.sleep(6)\nprint('tests pass')\n")
    return make_git_repo(tmp_path / "slow-repo", test_script=script)


def watch_payment_window(cluster: Cluster) -> dict[str, Any]:
    """Launch a reminder whose payment window is TIMER_SECONDS long; watch its timer open and fire."""
    with registered(Reminder, send_reminder):
        launched = server_now()
        wf = services.workflow_launch(kind="reminder", goal="Collect INV-skew", params={
            "invoice": "INV-skew", "email": "ap@example.com", "max_reminders": 1,
            "days_between": TIMER_SECONDS / 86400}).pk
        timer = sweeping(cluster, lambda: Timer.objects.filter(workflow_id=wf).first(), timeout=60,
                         what="the payment window's timer to open")
        opened_seen = server_now()
        fired_seen = sweeping(
            cluster, lambda: Timer.objects.filter(pk=timer.pk, status=Timer.Status.FIRED).exists() and server_now(),
            timeout=TIMER_SECONDS + 30, what="the payment window's timer to fire")
        # Unpaid after its one reminder: the expired window fails the workflow.
        sweeping(cluster, reached(cluster, wf, "failed"), timeout=30, what=f"reminder {wf} to fail")
    timer.refresh_from_db()
    return {"workflow": wf, "timer": timer, "launched": launched, "opened_seen": opened_seen,
            "fired_seen": fired_seen}


def assert_timer_on_time(seen: dict[str, Any]) -> tuple[float, float]:
    """fire_at is TIMER_SECONDS after the wait opened on the server's clock, and the timer fired
    neither before fire_at nor later than a beat interval (plus slack) after it."""
    timer: Timer = seen["timer"]
    window = timedelta(seconds=TIMER_SECONDS)
    assert seen["launched"] + window <= timer.fire_at <= seen["opened_seen"] + window, seen
    open_s = (seen["fired_seen"] - seen["opened_seen"]).total_seconds()
    late_s = (seen["fired_seen"] - timer.fire_at).total_seconds()
    assert open_s >= TIMER_SECONDS - POLL_SLACK_SECONDS, f"fired early: open for {open_s:.2f} s, {seen}"
    assert timer.fired_at is not None and timer.fired_at >= timer.fire_at, seen
    assert 0 <= late_s <= BEAT_INTERVAL_SECONDS + POLL_SLACK_SECONDS, f"fired {late_s:.2f} s after fire_at, {seen}"
    return open_s, late_s


def test_a_worker_five_minutes_behind_keeps_its_lease_and_its_timers_fire_on_time(
    cluster: Cluster, tmp_path: Path, requester: Any, figures: Any,
) -> None:
    """A worker whose clock is 300 s behind runs a 6 s activity under its 30 s lease while
    on-time sweeps run, and is not reaped; the timer it opens fires after its full window."""
    cluster.extra_env["AGENTOPS_AGENT_MODULES"] = MODULES
    worker = start_skewed_worker(cluster, "behind", -SKEW_SECONDS)
    beat = cluster.start_beat("beat", ready=False)
    offset = wall_clock_offset(cluster, worker)
    cluster.wait_ready(beat)
    assert abs(offset + SKEW_SECONDS) < 5, f"the worker's clock is {offset:+.1f} s off, not -{SKEW_SECONDS} s"

    launched = server_now()
    wf = launch_release(slow_repo(tmp_path), requester, "Ship while the worker's clock is behind")
    sweeping(cluster, reached(cluster, wf, "waiting", "WAIT_FOR_APPROVAL"), timeout=90,
             what=f"workflow {wf} to wait for approval")
    waiting_seen = server_now()

    attempts = ActivityAttempt.objects.filter(activity__workflow_id=wf)
    assert {(a.number, a.status) for a in attempts} == {(1, "succeeded")}, list(attempts.values())
    assert event_count("activity.lease_expired", workflow_id=wf) == 0
    run_tests = attempts.get(activity__name="run_tests")
    assert run_tests.finished_at is not None
    ran_s = (run_tests.finished_at - run_tests.started_at).total_seconds()
    assert ran_s >= 6, f"run_tests ran {ran_s:.2f} s: too short to span the sweeps"
    # The approval's expiry was computed by the skewed worker, on the server's clock.
    approval = Wait.objects.get(workflow_id=wf, kind="approval")
    expiry = timedelta(hours=Workflow.objects.get(pk=wf).params["approval_expiry_hours"])
    assert approval.expires_at is not None
    assert launched + expiry <= approval.expires_at <= waiting_seen + expiry, (launched, approval.expires_at)
    assert_event_seqs_contiguous([wf])

    open_s, late_s = assert_timer_on_time(watch_payment_window(cluster))
    figures("worker clock 300 s behind", worker_offset_s=f"{offset:+.1f}", run_tests_s=f"{ran_s:.2f}",
            run_tests_lease_s=registry.activity_type("run_tests").lease_seconds, leases_expired=0,
            timer_window_s=TIMER_SECONDS, timer_open_s=f"{open_s:.2f}", fired_after_fire_at_s=f"{late_s:.2f}")


def test_a_worker_five_minutes_ahead_is_taken_over_when_its_lease_runs_out_and_its_timers_fire_on_time(
    cluster: Cluster, tmp_path: Path, requester: Any, figures: Any,
) -> None:
    """The timer a worker 300 s ahead opens fires after its window, not five minutes later;
    killed mid-activity, its lease runs out on the server's clock and an on-time worker takes
    the activity over within the lease, not five minutes later.

    Beat starts only after the timer fired: until then the sweeps are this process's alone, so
    the worker that is ahead never judges its own times against its own clock."""
    cluster.extra_env["AGENTOPS_AGENT_MODULES"] = MODULES
    ahead = start_skewed_worker(cluster, "ahead", SKEW_SECONDS)
    offset = wall_clock_offset(cluster, ahead)
    assert abs(offset - SKEW_SECONDS) < 5, f"the worker's clock is {offset:+.1f} s off, not +{SKEW_SECONDS} s"

    open_s, late_s = assert_timer_on_time(watch_payment_window(cluster))

    wf = launch_release(slow_repo(tmp_path), requester, "Ship while the worker's clock is ahead")
    sweeping(cluster, lambda: ahead.descendant_running("check.py"), timeout=60,
             what="the test command to run under the worker that is ahead")
    on_time = cluster.start_worker("ontime", ready=False)  # boots while the lease runs out
    beat = cluster.start_beat("beat", ready=False)
    killed = server_now()
    ahead.kill_group(signal.SIGKILL)
    cluster.wait_ready(on_time)
    cluster.wait_ready(beat)
    lease = registry.activity_type("run_tests").lease_seconds
    assert lease is not None
    sweeping(cluster, reached(cluster, wf, "waiting", "WAIT_FOR_APPROVAL"), timeout=lease + 40,
             what=f"workflow {wf} to wait for approval after the takeover")

    attempts = list(ActivityAttempt.objects.filter(activity__workflow_id=wf, activity__name="run_tests")
                    .order_by("number"))
    assert [(a.number, a.status) for a in attempts] == [(1, "lost"), (2, "succeeded")]
    assert attempts[0].worker.startswith("ahead@") and attempts[1].worker.startswith("ontime@"), attempts
    # Attempt 1's lease ran out on the server's clock: within one lease of the kill, not 300 s later.
    takeover_s = (attempts[1].started_at - killed).total_seconds()
    assert takeover_s <= lease + BEAT_INTERVAL_SECONDS + 5.0, takeover_s
    assert event_count("activity.lease_expired", workflow_id=wf) == 1
    assert_event_seqs_contiguous([wf])
    figures("worker clock 300 s ahead", worker_offset_s=f"{offset:+.1f}", timer_window_s=TIMER_SECONDS,
            timer_open_s=f"{open_s:.2f}", fired_after_fire_at_s=f"{late_s:.2f}", run_tests_lease_s=lease,
            takeover_after_kill_s=f"{takeover_s:.2f}")
