"""A schedule on real beats: two beats ring its beat entry and both run the
sweep, one of them is killed and started again, and each occurrence launches exactly once."""
from __future__ import annotations

import signal
import time

import pytest
from django_celery_beat.models import PeriodicTask

from tests.conftest import release_params
from workflows import clock
from workflows.features.schedules import services as schedules
from workflows.models import Schedule, ScheduleOccurrence, Workflow

pytestmark = [pytest.mark.process, pytest.mark.django_db(transaction=True)]
EVERY = 10  # seconds: MIN_EVERY_SECONDS


def test_two_beats_and_a_restart_launch_each_occurrence_once(cluster, git_repo, requester, figures):
    worker, first = cluster.start(workers=("w",), beats=("beat1",))
    schedule = schedules.schedule_add(name="ten-seconds", kind="release", goal="Publish the notes on schedule",
                                      params=release_params(git_repo), every=f"{EVERY}s", overlap="allow_all",
                                      user=requester)
    entry = f"agentops schedule {schedule.name}"
    cluster.wait_for(lambda: PeriodicTask.objects.filter(name=entry).exists(), timeout=5, what="the beat entry")
    second = cluster.start_beat("beat2")
    cluster.wait_for(lambda: ScheduleOccurrence.objects.filter(schedule=schedule).count() >= 2, timeout=60,
                     what="two occurrences")
    first.popen.send_signal(signal.SIGKILL)  # a beat that dies, and is started again
    first.popen.wait(10)
    restarted = cluster.start_beat("beat1-again")
    cluster.wait_for(lambda: ScheduleOccurrence.objects.filter(schedule=schedule).count() >= 5, timeout=90,
                     what="five occurrences")
    schedules.schedule_pause(name=schedule.name)
    time.sleep(2)  # a fire already sent finds the schedule paused

    rows = list(ScheduleOccurrence.objects.filter(schedule=schedule).order_by("at"))
    seconds = [(r.at - schedule.anchor_at).total_seconds() for r in rows]
    assert seconds == [EVERY * n for n in range(1, len(rows) + 1)], seconds  # every occurrence, none twice
    assert {r.outcome for r in rows} == {"launched"}
    launched = Workflow.objects.filter(kind="release", intents__goal="Publish the notes on schedule")
    assert launched.count() == len(rows) == len({r.workflow_id for r in rows})
    assert set(launched.values_list("launched_by__username", flat=True)) == {requester.username}
    lateness = [(r.recorded_at - r.at).total_seconds() for r in rows]
    assert max(lateness) < EVERY, lateness  # a beat rang it, or the sweep found it, within a beat tick or two
    sends = {b.name: b.log().count(f"Sending due task {entry}") for b in (first, second, restarted)}
    assert sum(sends.values()) >= len(rows) and sends[second.name] >= 1, sends
    schedule.refresh_from_db()
    assert schedule.paused and schedule.handled_until >= rows[-1].at
    figures("schedules, two beats and a restart", occurrences=len(rows), launches=launched.count(),
            beat_sends=sends, max_lateness_s=round(max(lateness), 2), at=clock.now().isoformat()[:19])
    assert Schedule.objects.count() == 1 and worker.alive()
