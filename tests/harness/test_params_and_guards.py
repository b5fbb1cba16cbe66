"""Launch-time refusals and the tool layer's guards of the harness kind, without a worker."""
from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from agentops.agents.harness import checks, gitops, tools
from agentops.agents.harness.definition import Harness
from agentops.kind import InvalidInput


def test_the_defaults_are_filled_in_at_launch():
    assert Harness().validate_params({}) == {
        "workspace": "", "approver_role": "harness-approvers", "isolation": "bwrap", "max_sessions": 40,
        "max_attempts": 3, "feature_budget_usd": 0.0, "session_max_turns": 40, "session_max_tokens": 400_000,
        "session_max_seconds": 1800.0, "command_timeout_seconds": 120, "command_idle_seconds": 30,
        "repeat_limit": 3, "same_error_limit": 3, "same_diff_limit": 3, "stagnation_sessions": 8,
        "check_timeout_seconds": 60.0, "approval_expiry_hours": 72.0, "regression_max_checks": 10,
        "regression_full_every": 10, "reviewer": False, "reviewer_budget_usd": 0.5}


@pytest.mark.parametrize(("params", "message"), [
    ({"workspace": "relative/dir"}, "must be an absolute path"),
    ({"max_sessions": "0"}, "max_sessions=0 must be between 1 and 1000"),
    ({"max_attempts": "many"}, "max_attempts must be a number"),
    ({"colour": "red"}, "Unknown parameter"),
    ({"isolation": "container"}, "isolation='container' must be bwrap"),
    ({"command_idle_seconds": "0"}, "command_idle_seconds=0 must be between 1 and 600"),
])
def test_bad_parameters_are_refused_at_launch(params, message):
    with pytest.raises(InvalidInput, match=message):
        Harness().validate_params(params)


def test_a_workspace_that_is_a_non_empty_directory_without_git_is_refused(tmp_path: Path):
    (tmp_path / "notes.txt").write_text("mine")
    with pytest.raises(InvalidInput, match="neither an empty directory nor a git repository"):
        Harness().validate_params({"workspace": str(tmp_path)})


def test_writes_to_harness_owned_paths_git_and_outside_are_refused(tmp_path: Path):
    root = tmp_path / "ws"
    gitops.ensure_repo(root)
    session = tools.Session(root=root.resolve(), operation_id="op", feature="F01")
    for path, reason in [("features.json", "owned by the harness"), ("checks/check_f01.py", "owned by the harness"),
                         (".git/hooks/pre-commit", "inside .git"), ("../outside.txt", "outside the workspace")]:
        ok, output = tools.call(session, "write_file", {"path": path, "content": "x"})
        assert not ok and reason in output
    assert len(session.refused) == 4 and not (tmp_path / "outside.txt").exists()


def test_request_pass_for_another_feature_is_refused_and_does_not_end_the_session(tmp_path: Path):
    root = tmp_path / "ws"
    gitops.ensure_repo(root)
    session = tools.Session(root=root.resolve(), operation_id="op", feature="F02")
    ok, output = tools.call(session, "request_pass", {"feature_id": "F03"})
    assert (ok, session.ended) == (False, "") and "holds the lease on F02, not F03" in output


def test_a_tampered_check_is_reverted_in_a_commit_of_its_own(tmp_path: Path):
    root = tmp_path / "ws"
    gitops.ensure_repo(root)
    (root / "checks").mkdir()
    (root / "checks" / "check_f01.py").write_text("raise SystemExit(1)\n")
    (root / "features.json").write_text("[]\n")
    approved = gitops.commit_all(root, "scaffold")
    (root / "checks" / "check_f01.py").write_text("pass\n")
    (root / "checks" / "extra.py").write_text("pass\n")
    gitops.commit_all(root, "make the check pass")
    (root / "todo.py").write_text("work in progress\n")  # not the harness's: left alone
    assert gitops.tampered(root, protected_sha=approved) == ["checks/check_f01.py", "checks/extra.py"]
    gitops.revert_tamper(root, protected_sha=approved, operation_id="op")
    assert gitops.tampered(root, protected_sha=approved) == []
    assert (root / "checks" / "check_f01.py").read_text() == "raise SystemExit(1)\n"
    assert not (root / "checks" / "extra.py").exists() and (root / "todo.py").exists()
    last = subprocess.run(["git", "-C", str(root), "log", "-1", "--format=%B"], capture_output=True, text=True).stdout
    assert "Harness-Operation: op" in last


def test_a_check_on_a_worker_without_the_required_isolation_is_unverified_never_passing(tmp_path: Path, settings):
    root = tmp_path / "ws"
    gitops.ensure_repo(root)
    (root / "checks").mkdir()
    (root / "checks" / "ok.py").write_text("print('fine')\n")
    sha = gitops.commit_all(root, "a check that passes")
    feature = {"id": "F01", "description": "d", "check": "python checks/ok.py"}
    settings.AGENTOPS_SANDBOX = "none"
    refused, = checks.run_checks(root, sha, [feature], where="worktree", timeout_seconds=30,
                                 scratch=tmp_path / "scratch", require_isolation="bwrap")
    assert (refused["passed"], refused["exit_code"]) == (False, -1)
    assert refused["output_tail"].startswith("unverified: the check could not run") and "bubblewrap" in \
        refused["output_tail"]
    allowed, = checks.run_checks(root, sha, [feature], where="worktree", timeout_seconds=30,
                                 scratch=tmp_path / "scratch", require_isolation="none")
    assert (allowed["passed"], allowed["isolation"]) == (True, "none")
