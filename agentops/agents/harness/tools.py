"""The harness-owned tool layer: the same tools for the scripted provider and for Claude.

Paths are opened beneath the workspace through no link (``agentops.sandbox.files``); ``.git`` is
never writable and, in a coding session, neither are the harness-owned ``features.json`` and
``checks/``. Commands run
through ``agentops.sandbox`` (own process group, hard and no-output timeouts that kill the
group, scrubbed environment, resource limits, bubblewrap where it works); dev servers run as
engine-owned services (a port allocated, in the session's own loopback-only network shared with
its commands, the process group stopped at the latest when the session ends; what the engine
knows of them it keeps where no command can write).
``request_pass`` and ``end_session`` end a session; they decide nothing: the engine grades
afterwards.
"""
from __future__ import annotations

import json
import os
import shlex
import shutil
import signal
import socket
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from django.conf import settings

from agentops import sandbox
from agentops.agents.harness import gitops
from agentops.sandbox import files
from agentops.sandbox import limits as resource_limits
from agentops.sandbox.network import Network, NetworkUnavailable, network_create

MAX_OUTPUT_CHARS = 4000
MAX_WRITE_CHARS = 200_000
MAX_READ_LINES = 400
HEAD_CHARS = 1000  # of a long command output, the start kept besides its end
MAX_SERVICES = 3
SERVICE_READY_SECONDS = 15.0


def _schema(properties: dict[str, Any], required: list[str]) -> dict[str, Any]:
    return {"type": "object", "properties": properties, "required": required}


_STR = {"type": "string"}
_INT = {"type": "integer"}
TOOLS: list[dict[str, Any]] = [
    {"name": "list_files", "description": "List files under a directory of the workspace.",
     "input_schema": _schema({"path": _STR}, [])},
    {"name": "read_file", "description": f"Read a text file of the workspace with line numbers; start_line and "
     f"end_line (1-based, inclusive) pick a range (at most {MAX_READ_LINES} lines at a time).",
     "input_schema": _schema({"path": _STR, "start_line": _INT, "end_line": _INT}, ["path"])},
    {"name": "write_file", "description": "Write a whole text file in the workspace (features.json and checks/ "
     "are read-only in coding sessions).", "input_schema": _schema({"path": _STR, "content": _STR},
                                                                   ["path", "content"])},
    {"name": "str_replace", "description": "Replace the one occurrence of old_str in a file by new_str (refused "
     "when old_str occurs zero or several times: add context to make it unique).",
     "input_schema": _schema({"path": _STR, "old_str": _STR, "new_str": _STR}, ["path", "old_str", "new_str"])},
    {"name": "insert", "description": "Insert text after line insert_line of a file (0: at the top).",
     "input_schema": _schema({"path": _STR, "insert_line": _INT, "text": _STR}, ["path", "insert_line", "text"])},
    {"name": "run_command", "description": "Run a command (argv split like a shell, no shell features) in the "
     "workspace; it and everything it starts are killed at the timeout, or when it prints nothing for "
     "idle_seconds (the partial output is returned). Use service_start for servers.",
     "input_schema": _schema({"command": _STR, "timeout_seconds": _INT, "idle_seconds": _INT}, ["command"])},
    {"name": "service_start", "description": "Start a long-running process (a dev server) owned by the engine: "
     "it gets a free port as $PORT and in place of {port} in the command, runs until service_stop or the end "
     "of the session, and its output is kept for service_logs.",
     "input_schema": _schema({"name": _STR, "command": _STR}, ["name", "command"])},
    {"name": "service_stop", "description": "Stop a service started by service_start (its whole process group).",
     "input_schema": _schema({"name": _STR}, ["name"])},
    {"name": "service_logs", "description": "The last output of a service started by service_start.",
     "input_schema": _schema({"name": _STR}, ["name"])},
    {"name": "git_commit", "description": "Commit every change in the workspace (no push, no history rewrite).",
     "input_schema": _schema({"message": _STR}, ["message"])},
    {"name": "propose_feature_change", "description": "Propose a new features.json (the whole file) and new or "
     "changed check files: a person approves it before it applies; until then the approved list stands.",
     "input_schema": _schema({"features_json": _STR, "checks": {"type": "object",
                                                                "additionalProperties": _STR},
                              "reason": _STR}, ["features_json", "reason"])},
    {"name": "request_pass", "description": "Ask the engine to grade your feature: it runs the feature's check "
     "on your last commit in a clean checkout. Ends the session.",
     "input_schema": _schema({"feature_id": _STR, "note": _STR}, ["feature_id"])},
    {"name": "end_session", "description": "End the session with a short report: what you did, the files you "
     "touched, what you learned and the next step.",
     "input_schema": _schema({"summary": _STR, "all_done": {"type": "boolean"}, "learnings": _STR,
                              "next_step": _STR}, ["summary"])},
]
INITIALIZER_TOOLS = [t for t in TOOLS if t["name"] not in ("request_pass", "propose_feature_change")]


@dataclass
class Service:
    """A process a session started with service_start; the engine stops its group."""

    name: str
    proc: subprocess.Popen[bytes]
    port: int
    log: Path
    group: resource_limits.Group | None = None

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
    require_isolation: str = "none"  # "bwrap": a command that would run with less is refused
    command_timeout_seconds: int = 120  # the hard cap of one run_command (the tool-call budget)
    idle_seconds: int = 30  # the default soft no-output timeout of run_command
    service_dir: Path | None = None  # this workflow's services: logs, the engine's records, their TMPDIRs
    services: dict[str, Service] = field(default_factory=dict)
    network: Network | None = None  # the session's own network, made at its first service
    proposal: dict[str, Any] | None = None
    touched: list[str] = field(default_factory=list)

    def touch(self, path: Path) -> None:
        relative = str(path.relative_to(self.root))
        if relative not in self.touched:
            self.touched.append(relative)

    def close(self) -> list[str]:
        """Stop every service still running (session end); returns their names."""
        names = list(self.services)
        for name in names:
            _service_stop(self, name)
        if self.network is not None:
            self.network.close()
            self.network = None
        return names


def _writable(session: Session, relative: str) -> str:
    """``relative`` as the file tools name it, or PermissionError for a path the model may not
    write (links, hard links and special files are refused by ``files.write_text`` itself)."""
    parts = files.parts(relative)
    if parts and parts[0] == ".git":
        raise PermissionError(f"{relative!r} is inside .git, which only the engine changes")
    if session.protect and parts and parts[0] in gitops.PROTECTED:
        raise PermissionError(f"{relative!r} is owned by the harness (the approved feature list and checks) and "
                              "is read-only; use request_pass to be graded")
    return "/".join(parts)


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
        listed = files.list_files(root, str(args.get("path") or "."), limit=500, skip={".git"})
        return True, "\n".join(listed) or "(no files)"
    if name == "read_file":
        return True, _read(root, str(args["path"]), args.get("start_line"), args.get("end_line"))
    if name == "write_file":
        target, content = _writable(session, str(args["path"])), str(args["content"])
        if len(content) > MAX_WRITE_CHARS:
            return False, f"content is over {MAX_WRITE_CHARS:,} characters"
        sandbox.resource_limits.room_check(root, adding_bytes=len(content.encode()))
        files.write_text(root, target, content)
        session.touch(root / target)
        return True, f"wrote {len(content)} characters to {target}"
    if name == "str_replace":
        target = _writable(session, str(args["path"]))
        text, old, new = files.read_text(root, target), str(args["old_str"]), str(args["new_str"])
        count = text.count(old) if old else 0
        if count != 1:
            return False, (f"old_str occurs {count} times in {target}; it must occur exactly once "
                           "(add surrounding lines to make it unique)")
        return _save(session, target, text.replace(old, new, 1), f"replaced 1 occurrence in {args['path']}")
    if name == "insert":
        target = _writable(session, str(args["path"]))
        lines = files.read_text(root, target).splitlines(keepends=True)
        at = int(args["insert_line"])
        if not 0 <= at <= len(lines):
            return False, f"insert_line must be between 0 and {len(lines)} (the file's line count)"
        text = str(args["text"])
        lines[at:at] = [text if text.endswith("\n") else text + "\n"]
        return _save(session, target, "".join(lines), f"inserted after line {at} of {args['path']}")
    if name == "run_command":
        return _run_command(session, str(args["command"]), int(args.get("timeout_seconds") or 30),
                            int(args.get("idle_seconds") or session.idle_seconds))
    if name == "service_start":
        return _service_start(session, str(args["name"]), str(args["command"]))
    if name == "service_stop":
        return _service_stop(session, str(args["name"]))
    if name == "service_logs":
        service = _service(session, str(args["name"]))
        return True, sandbox.redacted_tail(service.log.read_text(errors="replace"), MAX_OUTPUT_CHARS)
    if name == "propose_feature_change":
        return _propose(session, args)
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
        session.report = {"summary": str(args.get("summary", ""))[:2000], "all_done": args.get("all_done") is True,
                          "learnings": str(args.get("learnings", ""))[:1000],
                          "next_step": str(args.get("next_step", ""))[:500]}
        return True, "session ended"
    return False, f"unknown tool {name!r}; tools are {', '.join(t['name'] for t in TOOLS)}"


def _save(session: Session, target: str, text: str, message: str) -> tuple[bool, str]:
    if len(text) > MAX_WRITE_CHARS:
        return False, f"the file would be over {MAX_WRITE_CHARS:,} characters"
    sandbox.resource_limits.room_check(session.root, adding_bytes=len(text.encode()))
    files.write_text(session.root, target, text)
    session.touch(session.root / target)
    return True, message


def _read(root: Path, relative: str, start: Any, end: Any) -> str:
    """Numbered lines ``start``–``end`` of ``relative`` (at most MAX_READ_LINES), with the file's length."""
    path = Path(relative)
    lines = files.read_text(root, relative).splitlines()
    first = max(1, int(start or 1))
    last = min(len(lines), int(end or first + MAX_READ_LINES - 1), first + MAX_READ_LINES - 1)
    body = "\n".join(f"{n:>5}\t{lines[n - 1]}" for n in range(first, last + 1))
    more = f"; read on with start_line={last + 1}" if last < len(lines) else ""
    return f"[{path.name}: lines {first}-{last} of {len(lines)}{more}]\n{body}"[:MAX_OUTPUT_CHARS * 2]


def _isolation_or_refuse(session: Session) -> str:
    try:
        got = sandbox.isolation()
    except sandbox.SandboxUnavailable as exc:  # no bubblewrap, and a real model: nothing runs
        raise PermissionError(str(exc)) from exc
    if session.require_isolation == "bwrap" and got != "bwrap":
        raise PermissionError("this workflow requires bubblewrap isolation and this worker would run the command "
                              f"with {got!r}; it was not run")
    return got


def _run_command(session: Session, command: str, timeout: int, idle: int) -> tuple[bool, str]:
    argv = shlex.split(command)
    if not argv:
        return False, "empty command"
    _isolation_or_refuse(session)
    # The workflow's cap (command_timeout_seconds) under the worker's (the operator's setting).
    timeout = max(1, min(timeout, session.command_timeout_seconds, settings.AGENTOPS_HARNESS_COMMAND_TIMEOUT_SECONDS))
    idle = max(1, min(idle, timeout))
    try:
        done = sandbox.run(argv, workspace=session.root, timeout_seconds=timeout, idle_timeout_seconds=idle,
                           max_output_bytes=4 * MAX_OUTPUT_CHARS, keep_head_bytes=HEAD_CHARS,
                           network=session.network)
    except FileNotFoundError:
        return False, f"command {argv[0]!r} not found"
    session.isolation = done.isolation
    output = _head_and_tail(done)
    if done.limit_hit:
        return False, (f"command stopped: {done.limit_note()}; it and every process it started were stopped "
                       f"(sandbox: {done.isolation})\n{output}")
    if done.timed_out:
        return False, (f"command timed out after {timeout} s; it and every process it started were stopped "
                       f"(sandbox: {done.isolation})\n{output}")
    if done.idle_timed_out:
        return False, (f"command printed nothing for {idle} s (soft timeout); it and every process it started were "
                       f"stopped; output so far follows (sandbox: {done.isolation}). Start servers with "
                       f"service_start.\n{output}")
    return done.exit_code == 0, f"exit {done.exit_code} (sandbox: {done.isolation})\n{output}"


def _head_and_tail(done: sandbox.Completed) -> str:
    """A command's output within MAX_OUTPUT_CHARS: all of it, or its first HEAD_CHARS and its end."""
    # Past the sandbox's bound its output starts with a line saying how much it cut.
    text = done.output.split("\n", 1)[-1] if done.cut_bytes else done.output
    if not done.cut_bytes and len(text) <= MAX_OUTPUT_CHARS:
        return text
    head = done.head or text[:HEAD_CHARS]
    tail = sandbox.redacted_tail(text, MAX_OUTPUT_CHARS - HEAD_CHARS)
    omitted = done.cut_bytes + len(text.encode()) - len(head.encode()) - len(tail.encode())
    return f"{head}\n[… about {max(0, omitted):,} bytes of output left out …]\n{tail}"


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


def _service(session: Session, name: str) -> Service:
    service = session.services.get(name)
    if service is None:
        raise KeyError(f"no service {name!r} in this session; started: {', '.join(session.services) or 'none'}")
    return service


def _service_start(session: Session, name: str, command: str) -> tuple[bool, str]:
    """Start ``command`` in a process group of its own with a free loopback port, in the session's
    network under bubblewrap; ready once it listens there."""
    if not name.isidentifier() or len(name) > 40:
        return False, "a service name is a short identifier, e.g. web"
    if name in session.services or len(session.services) >= MAX_SERVICES:
        return False, f"service {name!r} is already running, or {MAX_SERVICES} are (stop one first)"
    assert session.service_dir is not None
    kind = _isolation_or_refuse(session)
    argv = shlex.split(command)
    if not argv:
        return False, "empty command"
    if kind == "bwrap" and session.network is None:
        try:
            session.network = network_create(sandbox.bwrap_works()[1])
        except NetworkUnavailable as exc:
            return False, f"services cannot start on this worker: {exc}"
    # In the session's own network every port is free but those of its running services.
    port = _free_port() if session.network is None else min(
        set(range(8000, 8000 + MAX_SERVICES + 1)) - {s.port for s in session.services.values()})
    argv = [part.replace("{port}", str(port)) for part in argv]
    log, tmpdir, records = _service_paths(session.service_dir, name)
    env = {**sandbox.child_environment(session.root, tmpdir), "PORT": str(port)}
    line, group = sandbox.command_line(argv, kind=kind, workspace=session.root, tmpdir=tmpdir,
                                       network=session.network)
    with log.open("wb") as out:
        proc = subprocess.Popen(line, cwd=session.root, env=env, stdin=subprocess.DEVNULL, stdout=out,
                                stderr=subprocess.STDOUT, start_new_session=True)
    _record(records / f"{name}.json", proc.pid, group)
    session.services[name] = Service(name=name, proc=proc, port=port, log=log, group=group)
    where = " in the session's own network (reach it from run_command)" if session.network is not None else ""
    deadline = time.monotonic() + SERVICE_READY_SECONDS
    while time.monotonic() < deadline and proc.poll() is None:
        if _listening(session, port):
            return True, f"service {name} listening on 127.0.0.1:{port}{where} (pid {proc.pid}, sandbox: {kind})"
        time.sleep(0.1)
    tail = sandbox.redacted_tail(log.read_text(errors="replace"), 1000)
    if proc.poll() is not None:
        _service_stop(session, name)
        return False, f"service {name} exited with {proc.returncode} before listening on port {port}\n{tail}"
    return True, f"service {name} started (pid {proc.pid}) but is not listening on {port} yet\n{tail}"


def _service_paths(service_dir: Path, name: str) -> tuple[Path, Path, Path]:
    """A service's log, its own TMPDIR (the only directory besides the workspace it may write)
    and the engine's records, which no command can write (bubblewrap binds neither them nor the log)."""
    records, tmpdir = service_dir / "records", service_dir / "tmp" / name
    shutil.rmtree(tmpdir, ignore_errors=True)
    for path in (records, tmpdir):
        path.mkdir(parents=True, exist_ok=True)
    return service_dir / f"{name}.log", tmpdir, records


def _listening(session: Session, port: int) -> bool:
    if session.network is not None:
        return session.network.listening(port)
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        return sock.connect_ex(("127.0.0.1", port)) == 0


def _record(path: Path, pid: int, group: resource_limits.Group | None) -> None:
    """What the engine needs to stop a service a dead attempt left: its group, the start time of
    its leader (so a reused pid is never signalled) and its control groups."""
    record = {"pgid": pid, "started": _start_ticks(pid), "cgroups": [str(p) for p in group.dirs] if group else [],
              "v2": bool(group and group.v2)}
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(record))
    os.replace(tmp, path)


def _start_ticks(pid: int) -> int:
    """The start time of process ``pid`` in clock ticks since boot (0 when it is gone)."""
    fields = sandbox.proc_stat(pid)
    return int(fields[19]) if fields is not None else 0


def _service_stop(session: Session, name: str) -> tuple[bool, str]:
    service = session.services.pop(name, None)
    if service is None:
        return False, f"no service {name!r} in this session"
    stop_group(service.proc.pid)
    service.proc.wait()
    if service.group is not None:
        service.group.remove()
    if session.service_dir is not None:
        (session.service_dir / "records" / f"{name}.json").unlink(missing_ok=True)
    return True, f"service {name} stopped (exit {service.proc.returncode})"


def stop_group(pgid: int, grace_seconds: float = 2.0) -> None:
    """SIGTERM a process group, then SIGKILL what is left of it after ``grace_seconds``."""
    for sig in (signal.SIGTERM, signal.SIGKILL):
        try:
            os.killpg(pgid, sig)
        except (ProcessLookupError, PermissionError):
            return
        deadline = time.monotonic() + grace_seconds
        while sig == signal.SIGTERM and time.monotonic() < deadline:
            try:
                os.killpg(pgid, 0)
            except (ProcessLookupError, PermissionError):
                return
            time.sleep(0.05)


def stop_leftover_services(service_dir: Path) -> list[int]:
    """Stop the services a dead attempt of this workflow left running, from the engine's records
    (never from anything a command could write); returns the groups stopped. A record whose
    process is gone, or whose pid now names a process started at another time, stops nothing."""
    stopped = []
    records = service_dir / "records"
    for path in sorted(records.glob("*.json")) if records.is_dir() else []:
        try:
            record = json.loads(path.read_text())
            pgid, started = int(record["pgid"]), int(record["started"])
        except (ValueError, KeyError, TypeError):
            pgid, started, record = 0, 0, {}
        if pgid > 1 and started and _start_ticks(pgid) == started:
            stop_group(pgid)
            stopped.append(pgid)
        resource_limits.Group(dirs=[Path(p) for p in record.get("cgroups", [])], v2=bool(record.get("v2"))).remove()
        path.unlink(missing_ok=True)
    return stopped


def _propose(session: Session, args: dict[str, Any]) -> tuple[bool, str]:
    """Keep a proposed feature list and checks for a person to approve; nothing in the workspace changes."""
    raw = str(args["features_json"])
    checks = args.get("checks") or {}
    if not isinstance(checks, dict) or not all(isinstance(v, str) for v in checks.values()):
        return False, "checks must map paths under checks/ to file contents"
    for path in checks:
        parts = Path(str(path)).parts
        if not parts or parts[0] != "checks" or ".." in parts or len(str(checks[path])) > MAX_WRITE_CHARS:
            return False, f"check path {path!r} must be a file under checks/ (no '..')"
    try:
        json.loads(raw)
    except json.JSONDecodeError as exc:
        return False, f"features_json is not JSON ({exc.msg} at line {exc.lineno})"
    session.proposal = {"features_json": raw[:MAX_WRITE_CHARS], "checks": {str(k): str(v) for k, v in checks.items()},
                        "reason": str(args.get("reason", ""))[:1000]}
    return True, ("proposal kept: after this session the engine validates it and asks a person to approve it; "
                  "until then the approved feature list and checks stand")
