"""H4 (docs/harness.md) + the short session lease: a worker SIGKILLed in the middle of a coding session.

Real workers and beat, the two-feature project of tests/harness (a schedule file the workers
read). F02's session writes app.py and then sits (a fault rule sleeps after the write, before the
commit); the test SIGKILLs that worker's process group. The session's lease
(AGENTOPS_HARNESS_SESSION_LEASE_SECONDS, 10 s here, heartbeated by every blocking step) runs out
and the other worker's attempt saves the half-work to ``wip/F02/1``, starts again from the
session's base commit and the list is finished. Measured: kill → takeover seconds, wall time.
(The todo demo on real workers is test_harness_demo.py.)
"""
from __future__ import annotations

import subprocess
import time
from pathlib import Path
from typing import Any

import pytest
from django.contrib.auth.models import Group, User

from tests.harness.conftest import APP_BOTH, APP_GREET, solve, write_schedule
from tests.process.harness import Cluster, assert_event_seqs_contiguous, wait_until_status
from workflows import services
from workflows.models import Activity, ActivityAttempt, Event, Wait, Workflow

pytestmark = [pytest.mark.process, pytest.mark.django_db(transaction=True), pytest.mark.timeout(300)]

SESSION_LEASE_SECONDS = 10
# Long enough that only the kill ends it: the test kills the worker while it sleeps.
HOLD_AFTER_WRITE = [{"point": "harness.after_tool", "action": "sleep", "seconds": 120,
                     "when": {"tool": "write_file", "feature": "F02", "feature_attempt": 1, "attempt": 1}}]


def test_a_worker_killed_mid_edit_loses_nothing_and_counts_no_pass_twice(cluster: Cluster, tmp_path: Path,
                                                                        figures: Any) -> None:
    """The killed attempt is lost, the next one (another worker) saves its half-work to wip/F02/1,
    starts from base_sha and F02 passes once; the list reaches ``completed``."""
    schedule = write_schedule(tmp_path / "schedule.json", {"F01/1": solve("F01", APP_GREET),
                                                           "F02/1": solve("F02", APP_BOTH)})
    cluster.extra_env.update({"AGENTOPS_HARNESS_SESSION_LEASE_SECONDS": str(SESSION_LEASE_SECONDS),
                              "AGENTOPS_WORKSPACE_DIR": str(tmp_path / "workspaces"),
                              "AGENTOPS_HARNESS_SCHEDULE_FILE": str(schedule)})
    workers = [cluster.start_worker(name, faults=HOLD_AFTER_WRITE) for name in ("wa", "wb")]
    cluster.start_beat()
    approver = User.objects.create_user("hana", password="hana-password")
    approver.groups.add(Group.objects.get_or_create(name="harness-approvers")[0])
    started = time.monotonic()
    pk = services.workflow_launch(kind="harness", goal="Build app.py", params={}).pk
    wait_until_status(cluster, [pk], "waiting", node="WAIT_FOR_APPROVAL", timeout=120)
    wait = Wait.objects.get(workflow_id=pk, kind=Wait.Kind.APPROVAL, status=Wait.Status.OPEN)
    services.wait_approve(wait_id=wait.pk, user=approver, candidate_hash=wait.candidate_hash)

    fired = cluster.wait_for(lambda: next(iter(cluster.faults_fired()), None), timeout=120,
                             what="F02's session to write app.py")
    holder = next(w for w in workers if fired["pid"] in {c.pid for c in w.pool_children()})
    session = ActivityAttempt.objects.get(activity__workflow_id=pk, activity__name="harness_session",
                                          activity__input__feature__id="F02", activity__input__attempt=1,
                                          number=1)
    killed_at = time.time()
    assert holder.kill_group() == -9

    retry = cluster.wait_for(lambda: ActivityAttempt.objects.filter(activity_id=session.activity_id,
                                                                    number=2).first(),
                             timeout=60, what="another worker's attempt of the session")
    takeover_s = retry.started_at.timestamp() - killed_at
    wait_until_status(cluster, [pk], "completed", timeout=240)
    wall_s = time.monotonic() - started

    workflow = Workflow.objects.get(pk=pk)
    assert workflow.result["features_passing"] == 2
    attempts = list(Activity.objects.get(pk=session.activity_id).attempts.order_by("number"))
    assert [a.status for a in attempts] == ["lost", "succeeded"]
    assert retry.worker.split("@")[0] != holder.name
    # The half-work is on the wip ref; the retry started from the session's base commit.
    root = Path(workflow.state["workspace"])
    wips = [e.data for e in Event.objects.filter(workflow_id=pk, kind="harness.wip_saved")]
    assert [(w["ref"], w["files"], w["base_sha"]) for w in wips] == [
        ("wip/F02/1", ["app.py"], session.activity.input["base_sha"])]
    assert subprocess.run(["git", "-C", str(root), "rev-parse", "--verify", "refs/heads/wip/F02/1"],
                          capture_output=True).returncode == 0
    # No pass is counted twice: one passing verdict per feature, one session each.
    verdicts = [e.data["feature"] for e in Event.objects.filter(
        workflow_id=pk, kind="harness.check_ran", data__purpose="verify", data__passed=True)]
    assert verdicts == ["F01", "F02"]
    ended = [(e.data["feature"], e.data["crashed_attempts"]) for e in Event.objects.filter(
        workflow_id=pk, kind="harness.session_ended").order_by("seq")]
    assert ended == [("F01", 0), ("F02", 1)]
    assert workflow.state["sessions"] == 2
    assert_event_seqs_contiguous([pk])
    figures("harness session SIGKILLed mid-edit", session_lease_s=SESSION_LEASE_SECONDS,
            takeover_s=f"{takeover_s:.1f}", wall_s=f"{wall_s:.1f}", sessions=workflow.state["sessions"],
            checks_run=Event.objects.filter(workflow_id=pk, kind="harness.check_ran").count())
    assert takeover_s <= SESSION_LEASE_SECONDS + 15
