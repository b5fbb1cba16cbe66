"""Activity checkpoints: saved only by the attempt holding the lease, validated as data, handed to
the next attempt, cleared on success."""
from __future__ import annotations

from datetime import timedelta

import pytest

from tests.conftest import write_while_held
from tests.workflows.test_chaining import chain_registered, launched  # noqa: F401  (a fixture)
from workflows import clock, services
from workflows.errors import InvalidInput
from workflows.models import Activity, Event
from workflows.services import RunOutcome
from workflows.services.activities import activity_claim_if_runnable

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.usefixtures("rung", "chain_registered")]


def claimed(attempt_worker: str = "w1"):
    workflow, activity = launched(steps=1)
    claim = activity_claim_if_runnable(activity_id=activity.pk, worker=attempt_worker, task_id="t")
    assert claim is not None
    return workflow, activity, claim


def test_the_next_attempt_gets_the_checkpoint_and_success_clears_it():
    workflow, activity, claim = claimed()
    assert claim.checkpoint is None
    assert services.activity_checkpoint_if_current(claim=claim, state={"turn": 3}, detail="turn 3") is True
    activity.refresh_from_db()
    assert (activity.checkpoint, activity.heartbeat_detail) == ({"turn": 3}, "turn 3")
    assert activity.checkpointed_at is not None and activity.lease_expires_at > clock.now()

    Activity.objects.filter(pk=activity.pk).update(lease_expires_at=clock.now() - timedelta(seconds=1))
    assert services.leases_reap_expired() == 1
    retry = activity_claim_if_runnable(activity_id=activity.pk, worker="w2", task_id="t2")
    assert retry is not None and (retry.attempt, retry.checkpoint) == (2, {"turn": 3})

    assert services.activity_result_record_if_current(claim=retry, result={"i": 0}) == RunOutcome.RECORDED
    activity.refresh_from_db()
    assert (activity.status, activity.checkpoint) == ("succeeded", None)


def test_a_superseded_attempt_cannot_overwrite_the_checkpoint():
    workflow, activity, stale = claimed()
    assert services.activity_checkpoint_if_current(claim=stale, state={"turn": 1}) is True
    Activity.objects.filter(pk=activity.pk).update(lease_expires_at=clock.now() - timedelta(seconds=1))
    services.leases_reap_expired()
    current = activity_claim_if_runnable(activity_id=activity.pk, worker="w2", task_id="t2")
    assert current is not None

    assert services.activity_checkpoint_if_current(claim=stale, state={"turn": 9}) is False

    activity.refresh_from_db()
    assert (activity.attempt, activity.checkpoint) == (2, {"turn": 1})
    saved = Event.objects.filter(workflow=workflow, kind="activity.checkpointed")
    assert [e.data["attempt"] for e in saved] == [1]


@pytest.mark.parametrize(("state", "message"), [
    (["not", "an", "object"], "must be a JSON object"),
    ({"score": float("nan")}, "not JSON-serializable"),
    ({"blob": "x" * 1_000_001}, "the limit is"),
    ({"text": "a\x00b"}, "NUL character"),
])
def test_bad_checkpoints_are_refused_and_change_nothing(state, message):
    workflow, activity, claim = claimed()
    def snapshot() -> tuple[object, ...]:
        workflow.refresh_from_db()
        return (workflow.event_seq, *Activity.objects.values_list("checkpoint", "heartbeat_at").get(pk=activity.pk))

    before = snapshot()
    with pytest.raises(InvalidInput, match=message):
        services.activity_checkpoint_if_current(claim=claim, state=state)
    assert snapshot() == before


def test_a_checkpoint_tells_the_attempt_to_stop_once_its_workflow_is_cancelled():
    """Like a heartbeat: a task that checkpoints instead of heartbeating must still notice a cancel."""
    workflow, activity, claim = claimed()
    services.workflow_cancel(workflow_id=workflow.pk, reason="not needed")
    workflow.refresh_from_db()
    assert workflow.status == "cancelled", "the running task was voided, and it made no commitment"

    assert services.activity_checkpoint_if_current(claim=claim, state={"turn": 1}) is False
    assert services.activity_heartbeat_if_current(claim=claim) is False

    activity.refresh_from_db()
    assert activity.checkpoint is None
    assert not Event.objects.filter(workflow=workflow, kind="activity.checkpointed").exists()


def test_notes_saved_with_a_checkpoint_share_its_transaction():
    """A turn's tool calls and the checkpoint after them: both recorded, in order, under
    consecutive sequence numbers, or (the attempt fenced off) neither, with no gap left."""
    workflow, activity, claim = claimed()
    notes = [("tool.called", {"tool": "write_file", "ok": True}), ("tool.called", {"tool": "read_file", "ok": True})]
    assert services.activity_checkpoint_if_current(claim=claim, state={"turn": 1}, detail="turn 1", notes=notes)

    events = list(Event.objects.filter(workflow=workflow).order_by("seq"))
    assert [e.seq for e in events] == list(range(1, len(events) + 1))
    assert [(e.kind, e.data.get("tool")) for e in events[-3:]] == [
        ("tool.called", "write_file"), ("tool.called", "read_file"), ("activity.checkpointed", None)]
    assert {e.data["attempt"] for e in events[-3:]} == {claim.attempt}

    services.workflow_cancel(workflow_id=workflow.pk, reason="not needed")
    workflow.refresh_from_db()
    seq_after_cancel = workflow.event_seq
    assert services.activity_checkpoint_if_current(claim=claim, state={"turn": 2}, notes=notes) is False
    workflow.refresh_from_db()
    assert workflow.event_seq == seq_after_cancel
    assert Event.objects.filter(workflow=workflow, kind="tool.called").count() == 2
    activity.refresh_from_db()
    assert activity.checkpoint == {"turn": 1}


def test_a_note_that_is_not_json_refuses_the_checkpoint_and_changes_nothing():
    workflow, activity, claim = claimed()
    workflow.refresh_from_db()
    before = workflow.event_seq
    with pytest.raises(InvalidInput, match="not JSON-serializable"):
        services.activity_checkpoint_if_current(claim=claim, state={"turn": 1},
                                                notes=[("tool.called", {"score": float("nan")})])
    workflow.refresh_from_db()
    activity.refresh_from_db()
    assert (workflow.event_seq, activity.checkpoint) == (before, None)


@pytest.mark.parametrize("write", ["note", "checkpoint"])
def test_a_note_or_checkpoint_waiting_on_a_cancel_sees_it_once_the_cancel_commits(write):
    """The fence is read after the workflow's row lock: a write that waited for a cancel holding
    that lock sees the attempt voided when the cancel commits, and writes nothing (its statement
    began before the cancel committed, so a fence read with that statement's snapshot would not)."""
    workflow, activity, claim = claimed()
    workflow.refresh_from_db()
    seq_before = workflow.event_seq

    def attempt_writes() -> bool:
        if write == "note":
            return services.activity_note_if_current(claim=claim, kind="tool.called", data={"tool": "write_file"})
        return services.activity_checkpoint_if_current(claim=claim, state={"turn": 1})

    _, saved = write_while_held(lambda: services.workflow_cancel(workflow_id=workflow.pk, reason="not needed"),
                                attempt_writes)

    assert saved is False
    workflow.refresh_from_db()
    activity.refresh_from_db()
    assert workflow.status == "cancelled" and activity.checkpoint is None
    assert not Event.objects.filter(workflow=workflow, kind__in=["tool.called", "activity.checkpointed"]).exists()
    assert list(Event.objects.filter(workflow=workflow).order_by("seq").values_list("seq", flat=True)) == list(
        range(1, workflow.event_seq + 1)) and workflow.event_seq > seq_before
