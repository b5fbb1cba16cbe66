"""The feature list and its checks: schema, the hash an approval is bound to, and running checks as the engine.

Each check runs in a checkout of its own that nothing else touched, not the session and not
another check's run (a detached ``git worktree`` of one commit, or a fresh clone for the final
verify), through ``agentops.sandbox`` with its own timeout: the model's code a check runs cannot
rewrite a check graded after it. Its exit status is the verdict: 0 passes, anything else (a
timeout, a missing command) does not.
"""
from __future__ import annotations

import hashlib
import json
import re
import shlex
import shutil
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path, PurePosixPath
from typing import Any, TypedDict

from django.conf import settings

from agentops import sandbox
from agentops.agents.harness.gitops import git
from agentops.kind import InvalidInput

FEATURE_ID = re.compile(r"^F\d{2,3}$")
MAX_FEATURES = 500
CHECK_RUNNERS = ("python", "python3", "sh")
OUTPUT_TAIL_CHARS = 2000


class Feature(TypedDict, total=False):
    """One row of the feature board, as the workflow's state keeps it."""

    id: str
    description: str
    steps: list[str]
    priority: int
    check: str
    status: str  # failing, passing, blocked
    attempts: int
    evidence: Any  # the last CheckResult that decided the status
    reason: str


class CheckResult(TypedDict):
    """The engine's evidence for one check run."""

    feature: str
    commit: str
    command: str
    exit_code: int
    passed: bool
    timed_out: bool
    duration_ms: int
    output_tail: str
    isolation: str
    where: str  # worktree or clone


def validate_features(raw: str, *, check_exists: Callable[[str], bool]) -> list[Feature]:
    """Parse and check features.json; raises InvalidInput naming the first problem.

    Each feature needs an ``id`` (F01…), a ``description``, ``steps`` (strings), a ``priority``
    (integer, lower first) and a ``check``: ``python checks/<file>`` or ``sh checks/<file>``
    naming a file that exists in the commit.
    """
    try:
        data = json.loads(raw)
    except json.JSONDecodeError as exc:
        raise InvalidInput(f"features.json is not JSON ({exc.msg} at line {exc.lineno}).") from None
    if not isinstance(data, list) or not 0 < len(data) <= MAX_FEATURES:
        raise InvalidInput(f"features.json must be a list of 1–{MAX_FEATURES} features.")
    seen: set[str] = set()
    features: list[Feature] = []
    for number, item in enumerate(data, start=1):
        if not isinstance(item, dict):
            raise InvalidInput(f"Feature {number} of features.json is not an object.")
        fid = item.get("id")
        if not isinstance(fid, str) or not FEATURE_ID.match(fid) or fid in seen:
            raise InvalidInput(f"Feature {number} of features.json needs a unique id like F01; got {fid!r}.")
        seen.add(fid)
        description, steps, priority = item.get("description"), item.get("steps", []), item.get("priority", number)
        if not isinstance(description, str) or not 0 < len(description) <= 500:
            raise InvalidInput(f"Feature {fid} needs a description of 1–500 characters.")
        if not isinstance(steps, list) or not all(isinstance(s, str) and len(s) <= 500 for s in steps):
            raise InvalidInput(f"Feature {fid}: steps must be a list of short strings.")
        if not isinstance(priority, int) or isinstance(priority, bool):
            raise InvalidInput(f"Feature {fid}: priority must be an integer (lower runs first).")
        check = item.get("check")
        argv = shlex.split(check) if isinstance(check, str) else []
        script = PurePosixPath(argv[1]) if len(argv) >= 2 else None
        if (not argv or argv[0] not in CHECK_RUNNERS or script is None or script.parts[0] != "checks"
                or ".." in script.parts):
            raise InvalidInput(f"Feature {fid}: check must be 'python checks/<file>' or 'sh checks/<file>'; "
                               f"got {check!r}.")
        if not check_exists(str(script)):
            raise InvalidInput(f"Feature {fid}: its check file {script} is not in the commit.")
        features.append({"id": fid, "description": description, "steps": steps[:20], "priority": priority,
                         "check": str(check)})
    return features


def contract_hash(repo: Path, commit: str) -> str:
    """SHA-256 over features.json and every file under checks/ at ``commit`` (by blob id): the
    thing an approval is bound to; any change to a description, a step or a check changes it."""
    listing = git(repo, "ls-tree", "-r", commit, "--", "features.json", "checks")
    return hashlib.sha256(listing.encode()).hexdigest()


def run_checks(repo: Path, commit: str, features: list[Feature], *, where: str, timeout_seconds: float,
               scratch: Path, require_isolation: str = "none") -> list[CheckResult]:
    """Run the checks of ``features`` on ``commit``, each in a fresh checkout of its own (``where``:
    worktree or clone) under ``scratch``, which is emptied first and removed after; results in list
    order. With ``require_isolation="bwrap"`` on a worker without bubblewrap, no check runs: each is
    unverified (exit code -1), never passing."""
    shutil.rmtree(scratch, ignore_errors=True)
    scratch.parent.mkdir(parents=True, exist_ok=True)
    git(repo, "worktree", "prune")
    scratch.mkdir()
    git_lock = threading.Lock()  # git's worktree bookkeeping in ``repo``: one change at a time

    def graded(number: int, feature: Feature) -> CheckResult:
        checkout = scratch / f"check-{number}"
        with git_lock:
            _checkout(repo, commit, checkout, where)
        try:
            return _run_one(checkout, commit, feature, where, timeout_seconds, require_isolation)
        finally:
            with git_lock:
                _discard(repo, checkout, where)

    try:
        workers = max(1, int(settings.AGENTOPS_HARNESS_CHECK_PARALLELISM))
        with ThreadPoolExecutor(max_workers=workers) as pool:
            futures = [pool.submit(graded, number, f) for number, f in enumerate(features)]
            return [future.result() for future in futures]
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
        git(repo, "worktree", "prune", check=False)


def _checkout(repo: Path, commit: str, checkout: Path, where: str) -> None:
    if where == "clone":
        git(checkout.parent, "clone", "-q", "--no-checkout", str(repo), str(checkout))
        git(checkout, "checkout", "-q", "--detach", commit)
    else:
        git(repo, "worktree", "add", "-q", "--detach", str(checkout), commit)


def _discard(repo: Path, checkout: Path, where: str) -> None:
    if where != "clone":
        git(repo, "worktree", "remove", "--force", str(checkout), check=False)
    shutil.rmtree(checkout, ignore_errors=True)


def _run_one(checkout: Path, commit: str, feature: Feature, where: str, timeout_seconds: float,
             require_isolation: str) -> CheckResult:
    command = feature["check"]
    started = time.monotonic()
    try:
        if require_isolation == "bwrap" and sandbox.isolation() != "bwrap":
            raise FileNotFoundError("this worker cannot run it under bubblewrap, which the workflow requires")
        done = sandbox.run(shlex.split(command), workspace=checkout, timeout_seconds=timeout_seconds,
                           max_output_bytes=4 * OUTPUT_TAIL_CHARS)
        exit_code, output, timed_out, isolation = done.exit_code, done.output, done.timed_out, done.isolation
    except (FileNotFoundError, sandbox.SandboxUnavailable) as exc:
        exit_code, output, timed_out, isolation = -1, f"unverified: the check could not run: {exc}", False, ""
    if timed_out:
        output += f"\n[the check was stopped after its timeout of {timeout_seconds:g} s]"
    return {"feature": feature["id"], "commit": commit, "command": command, "exit_code": exit_code,
            "passed": exit_code == 0 and not timed_out, "timed_out": timed_out,
            "duration_ms": round((time.monotonic() - started) * 1000),
            "output_tail": sandbox.redacted_tail(output, OUTPUT_TAIL_CHARS), "isolation": isolation, "where": where}
