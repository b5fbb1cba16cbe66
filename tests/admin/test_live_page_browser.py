"""The workflow page follows the event stream: in Chromium, an event recorded after
the page was opened appears at the top of its timeline without a reload, as text, and the page's status,
node, reason, spend, model calls and progress follow."""
from __future__ import annotations

from decimal import Decimal
from typing import Any

import pytest
from django.db import transaction
from django.urls import reverse
from playwright.sync_api import Page, expect

from tests.admin.conftest import gate_wait
from tests.admin.test_approval_queue_browser import log_in, screenshot
from workflows import clock, services
from workflows.models import ProgressSample, UsageEntry
from workflows.services.common import event_record, workflow_lock

pytestmark = pytest.mark.django_db(transaction=True)


def test_an_event_appears_on_the_open_workflow_page_without_reload(
    page: Page, live_server: Any, staff_outsider: Any, requester: Any, settings: Any
) -> None:
    settings.AGENTOPS_STREAM_POLL_SECONDS = 0.1
    workflow = gate_wait(requester).workflow
    url = reverse("admin:workflows_workflow_change", args=[workflow.pk])
    log_in(page, live_server, "oscar", "oscar-password", then=url)
    expect(page.locator("#ao-live")).to_have_text("Live: new events appear at the top as they are recorded.")
    rows = page.locator("#timeline tbody tr")
    before = rows.count()
    page.evaluate("window.notReloaded = true")

    with transaction.atomic():
        event = event_record(workflow=workflow_lock(workflow.pk), kind="tool.called", at=clock.now(),
                             tool="run_command", input="<b>make</b> test")
    expect(rows).to_have_count(before + 1)
    first = rows.first.locator("td")
    expect(first.nth(0)).to_have_text(str(event.seq))
    expect(first.nth(3)).to_have_text("tool.called")
    expect(first.nth(4)).to_contain_text("input <b>make</b> test")  # shown as text, not markup
    assert page.evaluate("window.notReloaded") is True
    screenshot(page, "live-timeline.png", selector="#timeline")


def test_status_spend_and_progress_follow_without_reload(
    page: Page, live_server: Any, staff_outsider: Any, requester: Any, settings: Any
) -> None:
    settings.AGENTOPS_STREAM_POLL_SECONDS = 0.1
    workflow = gate_wait(requester).workflow
    log_in(page, live_server, "oscar", "oscar-password",
           then=reverse("admin:workflows_workflow_change", args=[workflow.pk]))
    expect(page.locator("#ao-live")).to_have_text("Live: new events appear at the top as they are recorded.")
    expect(page.locator("#ao-live-status")).to_have_text("waiting")
    expect(page.locator("#ao-live-calls")).to_have_text("0")
    expect(page.locator("#ao-live-progress")).to_be_hidden()
    page.evaluate("window.notReloaded = true")

    UsageEntry.objects.create(workflow=workflow, key="op#0", operation_id="op", provider="anthropic",
                              model="claude-sonnet-5-5", status="charged", reserved_usd=Decimal("0.01"),
                              cost_usd=Decimal("0.0125"), created_at=clock.now())
    ProgressSample.objects.create(workflow=workflow, operation_id="p1", percent=40, confidence=0.9,
                                  created_at=clock.now())
    services.workflow_cancel(workflow_id=workflow.pk, reason="not needed after all", by="oscar")

    expect(page.locator("#ao-live-status")).to_have_text("cancelled")
    expect(page.locator("#ao-live-status")).to_have_class("ao-badge ao-cancelled")
    expect(page.locator("#ao-live-reason")).to_contain_text("not needed after all")
    expect(page.locator("#ao-live-spent")).to_have_text("$0.0125")
    expect(page.locator("#ao-live-calls")).to_have_text("1")
    expect(page.locator("#ao-live-progress strong")).to_have_text("40%")
    expect(page.locator("#ao-live")).to_contain_text("the workflow has finished")
    assert page.evaluate("window.notReloaded") is True


def test_the_model_call_in_flight_shows_its_partial_output(
    page: Page, live_server: Any, staff_outsider: Any, requester: Any, settings: Any
) -> None:
    from workflows import livewire

    settings.AGENTOPS_STREAM_POLL_SECONDS = 0.1
    settings.AGENTOPS_LIVE_REDIS_URL = "redis://127.0.0.1:6379/4"
    settings.AGENTOPS_MODEL_DELTA_SECONDS = 0
    workflow = gate_wait(requester).workflow
    url = reverse("admin:workflows_workflow_change", args=[workflow.pk])
    log_in(page, live_server, "oscar", "oscar-password", then=url)
    expect(page.locator("#ao-live")).to_have_text("Live: new events appear at the top as they are recorded.")
    deltas = livewire.DeltaBuffer(workflow_id=workflow.pk, operation_id="wf-1/EXECUTION.2/i1/0", call=3,
                                  model="claude-x")
    for piece in ("Reading ", "<the> ", "docs…"):
        deltas({"text": piece})
    expect(page.locator("#ao-live-model")).to_have_text(
        "model call wf-1/EXECUTION.2/i1/0#3 (claude-x), live:\nReading <the> docs…")


def test_the_page_stream_needs_the_view_permission(client: Any, db: None, requester: Any) -> None:
    from django.contrib.auth.models import User

    workflow = gate_wait(requester).workflow
    nobody = User.objects.create_user("staffer", password="pw", is_staff=True)
    client.force_login(nobody)
    answer = client.get(reverse("admin:workflows_workflow_events_stream", args=[workflow.pk]))
    assert answer.status_code == 403 and "may not see workflows" in answer.content.decode()
    answer = client.get(reverse("admin:workflows_workflow_live", args=[workflow.pk]))
    assert answer.status_code == 403 and "may not see workflows" in answer.content.decode()
