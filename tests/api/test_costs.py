"""Cost per step: the usage ledger per node, activity and model, on the API and the
workflow page, adding up to what the budget counts."""
from __future__ import annotations

from decimal import Decimal
from typing import Any

import pytest
from django.contrib.auth.models import User
from django.test import Client

from tests.api.conftest import Http, grant, token_for
from tests.conftest import drive
from workflows import selectors, services
from workflows.features.costs.breakdown import cost_breakdown
from workflows.models import UsageEntry


@pytest.fixture
def workspaces(settings: Any, tmp_path: Any) -> None:
    settings.AGENTOPS_WORKSPACE_DIR = tmp_path / "workspaces"


def autonomous_run() -> Any:
    workflow = drive(services.workflow_launch(kind="autonomous", goal="Prepare onboarding notes").pk)
    assert workflow.status == "completed", workflow.reason
    return workflow


@pytest.mark.django_db
@pytest.mark.usefixtures("workspaces")
def test_spend_per_node_activity_and_model_adds_up_to_the_ledger() -> None:
    workflow = autonomous_run()
    costs = cost_breakdown(workflow)
    assert Decimal(costs["spent_usd"]) == selectors.spent_usd(workflow)
    entries = UsageEntry.objects.filter(workflow=workflow)
    for axis in ("node", "activity", "model"):
        rows = costs[f"by_{axis}"]
        assert sum(Decimal(r["usd"]) for r in rows) == Decimal(costs["spent_usd"])
        assert sum(r["calls"] for r in rows) == entries.count() == 11
        assert sum(r["output_tokens"] for r in rows) == sum(e.output_tokens for e in entries)
        assert [Decimal(r["usd"]) for r in rows] == sorted((Decimal(r["usd"]) for r in rows), reverse=True)
    assert {r["activity"] for r in costs["by_activity"]} == set(
        workflow.activities.filter(operation_id__in=entries.values("operation_id")).values_list("name", flat=True))
    assert {r["node"] for r in costs["by_node"]} <= {"PLANNING", "EXECUTION", "VERIFICATION", "ADAPTATION"}
    [model] = costs["by_model"]
    assert model["model"] == entries.first().model


@pytest.mark.django_db(transaction=True)
@pytest.mark.usefixtures("workspaces", "rung")
def test_the_api_and_the_workflow_page_show_the_spend_per_step(http: Http) -> None:
    workflow = autonomous_run()
    token = token_for(grant(User.objects.create_user("vera"), "view_workflow").username)
    answer = http.get(f"/workflows/{workflow.pk}/costs", token=token)
    assert answer.status == 200 and answer.body == cost_breakdown(workflow)
    assert http.get("/workflows/999999/costs", token=token).status == 404

    staff = User.objects.create_superuser("root", password="pw")
    client = Client()
    client.force_login(staff)
    page = client.get(f"/admin/workflows/workflow/{workflow.pk}/change/").content.decode()
    assert 'id="costs-by-node"' in page and 'id="costs-by-activity"' in page and 'id="costs-by-model"' in page
    top = cost_breakdown(workflow)["by_activity"][0]
    assert f"<code>{top['activity']}</code>" in page
