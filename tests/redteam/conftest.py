"""The red-team suite's ledger: every escape technique tried, the boundary that held it, and a count at the end.

Each test calls ``contained(technique, boundary)`` once its assertions about that technique
have passed; the terminal summary prints the table (docs/security.md has the same table) and
the counts, so CI's output says how many techniques were tried and contained.
"""
from __future__ import annotations

import os
import stat
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from agentops import sandbox
from tests.harness.conftest import harness_approver, harness_workspaces, mini_schedule  # noqa: F401 (fixtures)

BWRAP_WORKS, BWRAP_DETAIL = sandbox.bwrap_works()
needs_bwrap = pytest.mark.skipif(not BWRAP_WORKS, reason=f"bubblewrap does not run here: {BWRAP_DETAIL}")
LEDGER: dict[str, str] = {}
TRIED: set[str] = set()
SECRET = f"sk-redteam-{uuid.uuid4().hex}"


def tried(*techniques: str) -> None:
    TRIED.update(techniques)


def contained(technique: str, boundary: str) -> None:
    TRIED.add(technique)
    LEDGER[technique] = boundary


def pytest_terminal_summary(terminalreporter: Any) -> None:
    if not TRIED:
        return
    terminalreporter.section("red team")
    for technique in sorted(TRIED):
        terminalreporter.write_line(f"{'contained' if technique in LEDGER else 'NOT CONTAINED':>13}  {technique}"
                                    f"{'  -- ' + LEDGER[technique] if technique in LEDGER else ''}")
    terminalreporter.write_line(f"red team: {len(TRIED)} techniques tried, {len(LEDGER)} contained")


@pytest.fixture
def outside(tmp_path: Path) -> Path:
    """A directory outside every workspace holding a secret file; a technique that escapes leaves a mark here."""
    path = tmp_path / "outside"
    path.mkdir()
    (path / "secret.txt").write_text(SECRET)
    return path


@pytest.fixture
def worker_secret(monkeypatch: pytest.MonkeyPatch) -> str:
    """The worker holds a secret in its environment, as production workers hold their keys."""
    monkeypatch.setenv("REDTEAM_API_KEY", SECRET)
    return SECRET


@pytest.fixture
def payload(outside: Path) -> Callable[[Path], Path]:
    """Write the program a technique tries to have the engine run: it leaves ``ran-<arg>`` outside."""

    def write(root: Path) -> Path:
        script = root / "x.sh"
        script.write_text(f"#!/bin/sh\ntouch {outside}/ran-$1\ncat /proc/$PPID/environ > {outside}/environ-$1\n")
        script.chmod(script.stat().st_mode | stat.S_IXUSR)
        return script

    return write


def marks(outside: Path) -> list[str]:
    """What escaped: every file outside but the secret."""
    return sorted(p.name for p in outside.iterdir() if p.name != "secret.txt")


def running(needle: str) -> list[int]:
    """Processes of this machine whose command line holds ``needle``."""
    found = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                if needle in Path(f"/proc/{entry}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace"):
                    found.append(int(entry))
            except OSError:
                continue
    return [pid for pid in found if pid != os.getpid()]
