"""The process's heartbeat thread (``workflows.heartbeats``): every block in ``keep_alive`` is beaten
a third of its lease after the last beat, by one thread however many blocks are open, and no more
once its block ends or a beat finds the lease lost."""
from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from contextlib import ExitStack
from typing import Any

import pytest

from tests.conftest import release_params
from workflows import heartbeats, services
from workflows.activity_context import ActivityContext
from workflows.heartbeats import keep_alive
from workflows.leases import Claim, LeaseLost
from workflows.models import Activity
from workflows.services.activities import DatabaseLease
from workflows.testing import FakeLease

INTERVAL = 0.1


@pytest.fixture(autouse=True)
def short_beats(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    monkeypatch.setattr(heartbeats, "heartbeat_interval_seconds", lambda ctx: INTERVAL)
    yield
    # A heartbeat thread ends when the turn of its last ended block comes up (up to an interval
    # later): a test that counts threads starts with none left by the one before.
    deadline = time.monotonic() + 10.0
    while heartbeat_threads() and time.monotonic() < deadline:
        time.sleep(0.05)


def context(lease: Any, operation_id: str = "wf-1/N.1/i1/0") -> ActivityContext:
    claim = Claim(activity_id=1, workflow_id=1, operation_id=operation_id, name="not_registered", attempt=1,
                  lease_token="t", input={}, previous_attempt_lost=False)
    return ActivityContext(claim=claim, lease=lease)


def heartbeat_threads() -> int:
    return sum(t.name == "agentops-heartbeats" for t in threading.enumerate())


class Lease(FakeLease):
    """A FakeLease whose beats can fail, be slow, or find the lease lost after ``lost_after`` beats."""

    def __init__(self, *, lost_after: int | None = None, fail_first: int = 0, slow: float = 0.0) -> None:
        super().__init__()
        self.lost_after, self.fail_first, self.slow = lost_after, fail_first, slow
        self.calls = 0
        self.beat_ended_at = 0.0

    def heartbeat(self, claim: Claim, detail: str) -> bool:
        self.calls += 1
        time.sleep(self.slow)
        self.beat_ended_at = time.monotonic()
        if self.calls <= self.fail_first:
            raise RuntimeError("the database went away")
        if self.lost_after is not None and self.calls > self.lost_after:
            return False
        return super().heartbeat(claim, detail)


def test_a_block_is_beaten_while_it_runs_and_not_after():
    lease = Lease()
    with keep_alive(context(lease), "waiting for model call 1") as beat:
        time.sleep(INTERVAL * 5.5)
    after_block = len(lease.heartbeats)
    time.sleep(INTERVAL * 4)

    assert 4 <= after_block <= 6, lease.heartbeats
    assert set(lease.heartbeats) == {"waiting for model call 1"}
    assert len(lease.heartbeats) == after_block, "an ended block is beaten no more"
    beat.raise_if_lost()  # nothing lost: no error


def test_a_beat_that_finds_the_lease_lost_is_the_blocks_last_and_the_caller_raises():
    lease = Lease(lost_after=1)
    with keep_alive(context(lease), "tool write_file") as beat:
        time.sleep(INTERVAL * 6)

    assert lease.calls == 2, "beaten once, then once more finding the lease lost, then never again"
    assert isinstance(beat.lost, LeaseLost)
    with pytest.raises(LeaseLost):
        beat.raise_if_lost()


def test_a_failed_beat_is_logged_and_the_block_beaten_again_at_its_next_turn(caplog: pytest.LogCaptureFixture):
    lease = Lease(fail_first=1)
    with keep_alive(context(lease), "checks"):
        time.sleep(INTERVAL * 3.5)

    assert lease.calls >= 2 and lease.heartbeats, "the beat after the failure went through"
    assert any(r.message == "activity.heartbeat.failed" for r in caplog.records)


def test_a_thousand_open_blocks_are_beaten_by_one_thread_when_beats_are_quick(monkeypatch: pytest.MonkeyPatch):
    # One beat per block every 3 s (a model call's is every 6.7 s): at the other tests' 0.1 s, a
    # thousand blocks are 10,000 beats a second, which a loaded test machine cannot keep up with;
    # and entering the thousand blocks may itself take over a second there (CI, three lanes on two
    # cores): the first beats must not fall due while the last blocks are entered.
    monkeypatch.setattr(heartbeats, "heartbeat_interval_seconds", lambda ctx: 3.0)
    leases = [Lease() for _ in range(1000)]
    with ExitStack() as stack:
        for n, lease in enumerate(leases):
            stack.enter_context(keep_alive(context(lease, operation_id=f"wf-{n}/N.1/i1/0"), "waiting"))
        time.sleep(4.0)
        assert heartbeat_threads() == 1
        assert all(lease.heartbeats for lease in leases), "every open block was beaten"


def test_beats_that_fall_behind_are_shared_by_more_threads_up_to_a_bound():
    """A slow database: 120 blocks whose beats take 50 ms each, due every 100 ms, are 6 s of beats
    for one thread. Threads join while a due beat waits over BEHIND_SECONDS (here, up to six would be
    needed), never over BEATERS; every block is still beaten; with nothing left to beat they end."""
    leases = [Lease(slow=0.05) for _ in range(120)]
    counts = []
    with ExitStack() as stack:
        for n, lease in enumerate(leases):
            stack.enter_context(keep_alive(context(lease, operation_id=f"wf-{n}/N.1/i1/0"), "waiting"))
        deadline = time.monotonic() + 10.0
        while time.monotonic() < deadline and (not counts or counts[-1] < heartbeats.BEATERS):
            counts.append(heartbeat_threads())
            time.sleep(0.05)
        for _ in range(40):
            counts.append(heartbeat_threads())
            time.sleep(0.05)
        beaten = [len(lease.heartbeats) for lease in leases]
    time.sleep(INTERVAL * 3)

    assert counts[0] == 1 and max(counts) == heartbeats.BEATERS, counts
    assert min(beaten) >= 1, beaten
    assert heartbeat_threads() == 0, "threads with nothing to beat end"


def test_leaving_a_block_waits_for_its_beat_in_progress():
    """A beat in progress when its block ends finishes before the caller goes on (it writes the
    activity row the caller is about to record its result on)."""
    lease = Lease(slow=INTERVAL * 3)
    with keep_alive(context(lease), "waiting"):
        time.sleep(INTERVAL * 1.5)  # the first beat started at INTERVAL and takes 3 × INTERVAL
    beat_ended_at, left_at = lease.beat_ended_at, time.monotonic()

    assert lease.calls == 1
    assert 0 < beat_ended_at <= left_at, "the block was left once its beat had ended"


def test_blocks_opened_after_an_idle_spell_are_beaten_again():
    """With nothing left to beat the thread ends (holding no connection); a new block starts one."""
    first = Lease()
    with keep_alive(context(first), "first"):
        time.sleep(INTERVAL * 1.5)
    time.sleep(INTERVAL * 3)  # its queue entry comes up and is dropped: nothing is left to beat
    assert heartbeat_threads() == 0
    second = Lease()
    with keep_alive(context(second), "second"):
        time.sleep(INTERVAL * 1.5)

    assert first.heartbeats == ["first"] and second.heartbeats == ["second"]


@pytest.mark.django_db(transaction=True)
def test_the_heartbeat_thread_extends_the_lease_in_the_database(git_repo: Any):
    workflow = services.workflow_launch(kind="release", goal="Ship the release notes", params=release_params(git_repo))
    services.workflow_advance_if_runnable(workflow_id=workflow.pk)
    activity = Activity.objects.get(workflow=workflow, name="inspect_repository")
    claim = services.activity_claim_if_runnable(activity_id=activity.pk, worker="w", task_id="t1")
    assert claim is not None
    claimed_expiry = Activity.objects.get(pk=activity.pk).lease_expires_at

    with keep_alive(ActivityContext(claim=claim, lease=DatabaseLease()), "cloning the repository") as beat:
        time.sleep(INTERVAL * 3)
    activity.refresh_from_db()
    assert activity.heartbeat_detail == "cloning the repository"
    assert activity.lease_expires_at > claimed_expiry
    beat.raise_if_lost()

    Activity.objects.filter(pk=activity.pk).update(lease_token="taken-over")  # another attempt holds it now
    with keep_alive(ActivityContext(claim=claim, lease=DatabaseLease()), "still cloning") as beat:
        time.sleep(INTERVAL * 3)
    assert isinstance(beat.lost, LeaseLost), "a beat of the superseded attempt finds its lease lost"
