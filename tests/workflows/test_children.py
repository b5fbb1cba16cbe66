"""Child workflows: started once, run in parallel, their ends delivered to the parent; budgets
reserved from the parent's; a parent's cancel, failure and new goal cancel its children and undo
their effects before its own."""
from __future__ import annotations

from decimal import Decimal
from typing import Any

import pytest

import tests.child_kinds  # registers the kinds; its square is an activity here too
from tests.conftest import drive
from workflows import engine, selectors, services
from workflows.models import Activity, Commitment, Event, Wait, Workflow
from workflows.services.children import children_collect_if_finished
from workflows.services.common import workflow_lock
from workflows.services.workflows import child_start

pytestmark = [pytest.mark.django_db, pytest.mark.usefixtures("rung")]


def children_of(parent: int) -> list[Workflow]:
    return list(Workflow.objects.filter(parent_id=parent).order_by("pk"))


def drive_tree(parent: int, *, rounds: int = 10) -> Workflow:
    """Drive the parent and its children in process, delivering each child's end as its doorbell would."""
    for _ in range(rounds):
        drive(parent)
        for child in children_of(parent):
            drive(child.pk)
        children_collect_if_finished(workflow_id=parent)
    return drive(parent)


def events(workflow_id: int, kind: str) -> list[dict[str, Any]]:
    return list(Event.objects.filter(workflow_id=workflow_id, kind=kind).order_by("seq").values_list("data", flat=True))


def test_two_children_run_in_parallel_and_the_parent_gets_both_results() -> None:
    """Both children's work is scheduled before either ends; the parent waits, then completes with both."""
    parent = services.workflow_launch(kind="test-fanout", goal="Square two numbers", params={"ns": [3, 4]})
    drive(parent.pk)
    parent.refresh_from_db()
    kids = children_of(parent.pk)
    assert parent.status == "waiting" and [k.kind for k in kids] == ["test-square", "test-square"]
    assert all(Activity.objects.filter(workflow=k, status="scheduled").exists() for k in kids)  # both in flight
    assert [k.parent_wait.operation_id for k in kids] == [f"wf-{parent.pk}/FAN.2/i1/{n}" for n in (0, 1)]
    done = drive_tree(parent.pk)
    assert done.status == "completed", done.reason
    assert done.result == {"children": [k.pk for k in kids],
                           "results": [{"n": 3, "square": 9}, {"n": 4, "square": 16}]}
    assert [e["status"] for e in events(parent.pk, "child.finished")] == ["completed", "completed"]
    launched = events(kids[0].pk, "workflow.launched")[0]
    assert (launched["parent"], launched["operation_id"]) == (parent.pk, kids[0].parent_wait.operation_id)


def test_starting_a_child_twice_starts_one() -> None:
    """A duplicate doorbell replays the handler, and child_start on a started operation starts nothing."""
    parent = services.workflow_launch(kind="test-fanout", goal="Square", params={"ns": [5]})
    drive(parent.pk)
    services.workflow_advance_if_runnable(workflow_id=parent.pk)
    (kid,) = children_of(parent.pk)
    command = engine.StartChild(operation_id=kid.parent_wait.operation_id, child_kind="test-square", goal="again",
                                params={"n": 5}, budget_usd=None)
    assert child_start(workflow_lock(parent.pk), command, now=kid.created_at) is True
    assert len(children_of(parent.pk)) == 1 and len(events(parent.pk, "child.started")) == 1


def test_a_failed_child_is_seen_by_the_parent() -> None:
    parent = services.workflow_launch(kind="test-fanout", goal="Square", params={"ns": [2, -1]})
    done = drive_tree(parent.pk)
    assert done.status == "failed"
    bad = children_of(parent.pk)[1]
    assert done.reason == f"child {bad.pk} failed: activity test_child_square failed: Permanent: no square for -1 here"


def test_a_childs_budget_is_reserved_from_the_parents() -> None:
    """Each child gets its budget as its total; the parent counts them while they run, and pauses
    when the next one does not fit."""
    parent = services.workflow_launch(kind="test-fanout", goal="Square", params={"ns": [1, 2, 3], "budget_usd": "0.40"},
                                      options=services.LaunchOptions(budget_total_usd=Decimal("1.00")))
    drive(parent.pk)
    parent.refresh_from_db()
    kids = children_of(parent.pk)
    assert [k.budget_total_usd for k in kids] == [Decimal("0.40"), Decimal("0.40")]
    assert selectors.spent_usd(parent) == Decimal("0.80")
    assert (parent.status, parent.pause_cause) == ("paused", "budget")
    assert "has 0.2000 of its 1.0000 USD left" in parent.reason and "needs 0.4000" in parent.reason
    services.workflow_budget_set(workflow_id=parent.pk, user=None, total_usd=Decimal("1.20"))
    done = drive_tree(parent.pk)
    assert done.status == "completed" and len(children_of(parent.pk)) == 3
    assert selectors.spent_usd(done) == Decimal(0)  # the children ended having spent nothing


def test_a_child_without_a_budget_gets_what_remains() -> None:
    parent = services.workflow_launch(kind="test-fanout", goal="Square", params={"ns": [1]},
                                      options=services.LaunchOptions(budget_total_usd=Decimal("0.50")))
    drive(parent.pk)
    assert [k.budget_total_usd for k in children_of(parent.pk)] == [Decimal("0.5000")]


@pytest.fixture
def fanout_of_deployers(deploy_target: Any) -> tuple[Workflow, list[Workflow]]:
    """A parent that deployed, with two children each holding a deployment."""
    parent = services.workflow_launch(kind="test-fanout", goal="Deploy twice",
                                      params={"ns": [1, 2], "child_kind": "test-deployer", "deploy_first": True})
    drive_tree(parent.pk, rounds=3)
    kids = children_of(parent.pk)
    assert [k.current_node for k in kids] == ["HOLD", "HOLD"]
    assert Commitment.objects.filter(status="active").count() == 3
    return Workflow.objects.get(pk=parent.pk), kids


def test_cancelling_the_parent_cancels_its_children_and_undoes_theirs_first(
    fanout_of_deployers: tuple[Workflow, list[Workflow]], deploy_target: Any
) -> None:
    parent, kids = fanout_of_deployers
    result = services.workflow_cancel(workflow_id=parent.pk, reason="not needed", by="ops")
    assert result.status == "cancelling"
    for kid in kids:
        kid.refresh_from_db()
        assert kid.status == "cancelling" and kid.reason == f"parent workflow {parent.pk} was cancelled (not needed)"
        assert events(kid.pk, "workflow.cancelling")[0]["by"] == f"parent workflow {parent.pk} (ops)"
    assert [e["child"] for e in events(parent.pk, "child.cancelled")] == [k.pk for k in kids]
    # The parent's own deployment waits for its children's to be undone.
    assert not Activity.objects.filter(workflow=parent, name="undeploy").exists()
    done = drive_tree(parent.pk)
    assert done.status == "cancelled"
    undos = list(Activity.objects.filter(name="undeploy").order_by("created_at", "pk"))
    assert undos[-1].workflow_id == parent.pk and {a.workflow_id for a in undos[:2]} == {k.pk for k in kids}
    assert Commitment.objects.filter(status="active").count() == 0
    assert all(e == {"created": 1, "deleted": 1} for e in deploy_target.store.stats()["effects"].values())
    assert [e["status"] for e in events(parent.pk, "child.finished")] == ["cancelled", "cancelled"]


def test_a_new_goal_cancels_the_children_and_undoes_their_effects_before_the_parents(
    fanout_of_deployers: tuple[Workflow, list[Workflow]],
) -> None:
    parent, kids = fanout_of_deployers
    services.workflow_supersede(workflow_id=parent.pk, goal="Deploy differently")
    assert all(Workflow.objects.get(pk=k.pk).status == "cancelling" for k in kids)
    assert events(parent.pk, "compensation.deferred")[0]["children"] == [k.pk for k in kids]
    assert not Activity.objects.filter(workflow=parent, name="undeploy").exists()
    for kid in kids:
        drive(kid.pk)
    assert all(Workflow.objects.get(pk=k.pk).status == "cancelled" for k in kids)
    children_collect_if_finished(workflow_id=parent.pk)
    assert Activity.objects.filter(workflow=parent, name="undeploy").count() == 1
    assert Wait.objects.filter(workflow=parent, kind="child", status="open").count() == 0


def test_a_failed_parent_cancels_its_children(fanout_of_deployers: tuple[Workflow, list[Workflow]]) -> None:
    from django.db import transaction

    from workflows import clock
    from workflows.services.visits import fail_locked

    parent, kids = fanout_of_deployers
    with transaction.atomic():
        fail_locked(workflow_lock(parent.pk), "gave up", now=clock.now())
    assert all(Workflow.objects.get(pk=k.pk).reason == f"parent workflow {parent.pk} failed: gave up" for k in kids)
    assert not Activity.objects.filter(workflow=parent, name="undeploy").exists()
    for kid in kids:
        drive(kid.pk)
    children_collect_if_finished(workflow_id=parent.pk)
    assert Activity.objects.filter(workflow=parent, name="undeploy").count() == 1


def test_show_lists_children_and_a_child_its_parent() -> None:
    parent = services.workflow_launch(kind="test-fanout", goal="Square", params={"ns": [1, 2]})
    drive(parent.pk)
    kids = children_of(parent.pk)
    detail = selectors.workflow_detail(Workflow.objects.get(pk=parent.pk))
    assert detail["parent"] is None
    assert [(c["id"], c["kind"], c["status"]) for c in detail["children"]] == [(k.pk, "test-square", "running")
                                                                                for k in kids]
    assert selectors.workflow_detail(kids[0])["parent"] == {"id": parent.pk, "kind": "test-fanout",
                                                            "operation_id": kids[0].parent_wait.operation_id}


def test_a_lost_end_doorbell_is_delivered_by_the_sweep_once() -> None:
    """A child ended but its parent was never rung: beat's sweep delivers it; running it again does nothing."""
    from workflows.services.sweeps import children_collect_due

    parent = services.workflow_launch(kind="test-fanout", goal="Square", params={"ns": [2]})
    drive(parent.pk)
    (kid,) = children_of(parent.pk)
    assert drive(kid.pk).status == "completed"  # its doorbell to the parent is "lost": nobody collects
    assert Workflow.objects.get(pk=parent.pk).status == "waiting"
    assert children_collect_due() == 1
    assert children_collect_due() == 0
    assert children_collect_if_finished(workflow_id=parent.pk) == 0
    assert Workflow.objects.get(pk=parent.pk).status == "running"  # woken; its advance is rung
    assert drive(parent.pk).result == {"children": [kid.pk], "results": [{"n": 2, "square": 4}]}
    assert len(events(parent.pk, "child.finished")) == 1


def test_a_child_ends_the_parent_in_its_own_visit_only() -> None:
    """The end of a child of a visit the parent left is recorded and wakes nothing."""
    parent = services.workflow_launch(kind="test-fanout", goal="Square", params={"ns": [2]})
    drive(parent.pk)
    (kid,) = children_of(parent.pk)
    services.workflow_supersede(workflow_id=parent.pk, goal="Square again")
    assert Workflow.objects.get(pk=kid.pk).status == "cancelled"  # nothing to compensate: ended at once
    children_collect_if_finished(workflow_id=parent.pk)
    assert events(parent.pk, "child.finished")[0]["status"] == "cancelled"
    assert len(children_of(parent.pk)) == 1  # the new visit's child starts on the next advance
    assert drive_tree(parent.pk).status == "completed" and len(children_of(parent.pk)) == 2


class StartAndLeave(engine.WorkflowDefinition):
    """Once its activity's result is in, starts a child and leaves the node in the same advance."""

    kind = "test-start-and-leave"
    start_node = "START"
    revalidate_node = "START"

    def validate_params(self, params: dict[str, Any]) -> dict[str, Any]:
        return params

    @engine.node("START")
    def start(self, ctx: engine.NodeContext[Any]) -> engine.Decision:
        ctx.activity(tests.child_kinds.square, {"n": 3})
        ctx.child("test-deployer", "Hold a deployment", {"n": 1})
        return engine.Goto("DONE")

    @engine.node("DONE")
    def done(self, ctx: engine.NodeContext[Any]) -> engine.Decision:
        return engine.Complete()


def test_a_child_started_in_the_advance_that_leaves_its_node_is_cancelled() -> None:
    """The advance that records the activity's result read no open child wait with its row lock;
    the one it opens itself is still found when it leaves the node, and its child cancelled."""
    from workflows.testing import registered

    with registered(StartAndLeave):
        parent = services.workflow_launch(kind="test-start-and-leave", goal="Start and leave")
        assert drive(parent.pk).status == "completed"
    (kid,) = children_of(parent.pk)
    assert Workflow.objects.get(pk=kid.pk).status in ("cancelling", "cancelled")
    assert [e["reason"] for e in events(parent.pk, "child.cancelled")] == [
        f"parent workflow {parent.pk} left node START (visit 1) that started it"]


def test_a_handle_of_another_visit_is_refused_as_a_bug_of_the_definition() -> None:
    from workflows.engine import ChildHandle, Decision, NodeContext, WorkflowDefinition, node
    from workflows.errors import InvalidDecision
    from workflows.testing import WorkflowRun

    class Stale(WorkflowDefinition):
        kind = "test-stale-handle"
        start_node = "LATER"
        revalidate_node = "LATER"

        @node("LATER")
        def later(self, ctx: NodeContext[Any]) -> Decision:
            ctx.wait_children(ChildHandle(operation_id="wf-1/EARLIER.1/i1/0", kind="test-square"))
            raise AssertionError("not reached")

    with pytest.raises(InvalidDecision, match="which another node visit started"):
        WorkflowRun(Stale)
