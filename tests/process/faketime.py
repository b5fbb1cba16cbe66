"""libfaketime for process tests (``workflows.testing.faketime``): skip, saying why, where it is missing."""
from __future__ import annotations

import pytest

from workflows.testing import faketime


def faketime_env(offset_seconds: int) -> dict[str, str]:
    """Environment variables that shift a process's wall clock by ``offset_seconds``; skips without libfaketime."""
    if not faketime.faketime_available():
        pytest.skip(faketime.MISSING)
    return faketime.faketime_env(offset_seconds)
