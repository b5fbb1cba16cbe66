"""The outside kind tested against the database with the kit's plugin and public names only."""
import pytest
from notes_kind import BOARD

from agentops.kind.presentation import Activity
from agentops.kind.testing import launch

pytestmark = pytest.mark.django_db


@pytest.fixture(autouse=True)
def empty_board():
    BOARD.pins.clear()


def test_a_reminder_waits_for_its_timer_then_pins_its_note(drive, clock, doorbells):
    workflow = drive(launch("outside_reminder", params={"text": "Call Ada", "delay_seconds": 3600}))
    assert (workflow.status, workflow.current_node, BOARD.pins) == ("waiting", "SLEEP", [])

    clock.advance(minutes=59)
    assert drive(workflow).status == "waiting"  # the timer is not due yet
    clock.advance(minutes=2)
    workflow = drive(workflow)

    ((key, text),) = BOARD.pins
    assert (workflow.status, workflow.result, text) == ("completed", {"pin": key}, "Call Ada")
    pin = Activity.objects.get(workflow=workflow, name="pin_note")
    assert doorbells.of("agentops.activity.run") == [{"activity_id": pin.pk}]  # rung, never published


def test_a_child_s_end_reaches_its_parent_through_drive(drive, doorbells):
    workflow = drive(launch("outside_digest", params={"text": "Weekly digest"}))

    (child,) = workflow.children.all()
    assert (child.kind, child.status) == ("outside_reminder", "completed")
    assert (workflow.status, workflow.result) == ("completed", {"child": child.pk, "status": "completed",
                                                               "note": child.result})
    assert [text for _, text in BOARD.pins] == ["Weekly digest"]
    assert doorbells.of("agentops.workflow.children_collect") == [{"workflow_id": workflow.pk}]


def test_a_crash_after_the_pin_does_not_pin_it_again(drive, clock, faults):
    workflow = launch("outside_reminder", params={"text": "Call Ada", "delay_seconds": 0})
    with faults.crash_at("activity.after_external_call", activity="pin_note"):
        drive(workflow)
    assert [(crash["point"], crash["attempt"]) for crash in faults.fired] == [("activity.after_external_call", 1)]
    assert len(BOARD.pins) == 1
    assert drive(workflow).status == "running"  # the crashed attempt holds its lease

    clock.advance(seconds=31)  # past the lease of pin_note
    workflow = drive(workflow)

    pin = Activity.objects.get(workflow=workflow, name="pin_note")
    assert (workflow.status, pin.attempt) == ("completed", 2)
    ((key, _),) = BOARD.pins  # the second attempt reconciled: still one pin
    assert workflow.result == {"pin": key}


def test_a_crash_before_the_pin_pins_it_on_the_next_attempt(drive, clock, faults):
    workflow = launch("outside_reminder", params={"text": "Call Ada", "delay_seconds": 0})
    with faults.crash_at("activity.before_external_call", activity="pin_note"):
        drive(workflow)
    assert BOARD.pins == []

    clock.advance(seconds=31)
    workflow = drive(workflow)

    assert (workflow.status, [text for _, text in BOARD.pins]) == ("completed", ["Call Ada"])


@pytest.mark.parametrize("point", ["activity.after_claim", "activity.before_writeback", "transition.before_commit"])
def test_a_crash_at_a_point_of_every_attempt_pins_the_note_once(drive, clock, faults, point):
    workflow = launch("outside_reminder", params={"text": "Call Ada", "delay_seconds": 0})
    with faults.crash_at(point, activity="pin_note"):
        drive(workflow)
    assert drive(workflow).status == "running"

    clock.advance(seconds=31)
    workflow = drive(workflow)

    ((key, _),) = BOARD.pins
    assert (workflow.status, workflow.result) == ("completed", {"pin": key})
    assert Activity.objects.get(workflow=workflow, name="pin_note").attempt == 2


@pytest.mark.django_db(transaction=True)
def test_in_a_transactional_test_too_a_crash_after_the_pin_does_not_pin_it_again(drive, clock, faults):
    workflow = launch("outside_reminder", params={"text": "Call Ada", "delay_seconds": 0})
    with faults.crash_at("activity.after_external_call", activity="pin_note"):
        drive(workflow)
    clock.advance(seconds=31)

    assert drive(workflow).status == "completed"
    assert len(BOARD.pins) == 1
