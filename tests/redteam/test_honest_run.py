"""An honest coder who runs the approved checks in the workspace is never taken for a tamperer: the
bytecode a check's import leaves is neither written nor committed, and no revert is recorded."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from agentops.agents.harness import gitops
from tests.harness.conftest import (
    APP_BOTH,
    APP_GREET,
    APP_STUB,
    MINI_FEATURES,
    commit,
    events,
    launch_approved,
    request_pass,
    write,
)
from workflows.models import Workflow

pytestmark = pytest.mark.django_db(transaction=True)

LIB = "import subprocess, sys\n\ndef says(cmd):\n    done = subprocess.run([sys.executable, 'app.py', cmd], " \
      "capture_output=True, text=True)\n    return done.stdout.strip()\n"
CHECK = "import sys\nfrom _lib import says\nsys.exit(0 if says('{cmd}') == '{want}' else 1)\n"


def run(command: str) -> dict[str, object]:
    return {"tool": "run_command", "input": {"command": command}}


def test_running_the_checks_in_the_workspace_is_not_tampering(harness_approver, mini_schedule):
    init = [write("features.json", json.dumps(MINI_FEATURES, indent=1)), write("checks/_lib.py", LIB),
            write("checks/check_f01.py", CHECK.format(cmd="greet", want="hello")),
            write("checks/check_f02.py", CHECK.format(cmd="shout", want="HELLO")),
            write("checks/smoke.sh", "python checks/check_f01.py || true\n"), write("init.sh", "true\n"),
            write("app.py", APP_STUB), run("python checks/check_f01.py"), commit("scaffold"),
            {"tool": "end_session", "input": {"summary": "scaffold"}}]
    mini_schedule({"INIT/1": init,
                   "F01/1": [write("app.py", APP_GREET), run("python checks/check_f01.py"),
                             run("python -m py_compile checks/_lib.py"), commit("F01"), request_pass("F01")],
                   "F02/1": [write("app.py", APP_BOTH), run("python checks/check_f02.py"), commit("F02"),
                             request_pass("F02")]})
    wf = launch_approved(harness_approver)
    wf.refresh_from_db()
    assert wf.status == Workflow.Status.COMPLETED, (wf.status, wf.current_node)
    assert events(wf.pk, "harness.tamper_reverted") == []
    root = Path(wf.state["workspace"])
    contract = gitops.git(root, "ls-tree", "-r", "--name-only", "HEAD", "--", "checks")
    assert "__pycache__" not in contract and ".pyc" not in contract, contract
