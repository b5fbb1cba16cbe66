"""Labels given at launch: checked, stored, shown, filtered (AND) and counted in /metrics."""
from __future__ import annotations

import json
from collections.abc import Iterator
from io import StringIO
from typing import Any

import pytest
from django.core.management import CommandError, call_command

from tests.conftest import one_event_kind
from tests.test_metrics import TOKEN, samples, scrape
from workflows import selectors, services
from workflows.errors import IdempotencyKeyReused, InvalidInput
from workflows.features.schedules import services as schedules
from workflows.models import Event, Schedule, Workflow, WorkflowLabel
from workflows.services.labels import MAX_LABELS, label_filters_parsed
from workflows.testing import registered

pytestmark = pytest.mark.django_db

Labelled = one_event_kind("labelled")


@pytest.fixture(autouse=True)
def labelled() -> Iterator[None]:
    with registered(Labelled):
        yield


def launch(**labels: str) -> Workflow:
    return services.workflow_launch(kind="labelled", goal="g", options=services.LaunchOptions(labels=labels))


def agent(*args: str) -> str:
    out = StringIO()
    call_command("agent", *args, stdout=out)
    return out.getvalue()


def test_labels_are_stored_a_row_each_and_recorded_in_the_launch_event():
    workflow = launch(team="infra", env="prod")
    assert sorted(WorkflowLabel.objects.filter(workflow=workflow).values_list("key", "value")) == [
        ("env", "prod"), ("team", "infra")]
    assert Event.objects.get(workflow=workflow, kind="workflow.launched").data["labels"] == {
        "team": "infra", "env": "prod"}
    assert selectors.workflow_summary(workflow)["labels"] == {"env": "prod", "team": "infra"}
    assert "labels" not in Event.objects.get(workflow=launch(), kind="workflow.launched").data


@pytest.mark.parametrize(("labels", "message"), [
    ({"Team": "infra"}, "The label key 'Team' is not 1–63 lowercase letters"),
    ({"1team": "infra"}, "The label key '1team'"),
    ({"k" * 64: "v"}, "is not 1–63 lowercase"),
    ({"team": ""}, "The label team='' has a value that is not 1–128"),
    ({"team": "in fra"}, "has a value that is not"),
    ({"team": "x" * 129}, "has a value that is not"),
    ({"team": "a\x00b"}, "has a value that is not"),
    ({f"k{i}": "v" for i in range(MAX_LABELS + 1)}, f"17 labels given; a workflow takes at most {MAX_LABELS}"),
])
def test_a_bad_label_is_refused_and_nothing_is_launched(labels, message):
    with pytest.raises(InvalidInput, match=message):
        services.workflow_launch(kind="labelled", goal="g", options=services.LaunchOptions(labels=labels))
    assert (Workflow.objects.count(), WorkflowLabel.objects.count(), Event.objects.count()) == (0, 0, 0)


def test_the_labels_are_part_of_an_idempotent_launch():
    """The same key with the same labels is the same launch; with other labels, a reused key."""
    first, created = services.workflow_launch_once(idempotency_key="k-1", kind="labelled", goal="g",
                                                   options=services.LaunchOptions(labels={"team": "infra"}))
    again, created_again = services.workflow_launch_once(idempotency_key="k-1", kind="labelled", goal="g",
                                                         options=services.LaunchOptions(labels={"team": "infra"}))
    assert (created, created_again, again.pk) == (True, False, first.pk)
    with pytest.raises(IdempotencyKeyReused):
        services.workflow_launch_once(idempotency_key="k-1", kind="labelled", goal="g",
                                      options=services.LaunchOptions(labels={"team": "ops"}))
    assert WorkflowLabel.objects.count() == 1


def test_the_list_filter_takes_every_label_given():
    """AND: each label narrows; a key given with two values matches nothing; no filter lists all."""
    a = launch(team="infra", env="prod")
    b = launch(team="infra", env="dev")
    c = launch(team="web", env="prod")
    plain = launch()

    def listed(*pairs: str) -> list[int]:
        return [w.pk for w in selectors.workflow_list(labels=label_filters_parsed(pairs))]

    assert listed("team=infra") == [b.pk, a.pk]
    assert listed("team=infra", "env=prod") == [a.pk]
    assert listed("env=prod") == [c.pk, a.pk]
    assert listed("team=infra", "team=web") == []
    assert listed("team=infra", "team=infra") == [b.pk, a.pk]
    assert listed() == [plain.pk, c.pk, b.pk, a.pk]
    with pytest.raises(InvalidInput, match="'team' is not KEY=VALUE"):
        label_filters_parsed(["team"])


def test_the_command_launches_lists_filters_and_shows_labels():
    out = agent("launch", "labelled", "--goal", "g", "--label", "team=infra", "--label", "env=prod", "--json")
    workflow_id = json.loads(out)["id"]
    launch(team="web")
    rows = json.loads(agent("list", "--label", "team=infra", "--json"))
    assert [(r["id"], r["labels"]) for r in rows] == [(workflow_id, {"env": "prod", "team": "infra"})]
    table = agent("list", "--label", "env=prod")
    assert "env=prod, team=infra" in table and "team=web" not in table
    assert "Labels: env=prod, team=infra" in agent("show", str(workflow_id))
    assert json.loads(agent("show", str(workflow_id), "--json"))["labels"] == {"env": "prod", "team": "infra"}


@pytest.mark.parametrize(("args", "message"), [
    (("launch", "labelled", "--goal", "g", "--label", "team"), "--label 'team' is not KEY=VALUE"),
    (("launch", "labelled", "--goal", "g", "--label", "team=a", "--label", "team=b"), "--label team is given twice"),
    (("launch", "labelled", "--goal", "g", "--label", "team=a b"), "has a value that is not"),
    (("list", "--label", "TEAM=a"), "The label key 'TEAM'"),
])
def test_the_command_refuses_bad_labels_with_exit_status_2(args, message):
    with pytest.raises(CommandError, match=message) as refused:
        agent(*args)
    assert refused.value.returncode == 2
    assert Workflow.objects.count() == 0


def test_a_schedule_carries_its_labels_to_each_launch():
    schedule = schedules.schedule_add(name="nightly", kind="labelled", goal="g", every="1h",
                                      labels={"team": "infra"})
    occurrence = schedules.schedule_trigger(name=schedule.name)
    assert selectors.labels_of(Workflow.objects.get(pk=occurrence.workflow_id)) == {"team": "infra"}
    assert selectors.schedule_summary(schedule)["labels"] == {"team": "infra"}
    with pytest.raises(InvalidInput, match="The label key 'Bad'"):
        schedules.schedule_add(name="bad", kind="labelled", goal="g", every="1h", labels={"Bad": "x"})
    assert not Schedule.objects.filter(name="bad").exists()


def metric_rows(found: dict[Any, float]) -> dict[tuple[tuple[str, str], ...], float]:
    return {labels: value for (name, labels), value in found.items() if name == "agentops_workflows"
            and dict(labels)["kind"] == "labelled"}


def test_metrics_count_workflows_by_the_labels_named_in_the_setting(client, settings):
    """AGENTOPS_METRICS_LABELS=team: agentops_workflows gains label_team ("" for workflows without
    it), every status present per value; past AGENTOPS_METRICS_LABEL_VALUES_MAX values, "_other"."""
    settings.AGENTOPS_METRICS_TOKEN = TOKEN
    launch(team="infra", env="prod")
    launch(team="infra")
    launch(team="web")
    launch(team="data")
    launch()
    assert ("label_team", "infra") not in next(iter(metric_rows(samples(scrape(client).content.decode()))))

    settings.AGENTOPS_METRICS_LABELS = ["team"]
    settings.AGENTOPS_METRICS_LABEL_VALUES_MAX = 2
    found = samples(scrape(client).content.decode())
    rows = metric_rows(found)
    # A kind without workflows keeps its zero series, with the label empty.
    assert found[("agentops_workflows", (("kind", "release"), ("label_team", ""), ("status", "running")))] == 0

    def count(team: str, status: str = "waiting") -> float:
        return rows[(("kind", "labelled"), ("label_team", team), ("status", status))]

    # The two most used values (ties by name) are kept: infra and data; web is counted as _other.
    assert (count("infra"), count("data"), count("_other"), count("")) == (2, 1, 1, 1)
    assert count("infra", "completed") == 0
    assert sum(rows.values()) == 5
    assert len(rows) == 4 * len(Workflow.Status.values)
