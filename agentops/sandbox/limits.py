"""What one sandboxed command may use: memory, processes, file size and /tmp (docs/security.md, "Limits").

Every command runs under ``prlimit`` (no core dumps; the size of one file it writes; without a
control group, an address-space limit per process) and, where the worker may create one, in a
control group of its own with a memory limit and a process limit: a fork bomb meets
``pids.max``, a runaway allocation the group's memory limit, and whatever the command started
is killed with the group when it ends, wherever in the process tree it went.

The control group is cgroup v1's ``pids`` and ``memory`` hierarchies under ``/sys/fs/cgroup``
(found when writable), or a delegated cgroup v2 directory that AGENTOPS_SANDBOX_CGROUP names.
The command is placed in it before it runs (a shell line writes its own pid into
``cgroup.procs`` and ``exec``\\ s the rest), so nothing it forks escapes the group.
"""
from __future__ import annotations

import functools
import logging
import os
import signal
import time
import uuid
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from django.conf import settings

logger = logging.getLogger("agentops.sandbox")

V1_ROOT = Path("/sys/fs/cgroup")
PARENT = "agentops"
MB = 1024 * 1024
# Joins the control groups named before "--", then becomes the command after it.
_JOIN = 'while [ "$1" != -- ]; do echo $$ > "$1" || exit 125; shift; done; shift; exec "$@"'


@dataclass(frozen=True)
class Limits:
    memory_bytes: int
    processes: int
    file_bytes: int
    tmp_bytes: int

    @classmethod
    def from_settings(cls) -> Limits:
        return cls(memory_bytes=settings.AGENTOPS_SANDBOX_MEMORY_MB * MB,
                   processes=settings.AGENTOPS_SANDBOX_MAX_PROCESSES,
                   file_bytes=settings.AGENTOPS_SANDBOX_MAX_FILE_MB * MB,
                   tmp_bytes=settings.AGENTOPS_SANDBOX_TMP_MB * MB)


@dataclass
class Group:
    """The control group(s) of one command: one directory per hierarchy (v1) or one (v2)."""

    dirs: list[Path]
    v2: bool

    def limit_hit(self) -> str:
        """``memory`` when the kernel killed a process of the group for memory, ``processes`` when
        a fork was refused at the process limit, else ""."""
        for path in self.dirs:
            if _count(path / ("memory.events" if self.v2 else "memory.oom_control"), "oom_kill"):
                return "memory"
        for path in self.dirs:
            if _count(path / "pids.events", "max"):
                return "processes"
        return ""

    def kill_all(self) -> None:
        """SIGKILL every process in the group until none is left (a fork bomb keeps forking until it is)."""
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            pids = {int(p) for path in self.dirs for p in _read(path / "cgroup.procs").split()}
            if not pids:
                return
            for pid in pids:
                try:
                    os.kill(pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
            time.sleep(0.02)
        logger.warning("sandbox.cgroup_not_emptied", extra={"cgroup": [str(p) for p in self.dirs]})

    def remove(self) -> None:
        self.kill_all()
        for path in self.dirs:
            for _ in range(50):  # the last processes may still be exiting
                try:
                    path.rmdir()
                    break
                except FileNotFoundError:
                    break
                except OSError:
                    time.sleep(0.02)


def _read(path: Path) -> str:
    try:
        return path.read_text()
    except OSError:
        return ""


def _count(path: Path, key: str) -> int:
    for line in _read(path).splitlines():
        name, _, value = line.partition(" ")
        if name == key and value.strip().isdigit():
            return int(value)
    return 0


@functools.cache
def cgroup_kind() -> tuple[str, str]:
    """Where this worker makes its commands' control groups: ("v1", root), ("v2", directory) or
    ("none", why), checked once per process and logged when there is none."""
    setting = settings.AGENTOPS_SANDBOX_CGROUP
    if setting == "none":
        return "none", "AGENTOPS_SANDBOX_CGROUP=none"
    if setting != "auto":
        base = Path(setting)
        controllers = _read(base / "cgroup.subtree_control").split()
        if not {"memory", "pids"} <= set(controllers):
            found = ("none", f"AGENTOPS_SANDBOX_CGROUP={setting} must be a cgroup v2 directory with the memory and "
                             "pids controllers in its cgroup.subtree_control")
            logger.warning("sandbox.cgroup_unavailable", extra={"detail": found[1]})
            return found
        return "v2", setting
    try:
        for hierarchy in ("pids", "memory"):
            parent = V1_ROOT / hierarchy / PARENT
            parent.mkdir(exist_ok=True)
            if not os.access(parent, os.W_OK | os.X_OK):  # made by another user (a root process before)
                raise PermissionError(13, "Permission denied", str(parent))
    except OSError as exc:
        logger.warning("sandbox.cgroup_unavailable", extra={"detail": str(exc)})
        return "none", f"no writable cgroup v1 pids and memory hierarchies ({exc.strerror})"
    return "v1", str(V1_ROOT)


def group_create(limits: Limits) -> Group | None:
    """A new control group with ``limits``, or None where this worker can make none."""
    kind, where = cgroup_kind()
    if kind == "none":
        return None
    name = f"cmd-{uuid.uuid4().hex[:16]}"
    group = Group(dirs=[], v2=kind == "v2")
    try:
        if kind == "v2":
            path = Path(where) / name
            path.mkdir()
            group.dirs.append(path)
            _write(path, memory="memory.max", swap="memory.swap.max", pids="pids.max", limits=limits)
            return group
        for hierarchy in ("pids", "memory"):
            path = V1_ROOT / hierarchy / PARENT / name
            path.mkdir()
            group.dirs.append(path)
        pids, memory = group.dirs
        (pids / "pids.max").write_text(str(limits.processes))
        _write(memory, memory="memory.limit_in_bytes", swap="memory.memsw.limit_in_bytes", pids="", limits=limits)
        return group
    except OSError as exc:
        logger.warning("sandbox.cgroup_failed", extra={"detail": str(exc)})
        group.remove()
        return None


def _write(path: Path, *, memory: str, swap: str, pids: str, limits: Limits) -> None:
    (path / memory).write_text(str(limits.memory_bytes))
    if (path / swap).exists():  # v1: memory and swap together; v2: no swap at all
        (path / swap).write_text(str(limits.memory_bytes) if swap.startswith("memory.memsw") else "0")
    if pids:
        (path / pids).write_text(str(limits.processes))


def wrap(argv: Sequence[str], limits: Limits, group: Group | None) -> list[str]:
    """``argv`` under ``prlimit`` and, with ``group``, joined to the control group before it runs.

    Without a group: memory is an address-space limit per process, and for a worker that is not
    root (the image's) processes are bounded by ``RLIMIT_NPROC``, which the kernel counts per user:
    the user's tasks now plus AGENTOPS_SANDBOX_MAX_PROCESSES, so a fork bomb stops there. A root
    worker is exempt from it; it has a cgroup v1 hierarchy to write instead (``cgroup_kind``)."""
    rlimits = ["prlimit", "--core=0", f"--fsize={limits.file_bytes}"]
    if group is None:
        rlimits.append(f"--as={limits.memory_bytes}")  # per process: the best there is without a group
        if os.geteuid() != 0:
            rlimits.append(f"--nproc={user_tasks(os.getuid()) + limits.processes}")
    command = [*rlimits, "--", *argv]
    if group is None:
        return command
    return ["/bin/sh", "-c", _JOIN, "sh", *(str(path / "cgroup.procs") for path in group.dirs), "--", *command]


def user_tasks(uid: int) -> int:
    """How many tasks (processes and their threads) the user ``uid`` runs: what RLIMIT_NPROC counts."""
    count = 0
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit():
            continue
        try:
            if entry.stat().st_uid == uid:
                count += len(os.listdir(f"/proc/{entry.name}/task"))
        except OSError:
            continue  # gone
    return count


# --- a workspace's disk use ----------------------------------------------------------------

def disk_use_bytes(root: Path) -> int:
    """The disk a workspace takes (its ``.git`` included): allocated blocks, each file counted once
    however many names it has, links never followed. Walked by directory descriptors, so a
    directory swapped for a link mid-walk is not entered."""
    seen: set[tuple[int, int]] = set()
    total = 0
    for _dir, dirs, files, dir_fd in os.fwalk(root, follow_symlinks=False):
        for name in [*dirs, *files]:
            try:
                st = os.stat(name, dir_fd=dir_fd, follow_symlinks=False)
            except OSError:
                continue  # gone since it was listed
            if (st.st_dev, st.st_ino) not in seen:
                seen.add((st.st_dev, st.st_ino))
                total += st.st_blocks * 512
    return total


def workspace_bound_bytes() -> int:
    return int(settings.AGENTOPS_SANDBOX_WORKSPACE_MB) * MB


def room_check(root: Path, *, adding_bytes: int) -> None:
    """Raise PermissionError when writing ``adding_bytes`` more would take the workspace past
    AGENTOPS_SANDBOX_WORKSPACE_MB (the engine's own write tools ask before they write)."""
    used, bound = disk_use_bytes(root), workspace_bound_bytes()
    if used + adding_bytes > bound:
        raise PermissionError(f"the workspace uses {used / MB:,.1f} MB of its {bound // MB:,} MB "
                              f"(AGENTOPS_SANDBOX_WORKSPACE_MB); remove files before writing more")


class DiskWatch:
    """Whether a running command took its workspace past the bound: past AGENTOPS_SANDBOX_WORKSPACE_MB,
    or past what the workspace already used when the command started if that was more (a command
    may always run in a workspace already over, it may not grow it). Walks at most every
    ``every_seconds``, and less often when a walk is slow (never more than a tenth of the time)."""

    def __init__(self, root: Path, *, every_seconds: float = 2.0) -> None:
        self.root, self.every = root, every_seconds
        self.bound = max(workspace_bound_bytes(), self._measure())
        self.next_at = time.monotonic() + self.every

    def _measure(self) -> int:
        started = time.monotonic()
        used = disk_use_bytes(self.root)
        self.every = max(self.every, 10 * (time.monotonic() - started))
        return used

    def over(self, now: float) -> bool:
        if now < self.next_at:
            return False
        self.next_at = now + self.every
        return self._measure() > self.bound
