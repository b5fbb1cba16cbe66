"""The engine's own git never runs or trusts what a workspace's ``.git`` holds, even one a model wrote freely
(no bubblewrap, or a workspace from before it): config, attributes, hooks, includes, replace refs, alternates,
links and nested repositories."""
from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from agentops import git as engine_git
from agentops.agents.harness import checks, gitops, presentation
from tests.redteam.conftest import contained, marks
from workflows.errors import Permanent

FAILING_CHECK = "import sys\nsys.exit(1)\n"


def plain_git(repo: Path, *args: str) -> str:
    """Git as the model runs it in its workspace: the repository's own configuration applies."""
    return subprocess.run(["git", "-C", str(repo), "-c", "user.name=m", "-c", "user.email=m@x", *args],
                          capture_output=True, text=True, check=True).stdout.strip()


@pytest.fixture
def repo(tmp_path: Path, payload) -> Path:
    root = (tmp_path / "ws").resolve()
    gitops.ensure_repo(root)
    (root / "checks").mkdir()
    (root / "checks" / "check_f01.py").write_text(FAILING_CHECK)
    (root / "features.json").write_text("[]")
    gitops.commit_all(root, "scaffold")
    payload(root)
    return root


def engine_works_on(repo: Path) -> None:
    """What the engine does at a session boundary and in a commit: status, add, commit, diff, log."""
    (repo / "app.py").write_text("print('hi')\n")
    gitops.dirty(repo)
    gitops.commit_all(repo, "work", trailers={"Harness-Operation": "op"})
    gitops.git(repo, "diff", "HEAD~1", "HEAD")
    gitops.git(repo, "log", "--oneline")


@pytest.mark.parametrize("setting", ["core.fsmonitor", "diff.external"])
def test_a_program_the_repositorys_config_names_never_runs(repo, outside, setting):
    plain_git(repo, "config", setting, "./x.sh config")
    engine_works_on(repo)
    assert marks(outside) == []
    assert (repo / ".git" / "config").read_text() == engine_git.OWNED_CONFIG
    contained(f"git config {setting} run by the engine's git", "engine-owned .git/config and -c overrides")


def test_a_clean_filter_named_by_gitattributes_never_runs(repo, outside):
    (repo / ".gitattributes").write_text("* filter=evil diff=evil\n")
    plain_git(repo, "config", "filter.evil.clean", "./x.sh filter")
    plain_git(repo, "config", "filter.evil.smudge", "./x.sh smudge")
    plain_git(repo, "config", "diff.evil.textconv", "./x.sh textconv")
    (repo / ".git" / "info").mkdir(exist_ok=True)
    (repo / ".git" / "info" / "attributes").write_text("* filter=evil\n")
    engine_works_on(repo)
    assert marks(outside) == []
    assert not (repo / ".git" / "info" / "attributes").exists()
    contained(".gitattributes filter/textconv driver run by git add", "engine-owned .git/config")


def test_an_included_config_is_never_read(repo, outside):
    (repo / "evil.cfg").write_text("[core]\n\tfsmonitor = ./x.sh include\n")
    plain_git(repo, "config", "include.path", "../evil.cfg")
    engine_works_on(repo)
    assert marks(outside) == []
    contained("include.path to a workspace file", "engine-owned .git/config")


def test_hooks_never_run(repo, outside):
    for hook in ("pre-commit", "post-commit", "commit-msg", "post-checkout", "reference-transaction"):
        target = repo / ".git" / "hooks" / hook
        target.write_text((repo / "x.sh").read_text().replace("$1", hook))
        target.chmod(0o755)
    engine_works_on(repo)
    gitops.save_wip_and_reset(repo, base_sha=gitops.head(repo) + "~1", name="x")
    assert marks(outside) == []
    contained(".git/hooks/*", "core.hooksPath=/dev/null")


def test_a_replaced_check_is_graded_as_it_is_not_as_replaced(repo):
    """``git replace`` of the approved check's blob by ``exit 0`` changes nothing the engine reads."""
    blob = plain_git(repo, "rev-parse", "HEAD:checks/check_f01.py")
    fake = subprocess.run(["git", "-C", str(repo), "hash-object", "-w", "--stdin"], input="raise SystemExit(0)\n",
                          capture_output=True, text=True, check=True).stdout.strip()
    plain_git(repo, "replace", blob, fake)
    assert plain_git(repo, "show", "HEAD:checks/check_f01.py") == "raise SystemExit(0)"  # the model's view
    head = gitops.head(repo)
    for where in ("worktree", "clone"):
        [result] = checks.run_checks(repo, head, [{"id": "F01", "check": "python checks/check_f01.py"}],
                                     where=where, timeout_seconds=30, scratch=repo.parent / f"scratch-{where}")
        assert not result["passed"] and result["exit_code"] == 1, result
    assert gitops.tampered(repo, protected_sha=head) == []
    contained("git replace of the approved check's blob", "GIT_NO_REPLACE_OBJECTS in the engine's git")


def test_grafts_and_alternates_are_removed_before_the_engine_reads(repo, tmp_path):
    other = tmp_path / "objects"
    other.mkdir()
    (repo / ".git" / "objects" / "info").mkdir(exist_ok=True)
    (repo / ".git" / "objects" / "info" / "alternates").write_text(f"{other}\n")
    (repo / ".git" / "info").mkdir(exist_ok=True)
    (repo / ".git" / "info" / "grafts").write_text(f"{gitops.head(repo)}\n")
    (repo / ".git" / "commondir").write_text(str(other))
    engine_works_on(repo)
    for name in ("objects/info/alternates", "info/grafts", "commondir"):
        assert not (repo / ".git" / name).exists(), name
    contained("alternates, grafts and commondir redirecting .git", "engine removes them before each command")


@pytest.mark.parametrize("form", ["symlink", "gitdir file"])
def test_a_dot_git_that_points_elsewhere_is_refused(repo, tmp_path, outside, form):
    elsewhere = tmp_path / "evil-git"
    subprocess.run(["git", "init", "-q", "--bare", str(elsewhere)], check=True)
    subprocess.run(["git", "--git-dir", str(elsewhere), "config", "core.fsmonitor", f"{repo}/x.sh dotgit"],
                   check=True)
    (repo / ".git").rename(tmp_path / "real-git")
    if form == "symlink":
        (repo / ".git").symlink_to(elsewhere)
    else:
        (repo / ".git").write_text(f"gitdir: {elsewhere}\n")
    with pytest.raises(Permanent, match="not a directory the engine made"):
        gitops.commit_all(repo, "work")
    assert marks(outside) == []
    contained(f".git replaced by a {form}", "engine refuses a .git that is not a directory")


def test_a_nested_repositorys_config_never_runs(repo, outside):
    sub = repo / "sub"
    sub.mkdir()
    plain_git(sub, "init", "-q")
    (sub / "f").write_text("x\n")
    plain_git(sub, "add", "f")
    plain_git(sub, "commit", "-qm", "inner")
    plain_git(sub, "config", "core.fsmonitor", f"{repo}/x.sh nested")
    (sub / ".gitattributes").write_text("* filter=evil\n")
    plain_git(sub, "config", "filter.evil.clean", f"{repo}/x.sh nested-filter")
    (sub / "f").write_text("changed\n")
    engine_works_on(repo)
    gitops.git(repo, "status", "--porcelain")
    assert marks(outside) == []
    contained("nested repository with its own config", "diff.ignoreSubmodules=all, overrides passed to child gits")


def test_the_admins_read_of_a_session_runs_nothing_the_workspace_asks_for(repo, outside):
    (repo / ".gitattributes").write_text("* diff=evil\n")
    gitops.commit_all(repo, "attributes")
    plain_git(repo, "config", "diff.evil.textconv", "./x.sh textconv")
    plain_git(repo, "config", "core.fsmonitor", "./x.sh fsmonitor")
    plain_git(repo, "config", "diff.external", "./x.sh external")
    (repo / "app.py").write_text("print(1)\n")
    plain_git(repo, "-c", "core.fsmonitor=false", "add", "app.py")
    plain_git(repo, "-c", "core.fsmonitor=false", "commit", "-qm", "app")
    commits, _ = presentation.session_commits(str(repo), "harness_session",
                                              {"head": gitops.head(repo), "base_sha": gitops.head(repo) + "~1"})
    assert [c.sha for c in commits] == [plain_git(repo, "rev-parse", "HEAD")] and "print(1)" in commits[0].text
    assert marks(outside) == []
    contained("textconv/external diff in the admin's git show", "engine git environment and overrides (read only)")
