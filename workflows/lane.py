"""The engine lane: how many threads of a threads-pool worker run the engine's bookkeeping at once.

A threads worker keeps hundreds of model calls in flight, a thread each. Between two waits a
thread runs the engine's bookkeeping (claim, fence, reserve, charge, note, checkpoint, record,
advance), a dozen short statements with Python in between. Left to themselves, a hundred threads
doing that at once take turns at the interpreter at every statement: each hand-off of Python's
interpreter lock is a few context switches, and under load they cost more CPU than the work
(bench/HISTORY.md, "CPU per call: the engine lane"). The lane lets AGENTOPS_IO_ENGINE_THREADS threads (4)
run that bookkeeping at once; the others wait for a turn in line, one sleep and one wake each.

What runs in the lane: a claimed attempt's bookkeeping before and after the activity function
(``activity_run_if_runnable``), and, from inside the function, the context's notes, checkpoints
and steering questions and a model call's reservation, charge and note (``metered_complete``).
The activity function itself, the model's answer, the provider's SDK, a rate limit's wait and
heartbeats run outside it: code that waits never holds the lane.

Work in hand goes first. A thread that holds a claimed attempt (coming back for a model call's
reservation or charge, a note, its result) is given a turn before one that is about to claim new
work (a Celery message's first turn, ``turn(new_work=True)``). When a thousand agents are launched
at once, each thread then takes its agent through to its model call before the next claim, instead
of every claim going first and every first call waiting behind all of them (bench/HISTORY.md,
"Agents in flight: work in hand first"). New work is not starved: one that has waited NEW_WORK_WAIT_SECONDS goes
before work in hand.

Two rules keep the lane from waiting on itself. A thread inside a transaction takes no turn (it
runs as if the lane were off): it may hold row locks a thread in the lane waits for. A thread
that has to wait for its turn gives its pooled database connection back first: a thread in the
lane may be waiting for a connection.

Off (every call a no-op) unless ``configure`` gave it a size: the worker does for a threads pool
(``agentops.celery``); a prefork process runs one activity at a time and has no lane.
"""
from __future__ import annotations

import threading
import time
from collections import deque
from collections.abc import Iterator
from contextlib import contextmanager

from django.db import connection

from workflows.connections import connection_release_while_waiting

# The longest a thread about to claim new work waits behind threads with work in hand.
NEW_WORK_WAIT_SECONDS = 10.0


class Turns:
    """``size`` turns, handed out first come, first served within two lines: a turn given back
    passes straight to the thread that has waited longest with work in hand, else to the one that
    has waited longest to claim new work (first, once it has waited NEW_WORK_WAIT_SECONDS). A
    thread that comes back to the lane often cannot keep taking turns ahead of one that waits in
    its line (as with ``threading.Semaphore``)."""

    def __init__(self, size: int) -> None:
        self.size = size
        self._free = size
        self._lock = threading.Lock()
        # Each waiter's lock is held until its turn is handed to it.
        self._in_hand: deque[threading.Lock] = deque()
        self._new_work: deque[tuple[float, threading.Lock]] = deque()  # with time.monotonic() of asking

    def take(self, *, new_work: bool = False) -> None:
        with self._lock:
            if self._free:
                self._free -= 1
                return
            waiter = threading.Lock()
            waiter.acquire()
            if new_work:
                self._new_work.append((time.monotonic(), waiter))
            else:
                self._in_hand.append(waiter)
        connection_release_while_waiting()
        waiter.acquire()  # released by ``give``, which passes its turn on to this thread

    def give(self) -> None:
        with self._lock:
            if self._new_work and (not self._in_hand
                                   or time.monotonic() - self._new_work[0][0] >= NEW_WORK_WAIT_SECONDS):
                self._new_work.popleft()[1].release()
            elif self._in_hand:
                self._in_hand.popleft().release()
            else:
                self._free += 1


_turns: Turns | None = None
_local = threading.local()  # .holding: this thread has a turn


def configure(threads: int) -> None:
    """Let ``threads`` threads of this process hold a turn at once; 0 turns the lane off."""
    global _turns
    if threads < 0:
        raise ValueError(f"the engine lane needs 0 (off) or more threads, not {threads}")
    _turns = Turns(threads) if threads else None


def size() -> int:
    """The threads that may hold a turn at once; 0 when the lane is off."""
    return _turns.size if _turns is not None else 0


def holding() -> bool:
    """Whether this thread holds a turn."""
    return getattr(_local, "holding", False)


@contextmanager
def turn(*, new_work: bool = False) -> Iterator[None]:
    """Run the block holding a turn in the lane (taken here unless this thread holds one already,
    or is inside a transaction: see the module's docstring). ``new_work``: the block is about to
    claim an attempt, and waits behind threads that hold one."""
    turns = _turns
    if turns is None or holding() or connection.in_atomic_block:
        yield
        return
    turns.take(new_work=new_work)
    _local.holding = True
    try:
        yield
    finally:
        _local.holding = False
        turns.give()


@contextmanager
def waiting() -> Iterator[None]:
    """Run the block (a wait: the activity function, the model's answer) without this thread's
    turn, and take a turn again after it. Inside a transaction the turn is kept: taking it back
    there could wait on a thread that waits for the transaction's locks."""
    turns = _turns
    if turns is None or not holding() or connection.in_atomic_block:
        yield
        return
    _local.holding = False
    turns.give()
    try:
        yield
    finally:
        turns.take()
        _local.holding = True
