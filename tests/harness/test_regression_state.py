"""REGRESSION writes what changed: a check that passes again leaves its feature as it was."""
from __future__ import annotations

import pytest

from agentops.kind import resolve, state_at
from agentops.kind.presentation import Activity
from tests.harness.conftest import APP_BOTH, APP_GREET, launch_approved, solve

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.timeout(180)]


def test_a_feature_that_passes_its_regression_check_keeps_the_evidence_that_made_it_pass(
        harness_approver, mini_schedule):
    """F01 passes on its own commit; after F02's pass its check runs again on F02's commit and
    passes: the state entering ASSESS still holds F01's own run, the re-run is in the activity."""
    mini_schedule({"F01/1": solve("F01", APP_GREET), "F02/1": solve("F02", APP_BOTH)})
    workflow = launch_approved(harness_approver)
    assert workflow.status == "completed", workflow.reason

    regression = Activity.objects.get(workflow=workflow, node="REGRESSION", status="succeeded")
    rerun = resolve(workflow.pk, regression.result)["results"]
    assert [(r["feature"], r["passed"]) for r in rerun] == [("F01", True)]
    own = Activity.objects.get(workflow=workflow, node="VERIFY_FEATURE", input__features__0__id="F01")
    own_commit = resolve(workflow.pk, own.result)["results"][0]["commit"]
    assert own_commit != rerun[0]["commit"]
    entering_assess = state_at(workflow, regression.node_visit + 1)
    f01 = next(f for f in entering_assess["features"] if f["id"] == "F01")
    assert (f01["status"], f01["evidence"]["commit"]) == ("passing", own_commit)
