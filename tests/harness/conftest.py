"""Fixtures for the harness kind: a workspace directory, an approver, driving a workflow to its approval, and a
two-feature project whose scripted sessions each test writes."""
from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from django.contrib.auth.models import Group, User

from agentops.kind import testing as kit
from agentops.kind.presentation import Workflow


@pytest.fixture(autouse=True)
def harness_workspaces(tmp_path: Path, settings: Any) -> Path:
    settings.AGENTOPS_WORKSPACE_DIR = tmp_path / "workspaces"
    settings.AGENTOPS_MODEL_PROVIDER = "scripted"
    return tmp_path / "workspaces"


@pytest.fixture
def harness_approver(db: None) -> User:
    user = User.objects.create_user("hana", password="hana-password")
    user.groups.add(Group.objects.get_or_create(name="harness-approvers")[0])
    return user


def drive_all(workflow_id: int) -> Workflow:
    """The kit's ``drive``: the harness and its children to their next wait, each retry window
    opened at once (no clock waits in tests)."""
    return kit.drive(workflow_id, max_rounds=400, retry_now=True)


def approve_feature_list(workflow_id: int, user: User) -> None:
    kit.approve(workflow_id, by=user.username)


# A two-feature project for the guard tests: `python app.py greet` prints hello (F01), `python
# app.py shout` prints HELLO (F02); the smoke check greets. Solutions are whole files of app.py.
CHECK_TEMPLATE = """import subprocess, sys
done = subprocess.run([sys.executable, "app.py", "{cmd}"], capture_output=True, text=True)
print(done.stdout + done.stderr)
sys.exit(0 if done.stdout.strip() == "{want}" else 1)
"""
MINI_FEATURES = [
    {"id": "F01", "description": "app.py greet prints hello", "steps": ["python app.py greet"], "priority": 1,
     "check": "python checks/check_f01.py", "passes": False},
    {"id": "F02", "description": "app.py shout prints HELLO", "steps": ["python app.py shout"], "priority": 2,
     "check": "python checks/check_f02.py", "passes": False},
]
APP_STUB = "import sys\nsys.exit(1)\n"
APP_GREET = "import sys\nif sys.argv[1] == 'greet':\n    print('hello')\n"
APP_BOTH = APP_GREET + "if sys.argv[1] == 'shout':\n    print('HELLO')\n"


def write(path: str, content: str) -> dict[str, Any]:
    return {"tool": "write_file", "input": {"path": path, "content": content}}


def commit(message: str = "work") -> dict[str, Any]:
    return {"tool": "git_commit", "input": {"message": message}}


def request_pass(feature: str) -> dict[str, Any]:
    return {"tool": "request_pass", "input": {"feature_id": feature}}


def solve(feature: str, app: str) -> list[dict[str, Any]]:
    return [write("app.py", app), commit(f"{feature}: implement"), request_pass(feature)]


MINI_INIT = [
    write("features.json", json.dumps(MINI_FEATURES, indent=1)),
    write("checks/check_f01.py", CHECK_TEMPLATE.format(cmd="greet", want="hello")),
    write("checks/check_f02.py", CHECK_TEMPLATE.format(cmd="shout", want="HELLO")),
    write("checks/smoke.sh", "python app.py greet | grep -q hello\n"),
    write("init.sh", "python -c 'import sys; assert sys.version_info >= (3, 10)'\n"),
    write("app.py", APP_STUB),
    commit("scaffold"),
    {"tool": "end_session", "input": {"summary": "scaffold"}},
]


def write_schedule(path: Path, sessions: dict[str, list[dict[str, Any]]]) -> Path:
    """A schedule file for AGENTOPS_HARNESS_SCHEDULE_FILE: MINI_INIT, then ``sessions``."""
    path.write_text(json.dumps({"sessions": {"INIT/1": MINI_INIT, **sessions}}))
    return path


@pytest.fixture
def mini_schedule(settings: Any, tmp_path: Path) -> Callable[[dict[str, list[dict[str, Any]]]], None]:
    """Play the scripted provider from the given sessions (keyed feature/attempt) after MINI_INIT."""

    def use(sessions: dict[str, list[dict[str, Any]]]) -> None:
        settings.AGENTOPS_HARNESS_SCHEDULE_FILE = str(write_schedule(tmp_path / "schedule.json", sessions))

    return use


def launch_approved(user: User, **params: Any) -> Workflow:
    """Launch a harness on the mini project, approve its feature list, drive it until it rests."""
    wf = drive_all(kit.launch("harness", goal="Build app.py", params={k: str(v) for k, v in params.items()}).pk)
    kit.approve(wf, by=user.username)
    return drive_all(wf.pk)


def events(workflow_id: int, kind: str) -> list[dict[str, Any]]:
    return [event.data for event in kit.events(workflow_id, kind)]
