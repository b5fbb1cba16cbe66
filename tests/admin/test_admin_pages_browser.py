"""The admin pages in a real browser (Debian's Chromium, headless): each decision's own message, the
approval queue's summary, and the paged event timeline."""
from __future__ import annotations

import re
from typing import Any

import pytest
from django.urls import reverse
from playwright.sync_api import Page, expect

from tests.admin.conftest import GATE_HASH, gate_wait
from tests.admin.test_admin_display import add_events
from tests.admin.test_approval_queue_browser import card, log_in, screenshot
from workflows import services
from workflows.admin.inspection import EVENTS_PER_PAGE
from workflows.models import Wait

pytestmark = pytest.mark.django_db(transaction=True)

QUEUE = reverse("admin:workflows_wait_approvals")


def shown_messages(page: Page) -> list[str]:
    return page.locator(".messagelist li").all_inner_texts()


def test_two_decisions_from_one_tab_each_show_their_own_message(
    page: Page, live_server: Any, staff_approver: Any, requester: Any
) -> None:
    first, second, third = (gate_wait(requester) for _ in range(3))
    log_in(page, live_server, "alice", "alice-password")

    card(page, first).get_by_role("button", name="Approve").click()
    expect(page.locator(".messagelist")).to_be_visible()
    assert shown_messages(page) == [f"Wait {first.pk} approved by alice."]
    card(page, second).get_by_role("button", name="Reject").click()
    expect(page.locator(f"#wait-{second.pk}")).to_have_count(0)
    assert shown_messages(page) == [f"Wait {second.pk} rejected by alice."]

    # Two POSTs from this tab before either page is shown (its cookies and CSRF token): a repeat
    # of the first decision, then a new one. Each redirect leads to a page with its own message.
    token = next(c["value"] for c in page.context.cookies() if c["name"] == "csrftoken")
    posts = [page.request.post(live_server.url + reverse("admin:workflows_wait_decide", args=[wait.pk]),
                               form={"csrfmiddlewaretoken": token, "decision": "approve", "candidate_hash": GATE_HASH},
                               max_redirects=0) for wait in (first, third)]
    assert [p.status for p in posts] == [302, 302]
    page.goto(live_server.url + posts[0].headers["location"])
    [repeat] = shown_messages(page)
    assert repeat.startswith(f"Wait {first.pk} was already approved by alice at ") and "nothing changed" in repeat
    page.goto(live_server.url + posts[1].headers["location"])
    assert shown_messages(page) == [f"Wait {third.pk} approved by alice."]
    page.goto(live_server.url + QUEUE)
    assert shown_messages(page) == []  # nothing left over in the browser's message storage
    expect(page.get_by_text("Nothing is waiting for your decision.")).to_be_visible()


def test_the_queue_opens_with_a_summary_of_every_approval_linked_to_its_card(
    page: Page, live_server: Any, staff_approver: Any, requester: Any
) -> None:
    waits = [gate_wait(requester) for _ in range(5)]
    log_in(page, live_server, "alice", "alice-password")

    summary = page.locator("#summary")
    expect(summary.locator("tbody tr")).to_have_count(5)
    box = summary.bounding_box()
    assert box is not None and box["y"] + box["height"] <= 900, "the summary is not on the first screen"
    height = page.evaluate("() => document.documentElement.scrollHeight")
    overflow = page.evaluate("() => document.documentElement.scrollWidth - document.documentElement.clientWidth")
    assert height > 3000 and overflow <= 0  # five cards in full below it, in a laptop's width
    screenshot(page, "approval-queue-summary.png", full_page=False)

    last = waits[2]  # cards follow it, so its link can scroll it to the top
    expect(page.locator(f"#summary-wait-{last.pk}")).to_contain_text(GATE_HASH[:12])
    page.locator(f"#summary-wait-{last.pk}").get_by_role("link", name=f"review wait {last.pk}").click()
    expect(page).to_have_url(re.compile(rf"#wait-{last.pk}$"))
    top = page.evaluate(f"() => document.getElementById('wait-{last.pk}').getBoundingClientRect().top")
    assert 0 <= top < 100, f"the card of wait {last.pk} is {top} px from the top after following its link"
    card(page, last).get_by_role("button", name="Approve").click()
    expect(page.locator(f"#summary-wait-{last.pk}")).to_have_count(0)
    expect(page.locator("#summary tbody tr")).to_have_count(4)
    assert Wait.objects.get(pk=last.pk).decision == "approved"


def test_a_long_timeline_is_paged_newest_first(
    page: Page, live_server: Any, staff_outsider: Any, requester: Any, approver: Any
) -> None:
    wait = gate_wait(requester)
    services.wait_approve(wait_id=wait.pk, user=approver, candidate_hash=GATE_HASH)
    workflow = wait.workflow
    workflow.refresh_from_db()
    add_events(workflow, 500 - workflow.event_seq)
    url = reverse("admin:workflows_workflow_change", args=[workflow.pk])
    log_in(page, live_server, "oscar", "oscar-password", then=url)

    rows = page.locator("#timeline tbody tr")
    expect(rows).to_have_count(EVENTS_PER_PAGE)
    expect(rows.first.locator("td").first).to_have_text("500")
    page.locator("#timeline .ao-pager").first.get_by_role("link", name="older ›").click()
    expect(page).to_have_url(re.compile(r"\?events=2#timeline$"))
    expect(rows.first.locator("td").first).to_have_text("450")
    page.locator("#timeline .ao-pager").last.get_by_role("link", name="10", exact=True).click()
    expect(rows.first.locator("td").first).to_have_text("50")
    expect(rows.last.locator("td").first).to_have_text("1")
    expect(rows.last).to_contain_text("workflow.launched")
    expect(page.locator("#timeline")).to_contain_text("Events 1–50 of 500.")
    response = page.goto(live_server.url + url)
    assert response is not None
    print(f"\n[figures] workflow page with 500 events: {len(response.body())} bytes")
