"""Git as the harness uses it: the engine's own commits, session boundaries, WIP refs and tamper reverts.

Git runs in the worker (not in the sandbox) through ``agentops.git``: the repository's
configuration is the engine's own, rewritten before every command, and every setting that would
run a program is overridden, so nothing a session wrote into the workspace (``.git`` included)
runs as the engine.
"""
from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from agentops import git as engine_git

# Paths the engine owns once the feature list is approved: sessions may read them, never change them.
PROTECTED = ("features.json", "checks")


def git(repo: Path | str, *args: str, check: bool = True) -> str:
    """Run git in ``repo`` as the engine (``agentops.git.run``); raises Permanent naming the
    command when it fails (and ``check``)."""
    return engine_git.run(repo, *args, check=check)


def head(repo: Path) -> str:
    return git(repo, "rev-parse", "--verify", "-q", "HEAD", check=False)


def head_before(repo: Path, made_by: Callable[[str], bool]) -> str:
    """The commit HEAD's first-parent line stood on before the oldest commit whose
    ``Harness-Operation`` trailer names an operation ``made_by`` accepts: HEAD itself when there is
    none, "" when that line has no other commit.

    The commits of a session's earlier attempts, or of its node's earlier visits, carry those
    trailers; this is the commit the session started from.
    """
    # On a branch with no commit yet git log fails and prints nothing: there is no such commit.
    log = git(repo, "log", "--first-parent", "--format=%H %(trailers:key=Harness-Operation,valueonly,separator=%x2C)",
              check=False)
    line = [(sha, operations.split(",")) for sha, _, operations in (entry.partition(" ") for entry in log.splitlines())]
    made = [i for i, (_, operations) in enumerate(line) if any(made_by(op) for op in operations if op)]
    start = made[-1] + 1 if made else 0
    return line[start][0] if start < len(line) else ""


def dirty(repo: Path) -> list[str]:
    """Uncommitted changes, untracked files included (``git status --porcelain`` lines); a nested
    repository is not a change: it is left out of the work (``agentops.git.exclude_nested``)."""
    lines = [line for line in git(repo, "status", "--porcelain", "--untracked-files=all").splitlines() if line]
    nested = engine_git.exclude_nested(repo, [line[3:] for line in lines if line.startswith("?? ")])
    return [line for line in lines if line[3:] not in nested]


def ensure_repo(repo: Path) -> None:
    repo.mkdir(parents=True, exist_ok=True)
    if not (repo / ".git").exists():
        git(repo, "init", "-q", "-b", "main")


def commit_all(repo: Path, message: str, *, trailers: dict[str, str] | None = None) -> str:
    """Commit everything in the tree but nested repositories; returns the new HEAD, or "" when there
    was nothing to commit."""
    dirty(repo)
    git(repo, "add", "-A")
    if not git(repo, "status", "--porcelain"):
        return ""
    args = ["commit", "-q", "--no-verify", "-m", message]
    for key, value in (trailers or {}).items():
        args += ["--trailer", f"{key}: {value}"]
    git(repo, *args)
    return head(repo)


@dataclass(frozen=True)
class Wip:
    """Half-work found in the workspace at a session boundary, saved under ``ref``."""

    ref: str
    commit: str
    files: list[str]
    head_moved: bool


def save_wip_and_reset(repo: Path, *, base_sha: str, name: str) -> Wip | None:
    """Restore the workspace to ``base_sha``; what was there beyond it is saved to ``refs/heads/wip/<name>``.

    Idempotent: a clean tree at ``base_sha`` returns None and changes nothing; a second save of
    the same name gets a numbered suffix rather than overwriting the first. An empty ``base_sha``
    is a repository with no commit yet: the branch goes back to unborn and the files stay in the
    tree, uncommitted (nothing tells the session's files from those that were there before).
    """
    changes = dirty(repo)
    current = head(repo)
    if not changes and current == base_sha:
        return None
    files = sorted({line[3:] for line in changes})
    if changes:
        commit_all(repo, f"WIP {name}: half-work saved by the harness at a session boundary")
    saved = head(repo)
    if not files:
        files = git(repo, "diff", "--name-only", base_sha, saved).splitlines() if base_sha else \
            git(repo, "ls-tree", "-r", "--name-only", saved).splitlines()
    ref = f"wip/{name}"
    suffix = 1
    while git(repo, "rev-parse", "--verify", "-q", f"refs/heads/{ref}", check=False):
        suffix += 1
        ref = f"wip/{name}-{suffix}"
    git(repo, "update-ref", f"refs/heads/{ref}", saved)
    if base_sha:
        git(repo, "reset", "-q", "--hard", base_sha)
        git(repo, "clean", "-fdq")
    else:
        git(repo, "update-ref", "-d", git(repo, "symbolic-ref", "HEAD"))
        git(repo, "read-tree", "--empty")
    return Wip(ref=ref, commit=saved, files=files[:50], head_moved=current != base_sha)


def tampered(repo: Path, *, protected_sha: str) -> list[str]:
    """Harness-owned paths that differ from ``protected_sha`` (committed or not)."""
    committed = git(repo, "diff", "--name-only", protected_sha, "HEAD", "--", *PROTECTED).splitlines()
    pending = [line[3:] for line in git(repo, "status", "--porcelain", "--untracked-files=all", "--",
                                        *PROTECTED).splitlines() if line]
    return sorted(set(committed) | set(pending))


def revert_tamper(repo: Path, *, protected_sha: str, operation_id: str) -> str:
    """Put the harness-owned paths back as approved and commit only them; returns the new HEAD.

    Other uncommitted work of the session is left as it is (the next boundary saves it as WIP).
    """
    git(repo, "rm", "-rq", "--cached", "--ignore-unmatch", "--", *PROTECTED)
    for path in PROTECTED:
        target = repo / path
        if target.is_dir():
            git(repo, "clean", "-fdqx", "--", path)
    git(repo, "checkout", protected_sha, "--", *PROTECTED)
    git(repo, "clean", "-fdq", "--", *PROTECTED)
    if git(repo, "diff", "--cached", "--name-only", "HEAD", "--", *PROTECTED):
        message = "harness: revert changes to the approved feature list and checks"
        git(repo, "commit", "-q", "--no-verify", "-m", message, "--trailer",
            f"Harness-Operation: {operation_id}", "--", *PROTECTED)
    return head(repo)
