"""The sandbox every command agentops runs for a user goes through (run_command, release tests).

What a sandboxed command sees (docs/operators.md, "The sandbox"):

- an environment built from an allow-list (``PATH``, ``HOME`` = the workspace, ``LANG``,
  ``LC_ALL``, ``TERM``, ``TMPDIR``), never the worker's own variables;
- under bubblewrap (``AGENTOPS_SANDBOX`` = ``auto`` where it works, or ``bwrap``): the system
  (``/usr``, ``/bin``, ``/lib*``, ``/etc``) and the worker's Python read-only, the workspace
  writable but its ``.git`` read-only, nothing else of the file system, a private ``/tmp`` of
  bounded size, no network (or a session's own loopback-only network, ``network.py``), its own
  PID namespace; it dies with the worker;
- with ``none``: the worker's file system and network. ``auto`` where bubblewrap is absent runs the
  offline scripted model's commands so (they are the project's own) and refuses a real model's:
  without bubblewrap a model-chosen command only runs unisolated when an operator said
  AGENTOPS_SANDBOX=none (``isolation``).

Either way the command runs in its own session and process group, under the resource limits of
``limits.py`` (a control group of its own where the worker can make one): a timeout sends SIGTERM
to the group, then SIGKILL after a grace, and nothing it started outlives it. Its output is
bounded and every known secret value in it is replaced by ``[redacted]`` (``redact``).
"""
from __future__ import annotations

import errno
import functools
import logging
import os
import re
import selectors
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import quote, unquote, urlsplit

from django.conf import settings
from django.core import checks

from agentops.sandbox import limits as resource_limits
from agentops.sandbox.network import Network
from workflows.errors import Permanent

logger = logging.getLogger("agentops.sandbox")

REDACTED = "[redacted]"
MODES = ("auto", "bwrap", "none")
DEFAULT_MAX_OUTPUT_BYTES = 256_000
# A secret shorter than this is not searched for: replacing every "abc" in a test log would
# bury the output and hide nothing worth hiding.
MIN_SECRET_CHARS = 4
_SECRET_NAME = re.compile(r"(_KEY|_TOKEN|_SECRET|_PASSWORD)$")
_SYSTEM_READ_ONLY = ("/usr", "/etc", "/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32")


class SandboxUnavailable(Permanent):
    """Bubblewrap does not run on this worker, and the command may not run without it
    (AGENTOPS_SANDBOX=bwrap, or ``auto`` with a real model)."""


@dataclass(frozen=True)
class Completed:
    """What a sandboxed command did. ``output`` is stdout and stderr interleaved, redacted."""

    exit_code: int
    output: str
    timed_out: bool
    isolation: str  # "bwrap" or "none"
    cut_bytes: int = 0
    idle_timed_out: bool = False  # stopped after ``idle_timeout_seconds`` without output
    head: str = ""  # with ``keep_head_bytes`` and output cut: its first bytes (redacted), not in ``output``
    limit_hit: str = ""  # "memory" or "processes" (its control group's limit), "disk" (its workspace's)

    def limit_note(self) -> str:
        """What to tell the model when the command met a limit ("" when it did not)."""
        if self.limit_hit == "memory":
            return f"the command reached the sandbox's memory limit ({settings.AGENTOPS_SANDBOX_MEMORY_MB} MB)"
        if self.limit_hit == "processes":
            return f"the command reached the sandbox's limit of {settings.AGENTOPS_SANDBOX_MAX_PROCESSES} processes"
        if self.limit_hit == "disk":
            return (f"the command took the workspace past its disk limit ({settings.AGENTOPS_SANDBOX_WORKSPACE_MB} MB, "
                    "AGENTOPS_SANDBOX_WORKSPACE_MB) and was stopped; remove files to make room")
        return ""


# --- secrets -------------------------------------------------------------------------------

def _url_password(url: str) -> str:
    try:
        return unquote(urlsplit(url).password or "")
    except ValueError:
        return ""


def secret_values() -> list[str]:
    """The values the worker holds that no tool output may carry, longest first.

    The settings' secrets (Django's key, the Anthropic key, the passwords in the database and
    broker addresses) and every variable of the worker's environment whose name ends in _KEY,
    _TOKEN, _SECRET or _PASSWORD, or that is an address with a password in it. The environment
    is read here, at call time, not for configuration but to know what to hide: a secret set
    after start-up is hidden too.
    """
    found = {settings.SECRET_KEY, getattr(settings, "ANTHROPIC_API_KEY", ""),
             str(settings.DATABASES["default"].get("PASSWORD") or ""),
             _url_password(str(getattr(settings, "CELERY_BROKER_URL", "")))}
    for name, value in os.environ.items():
        if _SECRET_NAME.search(name.upper()):
            found.add(value)
        elif "://" in value:
            found.add(_url_password(value))
    found |= {quote(v, safe="") for v in found}  # as it would appear in an address
    return sorted((v for v in found if len(v) >= MIN_SECRET_CHARS), key=len, reverse=True)


def redact(text: str, secrets: Sequence[str] | None = None) -> str:
    """Replace every known secret value in ``text`` by ``[redacted]``: the last line of defence
    between a tool's output and events, checkpoints, admin pages and the model."""
    for secret in secret_values() if secrets is None else secrets:
        if secret in text:
            text = text.replace(secret, REDACTED)
    return text


def redacted_tail(text: str, limit: int, secrets: Sequence[str] | None = None) -> str:
    """The last ``limit`` characters of ``text``, redacted, with no secret's end left at the cut."""
    secrets = secret_values() if secrets is None else secrets
    text = redact(text, secrets)
    return _redact_cut(text[-limit:], secrets) if len(text) > limit else text


def _redact_end(text: str, secrets: Sequence[str]) -> str:
    """Redact the start of a secret that a cut left at the end of ``text``."""
    for secret in secrets:
        for size in range(len(secret) - 1, MIN_SECRET_CHARS - 1, -1):
            if text.endswith(secret[:size]):
                return text[:-size] + REDACTED
    return text


def _redact_cut(text: str, secrets: Sequence[str]) -> str:
    """Redact the end of a secret that a cut left at the start of ``text``."""
    for secret in secrets:
        for size in range(len(secret) - 1, MIN_SECRET_CHARS - 1, -1):
            if text.startswith(secret[-size:]):
                return REDACTED + text[size:]
    return text


# --- isolation -----------------------------------------------------------------------------

@functools.cache
def bwrap_works() -> tuple[bool, str]:
    """Whether bubblewrap runs here with the namespaces we use (checked once per process);
    (True, its path) or (False, why not), logged once."""
    works, detail = _probe_bwrap()
    if not works:
        logger.warning("sandbox.bwrap_unavailable", extra={"detail": detail})
    return works, detail


def _probe_bwrap() -> tuple[bool, str]:
    path = shutil.which("bwrap")
    if path is None:
        return False, "bwrap is not installed (apt-get install bubblewrap)"
    try:
        # The mounts every command gets: a container's masked /proc refuses --proc (docs/operators.md).
        done = subprocess.run([path, "--ro-bind", "/", "/", "--proc", "/proc", "--dev", "/dev", "--tmpfs", "/tmp",
                               "--unshare-net", "--unshare-pid", "--die-with-parent", "true"],
                              capture_output=True, text=True, timeout=20, check=False, env={})
    except (OSError, subprocess.TimeoutExpired) as exc:
        return False, f"bwrap did not start: {exc}"
    if done.returncode != 0:
        return False, f"bwrap does not work here: {done.stderr.strip()[:300]}"
    return True, path


def model_is_real() -> bool:
    """Whether this worker's model is a real one (any provider but the offline scripted one): its
    commands are chosen by a model, not written by the project."""
    return settings.AGENTOPS_MODEL_PROVIDER != "scripted"


def unisolated_refusal(detail: str) -> str:
    """Why a command is not run: a real model, and no bubblewrap; what to install, or the one setting
    that accepts the risk."""
    return (f"A model-chosen command needs bubblewrap and {detail}; it was not run. Install bubblewrap on "
            "this worker (apt-get install bubblewrap), or set AGENTOPS_SANDBOX=none to accept running a "
            "model's commands with the worker's file system, network and user.")


def isolation() -> str:
    """The isolation the next command gets: "bwrap" or "none" (only with AGENTOPS_SANDBOX=none, or
    with ``auto`` for the offline scripted model, whose commands are the project's own). Raises
    SandboxUnavailable when bubblewrap does not work here and AGENTOPS_SANDBOX=bwrap, or ``auto``
    with a real model: it fails closed."""
    mode = settings.AGENTOPS_SANDBOX
    if mode == "none":
        return "none"
    works, detail = bwrap_works()
    if works:
        return "bwrap"
    if mode == "bwrap":
        raise SandboxUnavailable(f"AGENTOPS_SANDBOX=bwrap but {detail}; the command was not run. Install "
                                 "bubblewrap on this worker, or set AGENTOPS_SANDBOX=none to accept running "
                                 "commands without it.")
    if model_is_real():
        raise SandboxUnavailable(unisolated_refusal(detail))
    _say_unisolated_offline(detail)
    return "none"


@functools.cache
def _say_unisolated_offline(detail: str) -> None:
    logger.warning("sandbox.unisolated_offline", extra={"detail": detail, "why": (
        "the offline scripted model's commands (the project's own) run without isolation; a real model's "
        "would be refused")})


def isolation_problems() -> list[tuple[str, str, str]]:
    """What this worker's isolation means for model-chosen commands, as (id, message, hint): the
    start-up check's warnings (``checks.py``) and the worker's log at start."""
    mode, real = settings.AGENTOPS_SANDBOX, model_is_real()
    if mode == "none":
        if not real:
            return []
        return [("agentops.W010", "AGENTOPS_SANDBOX=none: a real model's commands, services and checks run with "
                 "the worker's file system, network and user.",
                 "Install bubblewrap and set AGENTOPS_SANDBOX=auto (the default) to isolate them.")]
    works, detail = bwrap_works()
    if works:
        return []
    if mode == "bwrap" or real:
        why = ("AGENTOPS_SANDBOX=bwrap" if mode == "bwrap"
               else f"the model provider is {settings.AGENTOPS_MODEL_PROVIDER!r}")
        return [("agentops.W012", f"{why} and {detail}: this worker refuses every model-chosen command, service "
                 "and check (the attempt fails, saying so).",
                 "Install bubblewrap (apt-get install bubblewrap), or set AGENTOPS_SANDBOX=none to accept the risk.")]
    return [("agentops.W011", f"{detail}: the offline scripted model's commands (the project's own) run without "
             "isolation; a real model's would be refused.",
             "Install bubblewrap (apt-get install bubblewrap) before configuring a real model.")]


@checks.register("agentops")
def check_isolation(app_configs: Any = None, **kwargs: Any) -> list[checks.CheckMessage]:
    """The start-up check (`manage.py check`, runserver, migrate) of ``isolation_problems``."""
    return [checks.Warning(message, hint=hint, id=code) for code, message, hint in isolation_problems()]


def log_isolation() -> None:
    """Say at a worker's start what its model-chosen commands get (bubblewrap, or why not)."""
    problems = isolation_problems()
    for code, message, hint in problems:
        logger.warning("sandbox.isolation", extra={"check": code, "detail": message, "hint": hint})
    if not problems:
        logger.info("sandbox.isolation", extra={"detail": "none (AGENTOPS_SANDBOX=none)" if
                                                settings.AGENTOPS_SANDBOX == "none" else "bwrap"})


def child_path() -> str:
    """PATH for commands: the worker's interpreter first (``python`` is the worker's Python), then its PATH."""
    entries = [os.path.dirname(sys.executable)]
    entries += [e for e in os.environ.get("PATH", "/usr/local/bin:/usr/bin:/bin").split(os.pathsep) if e]
    return os.pathsep.join(dict.fromkeys(entries))


def child_environment(workspace: Path, tmpdir: Path) -> dict[str, str]:
    """The whole environment a command gets: an allow-list, nothing of the worker's own."""
    # No bytecode: a check run in the workspace must not leave files under the approved checks/.
    return {"PATH": child_path(), "HOME": str(workspace), "TMPDIR": str(tmpdir), "LANG": "C.UTF-8",
            "LC_ALL": "C.UTF-8", "TERM": "dumb", "PYTHONDONTWRITEBYTECODE": "1"}


def _python_roots() -> list[str]:
    """The worker's Python (venv and base installation) and the PATH entries, for read-only binds."""
    roots = {sys.prefix, sys.base_prefix, sys.exec_prefix, os.path.dirname(os.path.realpath(sys.executable))}
    for entry in child_path().split(os.pathsep):
        parent = os.path.dirname(entry.rstrip("/"))
        # A venv's bin/ is useless without its lib/: bind the whole venv.
        roots.add(parent if os.path.exists(os.path.join(parent, "pyvenv.cfg")) else entry)
    system = tuple(p + "/" for p in _SYSTEM_READ_ONLY)
    return sorted(r for r in roots if os.path.isdir(r) and not (r + "/").startswith(system))


def bwrap_argv(bwrap: str, argv: Sequence[str], *, workspace: Path, tmpdir: Path, shared_network: bool = False,
               tmp_bytes: int | None = None) -> list[str]:
    """The bubblewrap command line: read-only system and Python, the workspace writable but its
    ``.git`` read-only, no network (``shared_network``: the network it is started in, a session's)."""
    args = [bwrap]
    for path in _SYSTEM_READ_ONLY:
        if os.path.islink(path):  # merged /usr: /bin -> usr/bin
            args += ["--symlink", os.readlink(path), path]
        elif os.path.isdir(path):
            args += ["--ro-bind", path, path]
    args += ["--proc", "/proc", "--dev", "/dev"]
    if tmp_bytes:
        args += ["--size", str(tmp_bytes)]
    args += ["--tmpfs", "/tmp"]
    for root in _python_roots():
        args += ["--ro-bind-try", root, root]
    # Binds apply in order: the writable ones last, so a workspace under /tmp is the real one.
    args += ["--bind", str(workspace), str(workspace), "--bind", str(tmpdir), str(tmpdir)]
    dot_git = workspace / ".git"
    if dot_git.is_dir() and not dot_git.is_symlink():
        # The engine's git reads it: a command may look (git log), never write, rename or replace it.
        args += ["--ro-bind", str(dot_git), str(dot_git)]
    # No --new-session: the command must stay in the process group the timeout signals; its
    # stdin is /dev/null, so there is no terminal to inject input into.
    args += [*([] if shared_network else ["--unshare-net"]), "--unshare-pid", "--unshare-ipc", "--unshare-uts",
             "--unshare-cgroup-try", "--die-with-parent", "--cap-drop", "ALL", "--chdir", str(workspace), "--", *argv]
    return args


def command_line(argv: Sequence[str], *, kind: str, workspace: Path, tmpdir: Path,
                 network: Network | None) -> tuple[list[str], resource_limits.Group | None]:
    """The whole command line of a sandboxed command (limits, then the session's network, then
    bubblewrap for ``kind`` "bwrap", then ``argv``; without bubblewrap there is no network of its
    own) and the control group it joins, made here with the settings' limits (None where the worker
    can make none). The caller removes the group once the command is gone (``Group.remove``)."""
    limits = resource_limits.Limits.from_settings()
    command = list(argv)
    if kind == "bwrap":
        command = bwrap_argv(bwrap_works()[1], argv, workspace=workspace, tmpdir=tmpdir,
                             shared_network=network is not None, tmp_bytes=limits.tmp_bytes)
        if network is not None:
            command = network.enter(command)
    group = resource_limits.group_create(limits)
    return resource_limits.wrap(command, limits, group), group


# --- running -------------------------------------------------------------------------------

def run(argv: Sequence[str], *, workspace: Path, timeout_seconds: float,
        on_wait: Callable[[], None] | None = None, wait_every_seconds: float = 5.0,
        max_output_bytes: int = DEFAULT_MAX_OUTPUT_BYTES, idle_timeout_seconds: float | None = None,
        keep_head_bytes: int = 0, network: Network | None = None) -> Completed:
    """Run ``argv`` in ``workspace``, sandboxed; returns when it and everything it started are gone.

    Past ``timeout_seconds`` the process group gets SIGTERM, then SIGKILL after
    AGENTOPS_SANDBOX_GRACE_SECONDS; the same happens (``idle_timed_out``) when it printed
    nothing for ``idle_timeout_seconds``. Output beyond ``max_output_bytes`` is cut from the front;
    ``keep_head_bytes`` keeps that many of its first bytes as ``head``. With ``network`` (a session's,
    under bubblewrap) it runs in that network instead of none. ``on_wait`` is called every
    ``wait_every_seconds`` while it
    runs (a heartbeat); an exception from it kills the command and propagates.
    Raises FileNotFoundError when the command is not found, SandboxUnavailable as ``isolation`` says.
    """
    if not argv:
        raise ValueError("empty command")
    workspace = Path(workspace).resolve()
    kind = isolation()
    _check_found(argv[0], workspace)
    disk = resource_limits.DiskWatch(workspace)
    tmpdir = Path(tempfile.mkdtemp(dir=workspace.parent, prefix=f".{workspace.name}.tmp-"))
    group: resource_limits.Group | None = None
    disk_full = False
    try:
        command, group = command_line(argv, kind=kind, workspace=workspace, tmpdir=tmpdir, network=network)
        proc = subprocess.Popen(command, cwd=workspace, env=child_environment(workspace, tmpdir),
                                stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                start_new_session=True)
        try:
            raw, cut, timed_out, idled, head, disk_full = _collect(
                proc, deadline=time.monotonic() + timeout_seconds, on_wait=on_wait, wait_every=wait_every_seconds,
                limit=max_output_bytes, spare_leader=kind == "bwrap", idle_seconds=idle_timeout_seconds,
                head_bytes=keep_head_bytes, disk=disk)
        finally:
            _signal_group(proc.pid, signal.SIGKILL)
            proc.wait()
    finally:
        # Whatever the command started goes with it, wherever in the process tree it went.
        hit = group.limit_hit() if group is not None else ""
        hit = hit or ("disk" if disk_full else "")
        if group is not None:
            group.remove()
        shutil.rmtree(tmpdir, ignore_errors=True)
    secrets = secret_values()
    text = redact(raw.decode("utf-8", errors="replace").replace("\x00", "\\x00"), secrets)
    if cut:
        text = f"[… {cut} bytes of output cut …]\n" + _redact_cut(text, secrets)
    head_text = _redact_end(redact(head.decode("utf-8", errors="replace").replace("\x00", "\\x00"), secrets),
                            secrets)
    return Completed(exit_code=proc.returncode, output=text, timed_out=timed_out, isolation=kind, cut_bytes=cut,
                     idle_timed_out=idled, head=head_text, limit_hit=hit)


def _check_found(command: str, workspace: Path) -> None:
    if "/" in command:
        found = (workspace / command).is_file() and os.access(workspace / command, os.X_OK)
    else:
        found = shutil.which(command, path=child_path()) is not None
    if not found:
        raise FileNotFoundError(errno.ENOENT, f"command {command!r} not found", command)


def _collect(proc: subprocess.Popen[bytes], *, deadline: float, on_wait: Callable[[], None] | None,
             wait_every: float, limit: int, spare_leader: bool, idle_seconds: float | None = None,
             head_bytes: int = 0, disk: resource_limits.DiskWatch | None = None,
             ) -> tuple[bytes, int, bool, bool, bytes, bool]:
    """Read the output until the command is gone, enforcing the timeouts and the workspace's disk
    bound; returns (tail, bytes cut, timed out, stopped for silence, the first ``head_bytes`` when
    anything was cut, stopped for disk)."""
    assert proc.stdout is not None
    fd = proc.stdout.fileno()
    os.set_blocking(fd, False)
    buffer, cut, head = bytearray(), 0, bytearray()
    timed_out, idled, eof, disk_full = False, False, False, False
    last_output = time.monotonic()
    kill_at: float | None = None  # SIGKILL the group at this time
    killed_at: float | None = None
    next_wait = time.monotonic() + wait_every
    with selectors.DefaultSelector() as selector:
        selector.register(fd, selectors.EVENT_READ)
        while True:
            now = time.monotonic()
            exited = _exited(proc)
            if exited and eof:
                break
            if on_wait is not None and now >= next_wait:
                on_wait()
                next_wait = now + wait_every
            silent = idle_seconds is not None and now - last_output >= idle_seconds
            if not exited and kill_at is None and (now >= deadline or silent):
                timed_out, idled = now >= deadline, not now >= deadline
                kill_at = now + settings.AGENTOPS_SANDBOX_GRACE_SECONDS
                _signal_group(proc.pid, signal.SIGTERM, spare_leader=spare_leader)
            if not exited and killed_at is None and disk is not None and disk.over(now):
                # No grace: every second it runs it may write more.
                disk_full, kill_at = True, now
            # Once the command is done, whatever it left behind goes too (it may hold the pipe open).
            if killed_at is None and (exited or (kill_at is not None and now >= kill_at)):
                _signal_group(proc.pid, signal.SIGKILL)
                killed_at = now
            if killed_at is not None and now >= killed_at + 5:
                break  # the pipe is held by a process outside the group: stop reading
            if eof:
                time.sleep(0.05)
                continue
            if selector.select(0.2):
                chunk = os.read(fd, 65536)
                eof = not chunk
                buffer += chunk
                last_output = time.monotonic()
                if len(buffer) > 2 * limit:
                    if not cut:
                        head += buffer[:head_bytes]
                    cut += len(buffer) - limit
                    del buffer[:-limit]
    if len(buffer) > limit:
        if not cut:
            head += buffer[:head_bytes]
        cut += len(buffer) - limit
        del buffer[:-limit]
    return bytes(buffer), cut, timed_out, idled, bytes(head), disk_full


def _exited(proc: subprocess.Popen[bytes]) -> bool:
    """Whether the command's first process ended, without reaping it: while it is a zombie its
    process group id cannot be reused, so signalling the group cannot hit a stranger."""
    try:
        return os.waitid(os.P_PID, proc.pid, os.WEXITED | os.WNOHANG | os.WNOWAIT) is not None
    except ChildProcessError:
        return True


def proc_stat(pid: int) -> list[str] | None:
    """The fields of ``/proc/<pid>/stat`` after the command name (``[0]`` is the state, ``[1]`` the
    parent, ``[2]`` the process group, ``[19]`` the start time), or None when the process is gone."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    return stat[stat.rindex(")") + 2:].split()


def _signal_group(pgid: int, sig: signal.Signals, *, spare_leader: bool = False) -> None:
    """Signal the command's process group. With ``spare_leader`` (bubblewrap), bwrap itself and
    its PID namespace's init are left out: they would die at once and SIGKILL the command before
    its grace; SIGKILL goes to the whole group."""
    if not spare_leader:
        try:
            os.killpg(pgid, sig)
        except (ProcessLookupError, PermissionError):
            pass
        return
    members: dict[int, int] = {}
    for entry in os.listdir("/proc"):
        fields = proc_stat(int(entry)) if entry.isdigit() else None
        if fields is not None and int(fields[2]) == pgid:
            members[int(entry)] = int(fields[1])
    for pid, ppid in members.items():
        if pid != pgid and ppid != pgid:
            try:
                os.kill(pid, sig)
            except ProcessLookupError:
                pass
