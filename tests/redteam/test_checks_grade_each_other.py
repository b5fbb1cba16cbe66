"""A check runs the model's code; that code cannot rewrite a check graded after it.

F01's check runs the model's ``app.py``, which rewrites the body of F02's (failing) check, next to
it and in every other checkout it can guess; F02's check waits two seconds, then runs that body. A
shared checkout would grade F02 passing, one after the other or side by side; each check's own
fresh checkout, under bubblewrap, keeps it failing.
"""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from agentops.agents.harness import checks, gitops
from tests.redteam.conftest import contained, needs_bwrap

pytestmark = needs_bwrap

APP = """\
import pathlib
here = pathlib.Path.cwd()
for target in [here / "checks/f02_body.sh", *here.parent.glob("*/checks/f02_body.sh")]:
    try:
        target.write_text("exit 0\\n")
    except OSError:
        pass
print("hello")
"""
FEATURES = [{"id": "F01", "description": "greets", "steps": [], "priority": 1, "check": "sh checks/check_f01.sh"},
            {"id": "F02", "description": "is not done", "steps": [], "priority": 2, "check": "sh checks/check_f02.sh"}]


@pytest.fixture
def repo(tmp_path: Path, settings) -> tuple[Path, str]:
    settings.AGENTOPS_SANDBOX = "bwrap"
    root = (tmp_path / "ws").resolve()
    gitops.ensure_repo(root)
    (root / "checks").mkdir()
    (root / "features.json").write_text(json.dumps(FEATURES))
    (root / "app.py").write_text(APP)
    (root / "checks" / "check_f01.sh").write_text("python app.py | grep -q hello\n")
    (root / "checks" / "check_f02.sh").write_text("sleep 2\n. checks/f02_body.sh\n")
    (root / "checks" / "f02_body.sh").write_text("exit 1\n")
    return root, gitops.commit_all(root, "the approved contract")


@pytest.mark.parametrize("parallelism", [1, 4])
@pytest.mark.parametrize("where", ["worktree", "clone"])
def test_a_checks_run_cannot_rewrite_a_later_check(repo, tmp_path, settings, where, parallelism):
    root, commit = repo
    settings.AGENTOPS_HARNESS_CHECK_PARALLELISM = parallelism

    results = checks.run_checks(root, commit, FEATURES, where=where, timeout_seconds=20, scratch=tmp_path / "scratch")

    assert [(r["feature"], r["passed"], r["isolation"]) for r in results] == [
        ("F01", True, "bwrap"), ("F02", False, "bwrap")], results
    assert gitops.git(root, "status", "--porcelain") == ""  # the workspace was never the checkout
    assert not (tmp_path / "scratch").exists()
    contained(f"a check's run rewrites a later check ({where}, parallelism {parallelism})",
              "a fresh checkout per check, only its own mounted")
