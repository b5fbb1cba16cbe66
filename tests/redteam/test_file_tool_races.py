"""The engine's file tools against a workspace changing under them.

The file tools run in the worker, outside the sandbox, while a service the model started may
still run inside it. Here a process swaps a workspace directory with a link to a directory
outside (``renameat2(RENAME_EXCHANGE)`` in a tight loop, as a sandboxed service could) while
every file tool is called on a path through that directory: nothing outside is ever read,
listed or written. And special files the model can make (a FIFO, a socket) never hang a tool.
"""
from __future__ import annotations

import ctypes
import os
import socket
import subprocess
import sys
import textwrap
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from agentops.agents.autonomous.activities import run_tool
from agentops.agents.harness import tools
from agentops.sandbox import files
from tests.redteam.conftest import SECRET, contained

CALLS = 1_000
EDIT = "value = 1\n"

# A service inside the sandbox, reduced to its attack: exchange two names as fast as it can.
SWAPPER = textwrap.dedent("""
    import ctypes, os, platform, sys
    libc = ctypes.CDLL(None, use_errno=True)
    a, b = os.fsencode(sys.argv[1]), os.fsencode(sys.argv[2])
    AT_FDCWD, RENAME_EXCHANGE = -100, 2
    if hasattr(libc, "renameat2"):
        swap = lambda: libc.renameat2(AT_FDCWD, a, AT_FDCWD, b, RENAME_EXCHANGE)
    else:
        number = {"x86_64": 316, "aarch64": 276}[platform.machine()]
        swap = lambda: libc.syscall(number, AT_FDCWD, a, AT_FDCWD, b, RENAME_EXCHANGE)
    if swap() != 0:
        sys.exit(f"renameat2: {os.strerror(ctypes.get_errno())}")
    print("swapping", flush=True)
    while True:
        swap()
""")


def _exchange_works(tmp: Path) -> bool:
    (tmp / "x").mkdir()
    (tmp / "y").symlink_to(tmp)
    libc = ctypes.CDLL(None, use_errno=True)
    args = (-100, bytes(tmp / "x"), -100, bytes(tmp / "y"), 2)
    done = libc.renameat2(*args) if hasattr(libc, "renameat2") else libc.syscall(
        {"x86_64": 316, "aarch64": 276}.get(os.uname().machine, -1), *args)
    return bool(done == 0)


@pytest.fixture
def workspace(tmp_path: Path, outside: Path) -> Path:
    """``work/sub`` a directory of the workspace, ``work/link`` a link to ``outside``; both hold
    ``secret.txt`` (the real secret outside) and ``edit.txt`` with the same text, so an edit that
    lands outside succeeds and shows; only ``outside`` holds ``only-outside.txt``."""
    if not _exchange_works(tmp_path):
        pytest.skip("renameat2(RENAME_EXCHANGE) does not work here")
    root = (tmp_path / "ws").resolve()
    (root / "work" / "sub").mkdir(parents=True)
    (root / "work" / "sub" / "secret.txt").write_text("not the secret\n")
    (root / "work" / "sub" / "edit.txt").write_text(EDIT)
    (outside / "edit.txt").write_text(EDIT)
    (outside / "only-outside.txt").write_text("listed only by a tool that went outside\n")
    (root / "work" / "link").symlink_to(outside)
    return root


@pytest.fixture
def swapping(workspace: Path) -> Iterator[None]:
    proc = subprocess.Popen([sys.executable, "-c", SWAPPER, str(workspace / "work" / "sub"),
                             str(workspace / "work" / "link")], stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    assert proc.stdout is not None and proc.stdout.readline() == b"swapping\n", proc.stderr
    try:
        yield
    finally:
        proc.kill()
        proc.wait()


@pytest.fixture(params=["openat2", "fallback"])
def opening(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    if request.param == "openat2" and not files.openat2_used():
        pytest.skip("this kernel has no openat2")
    monkeypatch.setattr(files, "FORCE_FALLBACK", request.param == "fallback")
    return str(request.param)


def snapshot(outside: Path) -> dict[str, tuple[bytes, int, int]]:
    return {p.name: (p.read_bytes(), p.stat().st_ino, p.stat().st_mtime_ns) for p in outside.iterdir()}


def harness(root: Path, tmp_path: Path) -> Callable[[str, dict[str, Any]], tuple[bool, str]]:
    session = tools.Session(root=root, operation_id="op", feature="F01", service_dir=tmp_path / "services")
    return lambda name, args: tools.call(session, name, args)


def autonomous(root: Path, tmp_path: Path) -> Callable[[str, dict[str, Any]], tuple[bool, str]]:
    return lambda name, args: run_tool(root, name, args)


CASES = [
    (harness, "read_file", {"path": "work/sub/secret.txt"}),
    (harness, "list_files", {"path": "work/sub"}),
    (harness, "write_file", {"path": "work/sub/new.txt", "content": "written\n"}),
    (harness, "str_replace", {"path": "work/sub/edit.txt", "old_str": EDIT, "new_str": EDIT}),
    (harness, "insert", {"path": "work/sub/edit.txt", "insert_line": 0, "text": "# inserted"}),
    (autonomous, "read_file", {"path": "work/sub/secret.txt"}),
    (autonomous, "list_files", {"path": "work/sub"}),
    (autonomous, "write_file", {"path": "work/sub/new.txt", "content": "written\n"}),
]


@pytest.mark.parametrize(("layer", "name", "args"), CASES, ids=[f"{c[0].__name__}-{c[1]}" for c in CASES])
def test_a_directory_swapped_for_a_link_never_carries_a_tool_outside(layer, name, args, workspace, outside, tmp_path,
                                                                       opening, swapping):
    """Each tool, 1,000 times against the swap: no secret read or listed, nothing outside written."""
    before = snapshot(outside)
    call = layer(workspace, tmp_path)
    leaked = landed = succeeded = 0
    started = time.monotonic()
    last = before
    for _ in range(CALLS):
        ok, output = call(name, args)
        leaked += SECRET in output or "only-outside.txt" in output
        succeeded += ok
        if name not in ("read_file", "list_files"):
            now = snapshot(outside)
            landed += now != last
            last = now
    elapsed = time.monotonic() - started
    after = snapshot(outside)
    changed = sorted(n for n in set(before) | set(after) if before.get(n) != after.get(n))
    print(f"{layer.__name__} {name} ({opening}): {CALLS} calls in {elapsed:.2f} s, {succeeded} succeeded, "
          f"{leaked} read outside, {landed} wrote outside ({changed})")
    assert (leaked, landed, changed) == (0, 0, []), (
        f"{leaked} of {CALLS} calls read outside, {landed} wrote outside; files changed outside: {changed}")
    contained(f"swap a directory for a link during {layer.__name__} {name} (race)",
              "held directory fds, openat2 RESOLVE_BENEATH|NO_SYMLINKS or O_NOFOLLOW per component")


@pytest.mark.parametrize("kind", ["fifo", "socket"])
def test_a_fifo_or_socket_in_the_workspace_is_refused_at_once(kind, workspace, tmp_path, opening):
    """A FIFO nobody writes would block a plain open for reading forever; the tools refuse it at once."""
    path = workspace / "work" / "sub" / "special"
    if kind == "fifo":
        os.mkfifo(path)
    else:
        server = socket.socket(socket.AF_UNIX)
        server.bind(str(path))
    for call in (harness(workspace, tmp_path), autonomous(workspace, tmp_path)):
        for name, args in [("read_file", {"path": "work/sub/special"}),
                           ("write_file", {"path": "work/sub/special", "content": "x"})]:
            started = time.monotonic()
            ok, output = call(name, args)
            assert not ok and f"is a {kind.upper() if kind == 'fifo' else kind}, not a regular file" in output, output
            assert time.monotonic() - started < 1.0
    assert kind == "fifo" or path.exists()
    contained(f"a {kind} in the workspace, read_file / write_file", "regular files only, opened O_NONBLOCK")
