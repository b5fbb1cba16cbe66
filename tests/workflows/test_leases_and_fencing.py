"""Attempts under leases: lost attempts are reaped and reconciled, zombies are fenced, retries wait their turn."""
from __future__ import annotations

from collections.abc import Iterator
from datetime import timedelta
from typing import Any

import pytest

from agentops.agents.release.activities import deploy, inspect_repository
from agentops.deploytarget.server import Fault
from tests.conftest import drive, open_approval, release_params, run_at_once, run_claimed
from workflows import clock, engine, services
from workflows.activity_context import ActivityContext
from workflows.errors import Retryable
from workflows.models import Activity, ActivityAttempt, Event, Workflow
from workflows.registry import activity
from workflows.services import RunOutcome
from workflows.testing import registered

BAD_OUTPUT_KIND = "test-bad-output"

pytestmark = pytest.mark.usefixtures("rung")


BAD_OUTPUTS: dict[str, Any] = {
    "nul": {"text": "before\x00after"},
    "set": {"tags": {"a", "b"}},
    "nan": {"score": float("nan")},
    "huge": {"blob": "x" * 1_000_001},
    "surrogate": {"text": "bad \ud800"},
}


@activity("test_bad_output")
def bad_output(ctx: ActivityContext, input: dict[str, Any]) -> Any:
    return BAD_OUTPUTS[input["which"]]


# One node that runs an activity returning whatever the launch goal names (see BAD_OUTPUTS).
class BadOutput(engine.WorkflowDefinition):
    kind = BAD_OUTPUT_KIND
    start_node = "PRODUCE"
    revalidate_node = "PRODUCE"

    @engine.node("PRODUCE")
    def produce(self, ctx: engine.NodeContext) -> engine.Decision:
        return engine.Goto("DONE", {"output": ctx.activity(bad_output, {"which": ctx.goal})})

    @engine.node("DONE")
    def done(self, ctx: engine.NodeContext) -> engine.Decision:
        return engine.Complete()


@pytest.fixture(autouse=True)
def bad_output_registered() -> Iterator[None]:
    with registered(BadOutput, bad_output):
        yield


def launched(repo: Any) -> tuple[Workflow, Activity]:
    """A release workflow whose first activity (inspect_repository) is scheduled, not yet run."""
    workflow = services.workflow_launch(kind="release", goal="Ship the release notes", params=release_params(repo))
    services.workflow_advance_if_runnable(workflow_id=workflow.pk)
    return workflow, Activity.objects.get(workflow=workflow, name="inspect_repository")


def deploy_scheduled(repo: Any, approver: Any) -> tuple[Workflow, Activity]:
    """A release workflow approved by alice whose deploy is scheduled, not yet run."""
    workflow = drive(services.workflow_launch(kind="release", goal="Ship the release notes",
                                              params=release_params(repo)).pk)
    wait = open_approval(workflow.pk)
    services.wait_approve(wait_id=wait.pk, user=approver, candidate_hash=wait.candidate_hash)
    for _ in range(10):
        services.workflow_advance_if_runnable(workflow_id=workflow.pk)
        found = Activity.objects.filter(workflow=workflow, name="deploy").first()
        if found is not None:
            return workflow, found
        for pk in Activity.objects.filter(workflow=workflow, status="scheduled").values_list("pk", flat=True):
            services.activity_run_if_runnable(activity_id=pk)
    raise AssertionError("deploy was never scheduled")


def expire_lease(activity: Activity) -> None:
    Activity.objects.filter(pk=activity.pk).update(lease_expires_at=clock.now() - timedelta(seconds=1))


def events(workflow: Workflow, kind: str) -> list[dict[str, Any]]:
    return list(Event.objects.filter(workflow=workflow, kind=kind).order_by("seq").values_list("data", flat=True))


def attempts(activity: Activity) -> list[tuple[int, str]]:
    return list(ActivityAttempt.objects.filter(activity=activity).values_list("number", "status"))


@pytest.mark.django_db
def test_lost_deploy_attempt_is_reconciled_not_redeployed(git_repo, deploy_target, approver, rung):
    """The deploy target accepted attempt 1's POST and the worker died: attempt 2 finds it by key."""
    workflow, activity = deploy_scheduled(git_repo, approver)
    deploy_target.store.set_fault(Fault.build("accept_then_drop", 1))
    claim = services.activity_claim_if_runnable(activity_id=activity.pk, worker="doomed", task_id="t1")
    with pytest.raises(Retryable, match="closed the connection without a response"):
        run_claimed(deploy, claim)  # the POST took effect; this worker never records anything
    assert deploy_target.store.stats()["effects"][activity.sent_key]["created"] == 1
    expire_lease(activity)
    rung.clear()

    assert services.leases_reap_expired() == 1

    activity.refresh_from_db()
    assert (activity.status, activity.attempt) == ("scheduled", 1)
    assert attempts(activity) == [(1, "lost")]
    assert rung == [("activity", activity.pk)]
    assert services.activity_run_if_runnable(activity_id=activity.pk, worker="healthy") == RunOutcome.RECORDED

    activity.refresh_from_db()
    assert attempts(activity) == [(1, "lost"), (2, "succeeded")]
    assert events(workflow, "activity.succeeded")[-1] == {
        "operation_id": activity.operation_id, "attempt": 2, "reconciled": True,
    }
    stats = deploy_target.store.stats()
    assert stats["deployments"] == 1
    assert stats["effects"] == {activity.sent_key: {"created": 1, "deleted": 0}}
    workflow = drive(workflow.pk)
    assert workflow.status == "completed", workflow.reason
    assert workflow.result["deployment_id"] == activity.result["deployment_id"]


@pytest.mark.django_db
def test_zombie_attempt_cannot_overwrite_the_current_result(git_repo):
    """Attempt 1 wakes up after attempt 2 recorded: its heartbeat and result are refused as stale."""
    workflow, activity = launched(git_repo)
    zombie = services.activity_claim_if_runnable(activity_id=activity.pk, worker="paused", task_id="t1")
    expire_lease(activity)
    assert services.leases_reap_expired() == 1
    current = services.activity_claim_if_runnable(activity_id=activity.pk, worker="healthy", task_id="t2")
    assert (zombie.attempt, current.attempt) == (1, 2)

    assert services.activity_heartbeat_if_current(claim=zombie) is False
    assert services.activity_heartbeat_if_current(claim=current) is True
    result = run_claimed(inspect_repository, current)
    assert services.activity_result_record_if_current(claim=current, result=result) == RunOutcome.RECORDED
    workflow.refresh_from_db()
    before = (workflow.updated_at, workflow.current_node, workflow.state)

    outcome = services.activity_result_record_if_current(claim=zombie, result={**result, "head": "zombie"})

    assert outcome == RunOutcome.STALE
    activity.refresh_from_db()
    assert (activity.status, activity.attempt, activity.result) == ("succeeded", 2, result)
    workflow.refresh_from_db()
    assert (workflow.updated_at, workflow.current_node, workflow.state) == before
    assert workflow.state["evidence"]["head"] == result["head"]
    assert attempts(activity) == [(1, "stale"), (2, "succeeded")]
    assert events(workflow, "activity.stale_result_discarded") == [
        {"operation_id": activity.operation_id, "attempt": 1},
    ]
    # Its failure report and heartbeat are fenced off the same way.
    assert services.activity_failure_record_if_current(claim=zombie, error=RuntimeError("late")) == RunOutcome.STALE
    assert services.activity_heartbeat_if_current(claim=zombie) is False
    assert services.activity_heartbeat_if_current(claim=current) is False, "a finished attempt holds no lease"
    activity.refresh_from_db()
    assert (activity.status, activity.result, activity.error) == ("succeeded", result, "")


@pytest.mark.django_db
def test_heartbeat_extends_the_lease_of_the_current_attempt(git_repo, time_machine):
    """A heartbeat moves lease_expires_at forward, so a slow but live attempt is not reaped."""
    time_machine.move_to(clock.now(), tick=False)
    _, activity = launched(git_repo)
    claim = services.activity_claim_if_runnable(activity_id=activity.pk, worker="w", task_id="t1")
    activity.refresh_from_db()
    first_expiry = activity.lease_expires_at
    time_machine.shift(timedelta(seconds=50))

    assert services.activity_heartbeat_if_current(claim=claim, detail="cloned, tests running") is True

    activity.refresh_from_db()
    assert activity.lease_expires_at - first_expiry == timedelta(seconds=50)
    assert activity.heartbeat_detail == "cloned, tests running"
    time_machine.shift(timedelta(seconds=30))  # past the first lease, within the extended one
    assert services.leases_reap_expired() == 0
    activity.refresh_from_db()
    assert (activity.status, activity.attempt) == ("running", 1)


@pytest.mark.django_db
def test_duplicate_doorbell_is_ignored(git_repo):
    """Ringing an activity that already succeeded (or is running) runs nothing and says so."""
    workflow, activity = launched(git_repo)
    assert services.activity_run_if_runnable(activity_id=activity.pk, worker="w1") == RunOutcome.RECORDED
    activity.refresh_from_db()
    before = (activity.status, activity.attempt, activity.result, activity.completed_at)
    workflow.refresh_from_db()

    assert services.activity_run_if_runnable(activity_id=activity.pk, worker="w2") == RunOutcome.SKIPPED

    activity.refresh_from_db()
    assert (activity.status, activity.attempt, activity.result, activity.completed_at) == before
    assert attempts(activity) == [(1, "succeeded")]
    assert events(workflow, "activity.doorbell_ignored") == [
        {"operation_id": activity.operation_id, "status": "succeeded", "worker": "w2"},
    ]
    assert Workflow.objects.get(pk=workflow.pk).updated_at == workflow.updated_at

    running = Activity.objects.get(workflow=workflow, name="propose_change")
    services.activity_claim_if_runnable(activity_id=running.pk, worker="w1", task_id="t1")
    assert services.activity_run_if_runnable(activity_id=running.pk, worker="w2") == RunOutcome.SKIPPED
    running.refresh_from_db()
    assert (running.status, running.attempt) == ("running", 1)
    assert services.activity_run_if_runnable(activity_id=987654) == RunOutcome.SKIPPED


@pytest.mark.django_db
def test_retryable_failure_waits_for_its_retry_window(git_repo, deploy_target, approver, rung, time_machine):
    """A 503 opens a retry window: not dispatched or claimable before it opens, rung once after."""
    workflow, activity = deploy_scheduled(git_repo, approver)
    deploy_target.store.set_fault(Fault.build("fail", 1))
    time_machine.move_to(clock.now(), tick=False)

    assert services.activity_run_if_runnable(activity_id=activity.pk) == RunOutcome.RETRY_SCHEDULED

    activity.refresh_from_db()
    assert (activity.status, activity.attempt, activity.dispatched_at) == ("scheduled", 1, None)
    assert activity.next_attempt_at == clock.now() + timedelta(seconds=1)  # the target's Retry-After
    assert "503" in activity.error and "retry" in activity.error
    assert attempts(activity) == [(1, "failed")]
    rung.clear()
    assert services.activities_redrive_due() == 0
    assert services.activity_run_if_runnable(activity_id=activity.pk) == RunOutcome.SKIPPED
    assert rung == []

    time_machine.shift(timedelta(seconds=2))
    assert services.activities_redrive_due() == 1
    assert services.activities_redrive_due() == 0
    assert rung == [("activity", activity.pk)]
    assert services.activity_run_if_runnable(activity_id=activity.pk) == RunOutcome.RECORDED

    activity.refresh_from_db()
    assert (activity.status, activity.attempt) == ("succeeded", 2)
    assert deploy_target.store.stats()["effects"] == {activity.sent_key: {"created": 1, "deleted": 0}}


@pytest.mark.django_db
@pytest.mark.parametrize(("which", "message"), [
    ("nul", "contains a NUL character, which PostgreSQL cannot store"),
    ("set", "is not JSON-serializable: Object of type set"),
    ("nan", "is not JSON-serializable: Out of range float"),
    ("huge", "holds one value of 1000001 characters; the limit for one value is 1000000"),
    ("surrogate", "contains characters that are not valid Unicode (lone surrogates)"),
])
def test_unstorable_activity_result_is_a_permanent_failure(which, message):
    """A result that is not storable JSON fails the activity at once, with the reason, and is not retried."""
    workflow = services.workflow_launch(kind=BAD_OUTPUT_KIND, goal=which)
    services.workflow_advance_if_runnable(workflow_id=workflow.pk)
    activity = Activity.objects.get(workflow=workflow)

    assert services.activity_run_if_runnable(activity_id=activity.pk) == RunOutcome.FAILED

    activity.refresh_from_db()
    assert activity.status == "failed"
    assert activity.error.startswith("InvalidInput: The result of activity test_bad_output ")
    assert message in activity.error
    assert (activity.attempt, activity.result) == (1, None)
    workflow.refresh_from_db()
    assert workflow.status == "failed"
    assert "activity test_bad_output failed: InvalidInput" in workflow.reason


@pytest.mark.django_db
def test_reaping_twice_reaps_once(git_repo, rung):
    """Beat running the lease sweep twice marks the attempt lost once and re-drives it once."""
    workflow, activity = launched(git_repo)
    services.activity_claim_if_runnable(activity_id=activity.pk, worker="doomed", task_id="t1")
    assert services.leases_reap_expired() == 0, "a live lease is not reaped"
    expire_lease(activity)
    rung.clear()

    assert services.leases_reap_expired() == 1
    assert services.leases_reap_expired() == 0

    activity.refresh_from_db()
    assert (activity.status, activity.attempt) == ("scheduled", 1)
    assert attempts(activity) == [(1, "lost")]
    assert len(events(workflow, "activity.lease_expired")) == 1
    assert rung == [("activity", activity.pk)]
    assert services.activity_lease_expire_if_due(activity_id=activity.pk) is False


@pytest.mark.django_db
def test_attempt_lost_on_every_try_fails_the_workflow(git_repo):
    """A poison activity whose worker dies each time fails after its last allowed attempt."""
    workflow, activity = launched(git_repo)
    for _ in range(activity.max_attempts):
        assert services.activity_claim_if_runnable(activity_id=activity.pk, worker="doomed", task_id="t") is not None
        expire_lease(activity)
        assert services.leases_reap_expired() == 1

    activity.refresh_from_db()
    assert (activity.status, activity.attempt) == ("failed", 3)
    assert [s for _, s in attempts(activity)] == ["lost", "lost", "lost"]
    workflow.refresh_from_db()
    assert workflow.status == "failed"
    assert "activity inspect_repository failed: attempt 3 lost" in workflow.reason


@pytest.mark.django_db(transaction=True)
def test_two_reapers_at_once_reap_each_lease_once(git_repo, rung):
    """Two beats sweeping expired leases concurrently: every lost attempt is handled exactly once."""
    claimed = []
    for _ in range(5):
        workflow, activity = launched(git_repo)
        services.activity_claim_if_runnable(activity_id=activity.pk, worker="doomed", task_id="t")
        expire_lease(activity)
        claimed.append(activity)
    rung.clear()
    reaped = run_at_once(services.leases_reap_expired)

    assert all(isinstance(n, int) for n in reaped), reaped
    assert sum(reaped) == 5
    assert sorted(pk for _, pk in rung) == sorted(a.pk for a in claimed)
    assert Event.objects.filter(kind="activity.lease_expired").count() == 5
    assert ActivityAttempt.objects.filter(activity__in=claimed, status="lost").count() == 5


@pytest.mark.django_db
def test_an_unanswered_doorbell_is_rung_again_with_a_growing_delay(git_repo, rung, time_machine, settings):
    """Lost or only queued behind a backlog, a doorbell is rung again after 30 s, then after the
    activity has waited as long again: 30, 62, 124 s ... (capped), never on every sweep."""
    settings.AGENTOPS_REDISPATCH_AFTER_SECONDS = 30
    time_machine.move_to(clock.now(), tick=False)
    start = clock.now()
    _, activity = launched(git_repo)
    rung.clear()

    rang_at = []
    for second in range(0, 1500, 2):  # a sweep every 2 s for 25 minutes
        time_machine.move_to(start + timedelta(seconds=second), tick=False)
        if services.activities_redrive_due():
            rang_at.append(second)

    # 30 s, then twice the wait so far, until the gap reaches 8 x 30 s = 240 s.
    assert rang_at == [30, 60, 120, 240, 480, 720, 960, 1200, 1440]
    assert rung == [("activity", activity.pk)] * len(rang_at)
