"""The harness-owned tool layer: the same tools for the scripted provider and for Claude.

Paths resolve (symlinks included) inside the workspace; ``.git`` is never writable and, in a
coding session, neither are the harness-owned ``features.json`` and ``checks/``. Commands run
through ``agentops.sandbox`` (own process group, hard timeout that kills the group, scrubbed
environment, bubblewrap where it works). ``request_pass`` and ``end_session`` end a session;
they decide nothing: the engine grades afterwards.
"""
from __future__ import annotations

import shlex
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from django.conf import settings

from agentops import sandbox
from agentops.agents.harness import gitops

MAX_OUTPUT_CHARS = 4000
MAX_WRITE_CHARS = 200_000


def _schema(properties: dict[str, Any], required: list[str]) -> dict[str, Any]:
    return {"type": "object", "properties": properties, "required": required}


_STR = {"type": "string"}
TOOLS: list[dict[str, Any]] = [
    {"name": "list_files", "description": "List files under a directory of the workspace.",
     "input_schema": _schema({"path": _STR}, [])},
    {"name": "read_file", "description": "Read a text file of the workspace.",
     "input_schema": _schema({"path": _STR}, ["path"])},
    {"name": "write_file", "description": "Write a whole text file in the workspace (features.json and checks/ "
     "are read-only in coding sessions).", "input_schema": _schema({"path": _STR, "content": _STR},
                                                                   ["path", "content"])},
    {"name": "run_command", "description": "Run a command (argv split like a shell, no shell features) in the "
     "workspace; it and everything it starts are killed at the timeout.",
     "input_schema": _schema({"command": _STR, "timeout_seconds": {"type": "integer"}}, ["command"])},
    {"name": "git_commit", "description": "Commit every change in the workspace (no push, no history rewrite).",
     "input_schema": _schema({"message": _STR}, ["message"])},
    {"name": "request_pass", "description": "Ask the engine to grade your feature: it runs the feature's check "
     "on your last commit in a clean checkout. Ends the session.",
     "input_schema": _schema({"feature_id": _STR, "note": _STR}, ["feature_id"])},
    {"name": "end_session", "description": "End the session with a short report.",
     "input_schema": _schema({"summary": _STR, "all_done": {"type": "boolean"}}, ["summary"])},
]
INITIALIZER_TOOLS = [t for t in TOOLS if t["name"] != "request_pass"]


@dataclass
class Session:
    """What one session may touch and what it did; the tool calls mutate it."""

    root: Path
    operation_id: str
    feature: str = ""  # the leased feature; "" for the initializer
    protect: bool = True
    ended: str = ""  # "", "request_pass", "end_session"
    report: dict[str, Any] = field(default_factory=dict)
    commits: list[str] = field(default_factory=list)
    refused: list[dict[str, str]] = field(default_factory=list)
    isolation: str = ""


def confined(root: Path, relative: str) -> Path:
    """Resolve ``relative`` inside ``root`` (symlinks included) or refuse."""
    target = (root / relative).resolve()
    if target != root and not target.is_relative_to(root):
        raise PermissionError(f"{relative!r} is outside the workspace")
    return target


def _writable(session: Session, relative: str) -> Path:
    target = confined(session.root, relative)
    parts = target.relative_to(session.root).parts
    if parts and parts[0] == ".git":
        raise PermissionError(f"{relative!r} is inside .git, which only the engine changes")
    if session.protect and parts and parts[0] in gitops.PROTECTED:
        raise PermissionError(f"{relative!r} is owned by the harness (the approved feature list and checks) and "
                              "is read-only; use request_pass to be graded")
    return target


def call(session: Session, name: str, args: dict[str, Any]) -> tuple[bool, str]:
    """Run one tool; returns (ok, output). A refused or failed call is an error result, not a crash."""
    try:
        ok, output = _call(session, name, args)
    except PermissionError as exc:
        session.refused.append({"tool": name, "reason": str(exc)[:300]})
        ok, output = False, f"refused: {exc}"
    except (KeyError, ValueError, OSError, UnicodeDecodeError) as exc:
        ok, output = False, f"{type(exc).__name__}: {exc}"
    return ok, sandbox.redact(output.replace("\x00", "\\x00"))[:MAX_OUTPUT_CHARS * 2]


def _call(session: Session, name: str, args: dict[str, Any]) -> tuple[bool, str]:
    root = session.root
    if name == "list_files":
        base = confined(root, str(args.get("path") or "."))
        files = sorted(str(p.relative_to(root)) for p in base.rglob("*")
                       if p.is_file() and ".git" not in p.relative_to(root).parts)
        return True, "\n".join(files[:500]) or "(no files)"
    if name == "read_file":
        return True, confined(root, str(args["path"])).read_text(encoding="utf-8")[:MAX_OUTPUT_CHARS]
    if name == "write_file":
        target, content = _writable(session, str(args["path"])), str(args["content"])
        if len(content) > MAX_WRITE_CHARS:
            return False, f"content is over {MAX_WRITE_CHARS:,} characters"
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_text(content, encoding="utf-8")
        return True, f"wrote {len(content)} characters to {target.relative_to(root)}"
    if name == "run_command":
        return _run_command(session, str(args["command"]), int(args.get("timeout_seconds") or 30))
    if name == "git_commit":
        trailers = {"Harness-Operation": session.operation_id, **({"Feature": session.feature} if session.feature
                                                                  else {})}
        sha = gitops.commit_all(root, str(args["message"])[:2000] or "work in progress", trailers=trailers)
        if not sha:
            return False, "nothing to commit"
        session.commits.append(sha)
        return True, f"committed {sha}"
    if name == "request_pass":
        wanted = str(args["feature_id"])
        if wanted != session.feature:
            raise PermissionError(f"this session holds the lease on {session.feature}, not {wanted}; only "
                                  f"{session.feature} can be graded now")
        if gitops.dirty(root):
            return False, "the workspace has uncommitted changes: commit them (git_commit) before request_pass"
        session.ended, session.report = "request_pass", {"note": str(args.get("note", ""))[:1000]}
        return True, f"the engine will run {wanted}'s check on {gitops.head(root)}"
    if name == "end_session":
        session.ended = "end_session"
        session.report = {"summary": str(args.get("summary", ""))[:2000], "all_done": args.get("all_done") is True}
        return True, "session ended"
    return False, f"unknown tool {name!r}; tools are {', '.join(t['name'] for t in TOOLS)}"


def _run_command(session: Session, command: str, timeout: int) -> tuple[bool, str]:
    argv = shlex.split(command)
    if not argv:
        return False, "empty command"
    timeout = max(1, min(timeout, settings.AGENTOPS_HARNESS_COMMAND_TIMEOUT_SECONDS))
    try:
        done = sandbox.run(argv, workspace=session.root, timeout_seconds=timeout, max_output_bytes=4 * MAX_OUTPUT_CHARS)
    except FileNotFoundError:
        return False, f"command {argv[0]!r} not found"
    session.isolation = done.isolation
    output = sandbox.redacted_tail(done.output, MAX_OUTPUT_CHARS)
    if done.timed_out:
        return False, (f"command timed out after {timeout} s; it and every process it started were stopped "
                       f"(sandbox: {done.isolation})\n{output}")
    return done.exit_code == 0, f"exit {done.exit_code} (sandbox: {done.isolation})\n{output}"
