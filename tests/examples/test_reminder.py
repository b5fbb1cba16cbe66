"""The worked example of docs/authoring.md, run as the page says: with the test kit (no database),
in process against the test database with the kit's fixtures, and by the CLI. It imports only what
a kind author has (``agentops.kind``, ``agentops.kind.testing``, ``agentops.kind.presentation``):
tests/test_kind_surface.py keeps it so."""
from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from django.core.management import call_command
from django.core.management.base import CommandError, SystemCheckError

from agentops.kind import (
    ActivityContext,
    Complete,
    Decision,
    DefinitionError,
    InvalidInput,
    NodeContext,
    WorkflowDefinition,
    activity,
    node,
)
from agentops.kind.presentation import Workflow
from agentops.kind.testing import (
    ActivityEnvironment,
    LeaseLost,
    WorkflowRun,
    launch,
    registered,
    replay,
    signal,
)
from examples.reminder.activities import ReminderInput, ReminderSent, outbox, send_reminder
from examples.reminder.definition import Reminder

PARAMS = {"invoice": "INV-7", "email": "ap@example.com", "max_reminders": 2, "days_between": 7}


@pytest.fixture(autouse=True)
def workspace(tmp_path: Path, settings: Any) -> Path:
    settings.AGENTOPS_WORKSPACE_DIR = tmp_path / "workspaces"
    return tmp_path


@pytest.fixture
def reminder_kind() -> Iterator[None]:
    with registered(Reminder, send_reminder):
        yield


def test_a_paid_invoice_completes_after_one_reminder_in_memory():
    """The test kit drives the definition without a database: remind, wait, paid."""
    run = WorkflowRun(Reminder, goal="Collect INV-7", params=PARAMS)
    assert [c.name for c in run.pending.values()] == ["send_reminder"]

    run.complete(send_reminder, ReminderSent(message_id="m1", path="/dev/null"))
    assert (run.status, run.node) == ("waiting", "WAIT_FOR_PAYMENT")
    run.signal("paid", {"amount": "120.00"})

    assert (run.status, run.result) == ("completed", {"paid": {"amount": "120.00"}, "reminders": 1})


def test_silence_reminds_again_until_the_limit_then_fails():
    run = WorkflowRun(Reminder, goal="Collect INV-7", params=PARAMS)
    run.complete(send_reminder, ReminderSent(message_id="m1", path=""))
    run.expire()
    assert run.path == ["REMIND", "WAIT_FOR_PAYMENT", "REMIND"]
    run.complete(send_reminder, ReminderSent(message_id="m2", path=""))
    run.expire()

    assert (run.status, run.reason) == ("failed", "Invoice INV-7 is still unpaid after 2 reminders.")


def test_bad_parameters_are_refused_at_launch():
    with pytest.raises(InvalidInput, match="Parameter email must be one address"):
        WorkflowRun(Reminder, params={**PARAMS, "email": "nobody"})


def test_send_reminder_sends_once_per_operation_across_attempts(workspace):
    """A retried attempt (same operation id) finds its message and sends nothing again."""
    first = ActivityEnvironment(operation_id="wf-9/REMIND.1/i1/0").run(
        send_reminder, ReminderInput(invoice="INV-7", email="ap@example.com", number=1))
    retried = ActivityEnvironment(operation_id="wf-9/REMIND.1/i1/0", attempt=2).run(
        send_reminder, ReminderInput(invoice="INV-7", email="ap@example.com", number=1))

    assert first == retried
    assert isinstance(first, ReminderSent)
    assert [p.name for p in outbox().iterdir()] == ["wf-9_REMIND.1_i1_0.txt"]
    assert "Invoice INV-7 (reminder 1)" in Path(first.path).read_text()


@activity("test_kit_heartbeats")
def heartbeats(ctx: ActivityContext, input: dict[str, Any]) -> dict[str, Any]:
    for turn in range(input["turns"]):
        ctx.heartbeat(f"turn {turn}")
        ctx.checkpoint({"turn": turn}, force=True)
    ctx.note("tool.called", tool="none")
    return {"turns": input["turns"]}


def test_the_fake_lease_keeps_heartbeats_and_a_cancel_stops_the_activity():
    env = ActivityEnvironment()
    assert env.run(heartbeats, {"turns": 2}) == {"turns": 2}
    assert env.lease.heartbeats == ["turn 0", "turn 1"]
    assert env.lease.checkpoints == [{"turn": 0}, {"turn": 1}]
    assert env.lease.notes == [("tool.called", {"tool": "none"})]

    env.lease.cancel()
    with pytest.raises(LeaseLost, match="its work is no longer wanted"):
        env.run(heartbeats, {"turns": 1})


class ReminderThatLogsFirst(Reminder):
    """A changed definition: REMIND now asks for another activity first."""

    kind = "reminder_changed"

    @node("REMIND")
    def remind(self, ctx: NodeContext[Any]) -> Decision:
        ctx.activity(heartbeats, {"turns": 0})
        return super().remind(ctx)


def test_replay_names_where_a_changed_definition_no_longer_replays():
    run = WorkflowRun(Reminder, goal="Collect INV-7", params=PARAMS)
    run.complete(send_reminder, ReminderSent(message_id="m1", path=""))
    run.signal("paid", {"amount": "1"})

    assert replay(Reminder, run.history, params=PARAMS) is None
    divergence = replay(ReminderThatLogsFirst, run.history, params=PARAMS)
    assert divergence is not None
    assert (divergence.node, divergence.operation_id) == ("REMIND", "wf-1/REMIND.1/i1/0")
    assert "recorded as activity 'send_reminder'" in divergence.reason


def test_a_definition_without_its_start_node_fails_when_it_registers():
    class Broken(WorkflowDefinition):
        kind = "broken"
        start_node = "BEGIN"
        revalidate_node = "BEGIN"

        @node("FIRST")
        def first(self, ctx: NodeContext[Any]) -> Decision:
            return Complete()

    with pytest.raises(DefinitionError, match=r"start_node 'BEGIN' is not one of its nodes \(FIRST\)"), \
            registered(Broken):
        pass


def test_manage_py_check_refuses_an_activity_whose_compensation_does_not_resolve():
    with registered():  # whatever registers inside the block is gone after it
        @activity("test_kit_leaves_a_commitment", commitment="deployment", compensation="no_such_undo")
        def commits(ctx: ActivityContext, input: dict[str, Any]) -> dict[str, Any]:
            return {}

        with pytest.raises(SystemCheckError, match="names compensation 'no_such_undo'"):
            call_command("check")
    call_command("check")  # once it is gone, the shipped kinds pass


@pytest.mark.django_db
def test_the_example_runs_in_process_and_its_reminder_is_sent_once(reminder_kind, drive, clock):
    workflow = drive(launch("reminder", goal="Collect INV-7", params=PARAMS))
    assert (workflow.status, workflow.current_node) == ("waiting", "WAIT_FOR_PAYMENT")
    clock.advance(days=6)
    assert len(drive(workflow).state["sent"]) == 1  # a week between reminders
    clock.advance(days=1, seconds=1)
    workflow = drive(workflow)
    assert workflow.current_node == "WAIT_FOR_PAYMENT" and len(workflow.state["sent"]) == 2

    assert signal(workflow, "paid", {"amount": "120.00"}) == "applied"
    workflow = drive(workflow)

    assert (workflow.status, workflow.result) == ("completed", {"paid": {"amount": "120.00"}, "reminders": 2})
    assert len(list(outbox().iterdir())) == 2


@pytest.mark.django_db
def test_the_cli_refuses_bad_parameters_with_exit_2_and_writes_nothing(reminder_kind):
    with pytest.raises(CommandError, match="Parameter invoice is required"):
        call_command("agent", "launch", "reminder", "--goal", "Collect", "--param", "email=ap@example.com")
    assert not Workflow.objects.exists()
