"""One way to write dates and money, the queue's summary, and the paged timeline, through Django's test client."""
from __future__ import annotations

import re
from datetime import UTC, datetime, timedelta
from decimal import Decimal
from typing import Any

import pytest
from django.urls import reverse

from tests.admin.conftest import GATE_HASH, gate_wait, logged_in
from tests.conftest import drive
from workflows import clock, services
from workflows.admin.display import usd, when
from workflows.admin.inspection import ACTIVITIES_SHOWN, EVENTS_PER_PAGE
from workflows.models import Activity, Checkpoint, Commitment, Event, UsageEntry, Wait, Workflow
from workflows.services.steps import COMPENSATION_NODE

QUEUE = reverse("admin:workflows_wait_approvals")
MOMENT = r"\d{4}-\d\d-\d\d \d\d:\d\d:\d\d UTC"
# Django's English defaults ("Dec. 1, 2026, 9:14 a.m."), and a time of day without its date and zone.
OTHER_FORMATS = [r"\b[ap]\.m\.", r"\bnoon\b", r"\bmidnight\b",
                 r"\b(Jan|Feb|March|April|May|June|July|Aug|Sept|Oct|Nov|Dec)\.? \d{1,2}, \d{4}",
                 r"(?<![-\dT])\d\d:\d\d:\d\d(?! UTC)"]


def page_of(workflow_id: int, **query: Any) -> str:
    url = reverse("admin:workflows_workflow_change", args=[workflow_id])
    return url + ("?" + "&".join(f"{k}={v}" for k, v in query.items()) if query else "")


def other_formats(page: str) -> list[str]:
    text = re.sub(r"<script.*?</script>", "", page, flags=re.S)
    return [m.group(0) for pattern in OTHER_FORMATS for m in re.finditer(pattern, text)]


@pytest.fixture
def approved_gate(requester: Any, approver: Any) -> Workflow:
    wait = gate_wait(requester)
    services.wait_approve(wait_id=wait.pk, user=approver, candidate_hash=GATE_HASH)
    workflow = drive(wait.workflow_id)
    assert workflow.status == Workflow.Status.COMPLETED
    return workflow


def test_money_has_four_decimals_always() -> None:
    assert [usd(v) for v in (Decimal("0.0123"), Decimal("5"), 1234.5, "0.001212", 0, Decimal("-0.5"))] == [
        "$0.0123", "$5.0000", "$1,234.5000", "$0.0012", "$0.0000", "-$0.5000"]
    assert (usd(Decimal("0.00004")), usd(None), usd("")) == ("<$0.0001", "", "")


def test_a_moment_is_written_with_its_zone() -> None:
    # A fixed moment: clock.now() reads the database's clock when its reading is a minute old,
    # and this test has no database.
    at = datetime(2026, 11, 30, 9, 14, 2, 5, tzinfo=UTC)
    assert (when(at), when(None)) == ("2026-11-30 09:14:02 UTC", "")


@pytest.mark.django_db
class TestOneFormat:
    def test_the_workflow_page_writes_every_moment_one_way(self, approved_gate, staff_outsider):
        """The admin's own fields (created, updated) and our tables (waits, timeline, attempts) alike."""
        page = logged_in(staff_outsider).get(page_of(approved_gate.pk)).content.decode()

        assert other_formats(page) == []
        created = re.search(r'<div class="readonly">(' + MOMENT + r")</div>", page)
        assert created and created.group(1) == when(approved_gate.created_at)
        assert re.search(r"approved by alice at " + MOMENT, page)
        assert len(re.findall(MOMENT, page)) > 10

    def test_the_queue_and_the_lists_write_moments_the_same_way(self, waiting_gate, staff_approver, admin_user):
        client = logged_in(admin_user)
        for url in (QUEUE, reverse("admin:workflows_workflow_changelist"), reverse("admin:workflows_wait_changelist"),
                    reverse("admin:workflows_activity_changelist")):
            page = client.get(url).content.decode()
            assert other_formats(page) == [], url
            assert re.search(MOMENT, page), url

    def test_money_on_the_workflow_page_and_the_budget_page_has_four_decimals(self, staff_outsider, operator,
                                                                             requester):
        workflow = services.workflow_launch(kind="autonomous", goal="Write notes", user=requester,
                                            options=services.LaunchOptions(budget_total_usd=Decimal("2.5"),
                                                                           budget_hourly_usd=Decimal("1")))
        UsageEntry.objects.create(workflow=workflow, key="op#0", operation_id="op", provider="anthropic",
                                  model="claude-sonnet-5-5", status="charged", reserved_usd=Decimal("0.01"),
                                  cost_usd=Decimal("0.001212"), created_at=clock.now())

        page = logged_in(staff_outsider).get(page_of(workflow.pk)).content.decode()
        budget = logged_in(operator).get(reverse("admin:workflows_workflow_budget", args=[workflow.pk]))

        for text in (page, budget.content.decode()):
            amounts = re.findall(r"[<-]?\$[\d,]+(?:\.\d+)?", text)
            assert amounts and all(re.fullmatch(r"[<-]?\$[\d,]+\.\d{4}", a) for a in amounts), amounts
            assert re.findall(r"\d\.\d+ USD", text) == []
        assert '<strong id="ao-live-spent">$0.0012</strong> of $2.5000' in page
        assert "$0.0012 of $1.0000 per hour" in page
        assert "$2.4988" in page  # remaining


@pytest.mark.django_db
class TestQueueSummary:
    def test_the_summary_lists_each_approval_with_a_link_to_its_card(self, staff_approver, requester):
        waits = [gate_wait(requester), gate_wait(requester)]
        Wait.objects.filter(pk=waits[1].pk).update(expires_at=clock.now() + timedelta(minutes=30))

        page = logged_in(staff_approver).get(QUEUE).content.decode()

        summary = re.search(r'<table class="ao-table ao-summary" id="summary".*?</table>', page, re.S).group(0)
        assert "2 approvals waiting for your decision, soonest expiry first" in summary
        rows = re.findall(r'<tr id="summary-wait-(\d+)">(.*?)</tr>', summary, re.S)
        assert [int(pk) for pk, _ in rows] == [waits[1].pk, waits[0].pk]
        for wait, (_, row) in zip([waits[1], waits[0]], rows, strict=True):
            assert f'href="#wait-{wait.pk}"' in row and f'id="wait-{wait.pk}"' in page
            assert f">workflow {wait.workflow_id}</a>" in row and f"<td>{wait.workflow.kind}</td>" in row
            assert "Open the gate for &lt;release&gt; 1.0" in row and f">{GATE_HASH[:12]}</code>" in row
        assert re.search(r'<td class="ao-nowrap">(29|30)\xa0minutes</td>', rows[0][1])
        assert page.index('id="summary"') < page.index(f'id="wait-{waits[1].pk}"')

    def test_no_summary_when_nothing_waits(self, staff_approver):
        page = logged_in(staff_approver).get(QUEUE).content.decode()
        assert 'id="summary"' not in page and "Nothing is waiting for your decision." in page


def add_events(workflow: Workflow, count: int) -> None:
    """``count`` more events (tool calls of a long-running agent), as event_record numbers them."""
    start = workflow.event_seq
    Event.objects.bulk_create(
        Event(workflow=workflow, seq=start + n, kind="tool.called", created_at=clock.now(),
              data={"tool": "run_command", "input": f"make test #{start + n}", "ok": True, "output": "ok " * 40})
        for n in range(1, count + 1))
    Workflow.objects.filter(pk=workflow.pk).update(event_seq=start + count)
    workflow.refresh_from_db()


@pytest.mark.django_db
class TestLongRunsStaySmall:
    def test_the_timeline_shows_one_page_newest_first_with_links_to_the_others(self, approved_gate, staff_outsider):
        add_events(approved_gate, 500 - approved_gate.event_seq)
        client = logged_in(staff_outsider)

        first = client.get(page_of(approved_gate.pk)).content.decode()
        third = client.get(page_of(approved_gate.pk, events=3)).content.decode()
        beyond = client.get(page_of(approved_gate.pk, events=99)).content.decode()

        def seqs(page: str) -> list[int]:
            timeline = page[page.index('id="timeline"'):page.index('id="checkpoints"')]
            return [int(s) for s in re.findall(r'<tr class="ao-ev-[^"]*"><td>(\d+)</td>', timeline)]

        assert seqs(first) == list(range(500, 500 - EVENTS_PER_PAGE, -1))
        assert seqs(third) == list(range(400, 350, -1))
        assert seqs(beyond) == list(range(50, 0, -1))  # the last page: the launch is event 1
        assert "Events 451–500 of 500." in first and "Events 351–400 of 500." in third
        pager = re.search(r'<nav class="ao-pager".*?</nav>', third, re.S).group(0)
        assert re.findall(r"<a href=\"[^\"]*\?events=(\d+)#timeline\">", pager) == ["2", "1", "2", "4", "5", "10", "4"]
        assert '<strong aria-current="page">3</strong>' in pager and "older ›" in pager and "‹ newer" in pager

    def test_the_newest_activities_are_listed_and_the_activity_list_has_the_rest(self, approved_gate,
                                                                                staff_outsider, admin_user):
        Activity.objects.bulk_create(
            Activity(workflow=approved_gate, operation_id=f"wf-{approved_gate.pk}/extra/{n}", name="extra_step",
                     node="DONE", node_visit=9, intent_version=1, next_attempt_at=clock.now(), created_at=clock.now(),
                     status=Activity.Status.SUCCEEDED, checkpoint={"turns": "y" * 5000})
            for n in range(ACTIVITIES_SHOWN + 5))
        total = Activity.objects.filter(workflow=approved_gate).count()

        page = logged_in(staff_outsider).get(page_of(approved_gate.pk)).content.decode()

        shown = re.findall(r'<tr id="activity-(\d+)">', page)
        newest = Activity.objects.filter(workflow=approved_gate).order_by("-pk")[:ACTIVITIES_SHOWN]
        assert [int(pk) for pk in shown] == [a.pk for a in newest]
        link = re.search(r'<a href="([^"]+)" id="earlier-activities">The activity list</a> has the\s+(\d+) earlier',
                         page)
        assert link and int(link.group(2)) == total - ACTIVITIES_SHOWN and "y" * 1000 not in page
        listed = logged_in(admin_user).get(link.group(1).replace("&amp;", "&"))
        assert listed.status_code == 200 and listed.context["cl"].result_count == total

    def test_a_commitment_shows_its_compensation_listed_or_not(self, approved_gate, staff_outsider):
        """The compensation is looked up by its operation id, also when it is older than the activities shown."""
        def activity(operation_id: str, **fields: Any) -> Activity:
            return Activity.objects.create(workflow=approved_gate, operation_id=operation_id, node_visit=3,
                                           intent_version=1, next_attempt_at=clock.now(), created_at=clock.now(),
                                           status=Activity.Status.SUCCEEDED, **fields)
        made = activity("wf-x/COMMIT.3/i1/0", name="deploy", node="COMMIT")
        activity("wf-x/COMMIT.3/i1/0/compensate", name="undeploy", node=COMPENSATION_NODE, attempt=2)
        for n in range(ACTIVITIES_SHOWN):
            activity(f"wf-x/LATER.4/i1/{n}", name="later", node="LATER")
        Commitment.objects.create(workflow=approved_gate, activity=made, kind="deployment", compensation="undeploy",
                                  status=Commitment.Status.COMPENSATED, created_at=clock.now())

        page = logged_in(staff_outsider).get(page_of(approved_gate.pk)).content.decode()

        assert '<td>undeploy: <span class="ao-badge ao-succeeded">succeeded</span> after 2 attempts</td>' in page

    def test_checkpoints_are_listed_without_their_state_which_has_a_page_of_its_own(self, approved_gate,
                                                                                    staff_outsider, requester):
        checkpoint = Checkpoint.objects.filter(workflow=approved_gate).order_by("-node_visit").first()
        Checkpoint.objects.filter(pk=checkpoint.pk).update(state={"big": "x" * 50_000, "marker": "<b>end</b>"})
        client = logged_in(staff_outsider)

        page = client.get(page_of(approved_gate.pk)).content.decode()
        url = reverse("admin:workflows_workflow_checkpoint", args=[approved_gate.pk, checkpoint.pk])
        state = client.get(url).content.decode()

        assert "x" * 1000 not in page and f'<a href="{url}">state at visit {checkpoint.node_visit}</a>' in page
        assert "x" * 50_000 in state and "&lt;b&gt;end&lt;/b&gt;" in state
        other = gate_wait(requester).workflow
        assert client.get(reverse("admin:workflows_workflow_checkpoint",
                                  args=[other.pk, checkpoint.pk])).status_code == 404
