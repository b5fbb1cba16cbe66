"""/metrics: a Prometheus scrape of the durable rows, behind a bearer token."""
from __future__ import annotations

from typing import Any

import pytest
from prometheus_client.parser import text_string_to_metric_families

from tests.conftest import drive, release_params
from workflows import services

pytestmark = pytest.mark.django_db

TOKEN = "scrape-token-0123456789"


def scrape(client: Any, token: str = TOKEN) -> Any:
    return client.get("/metrics", HTTP_AUTHORIZATION=f"Bearer {token}")


def samples(text: str) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    return {(s.name, tuple(sorted(s.labels.items()))): s.value
            for family in text_string_to_metric_families(text) for s in family.samples}


def test_a_scrape_reports_workflows_activities_waits_and_spend(client, settings, git_repo, deploy_target,
                                                               requester, tmp_path):
    settings.AGENTOPS_METRICS_TOKEN = TOKEN
    settings.AGENTOPS_WORKSPACE_DIR = tmp_path / "workspaces"
    drive(services.workflow_launch(kind="release", goal="Ship the notes", params=release_params(git_repo),
                                   user=requester).pk)
    drive(services.workflow_launch(kind="autonomous", goal="Prepare notes").pk)

    response = scrape(client)

    assert response.status_code == 200 and response["Content-Type"].startswith("text/plain")
    found = samples(response.content.decode())
    assert found[("agentops_workflows", (("kind", "release"), ("status", "waiting")))] == 1
    assert found[("agentops_workflows", (("kind", "autonomous"), ("status", "completed")))] == 1
    assert found[("agentops_activities", (("name", "run_tests"), ("status", "succeeded")))] == 1
    assert found[("agentops_activity_attempts", (("name", "propose_change"), ("status", "succeeded")))] == 1
    assert found[("agentops_waits_open", (("kind", "approval"),))] == 1
    assert found[("agentops_wait_oldest_age_seconds", (("kind", "approval"),))] >= 0
    assert found[("agentops_model_spend_usd", (("status", "charged"),))] > 0
    assert found[("agentops_activity_attempt_seconds_count", (("name", "run_tests"),))] == 1
    assert found[("agentops_model_call_seconds_count", (("model", "scripted/claude-sonnet-5-5"),))] >= 1
    assert found[("agentops_workflows_advance_failing", ())] == 0


def test_metrics_need_the_token_and_are_off_without_one(client, settings):
    settings.AGENTOPS_METRICS_TOKEN = ""
    assert client.get("/metrics").status_code == 404
    settings.AGENTOPS_METRICS_TOKEN = TOKEN
    assert client.get("/metrics").status_code == 401
    assert scrape(client, token="wrong-token-0123456789").status_code == 401
    assert scrape(client).status_code == 200
