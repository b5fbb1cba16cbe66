"""The test kit's database tier refuses misuse with a message that says what to do, its list of
fault points is the code's and the page's, and what people do to a workflow (signal, approve,
reject, cancel, supersede, resume, a budget) goes through the services as `manage.py agent` does; a
paused workflow rests in `drive`, and `retry_now` opens retry windows."""
from __future__ import annotations

import re
from collections.abc import Iterator
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest

from agentops.kind import (
    ActivityContext,
    CompensationInput,
    Complete,
    Decision,
    Fail,
    Goto,
    InvalidInput,
    NodeContext,
    Retryable,
    RetryPolicy,
    WaitRefused,
    WorkflowDefinition,
    activity,
    node,
)
from agentops.kind.testing import (
    FAULT_POINTS,
    Clock,
    Faults,
    WorkflowRun,
    approve,
    cancel,
    drive,
    events,
    launch,
    registered,
    reject,
    resume,
    set_budget,
    signal,
    supersede,
)
from tests.conftest import one_event_kind
from workflows import services
from workflows.errors import NotFound
from workflows.models import Wait
from workflows.testing.database import doorbells_recorded

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.django_db
def test_drive_names_a_workflow_that_does_not_exist() -> None:
    with pytest.raises(NotFound, match="Workflow 999999 does not exist in this test's database"):
        drive(999999)


def test_drive_refuses_an_in_memory_run() -> None:
    with registered(one_event_kind("kit_db_in_memory")):
        run = WorkflowRun(one_event_kind("kit_db_in_memory"))
        with pytest.raises(TypeError, match="drive takes a workflow row or its id .*, not WorkflowRun"):
            drive(run)


def test_an_unknown_fault_point_is_refused_with_the_known_ones(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="Unknown fault point 'activity.after_clam'; the points are: activity.after_"):
        with Faults(tmp_path / "faults.log").crash_at("activity.after_clam"):
            pass


@pytest.mark.django_db
def test_a_crash_the_block_never_reaches_fails_the_test(tmp_path: Path) -> None:
    """A rule matching no activity the block runs (a misspelt name, say) does not pass silently."""
    faults = Faults(tmp_path / "faults.log")
    with registered(one_event_kind("kit_db_waits")), doorbells_recorded() as rung:
        workflow = launch("kit_db_waits")
        with pytest.raises(AssertionError, match=r"No crash at activity.after_claim \(activity='no_such_activity'\)"):
            with faults.crash_at("activity.after_claim", activity="no_such_activity"):
                assert drive(workflow).status == "waiting"
    assert faults.fired == []
    assert rung.rung == []  # a launch that opens a wait rings nothing


@pytest.mark.django_db
def test_the_clock_moves_forward_only_and_only_while_running() -> None:
    with pytest.raises(RuntimeError, match="not running"):
        Clock().advance(seconds=1)
    with Clock().running() as clock:
        start = clock.now()
        assert timedelta(hours=2) <= clock.advance(hours=2) - start < timedelta(hours=2, minutes=1)
        with pytest.raises(ValueError, match="only moves forward"):
            clock.advance(seconds=-1)
    assert clock.now() < start + timedelta(hours=1)  # real time again


def test_the_fault_points_are_the_code_s_and_the_authoring_page_s() -> None:
    fired = set()
    for path in [*(ROOT / "workflows").rglob("*.py"), *(ROOT / "agentops").rglob("*.py")]:
        fired |= set(re.findall(r"faultpoint\(\s*\"([a-z_.]+)\"", path.read_text()))
    assert fired == set(FAULT_POINTS)
    page = (ROOT / "docs" / "authoring.md").read_text()
    table = re.findall(r"^\| `([a-z_.]+)` \|", page.split("### Fault points", 1)[1], re.M)
    assert table == list(FAULT_POINTS)


# --- what people do to a workflow, through the kit: signal, approve, reject, cancel, supersede ---

SENT: list[str] = []
UNSENT: list[str] = []


@activity("kit_db_draft")
def kit_draft(ctx: ActivityContext, input: dict[str, Any]) -> dict[str, Any]:
    return {"text": f"Dear {input['to']}, it ships today."}


@activity("kit_db_unsend")
def kit_unsend(ctx: ActivityContext, input: CompensationInput) -> dict[str, Any]:
    UNSENT.append(input.sent_key)
    return {"retracted": input.sent_key}


@activity("kit_db_send", commitment="message", compensation=kit_unsend)
def kit_send(ctx: ActivityContext, input: dict[str, Any]) -> dict[str, Any]:
    ctx.fence("send")
    SENT.append(ctx.idempotency_key)
    return {"message": ctx.idempotency_key}


class SendOnApproval(WorkflowDefinition):
    """Draft, approve, send (a commitment), then wait to hear it was delivered."""

    kind = "kit_db_send"
    start_node = "DRAFT"
    revalidate_node = "DRAFT"

    @node("DRAFT")
    def draft(self, ctx: NodeContext[Any]) -> Decision:
        return Goto("REVIEW", {"draft": ctx.activity(kit_draft, {"to": "Ada"})})

    @node("REVIEW")
    def review(self, ctx: NodeContext[Any]) -> Decision:
        outcome = ctx.approval(candidate=ctx.state["draft"], role="kit-leads", expires_in_seconds=3600)
        return Goto("SEND") if outcome.approved else Fail(f"Rejected: {outcome.comment}")

    @node("SEND")
    def send(self, ctx: NodeContext[Any]) -> Decision:
        sent = ctx.activity(kit_send, ctx.state["draft"])
        delivered = ctx.wait_for_event("delivered")
        return Complete({**sent, "delivered": delivered.payload})


@pytest.fixture
def send_kind() -> Iterator[None]:
    SENT.clear()
    UNSENT.clear()
    with registered(SendOnApproval, kit_draft, kit_send, kit_unsend):
        yield


@pytest.mark.django_db
def test_approve_then_a_signal_queued_before_its_wait_complete_the_workflow(send_kind, doorbells) -> None:
    workflow = drive(launch("kit_db_send", goal="Tell Ada"))
    assert (workflow.status, workflow.current_node) == ("waiting", "REVIEW")
    assert signal(workflow, "delivered", {"at": "09:00"}) == "queued"  # no wait for it is open yet

    assert approve(workflow, by="lead") == "applied"
    assert approve(workflow, by="lead") == "already_applied"
    workflow = drive(workflow)

    assert (workflow.status, workflow.result) == ("completed", {"message": SENT[0], "delivered": {"at": "09:00"}})
    assert Wait.objects.get(workflow=workflow, kind="approval").decided_by.groups.filter(name="kit-leads").exists()


@pytest.mark.django_db
def test_reject_fails_the_workflow_with_the_comment(send_kind, doorbells) -> None:
    workflow = drive(launch("kit_db_send"))
    assert reject(workflow, by="lead", comment="Too curt") == "applied"
    workflow = drive(workflow)
    assert (workflow.status, workflow.reason, SENT) == ("failed", "Rejected: Too curt", [])


@pytest.mark.django_db
def test_cancel_after_the_send_retracts_it(send_kind, doorbells) -> None:
    workflow = drive(launch("kit_db_send"))
    approve(workflow)
    assert drive(workflow).current_node == "SEND" and len(SENT) == 1

    assert cancel(workflow, reason="Ada called") == "suspended"  # the compensation is to run
    workflow = drive(workflow)

    assert (workflow.status, UNSENT) == ("cancelled", SENT)
    assert cancel(workflow) == "already_applied"


@pytest.mark.django_db
def test_a_new_goal_at_the_review_drafts_again_for_it(send_kind, doorbells) -> None:
    workflow = drive(launch("kit_db_send", goal="Tell Ada"))
    assert supersede(workflow, "Tell Ada and Grace") == "applied"
    workflow = drive(workflow)

    assert (workflow.status, workflow.current_node, workflow.intent_version) == ("waiting", "REVIEW", 2)
    assert Wait.objects.filter(workflow=workflow, kind="approval", status="open").get().intent_version == 2


@pytest.mark.django_db
def test_approve_without_an_open_approval_says_to_drive_first(send_kind, doorbells) -> None:
    workflow = launch("kit_db_send")  # not driven: it is still drafting
    with pytest.raises(AssertionError, match="has 0 open approvals, not one: drive it to its approval first"):
        approve(workflow)
    with pytest.raises(TypeError, match="not str"):
        signal("7", "delivered")  # type: ignore[arg-type]


@pytest.mark.django_db
def test_an_approval_for_another_candidate_is_refused_in_both_tiers(send_kind, doorbells) -> None:
    """The approval is bound to the candidate the approver saw: another hash is refused, in memory
    as against the database, and nothing is decided."""
    workflow = drive(launch("kit_db_send"))
    with pytest.raises(WaitRefused, match="is bound to candidate"):
        approve(workflow, by="lead", candidate_hash="0" * 64)
    assert approve(workflow, by="lead") == "applied"

    run = WorkflowRun(SendOnApproval)
    run.run(kit_draft)
    with pytest.raises(WaitRefused, match="is bound to candidate"):
        run.approve(candidate_hash="0" * 64)
    (wait,) = run.open_waits.values()
    run.approve(candidate_hash=wait.candidate_hash)
    assert run.node == "SEND"


@pytest.mark.django_db
def test_a_paused_workflow_rests_in_drive_and_resume_goes_on(send_kind, doorbells) -> None:
    workflow = launch("kit_db_send")  # its draft is due, not run yet
    services.workflow_pause(workflow_id=workflow.pk, reason="Hold on", by="ops")
    assert (drive(workflow).status, SENT) == ("paused", [])  # the draft waits for a person

    assert resume(workflow) == "applied"
    assert (drive(workflow).status, drive(workflow).current_node) == ("waiting", "REVIEW")
    assert [e.kind for e in events(workflow, "workflow.resumed")] == ["workflow.resumed"]


@pytest.mark.django_db
def test_set_budget_records_the_change_and_refuses_an_amount_that_is_none(send_kind, doorbells) -> None:
    workflow = drive(launch("kit_db_send", budget_total_usd="1.00"))
    assert set_budget(workflow, total_usd="2.50", hourly_usd=1).budget_total_usd == 2.5
    (changed,) = events(workflow, "budget.changed")
    assert (changed.data["by"], changed.data["new"]) == ("operator", {"total": "2.50", "hourly": "1"})
    with pytest.raises(InvalidInput, match="more than 4 decimal places"):
        set_budget(workflow, total_usd="0.00001")
    assert len(events(workflow, "budget.changed")) == 1


FLAKY: list[int] = []


@activity("kit_db_flaky", retry=RetryPolicy(max_attempts=3, initial_interval_seconds=600))
def kit_flaky(ctx: ActivityContext, input: dict[str, Any]) -> dict[str, Any]:
    FLAKY.append(ctx.attempt)
    if len(FLAKY) == 1:
        raise Retryable("the mail server is busy")
    return {"sent_on_attempt": ctx.attempt}


class Flaky(WorkflowDefinition):
    kind = "kit_db_flaky"
    start_node = "SEND"
    revalidate_node = "SEND"

    @node("SEND")
    def send(self, ctx: NodeContext[Any]) -> Decision:
        return Complete(ctx.activity(kit_flaky, {}))


@pytest.mark.django_db
def test_drive_rests_at_a_retry_window_and_retry_now_opens_it(doorbells) -> None:
    FLAKY.clear()
    with registered(Flaky, kit_flaky):
        workflow = drive(launch("kit_db_flaky"))
        assert (workflow.status, FLAKY) == ("running", [1])  # ten minutes until the retry
        assert [e.kind for e in events(workflow)][-1] == "activity.retry_scheduled"

        workflow = drive(workflow, retry_now=True)
    assert (workflow.status, workflow.result, FLAKY) == ("completed", {"sent_on_attempt": 2}, [1, 2])
