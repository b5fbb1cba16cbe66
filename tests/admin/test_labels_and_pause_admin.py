"""The admin: labels on the launch form, the list (a column, a filter, the search) and the page; Pause workflow."""
from __future__ import annotations

import html

import pytest
from django.contrib.auth.models import User
from django.urls import reverse

from tests.admin.conftest import GATE_KIND, logged_in, make_staff, messages_of
from workflows import services
from workflows.models import Event, Workflow

pytestmark = pytest.mark.django_db
CHANGELIST = reverse("admin:workflows_workflow_changelist")
LAUNCH = reverse("admin:workflows_workflow_launch")


def launch(**labels: str) -> Workflow:
    return services.workflow_launch(kind=GATE_KIND, goal="Open the gate", options=services.LaunchOptions(labels=labels))


def action_url(workflow_id: int, action: str) -> str:
    return reverse(f"admin:workflows_workflow_{action}", args=[workflow_id])


def listed_ids(page: str, workflows: list[Workflow]) -> set[int]:
    return {w.pk for w in workflows if reverse("admin:workflows_workflow_change", args=[w.pk]) in page}


@pytest.fixture
def launcher(db: None) -> User:
    user = User.objects.create_user("lena", password="lena-password")
    return make_staff(user, "workflows.view_workflow", "workflows.add_workflow")


def test_the_launch_form_takes_labels_and_refuses_bad_ones_on_the_form(launcher):
    client = logged_in(launcher)
    assert 'name="labels"' in client.get(LAUNCH, {"kind": GATE_KIND}).content.decode()
    refused = client.post(LAUNCH, {"kind": GATE_KIND, "goal": "Open it", "labels": "team=in fra"})
    assert refused.status_code == 200 and "label 'fra' is not KEY=VALUE" in html.unescape(refused.content.decode())
    assert not Workflow.objects.exists()
    answer = client.post(LAUNCH, {"kind": GATE_KIND, "goal": "Open it", "labels": "team=infra, env=prod"})
    assert answer.status_code == 302
    workflow = Workflow.objects.get()
    assert {label.key: label.value for label in workflow.labels.all()} == {"team": "infra", "env": "prod"}


def test_the_list_shows_labels_and_filters_and_searches_by_them(staff_outsider):
    a = launch(team="infra", env="prod")
    b = launch(team="infra", env="dev")
    c = launch(team="web")
    every = [a, b, c]
    client = logged_in(staff_outsider)
    page = client.get(CHANGELIST).content.decode()
    # Under each goal, as text (the cell is the page's link); the page links each to its filter.
    assert 'class="ao-one-line ao-labels" title="env=prod team=infra">env=prod team=infra</span>' in page
    assert "team=web</span>" in page
    assert "team=infra (2)" in page  # the filter's choices, most used first
    assert listed_ids(client.get(CHANGELIST, {"label": "team=infra"}).content.decode(), every) == {a.pk, b.pk}
    assert listed_ids(client.get(CHANGELIST, {"q": "team=infra env=prod"}).content.decode(), every) == {a.pk}
    assert listed_ids(client.get(CHANGELIST, {"label": "nonsense"}).content.decode(), every) == set()
    detail = client.get(reverse("admin:workflows_workflow_change", args=[a.pk])).content.decode()
    assert f'href="{CHANGELIST}?label=env=prod">env=prod</a>' in detail and "team=infra</a>" in detail


def test_pause_asks_for_confirmation_then_pauses_and_resume_goes_on(operator):
    workflow = launch()
    services.workflow_advance_if_runnable(workflow_id=workflow.pk)
    client = logged_in(operator)
    page = client.get(reverse("admin:workflows_workflow_change", args=[workflow.pk])).content.decode()
    assert f'href="{action_url(workflow.pk, "pause")}"' in page
    confirm = client.get(action_url(workflow.pk, "pause")).content.decode()
    assert f"Yes, pause workflow {workflow.pk}" in confirm and "nothing new starts" in confirm

    response = client.post(action_url(workflow.pk, "pause"), {"reason": "hold on"}, follow=True)
    workflow.refresh_from_db()
    assert (workflow.status, workflow.pause_cause, workflow.reason) == ("paused", "operator", "hold on")
    [(level, text)] = messages_of(response)
    assert level == "success" and text.startswith(f"Workflow {workflow.pk} is paused")
    assert Event.objects.get(workflow=workflow, kind="workflow.paused").data["by"] == "olga"
    attention = client.get(CHANGELIST, {"attention": "operator"}).content.decode()
    assert listed_ids(attention, [workflow, launch()]) == {workflow.pk}
    again = client.post(action_url(workflow.pk, "pause"), {"reason": ""}, follow=True)
    assert messages_of(again)[0][0] == "warning" and "already paused by an operator" in messages_of(again)[0][1]

    resumed = client.post(action_url(workflow.pk, "resume"), {}, follow=True)
    workflow.refresh_from_db()
    assert workflow.status == "waiting" and messages_of(resumed)[0][0] == "success"


def test_without_the_change_permission_pause_gets_403(staff_outsider):
    workflow = launch()
    client = logged_in(staff_outsider)
    assert client.get(action_url(workflow.pk, "pause")).status_code == 403
    assert client.post(action_url(workflow.pk, "pause"), {"reason": "x"}).status_code == 403
    assert Workflow.objects.get(pk=workflow.pk).status != "paused"
