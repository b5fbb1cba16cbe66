"""Run a process whose wall clock is off by a fixed offset, with libfaketime (Debian package faketime).

Only the wall clock moves (``time.time()``, ``datetime.now()``, ``CLOCK_REALTIME``): the
monotonic clock is left alone (FAKETIME_DONT_FAKE_MONOTONIC=1), as on a host whose clock was
set wrong. Faking the monotonic clock too hangs Python 3.11's timed lock waits, which Celery
uses (https://github.com/wolfcw/libfaketime/issues/390); ``faketime_site/sitecustomize.py``
works around the one call that breaks without it. Used by the clock-skew process tests and the
soak (``bench/soak.py``).
"""
from __future__ import annotations

import glob
import os
from pathlib import Path

LIBFAKETIME = sorted(glob.glob("/usr/lib/*/faketime/libfaketime.so.1"))
SITE_DIR = Path(__file__).resolve().parent / "faketime_site"
MISSING = "libfaketime is not installed: apt-get install -y faketime (make test installs it)"


def faketime_available() -> bool:
    return bool(LIBFAKETIME)


def faketime_env(offset_seconds: int) -> dict[str, str]:
    """Environment variables that shift a process's wall clock (and its children's) by ``offset_seconds``.

    Raises RuntimeError when libfaketime is not installed (check ``faketime_available()`` first).
    """
    if not LIBFAKETIME:
        raise RuntimeError(MISSING)
    path = os.pathsep.join(p for p in (str(SITE_DIR), os.environ.get("PYTHONPATH", "")) if p)
    return {"LD_PRELOAD": LIBFAKETIME[0], "FAKETIME": f"{offset_seconds:+d}s", "FAKETIME_DONT_FAKE_MONOTONIC": "1",
            "PYTHONPATH": path}
