"""The harness kind's admin page (H12 in docs/harness.md): the `todo` demo driven to `completed` in process, then
its feature board, features passing over time, each session's timeline and commits, isolation and limits."""
from __future__ import annotations

import json
import re
import shutil
from typing import Any

import pytest
from django.urls import reverse
from django.utils.html import escape
from playwright.sync_api import Page, expect

from agentops.agents.harness.presentation import SESSIONS_SHOWN
from tests.admin.conftest import logged_in
from tests.admin.test_approval_queue_browser import log_in, screenshot
from tests.harness.conftest import drive_all
from tests.harness.demo_run import todo_demo
from workflows import services
from workflows.models import Activity, Event, Workflow

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.timeout(300)]


@pytest.fixture
def completed_harness(settings: Any, tmp_path_factory: pytest.TempPathFactory) -> Workflow:
    """The demo as tests/harness/test_demo.py runs it (offline, in process, approved and resumed by hana of
    harness-approvers): run once, each test gets its rows and its workspace afresh."""
    return todo_demo(settings, tmp_path_factory)[0]


def page_of(workflow: Workflow) -> str:
    return reverse("admin:workflows_workflow_change", args=[workflow.pk])


def section(page: str, anchor: str) -> str:
    start = page.index(f'id="{anchor}"')
    return page[start:page.index('<div class="ao-section"', start + 1)]


def session(page: str, number: int) -> str:
    """One session's block (sessions are listed newest first, so the next block is the one before it)."""
    start = page.index(f'<details class="ao-session" id="session-{number}"')
    end = page.find(f'<details class="ao-session" id="session-{number - 1}"', start)
    return page[start:end if end > 0 else len(page)]


def session_of(workflow: Workflow, event_kind: str) -> int:
    """The number of the session whose operation recorded the first ``event_kind`` event."""
    event = Event.objects.filter(workflow=workflow, kind=event_kind).order_by("seq").first()
    assert event is not None, f"the demo recorded no {event_kind}"
    activity = Activity.objects.get(workflow=workflow, operation_id=event.data["operation_id"])
    return int(activity.input.get("session") or 0)


def test_the_page_shows_the_board_the_chart_the_sessions_and_their_commits(completed_harness, staff_outsider):
    """What the page shows is read from the run itself (its state, events and activities), so the
    test holds while the demo's schedule grows."""
    workflow, state = completed_harness, completed_harness.state
    page = logged_in(staff_outsider).get(page_of(workflow)).content.decode()
    print(f"\n[figures] harness workflow page: {len(page.encode())} bytes at {workflow.event_seq} events")

    board = section(page, "features")
    assert "10 passing, 0 failing, 0 blocked." in board
    for feature in state["features"]:
        fid = feature["id"]
        row = re.search(rf'<tr id="feature-{fid}">(.*?)</tr>', board, re.S).group(1)
        assert re.search(rf'<span class="ao-badge ao-passing">passing</span></td><td>{feature["attempts"]}</td>', row)
        assert "exit 0 in " in row and f"python checks/check_{fid.lower()}_" in row and f"PASS {fid}" in row
        assert state["head"][:12] in row

    chart = section(page, "passing")
    assert f'<title id="passing-{workflow.pk}-title">Features passing in workflow' in chart
    checks = Event.objects.filter(workflow=workflow, kind="harness.check_ran",
                                  data__purpose__in=["scaffold", "verify", "regression", "verify_all"]).count()
    print(f"[figures] {re.search(r'<desc[^>]*>(.*?)</desc>', chart).group(1)}")
    assert "0 of 10 at" in chart and "10 of 10 at" in chart and f"over {checks} check runs" in chart
    assert ": 10 of 10 passing after check run" in chart and '<polyline class="ao-line"' in chart
    assert "<script" not in chart

    limits = section(page, "harness-limits")
    assert re.search(r"checks ran under</th>\s*<td><strong>(bwrap|none)</strong> \(\d+ runs\)", limits)
    assert f"{state['sessions']} of at most {workflow.params['max_sessions']}" in limits

    sessions = page[page.index('id="sessions"'):]
    numbers = [int(n) for n in re.findall(r'<details class="ao-session" id="session-(\d+)"', sessions)]
    assert state["sessions"] + 1 > SESSIONS_SHOWN  # the demo's sessions take two pages
    assert numbers == list(range(state["sessions"], state["sessions"] - SESSIONS_SHOWN, -1))  # newest first
    assert f"Sessions 1–{SESSIONS_SHOWN} of {state['sessions'] + 1}, newest first" in sessions
    assert f'href="{page_of(workflow)}?sessions=2#sessions">older ›</a>' in sessions
    older = logged_in(staff_outsider).get(page_of(workflow), {"sessions": "2"}).content.decode()
    older = older[older.index('id="sessions"'):]
    assert [int(n) for n in re.findall(r'<details class="ao-session" id="session-(\d+)"', older)] == list(
        range(state["sessions"] - SESSIONS_SHOWN, -1, -1))  # the initializer last
    assert '<details class="ao-session" id="session-' in older and " open>" not in older.split("</summary>")[0]
    sessions += older  # each block below is read from the page that lists it
    newest = session(sessions, state["sessions"])
    assert re.search(r"model call</strong></td><td class=\"ao-details\">\d+ tokens in", newest)
    assert "check <span class=\"ao-badge ao-passing\">passed</span>" in newest
    assert f"commit {state['head']}" in newest and "diff --git a/" in newest  # git show --stat --patch

    killed = session(sessions, session_of(workflow, "harness.wip_saved"))
    assert "attempt 1 started" in killed and "attempt 2 started" in killed and "half-work saved" in killed
    command = next(e.data for e in Event.objects.filter(workflow=workflow, kind="tool.called").order_by("seq")
                   if e.data["tool"] == "run_command")
    assert escape(f"$ {json.loads(command['input'])['command']}") in sessions
    tampered = session(sessions, session_of(workflow, "harness.tamper_reverted"))
    assert "harness files reverted" in tampered and "features.json restored in" in tampered
    refused = Event.objects.filter(workflow=workflow, kind="harness.tool_refused").order_by("seq").first()
    assert refused is not None
    assert f"{refused.data['tool']} refused" in session(sessions, session_of(workflow, "harness.tool_refused"))
    assert "Only the newest 3 sessions&#x27; commits are read here" in session(sessions, 0)
    assert len(page.encode()) < 400_000


def test_a_run_waiting_for_its_feature_list_to_be_approved_shows_every_feature_red(staff_outsider, settings,
                                                                                  tmp_path):
    """Before any coding session: the board holds the scaffold's evidence, the chart stays at 0."""
    settings.AGENTOPS_WORKSPACE_DIR = tmp_path / "workspaces"
    settings.AGENTOPS_MODEL_PROVIDER = "scripted"
    launched = services.workflow_launch(kind="harness", goal="Build the todo CLI of the demo", params={})
    workflow = drive_all(launched.pk)
    assert (workflow.status, workflow.current_node) == ("waiting", "WAIT_FOR_APPROVAL")

    page = logged_in(staff_outsider).get(page_of(workflow)).content.decode()

    assert "0 passing, 10 failing, 0 blocked." in page
    assert page.count('<span class="ao-badge ao-failing">failing</span>') == 10 and "exit 1 in " in page
    assert "0 of 10 at" in section(page, "passing") and "10 of 10" not in section(page, "passing")
    assert f"0 of at most {workflow.params['max_sessions']}" in section(page, "harness-limits")
    initializer = session(page[page.index('id="sessions"'):], 0)
    assert "initializer" in initializer and "write_file" in initializer and "+++ b/features.json" in initializer


def test_a_workspace_this_server_cannot_read_leaves_the_page_without_diffs(completed_harness, staff_outsider):
    shutil.rmtree(completed_harness.state["workspace"])

    response = logged_in(staff_outsider).get(page_of(completed_harness))

    page = response.content.decode()
    assert response.status_code == 200 and "10 passing, 0 failing, 0 blocked." in page
    assert "is not readable on this web server (it may live on a worker&#x27;s disk)" in page
    assert "+++ b/todo.py" not in page


def test_the_board_in_chromium_at_1280_px(page: Page, live_server: Any, staff_outsider: Any, completed_harness):
    log_in(page, live_server, "oscar", "oscar-password", then=page_of(completed_harness))

    expect(page.locator("#features tbody tr")).to_have_count(10)
    expect(page.locator("#features .ao-badge.ao-passing")).to_have_count(10)
    expect(page.locator(f"#passing-{completed_harness.pk} svg")).to_be_visible()
    newest = f"#session-{completed_harness.state['sessions']}"
    expect(page.locator(newest)).to_have_attribute("open", "")
    expect(page.locator(f"{newest} .ao-steps tbody tr").first).to_be_visible()
    overflow = page.evaluate("() => document.documentElement.scrollWidth - document.documentElement.clientWidth")
    assert overflow <= 0, f"the page is {overflow} px wider than the window"
    page.locator("#features").scroll_into_view_if_needed()
    page.set_viewport_size({"width": 1280, "height": 1500})
    page.evaluate("() => document.getElementById('features').scrollIntoView()")
    screenshot(page, "harness-board.png", full_page=False)
