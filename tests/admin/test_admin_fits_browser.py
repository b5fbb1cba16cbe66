"""The admin on a laptop, in a real browser: the workflow list fits, an id search finds that
workflow, and a workflow paused for budget is offered what will work (Debian's Chromium, headless)."""
from __future__ import annotations

import re
from decimal import Decimal
from typing import Any

import pytest
from django.urls import reverse
from playwright.sync_api import Page, expect

from tests.admin.test_approval_queue_browser import log_in, screenshot
from tests.conftest import drive
from workflows import services
from workflows.models import Workflow

pytestmark = pytest.mark.django_db(transaction=True)

CHANGELIST = reverse("admin:workflows_workflow_changelist")
LONG_GOAL = ("Publish the release notes for version 4.2 of the billing service, with a section for each of the "
             "fourteen customer-facing changes and a migration guide for the two that break old clients")


@pytest.fixture
def many_workflows(requester: Any, waiting_release: Any) -> list[Workflow]:
    """Twelve agents with long goals, and a release waiting for approval (the longest node and wait)."""
    return [services.workflow_launch(kind="autonomous", goal=f"{LONG_GOAL} ({n})", user=requester)
            for n in range(12)]


@pytest.mark.parametrize("width", [1280, 1400])
def test_the_workflow_list_fits_a_laptop_screen(page: Page, live_server: Any, operator: Any, many_workflows: Any,
                                                 width: int) -> None:
    page.set_viewport_size({"width": width, "height": 900})
    log_in(page, live_server, "olga", "olga-password", then=CHANGELIST)
    expect(page.locator("#result_list tbody tr")).to_have_count(13)

    overflow = page.evaluate("() => document.documentElement.scrollWidth - document.documentElement.clientWidth")
    assert overflow <= 0, f"the page is {overflow} px wider than a {width} px window"
    screenshot(page, f"workflow-list-{width}.png", full_page=False)
    hidden = page.evaluate("() => { const r = document.querySelector('#changelist .results');"
                           " return r.scrollWidth - r.clientWidth; }")
    assert hidden <= 0, f"{hidden} px of the list are scrolled out of view in a {width} px window"
    goal = page.locator("#result_list .field-goal_short .ao-one-line").first
    kind = page.locator("#result_list .field-kind").first  # one short word: the height of one line
    assert goal.bounding_box()["height"] <= kind.bounding_box()["height"], "the goal wraps onto more than one line"
    expect(goal).to_have_attribute("title", f"{LONG_GOAL} (11)")
    for header in ("launched by", "updated"):
        box = page.locator("#result_list thead th", has_text=header).bounding_box()
        assert box is not None and box["x"] + box["width"] <= width, f"“{header}” is cut off"
    screenshot(page, f"workflow-list-{width}.png", full_page=False)


def test_searching_an_id_finds_that_workflow(page: Page, live_server: Any, operator: Any,
                                             many_workflows: list[Workflow]) -> None:
    wanted = many_workflows[3]
    log_in(page, live_server, "olga", "olga-password", then=CHANGELIST)

    page.fill("#searchbar", str(wanted.pk))
    page.press("#searchbar", "Enter")

    rows = page.locator("#result_list tbody tr")
    expect(rows).to_have_count(1)
    expect(rows.first.locator("th.field-id, td.field-id").first).to_have_text(str(wanted.pk))


def test_a_workflow_paused_for_budget_is_offered_a_budget_change_not_a_resume(
    page: Page, live_server: Any, operator: Any, requester: Any
) -> None:
    workflow = drive(services.workflow_launch(kind="autonomous", goal="Prepare onboarding notes", user=requester,
                                              options=services.LaunchOptions(budget_total_usd=Decimal("0.0001"))).pk)
    assert (workflow.status, workflow.pause_cause) == ("paused", "budget")
    page_url = reverse("admin:workflows_workflow_change", args=[workflow.pk])
    log_in(page, live_server, "olga", "olga-password", then=page_url)

    expect(page.get_by_role("link", name="Change budget").first).to_be_visible()
    expect(page.get_by_role("link", name="Resume workflow")).to_have_count(0)

    page.goto(live_server.url + reverse("admin:workflows_workflow_resume", args=[workflow.pk]))
    expect(page).to_have_url(re.compile(re.escape(live_server.url + page_url) + r"\?outcome="))
    expect(page.locator(".messagelist .warning")).to_contain_text("paused because its budget ran out")

    page.get_by_role("link", name="Change budget").first.click()
    page.fill("#id_total_usd", "5")
    page.get_by_role("button", name=f"Yes, change budget {workflow.pk}").click()
    expect(page.locator(".messagelist .success")).to_contain_text("It was paused for budget and goes on now.")
    assert Workflow.objects.get(pk=workflow.pk).status == "running"
