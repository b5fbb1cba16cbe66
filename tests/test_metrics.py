"""/metrics: a Prometheus scrape of the durable rows, behind a bearer token."""
from __future__ import annotations

import re
from pathlib import Path
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
    assert found[("agentops_activity_attempts_total", (("name", "propose_change"), ("status", "succeeded")))] == 1
    assert found[("agentops_waits_open", (("kind", "approval"),))] == 1
    assert found[("agentops_wait_oldest_age_seconds", (("kind", "approval"),))] >= 0
    assert found[("agentops_model_spend_usd_total", (("status", "charged"),))] > 0
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


def families(text: str) -> dict[str, Any]:
    return {family.name: family for family in text_string_to_metric_families(text)}


def test_counters_histograms_and_zero_series_follow_prometheus_conventions(client, settings, requester):
    """Attempts are counters, not gauges, and latencies histograms, not summaries of a sliding hour (whose
    every fall the docs' own rate(_sum)/rate(_count) would read as a reset); zero series are not left out
    and spend has every status (`uncertain` too), not only `charged`. On an empty database every series is
    there at 0; after work, the counters and the histograms' buckets only grow."""
    settings.AGENTOPS_METRICS_TOKEN = TOKEN
    empty = samples(scrape(client).content.decode())
    kinds = families(scrape(client).content.decode())
    assert kinds["agentops_activity_attempts"].type == "counter"
    assert kinds["agentops_model_calls"].type == "counter"
    assert kinds["agentops_model_tokens"].type == "counter"
    assert kinds["agentops_model_spend_usd"].type == "counter"
    assert kinds["agentops_activity_attempt_seconds"].type == "histogram"
    assert kinds["agentops_model_call_seconds"].type == "histogram"
    assert empty[("agentops_workflows", (("kind", "release"), ("status", "failed")))] == 0
    assert empty[("agentops_activity_attempts_total", (("name", "propose_change"), ("status", "failed")))] == 0
    assert empty[("agentops_activity_attempt_seconds_count", (("name", "run_tests"),))] == 0
    assert empty[("agentops_activity_attempt_seconds_bucket", (("le", "+Inf"), ("name", "run_tests")))] == 0
    assert empty[("agentops_model_spend_usd_total", (("status", "uncertain"),))] == 0
    assert empty[("agentops_waits_open", (("kind", "approval"),))] == 0

    drive(services.workflow_launch(kind="autonomous", goal="Prepare notes", user=requester).pk)
    after = samples(scrape(client).content.decode())
    for key, value in empty.items():
        if key[0].endswith(("_total", "_bucket", "_count", "_sum")):
            assert after[key] >= value, key
    model = "scripted/claude-sonnet-5-5"
    assert after[("agentops_model_calls_total", (("model", model), ("status", "charged")))] >= 1
    assert after[("agentops_model_tokens_total", (("model", model), ("type", "output")))] > 0
    assert after[("agentops_model_call_seconds_bucket", (("le", "+Inf"), ("model", model)))] == \
        after[("agentops_model_call_seconds_count", (("model", model),))] >= 1
    buckets = sorted((float(dict(labels)["le"]), v) for (name, labels), v in after.items()
                     if name == "agentops_activity_attempt_seconds_bucket" and dict(labels)["name"] == "plan_tasks")
    assert len(buckets) == 14 and buckets[-1][1] >= 1
    assert [v for _, v in buckets] == sorted(v for _, v in buckets)  # cumulative


SELECTOR = re.compile(r"(agentops_[a-z_]+)(\{[^}]*\})?")
RATE = re.compile(r"\b(?:rate|increase)\((agentops_[a-z_]+)")


def test_the_docs_example_queries_name_series_a_real_scrape_has(client, settings, requester):
    """docs/operators.md's PromQL: each selector names series of a real scrape (with its label values),
    and rate()/increase() are applied only to counters and histogram parts, never to a gauge."""
    settings.AGENTOPS_METRICS_TOKEN = TOKEN
    drive(services.workflow_launch(kind="autonomous", goal="Prepare notes", user=requester).pk)
    text = scrape(client).content.decode()
    found = samples(text)
    types = {f.name: f.type for f in text_string_to_metric_families(text)}
    docs = (Path(__file__).resolve().parents[1] / "docs" / "operators.md").read_text()
    block = docs.split("```promql\n", 1)[1].split("```", 1)[0]
    queries = [line for line in block.splitlines() if line.strip()]
    assert len(queries) >= 8
    for query in queries:
        for name, labels in SELECTOR.findall(query):
            wanted = dict(re.findall(r'(\w+)="([^"]*)"', labels))
            matching = [key for key in found if key[0] == name and wanted.items() <= dict(key[1]).items()]
            assert matching, f"{query}: no series {name}{labels} in a scrape"
        for name in RATE.findall(query):
            family = re.sub(r"_(total|bucket|sum|count)$", "", name)
            assert types.get(family) in ("counter", "histogram"), f"{query}: rate() of {name}, a {types.get(family)}"
