"""The autonomous agent's tools under bubblewrap: the same escapes, each refused or contained."""
from __future__ import annotations

import os
from pathlib import Path

import pytest

from agentops.agents.autonomous.activities import run_tool_isolated
from tests.redteam.conftest import SECRET, contained, needs_bwrap, running

pytestmark = needs_bwrap


@pytest.fixture
def root(tmp_path: Path, settings) -> Path:
    settings.AGENTOPS_SANDBOX = "bwrap"
    settings.AGENTOPS_SANDBOX_GRACE_SECONDS = 1.0
    settings.AGENTOPS_SANDBOX_MEMORY_MB = 256
    settings.AGENTOPS_SANDBOX_MAX_PROCESSES = 64
    path = (tmp_path / "wf-1").resolve()
    path.mkdir()
    return path


def command(root: Path, line: str, timeout: int = 20) -> tuple[bool, str]:
    ok, output, isolation = run_tool_isolated(root, "run_command", {"command": line, "timeout_seconds": timeout})
    assert isolation == "bwrap"
    return ok, output


def test_links_out_of_the_workspace_are_refused(root, outside):
    command(root, f"ln -s {outside} out")
    command(root, f"ln -s {outside}/secret.txt leak")
    for name, args in [("read_file", {"path": "leak"}), ("write_file", {"path": "out/x", "content": "x"}),
                       ("list_files", {"path": "out"}), ("read_file", {"path": "../outside/secret.txt"})]:
        ok, output, _ = run_tool_isolated(root, name, args)
        assert not ok and "outside the workspace" in output and SECRET not in output, (name, output)
    assert sorted(p.name for p in outside.iterdir()) == ["secret.txt"]
    contained("autonomous: links and ../ out of the workspace",
              "file tools refuse ../, absolute paths and links (sandbox/files.py)")


def test_a_hard_link_is_never_written_through(root, tmp_path):
    """Without bubblewrap a model could link a file of the worker into its workspace; the tools never write one."""
    victim = tmp_path / "victim.txt"
    victim.write_text("the worker's file\n")
    os.link(victim, root / "linked.txt")
    ok, output, _ = run_tool_isolated(root, "write_file", {"path": "linked.txt", "content": "owned"})
    assert not ok and "hard link" in output and victim.read_text() == "the worker's file\n"
    contained("autonomous: write_file through a hard link", "tool layer refuses files with a second name")


def test_the_workers_secrets_and_processes_are_out_of_reach(root, worker_secret):
    worker = os.getpid()
    outputs = [command(root, f"cat /proc/{worker}/environ")[1], command(root, "sh -c 'env; cat /proc/1/environ'")[1],
               command(root, f"kill -9 {worker}")[1]]
    assert all(worker_secret not in o and "[redacted]" not in o for o in outputs), outputs
    assert "No such file" in outputs[0] and "No such process" in outputs[2]
    contained("autonomous: the worker's environ, env, signals", "bubblewrap PID namespace, allow-listed environment")


def test_no_network_and_no_survivors(root):
    probe = "import socket\nfor p in (5432, 6379):\n    s = socket.socket(); s.settimeout(2)\n    " \
            "print(p, s.connect_ex(('127.0.0.1', p)))\n"
    (root / "net.py").write_text(probe)
    ok, output = command(root, "python net.py")
    assert "5432 0" not in output and "6379 0" not in output and "5432 " in output, output
    command(root, "sh -c 'setsid sleep 4545 > /dev/null 2>&1 &'")
    assert running("sleep 4545") == []
    contained("autonomous: network and background survivors", "no network in bubblewrap; PID namespace")


def test_floods_are_bounded(root):
    (root / "bomb.py").write_text("import os\nwhile True:\n    try:\n        os.fork()\n    except OSError:\n"
                                  "        pass\n")
    ok, output = command(root, "python bomb.py", timeout=5)
    assert not ok and running("bomb.py") == [] and ("limit of 64 processes" in output or "timed out" in output)
    ok, output = command(root, "python -c 'b = bytearray(1024 * 1024 * 1024)'")
    assert not ok and ("memory limit (256 MB)" in output or "MemoryError" in output), output
    contained("autonomous: fork bomb and memory flood", "the command's control group (pids.max, memory limit)")
