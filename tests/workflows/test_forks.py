"""Fork: a new workflow reuses the first N node visits of another and runs on; no effect is repeated."""
from __future__ import annotations

from decimal import Decimal
from typing import Any

import pytest

from agentops.agents.autonomous.definition import Autonomous
from tests.conftest import drive, open_approval, release_params
from workflows import replay, selectors, services, statestore
from workflows.errors import TransitionRefused
from workflows.features import forks
from workflows.models import Activity, Commitment, Event, UsageEntry, Workflow

pytestmark = pytest.mark.django_db

# The release path's visits: 1 GATHER_EVIDENCE, 2 BUILD_CANDIDATE, 3 VERIFY_CANDIDATE, 4 REQUEST_APPROVAL,
# 5 WAIT_FOR_APPROVAL, 6 REVALIDATE, 7 COMMIT_OPERATION (the deploy), 8 VERIFY_POSTCONDITION, 9 RECONCILE,
# 10 COMPLETE.
DEPLOY_VISIT = 7
BEFORE_APPROVAL = 4


def completed_release(repo: Any, requester: Any, approver: Any) -> Workflow:
    workflow = drive(services.workflow_launch(kind="release", goal="Ship the release notes",
                                              params=release_params(repo), user=requester).pk)
    wait = open_approval(workflow.pk)
    services.wait_approve(wait_id=wait.pk, user=approver, candidate_hash=wait.candidate_hash)
    workflow = drive(workflow.pk)
    assert workflow.status == "completed", workflow.reason
    return workflow


def test_a_fork_after_the_deploy_reuses_it_and_makes_no_effect(git_repo, deploy_target, approver, requester):
    """Forked at visit 7 (the deploy): the fork starts at visit 8 from the state the original entered it
    with, verifies and reconciles the original's deployment and completes; the target saw one deployment,
    the fork owns no commitment, and its steps carry its own operation ids."""
    original = completed_release(git_repo, requester, approver)
    fork = forks.workflow_fork(workflow_id=original.pk, from_visit=DEPLOY_VISIT, user=approver)
    assert (fork.current_node, fork.node_visit, fork.forked_from_id, fork.forked_from_visit) == (
        "VERIFY_POSTCONDITION", DEPLOY_VISIT + 1, original.pk, DEPLOY_VISIT)
    fork = drive(fork.pk)

    assert fork.status == "completed", fork.reason
    assert fork.result["deployment_id"] == original.result["deployment_id"]
    stats = deploy_target.store.stats()
    assert stats["deployments"] == 1 and list(stats["effects"].values()) == [{"created": 1, "deleted": 0}]
    names = list(Activity.objects.filter(workflow=fork).order_by("pk").values_list("name", flat=True))
    assert names == ["verify_deployment", "reconcile_deployment"]
    assert all(op.startswith(f"wf-{fork.pk}/") for op in Activity.objects.filter(workflow=fork).values_list(
        "operation_id", flat=True))
    assert not Commitment.objects.filter(workflow=fork).exists()
    assert Commitment.objects.get(workflow=original).status == "released"
    launched = Event.objects.get(workflow=fork, kind="workflow.launched")
    assert (launched.data["forked_from"], launched.data["from_visit"], launched.data["by"]) == (
        original.pk, DEPLOY_VISIT, "alice")
    forked = Event.objects.get(workflow=original, kind="workflow.forked")
    assert (forked.data["fork_id"], forked.data["from_visit"]) == (fork.pk, DEPLOY_VISIT)
    detail = selectors.workflow_detail(Workflow.objects.get(pk=original.pk))
    assert detail["forks"] == [{"id": fork.pk, "from_visit": DEPLOY_VISIT, "status": "completed"}]
    assert selectors.workflow_detail(fork)["forked_from"] == original.pk


def test_a_fork_before_the_approval_asks_again_and_deploys_under_its_own_key(
        git_repo, deploy_target, approver, requester):
    """Forked at visit 4: the proposal and the tests are reused (no model call, no test run); the fork
    asks for approval of the same candidate, then deploys once under its own operation id."""
    original = completed_release(git_repo, requester, approver)
    fork = drive(forks.workflow_fork(workflow_id=original.pk, from_visit=BEFORE_APPROVAL, user=requester).pk)
    assert (fork.status, fork.current_node) == ("waiting", "WAIT_FOR_APPROVAL")
    assert not Activity.objects.filter(workflow=fork, name__in=["propose_change", "run_tests"]).exists()
    wait = open_approval(fork.pk)
    assert wait.candidate_hash == original.state["candidate_hash"]
    services.wait_approve(wait_id=wait.pk, user=approver, candidate_hash=wait.candidate_hash)
    fork = drive(fork.pk)

    assert fork.status == "completed", fork.reason
    keys = {a.sent_key for a in Activity.objects.filter(name="deploy")}
    assert len(keys) == 2
    stats = deploy_target.store.stats()
    assert stats["deployments"] == 2 and set(stats["effects"]) == keys
    assert all(v == {"created": 1, "deleted": 0} for v in stats["effects"].values())


def test_cancelling_a_fork_leaves_the_originals_effect_alone(git_repo, deploy_target, approver, requester):
    """The deployment the fork reused belongs to the original: cancelling the fork compensates nothing."""
    original = completed_release(git_repo, requester, approver)
    fork = forks.workflow_fork(workflow_id=original.pk, from_visit=DEPLOY_VISIT, user=approver)
    services.workflow_cancel(workflow_id=fork.pk, reason="not needed", user=approver)
    fork = drive(fork.pk)

    assert fork.status == "cancelled"
    assert deploy_target.store.stats()["effects"] == {
        Activity.objects.get(workflow=original, name="deploy").sent_key: {"created": 1, "deleted": 0}}
    assert not Activity.objects.filter(workflow=fork, name="undeploy").exists()


def test_visits_out_of_range_and_unforkable_kinds_are_refused(settings, tmp_path, monkeypatch):
    settings.AGENTOPS_WORKSPACE_DIR = tmp_path / "workspaces"
    fresh = services.workflow_launch(kind="autonomous", goal="Prepare onboarding notes")
    before = Workflow.objects.count()
    with pytest.raises(TransitionRefused, match="has not finished a node visit yet"):
        forks.workflow_fork(workflow_id=fresh.pk, from_visit=1)
    done = drive(fresh.pk)
    last = done.node_visit - 1
    for visit in (0, done.node_visit, 10**6):
        with pytest.raises(TransitionRefused, match=rf"The visit to fork from must be between 1 and {last}, the "
                                                    rf"node visits workflow {done.pk} finished"):
            forks.workflow_fork(workflow_id=done.pk, from_visit=visit)
    monkeypatch.setattr(Autonomous, "fork_refusal", "its workspace lives on disk")
    with pytest.raises(TransitionRefused, match=f"Workflow {done.pk} cannot be forked: its workspace lives on disk"):
        forks.workflow_fork(workflow_id=done.pk, from_visit=1)
    assert Workflow.objects.count() == before
    assert not Event.objects.filter(kind="workflow.forked").exists()


def test_an_autonomous_fork_reuses_the_plan_and_runs_the_tasks_again(settings, tmp_path):
    """Forked after PLANNING: the fork makes no plan call and runs the three tasks itself."""
    settings.AGENTOPS_WORKSPACE_DIR = tmp_path / "workspaces"
    original = drive(services.workflow_launch(kind="autonomous", goal="Prepare onboarding notes").pk)
    fork = drive(forks.workflow_fork(workflow_id=original.pk, from_visit=1).pk)

    assert fork.status == "completed", fork.reason
    assert fork.result["tasks_done"] == 3
    assert not Activity.objects.filter(workflow=fork, name="plan_tasks").exists()
    assert Activity.objects.filter(workflow=fork, name="execute_task").count() == 3
    assert [t["title"] for t in fork.state["tasks"]] == [t["title"] for t in original.state["tasks"]]


def test_a_forks_history_starts_at_its_first_own_visit_and_replays(settings, tmp_path):
    """The visits it reused are the original's: its history (export-history, replay-check) starts after them."""
    settings.AGENTOPS_WORKSPACE_DIR = tmp_path / "workspaces"
    original = drive(services.workflow_launch(kind="autonomous", goal="Prepare onboarding notes").pk)
    fork = drive(forks.workflow_fork(workflow_id=original.pk, from_visit=3).pk)

    history = replay.history_of(fork)
    assert [v.visit for v in history.visits] == list(range(4, fork.node_visit + 1))
    assert history.visits[0].state == statestore.state_at(original, 4)
    assert replay.check(history) is None


def test_a_fork_carries_the_originals_labels(settings, tmp_path):
    settings.AGENTOPS_WORKSPACE_DIR = tmp_path / "workspaces"
    labels = {"team": "docs", "env": "prod"}
    original = drive(services.workflow_launch(kind="autonomous", goal="Prepare onboarding notes",
                                              options=services.LaunchOptions(labels=labels)).pk)
    fork = forks.workflow_fork(workflow_id=original.pk, from_visit=1)

    assert selectors.workflow_summary(fork)["labels"] == {"env": "prod", "team": "docs"}
    found = selectors.workflow_list(labels=[("team", "docs")]).values_list("pk", flat=True)
    assert list(found) == [fork.pk, original.pk]


def test_a_fork_gets_what_the_original_has_left_of_its_budget(settings, tmp_path):
    """One budget, not two: original and fork together never spend more than the original's total."""
    settings.AGENTOPS_WORKSPACE_DIR = tmp_path / "workspaces"
    original = drive(services.workflow_launch(kind="autonomous", goal="Prepare onboarding notes",
                                              options=services.LaunchOptions(budget_total_usd=Decimal("1.00"))).pk)
    UsageEntry.objects.create(workflow=original, key=f"test/{original.pk}/spend", operation_id="spend",
                              provider="scripted", model="m", status="charged", reserved_usd=Decimal("0.30"),
                              cost_usd=Decimal("0.30"), created_at=original.created_at)
    left = Decimal("1.00") - selectors.spent_usd(original)
    assert left <= Decimal("0.70")

    fork = forks.workflow_fork(workflow_id=original.pk, from_visit=1)

    assert fork.budget_total_usd == left
    unbudgeted = drive(services.workflow_launch(kind="autonomous", goal="Prepare onboarding notes").pk)
    assert forks.workflow_fork(workflow_id=unbudgeted.pk, from_visit=1).budget_total_usd is None
