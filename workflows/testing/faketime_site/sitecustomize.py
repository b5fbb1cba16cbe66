"""Imported by every Python process started under ``workflows.testing.faketime.faketime_env``.

libfaketime 0.9.10 (Debian's) with FAKETIME_DONT_FAKE_MONOTONIC=1 turns Python 3.11's
``clock_nanosleep(CLOCK_MONOTONIC, TIMER_ABSTIME)`` into EINVAL, so ``time.sleep`` raises
(https://github.com/wolfcw/libfaketime/issues/426). Sleep in ``select()`` instead, which it
leaves alone; a sleep never depended on the wall clock anyway.
"""
import select
import time


def _sleep(seconds: float) -> None:
    if seconds < 0:
        raise ValueError("sleep length must be non-negative")
    deadline = time.monotonic() + seconds
    while (left := deadline - time.monotonic()) > 0:
        select.select([], [], [], left)


time.sleep = _sleep
