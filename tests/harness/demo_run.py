"""The `todo` demo of docs/harness.md driven to `completed` once per pytest run (about 40 s), for the tests
that read it: tests/harness/test_demo.py asserts what the run did, tests/admin/test_harness_panel.py what
the admin page shows of it.

The first test that asks runs the demo in its own (transactional) database and keeps what the run
left: its rows, serialized for ``loaddata``, and a copy of its workspaces directory. Every later test
loads the rows into its empty database and gets the directory back as it was at the end of the run,
so a test may change either (one deletes the workspace) without the next seeing it."""
from __future__ import annotations

import json
import shutil
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from django.apps import apps
from django.contrib.auth.models import Group, User
from django.core import serializers
from django.core.management import call_command
from django.db.models import Model

from agentops.kind.presentation import Workflow
from agentops.kind.testing import launch, resume
from tests.harness.conftest import approve_feature_list, drive_all

# Each feature gets two attempts, so F09's second red session pauses the run for a person (H8).
DEMO_PARAMS = {"max_attempts": "2"}
# The worker "dies" after F03's second session wrote todo.py and before it committed.
KILL_F03_SESSION = [{"point": "harness.after_tool", "action": "raise",
                     "when": {"tool": "write_file", "feature": "F03", "feature_attempt": 2, "attempt": 1}}]


@dataclass
class DemoRun:
    """The completed run as a template: where its files are, its rows, and what it took."""

    root: Path
    workflow_id: int
    wall_seconds: float

    @property
    def workspaces(self) -> Path:
        return self.root / "workspaces"

    @property
    def pristine(self) -> Path:
        return self.root / "pristine"

    @property
    def rows(self) -> Path:
        return self.root / "rows.json"


_built: dict[str, DemoRun] = {}


def todo_demo(settings: Any, tmp_path_factory: pytest.TempPathFactory) -> tuple[Workflow, DemoRun]:
    """The completed demo in this test's database and workspaces directory (built by the first caller).

    The caller's test needs a transactional database: the run's heartbeats write from a thread of
    their own, on a connection of their own."""
    run = _built.get("todo")
    root = run.root if run else tmp_path_factory.mktemp("todo-demo")
    settings.AGENTOPS_WORKSPACE_DIR = root / "workspaces"
    settings.AGENTOPS_MODEL_PROVIDER = "scripted"
    settings.AGENTOPS_TESTING_FAULTS = json.dumps(KILL_F03_SESSION)
    settings.AGENTOPS_FAULT_LOG = str(root / "faults.log")
    if run is None:
        started = time.monotonic()
        workflow_id = _run_to_completed()
        _built["todo"] = run = DemoRun(root=root, workflow_id=workflow_id, wall_seconds=time.monotonic() - started)
        run.rows.write_text(serializers.serialize("json", _rows_of_the_run()))
        shutil.copytree(run.workspaces, run.pristine, symlinks=True)
    else:
        call_command("loaddata", str(run.rows), verbosity=0)
        shutil.rmtree(run.workspaces, ignore_errors=True)
        shutil.copytree(run.pristine, run.workspaces, symlinks=True)
    return Workflow.objects.get(pk=run.workflow_id), run


def _run_to_completed() -> int:
    """Launch, approve the feature list, resume after F09's feature-budget pause; what each stop shows
    on the way is asserted here (the tests see only the end)."""
    hana = User.objects.create_user("hana", password="hana-password")
    hana.groups.add(Group.objects.get_or_create(name="harness-approvers")[0])
    wf = launch("harness", goal="Build the todo CLI of the demo", params=DEMO_PARAMS)
    workflow = drive_all(wf.pk)
    assert (workflow.status, workflow.current_node) == ("waiting", "WAIT_FOR_APPROVAL")
    assert all(f["status"] == "failing" for f in workflow.state["features"])  # all red on the scaffold
    assert workflow.state["isolation"]["level"] == "bwrap"  # H7: probed and recorded
    approve_feature_list(wf.pk, hana)
    workflow = drive_all(wf.pk)
    # H8: F09's second red session used its feature budget (2 attempts): a pause for a person.
    assert (workflow.status, workflow.pause_cause, workflow.current_node) == ("paused", "definition", "DECIDE")
    assert "feature F09 used its 2 attempts" in workflow.reason
    resume(wf, by="hana")
    workflow = drive_all(wf.pk)
    assert workflow.status == "completed", (workflow.status, workflow.reason, workflow.state.get("progress"))
    return wf.pk


def _rows_of_the_run() -> Iterator[Model]:
    """What the run wrote: the workflows app's rows and its approver (not the users a test adds)."""
    yield from Group.objects.filter(name="harness-approvers")
    yield from User.objects.filter(username="hana")
    for model in apps.get_app_config("workflows").get_models():
        if model._meta.managed and not model._meta.proxy:
            yield from model._base_manager.order_by("pk")
