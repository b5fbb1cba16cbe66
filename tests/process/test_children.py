"""Child workflows on real workers and beat: two children run in parallel and
the parent completes with both results; a parent cancelled while its children hold deployments
leaves no live effect, its children's undone before its own."""
from __future__ import annotations

import time

import pytest
from django.conf import settings

import tests.child_kinds  # noqa: F401  (registers the kinds in this process too)
from tests.process.harness import Cluster, wait_until_status
from workflows import services
from workflows.models import Activity, ActivityAttempt, Commitment, Event, Workflow

pytestmark = [pytest.mark.process, pytest.mark.django_db(transaction=True)]

MODULES = ",".join([*settings.AGENTOPS_AGENT_MODULES, "tests.child_kinds"])


def test_a_parent_whose_two_children_run_in_parallel_completes_with_both_results(cluster: Cluster, figures):
    cluster.extra_env["AGENTOPS_AGENT_MODULES"] = MODULES
    cluster.start(workers=("wa", "wb"), beats=("beat",))
    started = time.monotonic()
    parent = services.workflow_launch(kind="test-fanout", goal="Square 6 and 7 at once",
                                      params={"ns": [6, 7], "seconds": 3}).pk
    wait_until_status(cluster, [parent], "completed", timeout=90)
    elapsed = time.monotonic() - started
    done = Workflow.objects.get(pk=parent)
    kids = list(Workflow.objects.filter(parent_id=parent).order_by("pk"))
    assert done.result == {"children": [k.pk for k in kids],
                           "results": [{"n": 6, "square": 36}, {"n": 7, "square": 49}]}
    assert [k.status for k in kids] == ["completed", "completed"]
    attempts = [ActivityAttempt.objects.get(activity__workflow=k) for k in kids]
    overlap = (min(a.finished_at for a in attempts) - max(a.started_at for a in attempts)).total_seconds()
    assert overlap > 1.0, f"the children's work did not run at the same time (overlap {overlap:.2f} s)"
    assert Event.objects.filter(workflow_id=parent, kind="child.finished").count() == 2
    assert Event.objects.filter(workflow_id=parent, kind="child.started").count() == 2
    figures("two children in parallel", children=len(kids), child_work_seconds=3,
            overlap_seconds=round(overlap, 2), parent_seconds=round(elapsed, 2),
            workers=sorted({a.worker for a in attempts}))


def test_cancelling_the_parent_mid_child_leaves_no_live_effect(cluster: Cluster, deploy_target, figures):
    cluster.extra_env["AGENTOPS_AGENT_MODULES"] = MODULES
    cluster.start(workers=("wa", "wb"), beats=("beat",))
    parent = services.workflow_launch(kind="test-fanout", goal="Deploy, then two children deploy",
                                      params={"ns": [1, 2], "child_kind": "test-deployer", "deploy_first": True}).pk
    cluster.wait_for(lambda: Workflow.objects.filter(parent_id=parent, status="waiting", current_node="HOLD").count()
                     == 2, timeout=90, what="both children to hold a deployment")
    assert Commitment.objects.filter(status="active").count() == 3
    cancelled_at = time.monotonic()
    services.workflow_cancel(workflow_id=parent, reason="the plan changed", by="ops")
    wait_until_status(cluster, [parent], "cancelled", timeout=90)
    took = time.monotonic() - cancelled_at
    kids = list(Workflow.objects.filter(parent_id=parent).order_by("pk"))
    assert [k.status for k in kids] == ["cancelled", "cancelled"]
    assert all(k.reason == f"parent workflow {parent} was cancelled (the plan changed)" for k in kids)
    live_effects = {key: e for key, e in deploy_target.store.stats()["effects"].items() if e["created"] > e["deleted"]}
    assert live_effects == {}
    assert len(deploy_target.store.stats()["effects"]) == 3
    assert Commitment.objects.filter(status="active").count() == 0
    assert not Activity.objects.filter(status__in=("scheduled", "running")).exists()
    # The children's deployments were undone before the parent's own.
    undone = {a.workflow_id: a for a in Activity.objects.filter(name="undeploy")}
    parent_undo = ActivityAttempt.objects.filter(activity=undone[parent], status="succeeded").get()
    for kid in kids:
        kid_undo = ActivityAttempt.objects.filter(activity=undone[kid.pk], status="succeeded").get()
        assert kid_undo.finished_at <= parent_undo.started_at
    figures("parent cancelled mid-child", children=len(kids), effects=3, live_effects=len(live_effects),
            active_commitments=0, cancel_to_cancelled_seconds=round(took, 2),
            child_cancel_events=Event.objects.filter(workflow_id=parent, kind="child.cancelled").count())
