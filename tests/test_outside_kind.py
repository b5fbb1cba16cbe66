"""tests/outside_kind, a package outside agentops with a kind of its own, tested as its author would:
in a pytest session of its own, whose conftest's one line declares the test kit's plugin (none of
agentops's test code is loaded), against a PostgreSQL test database of its own."""
from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

OUTSIDE = Path(__file__).resolve().parent / "outside_kind"


def test_the_outside_kind_s_tests_pass_with_the_plugin_alone() -> None:
    assert (OUTSIDE / "conftest.py").read_text() == 'pytest_plugins = ["agentops.kind.pytest_plugin"]\n'
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PYTEST_", "AGENTOPS_", "DJANGO_"))}
    if env.get("DATABASE_URL", "").startswith("postgres"):
        # Its own test database (pytest-django's test_<name>), so this suite's runs side by side never share one.
        env["DATABASE_URL"] += f"_outside_{os.getpid()}"
    done = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "--create-db"],
                          cwd=OUTSIDE, env=env, capture_output=True, text=True, timeout=300)
    expected = len(re.findall(r"^def test_", (OUTSIDE / "test_notes.py").read_text(), re.M))
    assert done.returncode == 0 and f"{expected} passed" in done.stdout, done.stdout[-4000:] + done.stderr[-2000:]
