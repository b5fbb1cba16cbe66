"""tests/outside_kind, a package outside agentops with a kind of its own, tested as its author would:
in a pytest session of its own, whose conftest's one line declares the test kit's plugin (none of
agentops's test code is loaded), against a test database of its own: PostgreSQL, and SQLite. Its
test on real workers runs with the process tests (tests/process/test_outside_kind_on_workers.py)."""
from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

OUTSIDE = Path(__file__).resolve().parent / "outside_kind"


def outside_session(env: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "--create-db", *args],
                          cwd=OUTSIDE, env=env, capture_output=True, text=True, timeout=300)


def outside_env(database: str, var_dir: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PYTEST_", "AGENTOPS_", "DJANGO_"))}
    env["AGENTOPS_VAR_DIR"] = str(var_dir)
    if database == "sqlite":
        env.pop("DATABASE_URL", None)
    elif env.get("DATABASE_URL", "").startswith("postgres"):
        # Its own test database (pytest-django's test_<name>), so this suite's runs side by side never share one.
        env["DATABASE_URL"] += f"_outside_{os.getpid()}"
    else:
        pytest.skip("the suite runs without a PostgreSQL DATABASE_URL")
    return env


@pytest.mark.parametrize("database", ["postgresql", "sqlite"])
def test_the_outside_kind_s_tests_pass_with_the_plugin_alone(database: str, tmp_path: Path) -> None:
    assert (OUTSIDE / "conftest.py").read_text() == 'pytest_plugins = ["agentops.kind.pytest_plugin"]\n'
    done = outside_session(outside_env(database, tmp_path), "--ignore=test_on_workers.py")
    summary = done.stdout.strip().splitlines()[-1] if done.stdout.strip() else ""
    passed = re.match(r"(\d+) passed(, \d+ warnings?)? in ", summary)  # nothing failed, skipped or errored
    functions = len(re.findall(r"^def test_", (OUTSIDE / "test_notes.py").read_text(), re.M))
    assert done.returncode == 0 and passed and int(passed.group(1)) >= functions, (
        done.stdout[-4000:] + done.stderr[-2000:])
