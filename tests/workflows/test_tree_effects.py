"""A tree of workflows is one unit of effect: what a completed child made belongs to its parent's
tree until the root ends, so a cancel, a new goal, a failure or a release change of an ancestor
undoes it or keeps it, never strands it nor makes it twice."""
from __future__ import annotations

from decimal import Decimal
from io import StringIO
from typing import Any

import pytest
from django.core.management import CommandError, call_command
from django.db import transaction

import tests.child_kinds  # noqa: F401 (registers the kinds)
from tests.conftest import drive
from tests.workflows.test_children import children_of, drive_tree, events
from workflows import clock, selectors, services
from workflows.errors import BudgetDeferred, InvalidInput
from workflows.models import Activity, Commitment, UsageEntry, Workflow
from workflows.services.children import children_collect_if_finished
from workflows.services.common import workflow_lock
from workflows.services.visits import fail_locked

pytestmark = [pytest.mark.django_db, pytest.mark.usefixtures("rung")]


def effects(deploy_target: Any) -> tuple[int, int]:
    """(deployments created, deleted) on the target, all keys together."""
    stats = deploy_target.store.stats()["effects"].values()
    return sum(e["created"] for e in stats), sum(e["deleted"] for e in stats)


def child_completed(parent: Workflow, child: Workflow) -> Workflow:
    """``child`` (holding its deployment) is told to finish and completes; its end is not yet collected."""
    services.workflow_signal(workflow_id=child.pk, name="finish", payload={})
    done = drive(child.pk)
    assert done.status == "completed", done.reason
    return done


@pytest.fixture
def one_deployer(deploy_target: Any) -> tuple[Workflow, Workflow]:
    parent = services.workflow_launch(kind="test-fanout", goal="Deploy once",
                                      params={"ns": [1], "child_kind": "test-deployer"})
    drive_tree(parent.pk, rounds=3)
    (kid,) = children_of(parent.pk)
    assert kid.current_node == "HOLD" and effects(deploy_target) == (1, 0)
    return Workflow.objects.get(pk=parent.pk), kid


def test_a_cancel_before_a_completed_childs_end_is_collected_undoes_the_childs_effect(one_deployer, deploy_target):
    parent, kid = one_deployer
    kid = child_completed(parent, kid)
    assert [e["parent"] for e in events(kid.pk, "commitment.held_for_parent")] == [parent.pk]
    assert Commitment.objects.get().status == "active"  # kept for the parent, not released

    services.workflow_cancel(workflow_id=parent.pk, reason="not needed", by="ops")
    done = drive_tree(parent.pk)

    assert done.status == "cancelled"
    assert effects(deploy_target) == (1, 1)
    commitment = Commitment.objects.get()
    assert (commitment.status, commitment.workflow_id, commitment.handed_over_by_id) == ("compensated", parent.pk,
                                                                                        kid.pk)
    assert [e["child"] for e in events(parent.pk, "commitment.adopted")] == [kid.pk]
    assert Activity.objects.get(name="undeploy").workflow_id == parent.pk


def test_a_tree_that_completes_releases_its_childrens_effects_at_the_root(one_deployer, deploy_target):
    parent, kid = one_deployer
    child_completed(parent, kid)
    done = drive_tree(parent.pk)
    assert done.status == "completed", done.reason
    commitment = Commitment.objects.get()
    assert (commitment.status, commitment.workflow_id, commitment.handed_over_by_id) == ("released", parent.pk,
                                                                                        kid.pk)
    assert effects(deploy_target) == (1, 0)
    assert [e["commitment_id"] for e in events(parent.pk, "commitment.released")] == [commitment.pk]


def test_a_release_change_after_a_childs_effect_keeps_course(one_deployer, deploy_target, settings):
    parent, kid = one_deployer
    child_completed(parent, kid)
    settings.AGENTOPS_PROMPT_VERSION = "tree-prompt-2"  # the workers restarted with a new prompt

    done = drive_tree(parent.pk)

    assert done.status == "completed", done.reason
    assert len(children_of(parent.pk)) == 1 and effects(deploy_target) == (1, 0)
    kept = events(parent.pk, "release.kept_course")
    assert len(kept) == 1 and kept[0]["effects"] == [Commitment.objects.get().activity.operation_id]


@pytest.fixture
def two_deployers(deploy_target: Any) -> tuple[Workflow, list[Workflow]]:
    """A parent that deployed, one child completed (collected: the parent holds its deployment), one holding."""
    parent = services.workflow_launch(kind="test-fanout", goal="Deploy twice",
                                      params={"ns": [1, 2], "child_kind": "test-deployer", "deploy_first": True})
    drive_tree(parent.pk, rounds=3)
    kids = children_of(parent.pk)
    child_completed(parent, kids[0])
    children_collect_if_finished(workflow_id=parent.pk)
    assert Commitment.objects.filter(workflow_id=parent.pk, status="active").count() == 2
    assert effects(deploy_target) == (3, 0)
    return Workflow.objects.get(pk=parent.pk), kids


def test_a_new_goal_undoes_what_a_completed_child_handed_over(two_deployers, deploy_target):
    parent, kids = two_deployers
    services.workflow_supersede(workflow_id=parent.pk, goal="Deploy differently")
    drive(kids[1].pk)
    children_collect_if_finished(workflow_id=parent.pk)
    drive(parent.pk)

    undone = Activity.objects.filter(name="undeploy", status="succeeded")
    assert undone.count() == 3, list(Activity.objects.filter(name="undeploy").values_list("workflow_id", "status"))
    old = Commitment.objects.filter(intent_version=1)
    assert old.count() == 3 and set(old.values_list("status", flat=True)) == {"compensated"}


def test_a_failed_parent_undoes_what_a_completed_child_handed_over(two_deployers, deploy_target):
    parent, kids = two_deployers
    with transaction.atomic():
        fail_locked(workflow_lock(parent.pk), "gave up", now=clock.now())
    drive(kids[1].pk)
    children_collect_if_finished(workflow_id=parent.pk)
    drive(parent.pk)

    assert Workflow.objects.get(pk=parent.pk).status == "failed"
    assert set(Commitment.objects.values_list("status", flat=True)) == {"compensated"}
    assert effects(deploy_target) == (3, 3)


def test_show_says_which_child_made_a_commitment(two_deployers):
    parent, kids = two_deployers
    rows = selectors.workflow_detail(Workflow.objects.get(pk=parent.pk))["commitments"]
    assert sorted((r["handed_over_by"] or 0) for r in rows) == [0, kids[0].pk]


def test_a_childs_budget_never_grows_past_what_its_ancestors_have_left(deploy_target, requester):
    """Parent total 1.00 gives its child 0.40: the child may grow to what the parent has left (0.60
    more), not to 5.00, from the service and the command line alike; lowering is always allowed."""
    parent = services.workflow_launch(kind="test-fanout", goal="Deploy",
                                      params={"ns": [1], "child_kind": "test-deployer", "budget_usd": "0.40"},
                                      options=services.LaunchOptions(budget_total_usd=Decimal("1.00")))
    drive_tree(parent.pk, rounds=2)
    (kid,) = children_of(parent.pk)
    assert kid.budget_total_usd == Decimal("0.40")

    with pytest.raises(InvalidInput, match=rf"would count 4.6000 more against workflow {parent.pk}, which has "
                                           r"0.6000 of its 1.0000 left"):
        services.workflow_budget_set(workflow_id=kid.pk, user=None, total_usd=Decimal("5"))
    err = StringIO()
    with pytest.raises(CommandError, match="Raise workflow"):
        call_command("agent", "budget", str(kid.pk), "--total", "5", "--user", requester.username, stderr=err)
    assert Workflow.objects.get(pk=kid.pk).budget_total_usd == Decimal("0.40")
    assert not events(kid.pk, "budget.changed")

    services.workflow_budget_set(workflow_id=kid.pk, user=None, total_usd=Decimal("1.00"))
    assert selectors.spent_usd(Workflow.objects.get(pk=parent.pk)) == Decimal("1.00")
    services.workflow_budget_set(workflow_id=kid.pk, user=None, total_usd=Decimal("0.10"))
    assert Workflow.objects.get(pk=kid.pk).budget_total_usd == Decimal("0.10")


def reserve(workflow_id: int, key: str, usd: str) -> bool:
    return services.budget_reserve_ensure(workflow_id=workflow_id, key=key, operation_id=key.split("#")[0],
                                          provider="scripted", model="scripted/m", estimate_usd=Decimal(usd))


def test_children_spend_within_their_parents_hourly_limit_together(deploy_target):
    """Each child gets its parent's hourly limit, and the tree's last hour counts against the
    parent's: two children at 0.40 each under a 1.00/h parent leave room for one more 0.20, not 0.80."""
    parent = services.workflow_launch(kind="test-fanout", goal="Deploy",
                                      params={"ns": [1, 2], "child_kind": "test-deployer"},
                                      options=services.LaunchOptions(budget_hourly_usd=Decimal("1.00")))
    drive_tree(parent.pk, rounds=2)
    first, second = children_of(parent.pk)
    assert first.budget_hourly_usd == second.budget_hourly_usd == Decimal("1.00")
    reserve(first.pk, "a#0", "0.40")
    reserve(second.pk, "b#0", "0.40")

    with pytest.raises(BudgetDeferred, match=rf"The tree of workflow {parent.pk} spent 0.8000 USD in the last "
                                             r"hour \(its hourly limit 1.0000"):
        reserve(first.pk, "c#0", "0.30")
    with pytest.raises(BudgetDeferred, match=rf"Workflow {parent.pk} spent 0.8000 USD in the last hour"):
        reserve(parent.pk, "p#0", "0.30")
    assert reserve(second.pk, "d#0", "0.20") is True
    assert not UsageEntry.objects.filter(key__in=["c#0", "p#0"]).exists()
