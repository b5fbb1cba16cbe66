"""The limits as the shipped image has them: a worker that is not root (uid 10001) and may make no
control group. A fork bomb stops at AGENTOPS_SANDBOX_MAX_PROCESSES more tasks (RLIMIT_NPROC, per
user), a memory flood at AGENTOPS_SANDBOX_MEMORY_MB (per process), a disk flood at the workspace's
bound; the worker goes on."""
from __future__ import annotations

import json
import os
import shutil
import stat
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.redteam.conftest import contained, needs_bwrap

UID = 10001
pytestmark = [needs_bwrap, pytest.mark.skipif(os.geteuid() != 0 or shutil.which("setpriv") is None,
                                              reason="needs root and setpriv to start a worker as another user")]

WORKER = """
import json, os, sys
import django
django.setup()
from agentops import sandbox
from agentops.sandbox import limits

workspace = sys.argv[1]
bomb = sandbox.run(["python3", "-c", "import subprocess\\nps = []\\ntry:\\n    while len(ps) < 400:\\n"
                    "        ps.append(subprocess.Popen(['sleep', '20']))\\nexcept OSError as exc:\\n"
                    "    print('refused', exc.strerror)\\nprint('started', len(ps))"],
                   workspace=workspace, timeout_seconds=30)
flood = sandbox.run(["python3", "-c", "x = bytearray(600 * 1024 * 1024); print('allocated')"],
                    workspace=workspace, timeout_seconds=30)
disk = sandbox.run(["python3", "-c", "import os, time\\nfor n in range(200):\\n    open(f'f{n}', 'wb').write("
                    "os.urandom(1 << 20)); time.sleep(0.02)"], workspace=workspace, timeout_seconds=30)
print(json.dumps({"uid": os.geteuid(), "cgroup": limits.cgroup_kind()[0], "isolation": bomb.isolation,
                  "bomb": bomb.output, "flood": [flood.exit_code, flood.output[-300:]],
                  "disk": disk.limit_hit, "left": limits.user_tasks(os.getuid())}))
"""


def as_worker(*command: str) -> list[str]:
    return ["setpriv", f"--reuid={UID}", f"--regid={UID}", "--clear-groups", *command]


@pytest.fixture
def reachable() -> Iterator[None]:
    """The project and its virtualenv reachable by the worker's user for the test's length: a clone
    made in a private directory (``mktemp -d``, mode 0700) gets the search bit (o+x, not read) on
    each directory above them that lacks it, and its mode back afterwards."""
    repo = Path(__file__).resolve().parents[2]
    changed: dict[Path, int] = {}
    for top in (repo, Path(sys.prefix)):
        for directory in (top, *top.parents):
            mode = directory.stat().st_mode
            if not mode & stat.S_IXOTH and directory not in changed:
                changed[directory] = stat.S_IMODE(mode)
                directory.chmod(stat.S_IMODE(mode) | stat.S_IXOTH)
    try:
        yield
    finally:
        for directory, mode in changed.items():
            directory.chmod(mode)


@pytest.fixture
def home(reachable: None) -> Iterator[Path]:
    """A directory the worker's user owns, where it can reach it (pytest's are the root user's alone)."""
    path = Path(tempfile.mkdtemp(prefix="agentops-uid-"))
    os.chown(path, UID, UID)
    yield path
    shutil.rmtree(path, ignore_errors=True)


def test_a_non_root_worker_without_a_control_group_still_bounds_processes_memory_and_disk(home: Path):
    tmp_path = home
    workspace = tmp_path / "ws"
    workspace.mkdir()
    os.chown(workspace, UID, UID)
    env = {"PATH": os.environ["PATH"], "DJANGO_SETTINGS_MODULE": "agentops.settings", "HOME": str(tmp_path),
           "AGENTOPS_VAR_DIR": str(tmp_path / "var"), "AGENTOPS_SANDBOX": "bwrap",
           "AGENTOPS_SANDBOX_MAX_PROCESSES": "40", "AGENTOPS_SANDBOX_MEMORY_MB": "256",
           "AGENTOPS_SANDBOX_WORKSPACE_MB": "50", "AGENTOPS_SANDBOX_GRACE_SECONDS": "1",
           "PYTHONPATH": str(Path(__file__).resolve().parents[2])}
    done = subprocess.run(as_worker(sys.executable, "-c", WORKER, str(workspace)), env=env, cwd=tmp_path,
                          capture_output=True, text=True, timeout=180, check=False)
    assert done.returncode == 0, done.stderr[-3000:]
    seen = json.loads(done.stdout.strip().splitlines()[-1])

    assert (seen["uid"], seen["cgroup"], seen["isolation"]) == (UID, "none", "bwrap")
    started = int(seen["bomb"].split("started")[-1])
    assert "refused Resource temporarily unavailable" in seen["bomb"] and started <= 40, seen["bomb"]
    assert seen["flood"][0] != 0 and "allocated" not in seen["flood"][1], seen["flood"]
    assert seen["disk"] == "disk"
    assert seen["left"] < 10  # nothing the commands started outlived them
    contained("a non-root worker with no control group: fork bomb, memory and disk floods",
              "RLIMIT_NPROC per user, RLIMIT_AS per process, the workspace's disk bound")
