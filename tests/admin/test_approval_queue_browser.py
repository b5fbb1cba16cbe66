"""The approval queue in a real browser: Debian's Chromium, headless, against a live server."""
from __future__ import annotations

import json
import os
import re
from datetime import timedelta
from decimal import Decimal
from pathlib import Path
from typing import Any

import pytest
from django.urls import reverse
from playwright.sync_api import Page, expect

from tests.admin.conftest import state_of
from tests.conftest import drive
from workflows import clock, services
from workflows.models import Activity, Event, ProgressSample, UsageEntry, Wait, Workflow

pytestmark = pytest.mark.django_db(transaction=True)

QUEUE = reverse("admin:workflows_wait_approvals")
# `make screenshots` sets this to docs/screenshots; ordinary runs write no files.
SCREENSHOT_DIR = os.environ.get("AGENTOPS_SCREENSHOT_DIR", "")


def log_in(page: Page, live_server: Any, username: str, password: str, *, then: str = QUEUE) -> None:
    page.goto(f"{live_server.url}{reverse('admin:login')}?next={then}")
    page.fill("#id_username", username)
    page.fill("#id_password", password)
    page.click("input[type=submit]")
    expect(page).to_have_url(f"{live_server.url}{then}")


def card(page: Page, wait: Wait) -> Any:
    return page.locator(f"#wait-{wait.pk}")


def screenshot(page: Page, name: str, *, selector: str = "", full_page: bool = True) -> None:
    """Save a PNG of the page (or of one element) for the docs, when asked to."""
    if not SCREENSHOT_DIR:
        return
    Path(SCREENSHOT_DIR).mkdir(parents=True, exist_ok=True)
    target = str(Path(SCREENSHOT_DIR) / name)
    if selector:
        page.locator(selector).screenshot(path=target)
    else:
        page.screenshot(path=target, full_page=full_page)


def test_an_approver_approves_from_the_queue_and_the_workflow_finishes(
    page: Page, live_server: Any, waiting_release: Wait, staff_approver: Any, deploy_target: Any
) -> None:
    log_in(page, live_server, "alice", "alice-password")
    title = waiting_release.candidate["title"]
    expect(card(page, waiting_release).get_by_role("heading", level=2)).to_contain_text(title)
    expect(card(page, waiting_release)).to_contain_text(waiting_release.candidate_hash)
    screenshot(page, "approval-queue.png")

    card(page, waiting_release).get_by_label("Comment").fill("Release notes read fine.")
    card(page, waiting_release).get_by_role("button", name="Approve").click()

    expect(page.locator(".messagelist .success")).to_have_text(f"Wait {waiting_release.pk} approved by alice.")
    expect(page.get_by_text("Nothing is waiting for your decision.")).to_be_visible()
    waiting_release.refresh_from_db()
    assert (waiting_release.decision, waiting_release.comment) == ("approved", "Release notes read fine.")
    assert drive(waiting_release.workflow_id).status == Workflow.Status.COMPLETED

    page.goto(live_server.url + reverse("admin:workflows_workflow_change", args=[waiting_release.workflow_id]))
    expect(page.locator(".ao-intro .ao-badge").first).to_have_text("completed")
    expect(page.locator(".ao-path svg")).to_be_visible()
    expect(page.locator("#waits")).to_contain_text("approved by alice at")
    page.set_viewport_size({"width": 1280, "height": 1150})
    screenshot(page, "workflow-page.png", full_page=False)
    screenshot(page, "workflow-activities.png", selector="#activities")


def test_a_user_without_the_role_sees_no_buttons_and_a_forged_post_gets_403(
    page: Page, live_server: Any, waiting_release: Wait, staff_outsider: Any
) -> None:
    log_in(page, live_server, "oscar", "oscar-password")
    expect(page.locator(f"#other-wait-{waiting_release.pk}")).to_contain_text("needs a member of group")
    expect(page.get_by_role("button", name="Approve")).to_have_count(0)
    expect(page.get_by_role("button", name="Reject")).to_have_count(0)
    before = state_of(waiting_release)

    token = next(c["value"] for c in page.context.cookies() if c["name"] == "csrftoken")
    response = page.request.post(
        live_server.url + reverse("admin:workflows_wait_decide", args=[waiting_release.pk]),
        form={"csrfmiddlewaretoken": token, "decision": "approve", "candidate_hash": waiting_release.candidate_hash},
    )

    assert response.status == 403
    assert "release-approvers" in response.text()
    assert state_of(waiting_release) == before


def test_a_double_click_on_approve_makes_one_decision(
    page: Page, live_server: Any, waiting_release: Wait, staff_approver: Any
) -> None:
    log_in(page, live_server, "alice", "alice-password")
    posts: list[str] = []
    page.on("request", lambda request: posts.append(request.url) if request.method == "POST" else None)

    card(page, waiting_release).get_by_role("button", name="Approve").dblclick()

    expect(page.get_by_text("Nothing is waiting for your decision.")).to_be_visible()
    expect(page.locator(".messagelist .error")).to_have_count(0)
    assert len(posts) >= 1
    assert Event.objects.filter(workflow_id=waiting_release.workflow_id, kind="wait.approved").count() == 1
    waiting_release.refresh_from_db()
    assert (waiting_release.status, waiting_release.decision) == ("satisfied", "approved")


def test_approving_a_stale_candidate_shows_the_refusal_and_changes_nothing(
    page: Page, live_server: Any, waiting_release: Wait, staff_approver: Any, requester: Any
) -> None:
    log_in(page, live_server, "alice", "alice-password")
    expect(card(page, waiting_release)).to_be_visible()
    # The goal changes after alice loaded the page: the candidate she is looking at is stale.
    services.workflow_supersede(workflow_id=waiting_release.workflow_id, goal="Publish notes for 1.1",
                                user=requester)
    before = state_of(waiting_release)

    card(page, waiting_release).get_by_role("button", name="Approve").click()

    expect(page.locator(".messagelist .error")).to_contain_text(
        re.compile(rf"Wait {waiting_release.pk} was invalidated at .* because the goal changed \(intent v1 → v2\); "
                   "decide on the new candidate instead."))
    assert state_of(waiting_release) == before
    assert waiting_release.status == Wait.Status.INVALIDATED and waiting_release.decision == ""


def test_an_autonomous_workflow_finishes_and_its_page_draws_spend_progress_and_tasks(
    page: Page, live_server: Any, staff_outsider: Any, requester: Any, settings: Any, tmp_path: Path,
    time_machine: Any,
) -> None:
    """An offline agent whose first task keeps failing: skipped, re-planned and done in round two. The
    clock moves ten minutes per step, so the charts span two hours as a real run's would."""
    settings.AGENTOPS_WORKSPACE_DIR = tmp_path / "workspaces"
    real_now = clock.now()
    start = real_now - timedelta(hours=2)
    time_machine.move_to(start, tick=True)
    workflow = services.workflow_launch(kind="autonomous", goal="Prepare onboarding notes for new operators",
                                        user=requester,
                                        options=services.LaunchOptions(budget_total_usd=Decimal("0.05")))
    settings.AGENTOPS_FAULT_LOG = str(tmp_path / "faults.log")
    settings.AGENTOPS_TESTING_FAULTS = json.dumps([{
        "point": "activity.before_external_call", "action": "raise",
        "when": {"operation_id": f"wf-{workflow.pk}/EXECUTION.2/i1/0"},
    }])
    for step in range(1, 30):
        time_machine.move_to(start + timedelta(minutes=10 * step), tick=True)
        Activity.objects.filter(workflow=workflow, status="scheduled").update(next_attempt_at=clock.now())
        workflow = drive(workflow.pk, max_rounds=1)
        if workflow.is_terminal:
            break
    time_machine.move_to(real_now, tick=True)
    assert workflow.status == Workflow.Status.COMPLETED, workflow.reason

    log_in(page, live_server, "oscar", "oscar-password",
           then=reverse("admin:workflows_workflow_change", args=[workflow.pk]))

    expect(page.locator("#budget")).to_contain_text("simulated spend")
    spend = page.locator(f"#spend-{workflow.pk} svg")
    expect(spend).to_be_visible()
    expect(spend.locator("circle.ao-point")).to_have_count(UsageEntry.objects.filter(workflow=workflow).count())
    progress = page.locator(f"#progress-{workflow.pk} svg")
    expect(progress.locator("circle.ao-point")).to_have_count(ProgressSample.objects.filter(workflow=workflow).count())
    expect(page.locator("#task-1")).to_contain_text(re.compile(r"1\s+Write a brief.*skipped.*fault injected", re.S))
    expect(page.locator("#task-4")).to_contain_text(re.compile(r"2\s+Retry Write a brief.*done", re.S))
    page.set_viewport_size({"width": 1280, "height": 1800})  # from the header down to the task list
    screenshot(page, "autonomous-workflow.png", full_page=False)
