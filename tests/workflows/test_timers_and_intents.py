"""Durable timers and intent versions: stale timers are ignored, due timers fire once, goals change."""
from __future__ import annotations

from collections.abc import Iterator
from datetime import timedelta
from typing import Any

import pytest

from tests.conftest import drive, open_approval, release_params, run_at_once
from workflows import clock, engine, services
from workflows.errors import InvalidInput, TransitionRefused
from workflows.models import Activity, Event, Intent, Timer, Wait, Workflow
from workflows.testing import registered

SLEEP_KIND = "test-sleep"
NAP_SECONDS = 3 * 3600

pytestmark = pytest.mark.usefixtures("rung")


# A definition that sleeps three hours, then completes with the goal it was pursuing.
class Sleeper(engine.WorkflowDefinition):
    kind = SLEEP_KIND
    start_node = "NAP"
    revalidate_node = "NAP"

    @engine.node("NAP")
    def nap(self, ctx: engine.NodeContext) -> engine.Decision:
        ctx.sleep(NAP_SECONDS)
        return engine.Goto("DONE")

    @engine.node("DONE")
    def done(self, ctx: engine.NodeContext) -> engine.Decision:
        return engine.Complete({"goal": ctx.goal, "intent_version": ctx.intent_version})


@pytest.fixture(autouse=True)
def sleeper_registered() -> Iterator[None]:
    with registered(Sleeper):
        yield


def sleeping(goal: str = "Nap, then report") -> Workflow:
    workflow = services.workflow_launch(kind=SLEEP_KIND, goal=goal)
    services.workflow_advance_if_runnable(workflow_id=workflow.pk)
    workflow.refresh_from_db()
    assert workflow.status == "waiting"
    return workflow


def launch_release(repo: Any, user: Any = None) -> Workflow:
    return services.workflow_launch(kind="release", goal="Ship the release notes", params=release_params(repo),
                                    user=user)


def events(workflow: Workflow, kind: str) -> list[dict[str, Any]]:
    return list(Event.objects.filter(workflow=workflow, kind=kind).values_list("data", flat=True))


def make_due(timer: Timer) -> None:
    Timer.objects.filter(pk=timer.pk).update(fire_at=clock.now() - timedelta(seconds=1))


@pytest.mark.django_db
def test_approval_timer_of_a_superseded_intent_is_ignored(git_repo, deploy_target, requester):
    """The v1 approval-expiry timer fires after v2 replaced the goal: ignored, nothing else happens."""
    workflow = drive(launch_release(git_repo, requester).pk)
    old_timer = Timer.objects.get(workflow=workflow, wait=open_approval(workflow.pk))
    services.workflow_supersede(workflow_id=workflow.pk, goal="Ship the changelog instead", user=requester)
    workflow = drive(workflow.pk)
    new_wait = open_approval(workflow.pk)
    new_timer = Timer.objects.get(wait=new_wait)
    assert (old_timer.intent_version, new_timer.intent_version) == (1, 2)
    make_due(old_timer)
    target_before = deploy_target.store.stats()
    updated_before = workflow.updated_at

    assert services.timers_fire_due() == 1
    assert services.timers_fire_due() == 0

    old_timer.refresh_from_db()
    assert old_timer.status == "ignored"
    assert "bound to intent v1, superseded by v2" in old_timer.note
    assert [e["timer_id"] for e in events(workflow, "timer.ignored")] == [old_timer.pk]
    assert "superseded" in events(workflow, "timer.ignored")[0]["reason"]
    assert not events(workflow, "timer.fired")
    workflow.refresh_from_db()
    assert (workflow.status, workflow.current_node, workflow.updated_at) == ("waiting", "WAIT_FOR_APPROVAL",
                                                                         updated_before)
    new_wait.refresh_from_db()
    new_timer.refresh_from_db()
    assert (new_wait.status, new_timer.status) == ("open", "pending")
    assert deploy_target.store.stats() == target_before


@pytest.mark.django_db
def test_sleep_of_a_superseded_intent_is_ignored_and_the_new_sleep_drives_progress(time_machine):
    """A 3 h sleep at v1, a new goal at +1 h: the v1 timer is ignored, the v2 timer completes the run."""
    time_machine.move_to(clock.now(), tick=False)
    workflow = sleeping("Nap, then report")
    v1_timer = Timer.objects.get(workflow=workflow)
    time_machine.shift(timedelta(hours=1))
    services.workflow_supersede(workflow_id=workflow.pk, goal="Nap, then report twice")
    services.workflow_advance_if_runnable(workflow_id=workflow.pk)
    v2_timer = Timer.objects.exclude(pk=v1_timer.pk).get(workflow=workflow)
    assert v2_timer.intent_version == 2
    assert v2_timer.fire_at - v1_timer.fire_at == timedelta(hours=1)

    time_machine.shift(timedelta(hours=2, seconds=1))  # v1's timer is due, v2's is not
    assert services.timers_fire_due() == 1
    assert services.timers_fire_due() == 0
    v1_timer.refresh_from_db()
    assert (v1_timer.status, v1_timer.note) == ("ignored", "bound to intent v1, superseded by v2")
    workflow.refresh_from_db()
    assert workflow.status == "waiting"

    time_machine.shift(timedelta(hours=1))
    assert services.timers_fire_due() == 1
    services.workflow_advance_if_runnable(workflow_id=workflow.pk)
    workflow.refresh_from_db()
    assert workflow.status == "completed"
    assert workflow.result == {"goal": "Nap, then report twice", "intent_version": 2}
    assert [e["timer_id"] for e in events(workflow, "timer.fired")] == [v2_timer.pk]


@pytest.mark.django_db
def test_firing_a_due_timer_twice_fires_it_once(rung):
    """A second call (a second beat, a redelivered task) finds nothing to fire."""
    workflow = sleeping()
    timer = Timer.objects.get(workflow=workflow)
    make_due(timer)
    rung.clear()

    assert services.timer_fire_if_due(timer_id=timer.pk) is True
    wait = Wait.objects.get(pk=timer.wait_id)
    state = (wait.status, wait.decided_at, Workflow.objects.get(pk=workflow.pk).updated_at,
             Event.objects.filter(workflow=workflow).count())
    assert services.timer_fire_if_due(timer_id=timer.pk) is False

    wait.refresh_from_db()
    assert (wait.status, wait.decided_at, Workflow.objects.get(pk=workflow.pk).updated_at,
            Event.objects.filter(workflow=workflow).count()) == state
    assert state[0] == "satisfied"
    assert len(events(workflow, "timer.fired")) == 1
    assert rung == [("workflow", workflow.pk)]


@pytest.mark.django_db
def test_running_the_timer_sweep_twice_fires_each_timer_once(rung):
    """Beat running the sweep twice fires every due timer exactly once and leaves others pending."""
    due = [sleeping(f"due {i}") for i in range(3)]
    later = sleeping("not due yet")
    for workflow in due:
        make_due(Timer.objects.get(workflow=workflow))

    assert services.timers_fire_due() == 3
    assert services.timers_fire_due() == 0

    for workflow in due:
        assert Timer.objects.get(workflow=workflow).status == "fired"
        assert len(events(workflow, "timer.fired")) == 1
        assert Workflow.objects.get(pk=workflow.pk).status == "running"
    assert Timer.objects.get(workflow=later).status == "pending"
    assert Workflow.objects.get(pk=later.pk).status == "waiting"


@pytest.mark.django_db
def test_timer_not_yet_due_does_not_fire():
    """timer_fire_if_due before fire_at changes nothing."""
    workflow = sleeping()
    timer = Timer.objects.get(workflow=workflow)
    assert services.timer_fire_if_due(timer_id=timer.pk) is False
    timer.refresh_from_db()
    assert timer.status == "pending"
    assert Workflow.objects.get(pk=workflow.pk).status == "waiting"


@pytest.mark.django_db(transaction=True)
def test_two_beats_firing_at_once_fire_each_timer_once():
    """Two sweeps racing over the same due timers: every timer fires once, none is lost."""
    workflows = [sleeping(f"race {i}") for i in range(8)]
    Timer.objects.filter(workflow__in=workflows).update(fire_at=clock.now() - timedelta(seconds=1))
    fired = run_at_once(services.timers_fire_due)

    assert all(isinstance(n, int) for n in fired), fired
    assert sum(fired) == 8
    assert Timer.objects.filter(workflow__in=workflows, status="fired").count() == 8
    assert Event.objects.filter(workflow__in=workflows, kind="timer.fired").count() == 8
    assert Event.objects.filter(workflow__in=workflows, kind="workflow.woken").count() == 8


@pytest.mark.django_db
def test_approval_expiry_fails_the_workflow(git_repo, deploy_target, requester, time_machine):
    """Nobody decided within the expiry: the wait expires and the workflow fails, deploying nothing."""
    workflow = drive(launch_release(git_repo, requester).pk)
    wait = open_approval(workflow.pk)
    time_machine.move_to(wait.expires_at + timedelta(seconds=1), tick=False)

    assert services.timers_fire_due() == 1
    wait.refresh_from_db()
    assert wait.status == "expired"
    workflow = drive(workflow.pk)

    assert workflow.status == "failed"
    assert "expired" in workflow.reason
    assert deploy_target.store.stats()["requests"] == 0
    assert not Activity.objects.filter(workflow=workflow, name="deploy").exists()


@pytest.mark.django_db
def test_new_goal_while_waiting_rebuilds_and_asks_again(git_repo, deploy_target, requester, approver):
    """Superseding during the approval wait revalidates, rebuilds for the new goal, and opens a v2 approval."""
    workflow = drive(launch_release(git_repo, requester).pk)
    old_wait = open_approval(workflow.pk)
    seq_before = workflow.event_seq

    intent = services.workflow_supersede(workflow_id=workflow.pk, goal="Ship the changelog instead", user=requester)

    assert (intent.intent_version, intent.outcome) == (2, services.Outcome.APPLIED)
    assert Intent.objects.get(workflow=workflow, version=1).superseded_at is not None
    old_wait.refresh_from_db()
    assert old_wait.status == "invalidated"
    workflow.refresh_from_db()
    assert (workflow.status, workflow.current_node, workflow.intent_version) == ("running", "REVALIDATE", 2)

    workflow = drive(workflow.pk)

    assert (workflow.status, workflow.current_node) == ("waiting", "WAIT_FOR_APPROVAL")
    path = [e.data["node"] for e in Event.objects.filter(workflow=workflow, seq__gt=seq_before, kind="node.entered")]
    assert path == ["REVALIDATE", "BUILD_CANDIDATE", "VERIFY_CANDIDATE", "REQUEST_APPROVAL", "WAIT_FOR_APPROVAL"]
    proposals = Activity.objects.filter(workflow=workflow, name="propose_change").order_by("pk")
    assert [p.input["goal"] for p in proposals] == ["Ship the release notes", "Ship the changelog instead"]
    assert "/i2/" in proposals.last().operation_id
    new_wait = open_approval(workflow.pk)
    assert new_wait.intent_version == 2
    assert new_wait.candidate["intent_version"] == 2
    assert "Ship the changelog instead" in new_wait.candidate["title"]
    assert new_wait.candidate_hash != old_wait.candidate_hash
    assert deploy_target.store.stats()["requests"] == 0

    services.wait_approve(wait_id=new_wait.pk, user=approver, candidate_hash=new_wait.candidate_hash)
    workflow = drive(workflow.pk)
    assert workflow.status == "completed", workflow.reason
    assert workflow.result["candidate_hash"] == new_wait.candidate_hash


@pytest.mark.django_db
def test_new_goal_for_a_completed_workflow_is_refused():
    """A finished workflow's goal cannot change; nothing is written."""
    workflow = sleeping()
    make_due(Timer.objects.get(workflow=workflow))
    services.timers_fire_due()
    services.workflow_advance_if_runnable(workflow_id=workflow.pk)
    workflow.refresh_from_db()
    assert workflow.status == "completed"
    before = (workflow.updated_at, workflow.event_seq, Intent.objects.filter(workflow=workflow).count())

    with pytest.raises(TransitionRefused, match=f"Workflow {workflow.pk} is completed; its goal can no longer"):
        services.workflow_supersede(workflow_id=workflow.pk, goal="Too late")

    workflow.refresh_from_db()
    assert (workflow.updated_at, workflow.event_seq, Intent.objects.filter(workflow=workflow).count()) == before


@pytest.mark.django_db
@pytest.mark.parametrize(("goal", "message"), [("", "non-empty"), ("a\x00b", "NUL"), ("x" * 10_001, "limit is 10000")])
def test_bad_new_goal_is_refused(goal, message):
    """A new goal is validated like a launch goal; the sleeping workflow is untouched."""
    workflow = sleeping()
    before = (workflow.updated_at, workflow.event_seq, workflow.intent_version)
    with pytest.raises(InvalidInput, match=message):
        services.workflow_supersede(workflow_id=workflow.pk, goal=goal)
    workflow.refresh_from_db()
    assert (workflow.updated_at, workflow.event_seq, workflow.intent_version) == before
    assert Wait.objects.get(workflow=workflow).status == "open"


@pytest.mark.django_db
def test_the_goal_read_with_the_row_lock_is_the_current_versions_and_a_new_goal_is_read_again(settings, tmp_path):
    """An advance reads the goal with the workflow's row lock (one statement fewer); a goal that
    changed since (a new intent version on the instance) is read from its own row, never the old one."""
    from django.db import connection, transaction
    from django.test.utils import CaptureQueriesContext

    from workflows import selectors
    from workflows.services.common import workflow_lock

    settings.AGENTOPS_WORKSPACE_DIR = tmp_path
    workflow = services.workflow_launch(kind="autonomous", goal="Prepare onboarding notes")
    with transaction.atomic():
        locked = workflow_lock(workflow.pk, advance=True)
        with CaptureQueriesContext(connection) as statements:
            assert selectors.current_goal(locked) == "Prepare onboarding notes"
        assert statements.captured_queries == [], "read with the lock"
    services.workflow_supersede(workflow_id=workflow.pk, goal="Prepare offboarding notes")
    with transaction.atomic():
        locked = workflow_lock(workflow.pk, advance=True)
        assert selectors.current_goal(locked) == "Prepare offboarding notes"
        Intent.objects.create(workflow=locked, version=locked.intent_version + 1, goal="A third goal",
                              created_at=clock.now())
        locked.intent_version += 1
        assert selectors.current_goal(locked) == "A third goal", "the version read with the lock is not this one"
