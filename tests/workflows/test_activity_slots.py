"""Concurrency keys for activities: AGENTOPS_ACTIVITY_CONCURRENCY caps the attempts
running at once per tenant and per kind; an attempt over a cap waits, stored, holding nothing, and
a freed slot goes to the waiting activities by priority, then fair share, then age."""
from __future__ import annotations

from collections.abc import Iterator
from datetime import timedelta
from typing import Any

import pytest
from django.contrib.auth.models import User
from django.db import connection

from tests.conftest import run_at_once
from workflows import clock, engine, services
from workflows.activity_context import ActivityContext
from workflows.leases import Claim
from workflows.models import Activity, ActivityAttempt, Event, Workflow
from workflows.registry import activity
from workflows.services import slots
from workflows.services.activities import activity_claim_if_runnable, activity_lease_expire_if_due
from workflows.services.steps import ChainSlot
from workflows.testing import registered

KIND = "test-slots"
OTHER_KIND = "test-slots-other"
STEP = "test_slots_step"


@activity(STEP)
def slot_step(ctx: ActivityContext, input: dict[str, Any]) -> dict[str, Any]:
    return {"i": input["i"]}


class Steps(engine.WorkflowDefinition):
    """``steps`` activities in turn, then done."""

    kind = KIND
    start_node = "STEPS"
    revalidate_node = "STEPS"

    def validate_params(self, params: dict[str, Any]) -> dict[str, Any]:
        return {"steps": int(params.get("steps", 1))}

    @engine.node("STEPS")
    def steps(self, ctx: engine.NodeContext) -> engine.Decision:
        return engine.Complete({"outputs": [ctx.activity(slot_step, {"i": i}) for i in range(ctx.params["steps"])]})


class OtherSteps(Steps):
    kind = OTHER_KIND


@pytest.fixture(autouse=True)
def kinds_registered() -> Iterator[None]:
    with registered(Steps, OtherSteps, slot_step):
        yield


pytestmark = [pytest.mark.usefixtures("rung"), pytest.mark.django_db(transaction=True)]


def launch(kind: str = KIND, *, user: Any = None, **options: Any) -> Activity:
    workflow = services.workflow_launch(kind=kind, goal="Count", user=user, options=services.LaunchOptions(**options))
    return Activity.objects.get(workflow=workflow)


def claim(act: Activity) -> Claim | None:
    return activity_claim_if_runnable(activity_id=act.pk, worker="w1", task_id="t")


def finish(c: Claim) -> None:
    services.activity_result_record_if_current(claim=c, result={"i": 0})


def rang(rung: list[tuple[str, int]], act: Activity) -> bool:
    return ("activity", act.pk) in rung


def test_an_attempt_over_the_kinds_cap_waits_stored_and_the_freed_slot_is_handed_to_the_oldest(
        settings: Any, rung: list[tuple[str, int]]) -> None:
    settings.AGENTOPS_ACTIVITY_CONCURRENCY = {f"kind:{KIND}": 2}
    first, second, third, fourth = (launch() for _ in range(4))
    running = [claim(first), claim(second)]
    assert all(running)
    assert "slot_waited_ms" not in Event.objects.get(workflow_id=first.workflow_id, kind="activity.started").data

    before = clock.now()
    assert claim(third) is None and claim(fourth) is None
    third.refresh_from_db()
    assert third.status == Activity.Status.SCHEDULED and third.attempt == 0
    assert third.slot_waiting_since is not None and third.slot_granted_at is None
    assert third.next_attempt_at >= before + timedelta(seconds=slots.RECHECK_SECONDS - 1)
    assert third.dispatched_at is None  # the redrive sweep rings it at its recheck if no one does
    waiting = Event.objects.get(workflow_id=third.workflow_id, kind="activity.waiting_for_slot")
    assert waiting.data["keys"] == {f"kind:{KIND}": {"cap": 2, "running": 2}}
    assert not ActivityAttempt.objects.filter(activity__in=[third, fourth]).exists()

    rung.clear()
    c = running[0]
    assert c is not None
    finish(c)
    third.refresh_from_db()
    assert third.slot_granted_at is not None and third.next_attempt_at <= clock.now()
    assert rang(rung, third) and not rang(rung, fourth)

    # The fourth, rung again (its recheck, or a duplicate doorbell), still waits: the slot is the third's.
    Activity.objects.filter(pk=fourth.pk).update(next_attempt_at=clock.now())
    assert claim(fourth) is None
    assert Event.objects.filter(workflow_id=fourth.workflow_id, kind="activity.waiting_for_slot").count() == 1

    granted = claim(third)
    assert granted is not None
    third.refresh_from_db()
    assert (third.status, third.slot_waiting_since, third.slot_granted_at) == (Activity.Status.RUNNING, None, None)
    started = Event.objects.get(workflow_id=third.workflow_id, kind="activity.started")
    assert started.data["slot_waited_ms"] >= 0
    assert Activity.objects.filter(workflow__kind=KIND, status=Activity.Status.RUNNING).count() == 2


@pytest.mark.skipif(connection.vendor != "postgresql", reason="SQLite runs one writing transaction at a time")
def test_workers_racing_for_the_last_slots_never_pass_the_cap(settings: Any) -> None:
    settings.AGENTOPS_ACTIVITY_CONCURRENCY = {f"kind:{KIND}": 3}
    acts = [launch() for _ in range(12)]
    queue = list(acts)

    def take() -> Claim | None:
        return claim(queue.pop())

    results = run_at_once(take, count=12)
    assert not [r for r in results if isinstance(r, Exception)]
    assert sum(r is not None for r in results) == 3
    assert Activity.objects.filter(status=Activity.Status.RUNNING).count() == 3
    assert Activity.objects.filter(slot_waiting_since__isnull=False).count() == 9


def test_other_kinds_are_not_held_by_a_kinds_cap(settings: Any) -> None:
    settings.AGENTOPS_ACTIVITY_CONCURRENCY = {f"kind:{KIND}": 1}
    assert claim(launch()) is not None
    assert claim(launch()) is None
    assert claim(launch(OTHER_KIND)) is not None
    assert claim(launch(OTHER_KIND)) is not None


def test_a_free_slot_goes_to_the_tenant_with_the_fewest_running_before_an_older_waiter(
        settings: Any, rung: list[tuple[str, int]], requester: User, approver: User) -> None:
    settings.AGENTOPS_ACTIVITY_CONCURRENCY = {f"kind:{KIND}": 2}
    big = [launch(user=requester) for _ in range(5)]
    small = launch(user=approver)
    running = [claim(big[0]), claim(big[1])]
    assert [claim(a) for a in big[2:]] == [None] * 3
    assert claim(small) is None  # the newest waiter

    rung.clear()
    c = running[0]
    assert c is not None
    finish(c)
    # The big tenant still runs one; the small one none: its waiter goes first although it came last.
    assert rang(rung, small) and not any(rang(rung, a) for a in big)


def test_priority_goes_before_fair_share_and_age(settings: Any, rung: list[tuple[str, int]]) -> None:
    settings.AGENTOPS_ACTIVITY_CONCURRENCY = {f"kind:{KIND}": 1}
    holder = claim(launch())
    older = launch()
    urgent = launch(priority=9)
    assert claim(older) is None and claim(urgent) is None
    rung.clear()
    assert holder is not None
    finish(holder)
    assert rang(rung, urgent) and not rang(rung, older)


def test_a_changed_priority_moves_a_waiting_activity_at_once(settings: Any, rung: list[tuple[str, int]]) -> None:
    settings.AGENTOPS_ACTIVITY_CONCURRENCY = {f"kind:{KIND}": 1}
    holder = claim(launch())
    older, raised = launch(), launch()
    assert claim(older) is None and claim(raised) is None
    services.workflow_priority_set(workflow_id=raised.workflow_id, priority=9)
    rung.clear()
    assert holder is not None
    finish(holder)
    assert rang(rung, raised) and not rang(rung, older)


def test_a_tenant_cap_by_label_holds_that_tenant_only(settings: Any) -> None:
    settings.AGENTOPS_TENANT_LABEL = "team"
    settings.AGENTOPS_ACTIVITY_CONCURRENCY = {"tenant:team=infra": 1, "tenant:*": 3}
    infra = [launch(labels={"team": "infra"}) for _ in range(2)]
    web = [launch(labels={"team": "web"}) for _ in range(4)]
    assert claim(infra[0]) is not None and claim(infra[1]) is None
    assert [claim(a) is not None for a in web] == [True, True, True, False]
    assert set(Activity.objects.filter(status=Activity.Status.RUNNING).values_list("tenant", flat=True)) == {
        "team=infra", "team=web"}
    overview = slots.overview()
    assert overview is not None
    by_key = {row["key"]: row for row in overview["keys"]}
    assert by_key["tenant:team=infra"] == {"key": "tenant:team=infra", "cap": 1, "running": 1,
                                           "waiting": {("team=infra", 5): 1}}
    assert by_key["tenant:team=web"] == {"key": "tenant:team=web", "cap": 3, "running": 3,
                                         "waiting": {("team=web", 5): 1}}


def test_a_lost_lease_and_a_cancel_free_their_slots(settings: Any, rung: list[tuple[str, int]]) -> None:
    settings.AGENTOPS_ACTIVITY_CONCURRENCY = {f"kind:{KIND}": 1}
    holder = launch()
    assert claim(holder) is not None
    waiter = launch()
    assert claim(waiter) is None

    rung.clear()
    Activity.objects.filter(pk=holder.pk).update(lease_expires_at=clock.now() - timedelta(seconds=1))
    assert activity_lease_expire_if_due(activity_id=holder.pk)
    assert rang(rung, waiter)
    assert claim(waiter) is not None

    third = launch()
    assert claim(third) is None
    rung.clear()
    services.workflow_cancel(workflow_id=waiter.workflow_id, reason="changed my mind")
    assert rang(rung, third)
    assert claim(third) is not None


def test_a_slot_handed_to_a_workflow_cancelled_before_it_ran_goes_to_the_next(
        settings: Any, rung: list[tuple[str, int]]) -> None:
    settings.AGENTOPS_ACTIVITY_CONCURRENCY = {f"kind:{KIND}": 1}
    holder = claim(launch())
    granted, next_in_line = launch(), launch()
    assert claim(granted) is None and claim(next_in_line) is None
    assert holder is not None
    finish(holder)
    rung.clear()
    services.workflow_cancel(workflow_id=granted.workflow_id, reason="not needed after all")
    assert rang(rung, next_in_line)
    assert claim(next_in_line) is not None


def test_a_slot_handed_out_and_never_taken_comes_back_after_its_hold(
        settings: Any, rung: list[tuple[str, int]]) -> None:
    settings.AGENTOPS_ACTIVITY_CONCURRENCY = {f"kind:{KIND}": 1}
    holder = claim(launch())
    lost_doorbell, patient = launch(), launch()
    assert claim(lost_doorbell) is None and claim(patient) is None
    assert holder is not None
    finish(holder)  # the slot is handed to lost_doorbell, whose doorbell never comes
    Activity.objects.filter(pk=lost_doorbell.pk).update(
        slot_granted_at=clock.now() - timedelta(seconds=slots.grant_hold_seconds() + 1))
    Activity.objects.filter(pk=patient.pk).update(next_attempt_at=clock.now())  # its recheck
    # The expired hand-out is no longer a slot; the oldest waiter (lost_doorbell) gets the slot again.
    rung.clear()
    assert claim(patient) is None
    assert rang(rung, lost_doorbell)
    assert claim(lost_doorbell) is not None


def test_a_paused_workflows_waiting_activity_is_passed_over(settings: Any, rung: list[tuple[str, int]]) -> None:
    settings.AGENTOPS_ACTIVITY_CONCURRENCY = {f"kind:{KIND}": 1}
    holder = claim(launch())
    paused, next_in_line = launch(), launch()
    assert claim(paused) is None and claim(next_in_line) is None
    services.workflow_pause(workflow_id=paused.workflow_id, reason="looking at it")
    rung.clear()
    assert holder is not None
    finish(holder)
    assert rang(rung, next_in_line) and not rang(rung, paused)


def test_under_a_cap_the_next_activity_is_not_chained_but_takes_its_turn(
        settings: Any, rung: list[tuple[str, int]]) -> None:
    settings.AGENTOPS_ACTIVITY_CHAIN_SECONDS = 60
    settings.AGENTOPS_ACTIVITY_CONCURRENCY = {f"kind:{KIND}": 1}
    workflow = services.workflow_launch(kind=KIND, goal="Count", params={"steps": 2})
    first = Activity.objects.get(workflow=workflow)
    waiter = launch()
    c = claim(first)
    assert c is not None and claim(waiter) is None
    rung.clear()
    chain = ChainSlot(worker="w1", task_id="t")
    services.activity_result_record_if_current(claim=c, result={"i": 0}, chain=chain)
    assert chain.claim is None
    second = Activity.objects.filter(workflow=workflow).order_by("pk").last()
    assert second is not None and second.pk != first.pk
    assert rang(rung, waiter) and rang(rung, second)
    assert claim(second) is None  # the waiter was first
    assert claim(waiter) is not None


def test_without_keys_nothing_waits_and_the_tenant_is_recorded(settings: Any, requester: User) -> None:
    settings.AGENTOPS_ACTIVITY_CONCURRENCY = {}
    acts = [launch(user=requester) for _ in range(5)]
    assert all(claim(a) is not None for a in acts)
    assert set(Activity.objects.values_list("tenant", flat=True)) == {f"user:{requester.pk}"}
    assert slots.overview() is None
    assert not Workflow.objects.filter(events__kind="activity.waiting_for_slot").exists()


def test_metrics_and_the_admin_show_each_key_its_use_and_who_waits(
        settings: Any, client: Any, admin_client: Any, requester: User) -> None:
    from tests.test_metrics import TOKEN, samples, scrape

    settings.AGENTOPS_METRICS_TOKEN = TOKEN
    settings.AGENTOPS_ACTIVITY_CONCURRENCY = {f"kind:{KIND}": 1, "tenant:*": 10}
    assert claim(launch(user=requester)) is not None
    assert claim(launch(user=requester, priority=8)) is None
    assert claim(launch(user=requester)) is None

    found = samples(scrape(client).content.decode())

    def value(name: str, **labels: str) -> float:
        return found[(name, tuple(sorted(labels.items())))]

    tenant = f"user:{requester.pk}"
    assert value("agentops_activity_slots", key=f"kind:{KIND}") == 1
    assert value("agentops_activity_slots_limit", key=f"kind:{KIND}") == 1
    assert value("agentops_activity_slots", key=f"tenant:{tenant}") == 1
    assert value("agentops_activity_slots_limit", key=f"tenant:{tenant}") == 10
    assert value("agentops_activity_slot_waiting", key=f"kind:{KIND}", tenant=tenant, priority="8") == 1
    assert value("agentops_activity_slot_waiting", key=f"kind:{KIND}", tenant=tenant, priority="5") == 1

    waiting = Activity.objects.filter(status=Activity.Status.SCHEDULED, slot_waiting_since__isnull=False).first()
    assert waiting is not None
    card = admin_client.get(f"/admin/workflows/workflow/{waiting.workflow_id}/change/").content.decode()
    assert "waiting for a concurrency slot since" in card

    page = admin_client.get("/admin/workflows/workflow/rate-limits/").content.decode()
    assert "Concurrent activities" in page
    assert f"<td>kind:{KIND}</td><td>1</td><td>1</td>" in page
    assert f"rita ({tenant}), 8: 1<br>rita ({tenant}), 5: 1" in page
