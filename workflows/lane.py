"""The engine lane: how many threads of a threads-pool worker run the engine's bookkeeping at once.

A threads worker keeps hundreds of model calls in flight, a thread each. Between two waits a
thread runs the engine's bookkeeping (claim, fence, reserve, charge, note, checkpoint, record,
advance), a dozen short statements with Python in between. Left to themselves, a hundred threads
doing that at once take turns at the interpreter at every statement: each hand-off of Python's
interpreter lock is a few context switches, and under load they cost more CPU than the work
(bench/README.md, "twenty-second session"). The lane lets AGENTOPS_IO_ENGINE_THREADS threads (4)
run that bookkeeping at once; the others wait for a turn in line, one sleep and one wake each.

What runs in the lane: a claimed attempt's bookkeeping before and after the activity function
(``activity_run_if_runnable``), and, from inside the function, the context's notes, checkpoints
and steering questions and a model call's reservation, charge and note (``metered_complete``).
The activity function itself, the model's answer, the provider's SDK, a rate limit's wait and
heartbeats run outside it: code that waits never holds the lane.

Two rules keep the lane from waiting on itself. A thread inside a transaction takes no turn (it
runs as if the lane were off): it may hold row locks a thread in the lane waits for. A thread
that has to wait for its turn gives its pooled database connection back first: a thread in the
lane may be waiting for a connection.

Off (every call a no-op) unless ``configure`` gave it a size: the worker does for a threads pool
(``agentops.celery``); a prefork process runs one activity at a time and has no lane.
"""
from __future__ import annotations

import threading
from collections import deque
from collections.abc import Iterator
from contextlib import contextmanager

from django.db import connection

from workflows.connections import connection_release_while_waiting


class Turns:
    """``size`` turns, handed out first come, first served: a turn given back passes straight to
    the thread that has waited longest, so a thread that comes back to the lane often cannot keep
    taking turns ahead of one that waits (as with ``threading.Semaphore``)."""

    def __init__(self, size: int) -> None:
        self.size = size
        self._free = size
        self._lock = threading.Lock()
        self._waiters: deque[threading.Lock] = deque()  # each held until its turn is handed to it

    def take(self) -> None:
        with self._lock:
            if self._free:
                self._free -= 1
                return
            waiter = threading.Lock()
            waiter.acquire()
            self._waiters.append(waiter)
        connection_release_while_waiting()
        waiter.acquire()  # released by ``give``, which passes its turn on to this thread

    def give(self) -> None:
        with self._lock:
            if self._waiters:
                self._waiters.popleft().release()
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
def turn() -> Iterator[None]:
    """Run the block holding a turn in the lane (taken here unless this thread holds one already,
    or is inside a transaction: see the module's docstring)."""
    turns = _turns
    if turns is None or holding() or connection.in_atomic_block:
        yield
        return
    turns.take()
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
