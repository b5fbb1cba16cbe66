"""6.16: the database connection drops in the middle of a transition; nothing half-applied remains."""
from __future__ import annotations

import json
from datetime import timedelta

import pytest
from django.db import DatabaseError, connection

from tests.conftest import release_params
from workflows import clock, services
from workflows.models import Activity, Event, Workflow

pytestmark = pytest.mark.django_db(transaction=True)


def test_connection_dropped_before_commit_rolls_back_and_the_retry_applies_once(
    git_repo, deploy_target, requester, settings, tmp_path
):
    """The backend is terminated just before the result's transaction commits: no event, no node
    change survives; the lease expires, attempt 2 records the result and advances exactly once."""
    if connection.vendor != "postgresql":
        pytest.skip("terminating a backend needs PostgreSQL")
    workflow = services.workflow_launch(kind="release", goal="g", params=release_params(git_repo), user=requester)
    services.workflow_advance_if_runnable(workflow_id=workflow.pk)
    activity = Activity.objects.get(workflow=workflow)
    settings.AGENTOPS_FAULT_LOG = str(tmp_path / "faults.log")
    settings.AGENTOPS_TESTING_FAULTS = json.dumps(
        [{"point": "transition.before_commit", "when": {"operation_id": activity.operation_id},
          "action": "pg_terminate_self"}]
    )
    events_before = Event.objects.filter(workflow=workflow).count() + 1  # + activity.started, committed earlier

    with pytest.raises(DatabaseError):
        services.activity_run_if_runnable(activity_id=activity.pk, worker="w1")
    connection.close()
    settings.AGENTOPS_TESTING_FAULTS = ""

    fired = [json.loads(line) for line in (tmp_path / "faults.log").read_text().splitlines()]
    assert [f["action"] for f in fired] == ["pg_terminate_self"]
    activity.refresh_from_db()
    workflow.refresh_from_db()
    assert (activity.status, activity.attempt) == ("running", 1)
    assert workflow.current_node == "GATHER_EVIDENCE"
    assert Event.objects.filter(workflow=workflow).count() == events_before

    Activity.objects.filter(pk=activity.pk).update(lease_expires_at=clock.now() - timedelta(seconds=1))
    assert services.leases_reap_expired() == 1
    assert services.activity_run_if_runnable(activity_id=activity.pk, worker="w2") == services.RunOutcome.RECORDED

    workflow = Workflow.objects.get(pk=workflow.pk)
    assert workflow.current_node == "BUILD_CANDIDATE"
    kinds = list(Event.objects.filter(workflow=workflow).values_list("kind", flat=True))
    assert kinds.count("activity.succeeded") == 1
    assert kinds.count("node.entered") == 1
    seqs = list(Event.objects.filter(workflow=workflow).values_list("seq", flat=True))
    assert seqs == list(range(1, len(seqs) + 1))
