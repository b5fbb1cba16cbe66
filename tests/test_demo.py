"""The README's demo runs to a completed agent on the embedded default (SQLite + filesystem broker)."""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO_ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.process
def test_demo_completes_a_release_on_sqlite_and_the_filesystem_broker(tmp_path: Path) -> None:
    env = {k: v for k, v in os.environ.items() if k not in ("DATABASE_URL", "CELERY_BROKER_URL")}
    env["AGENTOPS_VAR_DIR"] = str(tmp_path / "var")
    manage = [sys.executable, "manage.py"]
    subprocess.run([*manage, "migrate", "--verbosity", "0"], cwd=REPO_ROOT, env=env, check=True, timeout=120)
    done = subprocess.run([*manage, "demo", "--timeout", "90"], cwd=REPO_ROOT, env=env, capture_output=True,
                          text=True, timeout=150)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert "completed" in done.stdout
    # Said once, visibly: what the demo's commands ran in.
    assert done.stdout.count("Sandbox: ") == 1 and ("Sandbox: bubblewrap" in done.stdout or
                                                    "the project's own" in done.stdout), done.stdout[:2000]
    assert "wait.approved" in done.stdout
    assert (tmp_path / "var" / "agentops.sqlite3").exists()
