"""The reasoning plane on the workflow page: spend and progress charts, tasks, the budget action, the filters."""
from __future__ import annotations

import re
from datetime import timedelta
from decimal import Decimal
from typing import Any

import pytest
from django.urls import reverse

from tests.admin.conftest import GATE_KIND, gate_wait, logged_in, messages_of
from tests.conftest import drive, release_params
from workflows import clock, services
from workflows.models import Event, ProgressSample, UsageEntry, Workflow
from workflows.selectors import spend_summary

CHANGELIST = reverse("admin:workflows_workflow_changelist")
pytestmark = pytest.mark.django_db


def page_of(workflow_id: int) -> str:
    return reverse("admin:workflows_workflow_change", args=[workflow_id])


def budget_url(workflow_id: int) -> str:
    return reverse("admin:workflows_workflow_budget", args=[workflow_id])


def svg(page: str, slug: str) -> str:
    """The chart figure whose ids start with ``slug``."""
    match = re.search(rf'<figure class="ao-chart-figure" id="{slug}">(.*?)</figure>', page, re.S)
    assert match, f"no chart {slug!r} on the page"
    return match.group(1)


def points(chart: str) -> int:
    return chart.count('<circle class="ao-point"')


@pytest.fixture(autouse=True)
def workspaces(settings: Any, tmp_path: Any) -> None:
    settings.AGENTOPS_WORKSPACE_DIR = tmp_path / "workspaces"


@pytest.fixture
def finished_agent(requester: Any) -> Workflow:
    """An autonomous agent run to completion offline: 11 ledger rows, one progress sample, three tasks."""
    workflow = drive(services.workflow_launch(kind="autonomous", goal="Prepare onboarding notes", user=requester,
                                              options=services.LaunchOptions(budget_total_usd=Decimal("0.05"))).pk)
    assert workflow.status == Workflow.Status.COMPLETED, workflow.reason
    return workflow


@pytest.fixture
def gate(requester: Any) -> Workflow:
    """A running workflow with a total budget of 1 USD that makes no model calls."""
    return services.workflow_launch(kind=GATE_KIND, goal="Open the gate", user=requester,
                                    options=services.LaunchOptions(budget_total_usd=Decimal(1)))


@pytest.fixture
def budget_paused(requester: Any) -> Workflow:
    """An autonomous agent whose first model call does not fit its budget: paused for a person."""
    workflow = drive(services.workflow_launch(kind="autonomous", goal="Prepare onboarding notes", user=requester,
                                              options=services.LaunchOptions(budget_total_usd=Decimal("0.0001"))).pk)
    assert (workflow.status, workflow.current_node) == (Workflow.Status.PAUSED, "PLANNING")
    assert workflow.reason.startswith("Budget exhausted")
    return workflow


class TestCharts:
    def test_spend_and_progress_charts_and_the_task_list_render(self, finished_agent, staff_outsider):
        ProgressSample.objects.create(  # two earlier readings, so the progress chart has a line
            workflow=finished_agent, operation_id="earlier-1", percent=10, confidence=0.5,
            created_at=finished_agent.created_at)
        ProgressSample.objects.create(
            workflow=finished_agent, operation_id="earlier-2", percent=55, confidence=0.7,
            created_at=finished_agent.created_at + timedelta(milliseconds=1))

        page = logged_in(staff_outsider).get(page_of(finished_agent.pk)).content.decode()

        for section in ("Budget and spend", "Progress", "Tasks"):
            assert f"<h2>{section}</h2>" in page
        spend = svg(page, f"spend-{finished_agent.pk}")
        assert "<svg" in spend and "<script" not in spend
        assert f'<title id="spend-{finished_agent.pk}-title">Simulated cumulative spend of workflow' in spend
        assert points(spend) == UsageEntry.objects.filter(workflow=finished_agent).count() == 11
        assert spend.count("<title>") >= 11 and '<polyline class="ao-line"' in spend
        assert 'class="ao-limit"' in spend and "total budget $0.0500" in spend  # within five times the spend
        progress = svg(page, f"progress-{finished_agent.pk}")
        assert points(progress) == 3 and '<polyline class="ao-line"' in progress
        assert ">100%</text>" in progress and ": 55% (confidence 70%)</title>" in progress
        spent = Decimal(spend_summary(finished_agent)["spent_usd"]).quantize(Decimal("0.0001"))
        assert f'<strong id="ao-live-spent">${spent}</strong> of $0.0500' in page  # four decimals, the budget's too
        assert "simulated spend</span>" in page and "no money was spent" in page
        assert "<strong>100%</strong>" in page and "[done] Record the outcome" in page
        tasks = re.search(r'<div class="ao-section" id="tasks">(.*?)</div>', page, re.S).group(1)
        assert tasks.count('<span class="ao-badge ao-done">done</span>') == 3
        assert re.search(r'<tr id="task-3"><td>3</td>\s*<td>1</td>\s*<td><strong>Record the outcome</strong>', tasks)
        assert "Wrote notes/write-a-brief.md for &#x27;Write a brief&#x27;" in tasks

    def test_one_reading_is_a_dot_and_markup_in_model_output_is_text(self, staff_outsider, requester):
        workflow = services.workflow_launch(kind=GATE_KIND, goal="Open the gate", user=requester)
        ProgressSample.objects.create(workflow=workflow, operation_id="only", percent=40, confidence=0.9,
                                      achievements=["<script>alert('x')</script>"], remaining=["<b>more</b>"],
                                      created_at=clock.now())
        Workflow.objects.filter(pk=workflow.pk).update(state={"round": 1, "history": [], "tasks": [
            {"id": 1, "title": "<img src=x onerror=alert(1)>", "status": "pending"}]})

        page = logged_in(staff_outsider).get(page_of(workflow.pk)).content.decode()

        progress = svg(page, f"progress-{workflow.pk}")
        assert points(progress) == 1 and "<polyline" not in progress and 'r="6"' in progress
        assert "&lt;script&gt;alert(&#x27;x&#x27;)&lt;/script&gt;" in page and "<script>alert" not in page
        assert "&lt;b&gt;more&lt;/b&gt;" in page
        assert "&lt;img src=x onerror=alert(1)&gt;" in page and "<img src=x" not in page

    def test_a_long_ledger_is_thinned_to_100_points_and_the_page_says_so(self, staff_outsider, gate):
        start = clock.now() - timedelta(days=3)
        UsageEntry.objects.bulk_create(
            UsageEntry(workflow=gate, key=f"op{i}#0", operation_id=f"op{i}", provider="anthropic",
                       model="claude-sonnet-5-5", status="charged", reserved_usd=Decimal("0.01"),
                       cost_usd=Decimal("0.001"), created_at=start + timedelta(minutes=15 * i)) for i in range(250))

        page = logged_in(staff_outsider).get(page_of(gate.pk)).content.decode()

        spend = svg(page, f"spend-{gate.pk}")
        assert points(spend) == 100 and "150 of the readings are left out" in spend
        assert "$0.2500 after 250 calls" in spend and ">+2.6 days</text>" in spend
        assert '<line class="ao-limit" x1="78" y1="14.0"' in spend  # the 1 USD budget tops the scale

    def test_without_calls_or_readings_the_page_says_so_instead_of_drawing(self, staff_outsider, requester):
        workflow = gate_wait(requester).workflow
        page = logged_in(staff_outsider).get(page_of(workflow.pk)).content.decode()

        assert 'id="spend-empty">No model calls yet, so nothing is spent and there is no chart.' in page
        assert 'id="progress-empty">No progress readings yet: agents record one when an activity' in page
        assert '<figure class="ao-chart-figure"' not in page and 'id="tasks"' not in page
        assert "simulated spend</span>" in page  # the suite runs on the scripted provider


class TestBudgetAction:
    def test_a_raise_resumes_a_workflow_paused_for_budget(self, budget_paused, operator, rung):
        client = logged_in(operator)
        page = client.get(page_of(budget_paused.pk)).content.decode()
        assert 'id="budget-paused"><strong>Paused for budget.</strong>' in page
        assert f'href="{budget_url(budget_paused.pk)}"' in page
        confirm = client.get(budget_url(budget_paused.pk)).content.decode()
        assert "It is paused because its budget ran out." in confirm
        assert 'name="total_usd" value="0.0001"' in confirm and f"Yes, change budget {budget_paused.pk}" in confirm

        response = client.post(budget_url(budget_paused.pk), {"total_usd": "5", "hourly_usd": ""}, follow=True)

        assert messages_of(response) == [("success", f"Budget of workflow {budget_paused.pk}: total $5.0000, "
                                                     "hourly unlimited. It was paused for budget and goes on now.")]
        workflow = Workflow.objects.get(pk=budget_paused.pk)
        assert (workflow.status, workflow.budget_total_usd) == (Workflow.Status.RUNNING, Decimal(5))
        changed = Event.objects.get(workflow=workflow, kind="budget.changed")
        assert changed.data["by"] == "olga" and changed.data["old"]["total"] == "0.0001"
        assert ("workflow", workflow.pk) in rung
        assert drive(workflow.pk).status == Workflow.Status.COMPLETED

    @pytest.mark.parametrize(("form", "error"), [
        ({"total_usd": "-1"}, "A budget must be a positive amount of USD"),
        ({"total_usd": "0"}, "A budget must be a positive amount of USD"),
        ({"hourly_usd": "lots"}, "Enter a number."),
        ({"total_usd": "1.00001"}, "Ensure that there are no more than 4 decimal places."),
        ({"total_usd": "", "hourly_usd": ""}, "Give a total budget, an hourly budget or both."),
    ])
    def test_invalid_amounts_are_form_errors_and_change_nothing(self, gate, operator, form, error):
        before = Workflow.objects.values().get(pk=gate.pk)
        response = logged_in(operator).post(budget_url(gate.pk), form)
        assert response.status_code == 200 and error in response.content.decode()
        assert Workflow.objects.values().get(pk=gate.pk) == before

    def test_a_refusal_of_the_service_is_an_error_message(self, operator, requester):
        workflow = services.workflow_launch(kind=GATE_KIND, goal="Open the gate", user=requester)
        services.workflow_cancel(workflow_id=workflow.pk, reason="not needed", user=requester)

        response = logged_in(operator).post(budget_url(workflow.pk), {"total_usd": "3"}, follow=True)

        assert messages_of(response) == [
            ("error", f"Workflow {workflow.pk} is cancelled; its budget no longer matters.")]
        assert Workflow.objects.get(pk=workflow.pk).budget_total_usd is None

    def test_without_the_change_permission_there_is_no_button_and_a_post_gets_403(self, gate, staff_outsider):
        client = logged_in(staff_outsider)
        assert "Change budget…" not in client.get(page_of(gate.pk)).content.decode()
        assert client.get(budget_url(gate.pk)).status_code == 403
        response = client.post(budget_url(gate.pk), {"total_usd": "5"})
        assert response.status_code == 403 and "workflows.change_workflow" in response.content.decode()
        assert Workflow.objects.get(pk=gate.pk).budget_total_usd == Decimal(1)
        assert not Event.objects.filter(workflow=gate, kind="budget.changed").exists()

    def test_the_budget_action_needs_a_csrf_token(self, gate, operator):
        client = logged_in(operator, enforce_csrf_checks=True)
        assert client.post(budget_url(gate.pk), {"total_usd": "5"}).status_code == 403
        assert Workflow.objects.get(pk=gate.pk).budget_total_usd == Decimal(1)


class TestAttentionFilter:
    def test_stagnating_and_paused_for_budget_find_the_right_workflows(self, budget_paused, staff_outsider,
                                                                        requester, git_repo):
        def launch(goal: str) -> Workflow:  # running its first activity
            return services.workflow_launch(kind="release", goal=goal, user=requester, params=release_params(git_repo))

        healthy, stuck, long_ago, paused = launch("healthy"), launch("stuck"), launch("long ago"), launch("paused")
        assert services.stagnation_flag_if_due(workflow_id=stuck.pk, reason="no event for 3.0 h") == 1
        Workflow.objects.filter(pk=long_ago.pk).update(  # flagged, but longer ago than its 6-hour window
            stagnation_flagged_at=clock.now() - timedelta(hours=7))
        Workflow.objects.filter(pk=paused.pk).update(stagnation_policy="pause")
        assert services.stagnation_flag_if_due(workflow_id=paused.pk, reason="progress moved 1 point") == 1
        client = logged_in(staff_outsider)

        def ids(**query: str) -> set[int]:
            response = client.get(CHANGELIST, query)
            assert response.status_code == 200
            return {w.pk for w in response.context["cl"].result_list}

        assert ids(attention="stagnating") == {stuck.pk, paused.pk}
        assert ids(attention="budget") == {budget_paused.pk}
        Workflow.objects.filter(pk=healthy.pk).update(handler_failures=1)  # its last advance raised
        assert ids(attention="handler_failed") == {healthy.pk}
        assert ids() == {healthy.pk, stuck.pk, long_ago.pk, paused.pk, budget_paused.pk}
        page = client.get(CHANGELIST).content.decode()
        assert "By needs attention" in page and "paused for budget</a>" in page
        stuck_page = client.get(page_of(stuck.pk)).content.decode()
        assert '<p class="ao-alert" id="stagnating"><strong>Stagnating</strong> since' in stuck_page
        assert "no event for 3.0 h." in stuck_page
