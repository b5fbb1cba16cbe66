"""Issue 11, H4 + the short session lease: a worker SIGKILLed in the middle of a coding session.

Real workers and beat. F03's second session writes todo.py and then sits (a fault rule sleeps
after the write, before the commit); the test SIGKILLs that worker's process group. The session's
lease (AGENTOPS_HARNESS_SESSION_LEASE_SECONDS, 10 s here, heartbeated by every blocking step) runs
out and the other worker's attempt saves the half-work to ``wip/F03/2``, starts again from the
session's base commit and the list is finished. Measured: kill → takeover seconds, wall time.
"""
from __future__ import annotations

import subprocess
import time
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
from django.contrib.auth.models import Group, User

from tests.process.harness import Cluster, assert_event_seqs_contiguous, wait_until_status
from workflows import services
from workflows.models import Activity, ActivityAttempt, Event, Wait, Workflow

pytestmark = [pytest.mark.process, pytest.mark.django_db(transaction=True), pytest.mark.timeout(300)]

SESSION_LEASE_SECONDS = 10
# Long enough that only the kill ends it: the test kills the worker while it sleeps.
HOLD_AFTER_WRITE = [{"point": "harness.after_tool", "action": "sleep", "seconds": 120,
                     "when": {"tool": "write_file", "feature": "F03", "feature_attempt": 2, "attempt": 1}}]


def test_a_worker_killed_mid_edit_loses_nothing_and_counts_no_pass_twice(cluster: Cluster, tmp_path: Path,
                                                                        figures: Any) -> None:
    """The killed attempt is lost, the next one (another worker) saves its half-work to wip/F03/2,
    starts from base_sha and F03 passes once; the list reaches ``completed``."""
    cluster.extra_env.update({"AGENTOPS_HARNESS_SESSION_LEASE_SECONDS": str(SESSION_LEASE_SECONDS),
                              "AGENTOPS_WORKSPACE_DIR": str(tmp_path / "workspaces")})
    workers = [cluster.start_worker(name, faults=HOLD_AFTER_WRITE) for name in ("wa", "wb")]
    cluster.start_beat()
    approver = User.objects.create_user("hana", password="hana-password")
    approver.groups.add(Group.objects.get_or_create(name="harness-approvers")[0])
    started = time.monotonic()
    pk = services.workflow_launch(kind="harness", goal="Build the todo CLI of the demo", params={}).pk
    wait_until_status(cluster, [pk], "waiting", node="WAIT_FOR_APPROVAL", timeout=120)
    wait = Wait.objects.get(workflow_id=pk, kind=Wait.Kind.APPROVAL, status=Wait.Status.OPEN)
    services.wait_approve(wait_id=wait.pk, user=approver, candidate_hash=wait.candidate_hash)

    fired = cluster.wait_for(lambda: next((f for f in cluster.faults_fired() if f.get("feature") == "F03"), None),
                             timeout=120, what="F03's second session to write todo.py")
    holder = next(w for w in workers if fired["pid"] in {c.pid for c in w.pool_children()})
    session = ActivityAttempt.objects.get(activity__workflow_id=pk, activity__name="harness_session",
                                          activity__input__feature__id="F03", activity__input__attempt=2,
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
    assert workflow.result["features_passing"] == 10
    attempts = list(Activity.objects.get(pk=session.activity_id).attempts.order_by("number"))
    assert [a.status for a in attempts] == ["lost", "succeeded"]
    assert retry.worker.split("@")[0] != holder.name
    # The half-work is on the wip ref; the retry started from the session's base commit.
    root = Path(workflow.state["workspace"])
    wips = [e.data for e in Event.objects.filter(workflow_id=pk, kind="harness.wip_saved")]
    assert [(w["ref"], w["files"], w["base_sha"]) for w in wips] == [
        ("wip/F03/2", ["todo.py"], session.activity.input["base_sha"])]
    assert subprocess.run(["git", "-C", str(root), "rev-parse", "--verify", "refs/heads/wip/F03/2"],
                          capture_output=True).returncode == 0
    # No pass is counted twice: one passing verdict per feature and commit, F03's once.
    verdicts = [(e.data["feature"], e.data["commit"]) for e in Event.objects.filter(
        workflow_id=pk, kind="harness.check_ran", data__purpose="verify", data__passed=True)]
    assert max(Counter(verdicts).values()) == 1
    assert [f for f, _ in verdicts].count("F03") == 1
    ended = [e.data for e in Event.objects.filter(workflow_id=pk, kind="harness.session_ended",
                                                  data__feature="F03", data__feature_attempt=2)]
    assert [e["crashed_attempts"] for e in ended] == [1]
    assert workflow.state["sessions"] == 18
    assert_event_seqs_contiguous([pk])
    figures("issue 11 harness session SIGKILLed mid-edit", session_lease_s=SESSION_LEASE_SECONDS,
            takeover_s=f"{takeover_s:.1f}", wall_s=f"{wall_s:.1f}", sessions=workflow.state["sessions"],
            checks_run=Event.objects.filter(workflow_id=pk, kind="harness.check_ran").count())
    assert takeover_s <= SESSION_LEASE_SECONDS + 15
