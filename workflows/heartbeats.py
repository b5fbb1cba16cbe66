"""Heartbeats while an activity waits: ``keep_alive``, and the process's heartbeat thread.

A model call waits seconds for its answer, a tool or a check runs for minutes; meanwhile the
attempt's lease must be extended, or another worker takes the activity over. ``keep_alive(ctx,
detail)`` registers the block with the process's ``Heartbeater``: a daemon thread that beats
every registered lease a third of its activity's lease after the last beat, for as long as its
block runs. A threads worker with a thousand calls in flight has one heartbeat thread, not a
thousand started and joined: entering and leaving a block costs a lock and a heap entry. When
beats fall behind (a slow database), up to ``BEATERS`` threads share them; a thread with nothing
left to beat ends.

Each heartbeat thread beats on its own database connection (with the pool, given back after
each round; without it, closed when the thread ends).
A beat that finds the attempt fenced off (taken over, or its work voided) is the block's last:
``raise_if_lost`` then raises LeaseLost in the caller, which must not go on with effects. Any
other failure of a beat (a database blip) is logged and the block is beaten again at its next
turn: the lease has the slack of two missed beats.
"""
from __future__ import annotations

import heapq
import itertools
import logging
import os
import threading
import time
from typing import TYPE_CHECKING

from django.conf import settings

from workflows.connections import connection_release_while_waiting
from workflows.errors import AgentOpsError
from workflows.leases import LeaseLost

if TYPE_CHECKING:
    from workflows.activity_context import ActivityContext

log = logging.getLogger("agentops.heartbeats")

# How long leaving a block waits for its beat in progress (one short UPDATE) if the database hangs.
BEAT_IN_PROGRESS_WAIT_SECONDS = 5.0
# One thread beats a few hundred blocks in time. When a due beat has waited this long behind the
# others (a slow database, a thousand calls of minutes each), another thread joins, up to BEATERS;
# each takes at most ROUND blocks at once, so they share a backlog.
BEHIND_SECONDS = 1.0
BEATERS = 4
ROUND = 16


def heartbeat_interval_seconds(ctx: ActivityContext) -> float:
    """A third of the activity's lease: two beats may be missed before it runs out."""
    from workflows import registry

    try:
        lease = registry.activity_type(ctx.claim.name).lease_seconds
    except AgentOpsError:  # an activity of a test kit that is not registered
        lease = None
    return max(1.0, (lease or settings.AGENTOPS_LEASE_SECONDS) / 3)


class keep_alive:  # noqa: N801 - used as a context manager, like contextlib's
    """Heartbeat ``ctx``'s lease while the block runs (a model call's wait for its answer, a
    tool, a check), every third of the activity's lease, so a short lease holds through a slow
    answer and only a dead worker lets it run out. ``lost`` is the LeaseLost a beat met, if any;
    ``raise_if_lost`` raises it."""

    def __init__(self, ctx: ActivityContext, detail: str) -> None:
        self.ctx, self.detail = ctx, detail[:200]
        self.lost: LeaseLost | None = None
        self.interval = heartbeat_interval_seconds(ctx)
        self.done = False  # the block ended: beat no more (the heap entry is dropped when it comes up)
        self.idle = threading.Event()  # set unless a heartbeat thread is beating it right now
        self.idle.set()

    def __enter__(self) -> keep_alive:
        connection_release_while_waiting()
        HEARTBEATER.add(self)
        return self

    def __exit__(self, *exc: object) -> None:
        HEARTBEATER.remove(self)

    def raise_if_lost(self) -> None:
        if self.lost is not None:
            raise self.lost


class Heartbeater:
    """The process's heartbeat threads (one, unless beats fall behind) and their queue of blocks,
    earliest beat first."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._changed = threading.Condition(self._lock)
        self._queue: list[tuple[float, int, keep_alive]] = []  # (beat at, monotonic; order; block)
        self._order = itertools.count()
        self._threads: list[threading.Thread] = []

    def add(self, block: keep_alive) -> None:
        with self._lock:
            self._push(block, time.monotonic() + block.interval)
            self._threads = [thread for thread in self._threads if thread.is_alive()]
            if not self._threads:
                self._start()

    def _start(self) -> None:
        thread = threading.Thread(target=self._run, name="agentops-heartbeats", daemon=True)
        self._threads.append(thread)
        thread.start()

    def remove(self, block: keep_alive) -> None:
        with self._lock:
            block.done = True
        # A beat in progress is one short UPDATE; do not wait on it forever if the database hangs.
        block.idle.wait(BEAT_IN_PROGRESS_WAIT_SECONDS)

    def _push(self, block: keep_alive, at: float) -> None:
        earliest = self._queue[0][0] if self._queue else None
        heapq.heappush(self._queue, (at, next(self._order), block))
        if earliest is None or at < earliest:
            self._changed.notify()

    def _due(self) -> list[keep_alive] | None:
        """Wait for the next beat; the blocks due, marked as being beaten. None when no block is left
        (an ended block's entry is dropped when its turn comes): the calling thread then ends, and
        the next block added starts one."""
        with self._lock:
            while True:
                while self._queue and self._queue[0][2].done:
                    heapq.heappop(self._queue)
                if not self._queue:
                    self._threads.remove(threading.current_thread())
                    return None
                now = time.monotonic()
                if self._queue[0][0] <= now:
                    break
                self._changed.wait(self._queue[0][0] - now)
            due: list[keep_alive] = []
            while self._queue and self._queue[0][0] <= now and len(due) < ROUND:
                block = heapq.heappop(self._queue)[2]
                if not block.done:
                    block.idle.clear()
                    due.append(block)
            if self._queue and now - self._queue[0][0] > BEHIND_SECONDS and len(self._threads) < BEATERS:
                self._start()
            return due

    def _run(self) -> None:
        from django.db import connection

        try:
            while (due := self._due()) is not None:
                try:
                    self._round(due)
                except Exception:  # the thread outlives any failure; each block is beaten again at its turn
                    log.exception("heartbeats.round.failed")
        finally:
            connection.close()  # nothing left to beat: the thread ends and holds no connection

    def _round(self, due: list[keep_alive]) -> None:
        for block in due:
            lost = None
            try:
                lost = self._beat(block)
            finally:
                with self._lock:
                    block.idle.set()
                    if lost is not None:
                        block.lost = lost
                    elif not block.done:
                        self._push(block, time.monotonic() + block.interval)
        connection_release_while_waiting()

    @staticmethod
    def _beat(block: keep_alive) -> LeaseLost | None:
        from django.db import close_old_connections

        try:
            close_old_connections()  # one broken by a blip, or past CONN_MAX_AGE, is not reused
            block.ctx.heartbeat(block.detail)
        except LeaseLost as exc:
            return exc
        except Exception:  # a database blip: the next beat tries again, the lease has slack
            log.warning("activity.heartbeat.failed", extra={"operation_id": block.ctx.operation_id}, exc_info=True)
        return None


HEARTBEATER = Heartbeater()


def _after_fork_in_child() -> None:
    """A forked pool process starts with no heartbeat thread: it gets a heartbeater of its own."""
    global HEARTBEATER
    HEARTBEATER = Heartbeater()


os.register_at_fork(after_in_child=_after_fork_in_child)
