"""Activity inputs and results are checked against their dataclass's types both ways:
``X(name=5, n="seven")`` is built by Python without complaint; the codec refuses it, naming each
field, before it is stored, and refuses a stored value that no longer fits when it is read."""
from __future__ import annotations

import dataclasses
import threading
from collections.abc import Iterator

import pytest

from tests.conftest import drive
from workflows import codec, engine, services
from workflows.activity_context import ActivityContext
from workflows.errors import InvalidInput
from workflows.models import Activity, Event
from workflows.registry import activity
from workflows.testing import registered

KIND = "test-typed-values"


@dataclasses.dataclass(frozen=True)
class Line:
    sku: str
    quantity: int = 1


@dataclasses.dataclass(frozen=True)
class Order:
    name: str
    n: int
    lines: tuple[Line, ...] = ()
    note: str | None = None


@dataclasses.dataclass(frozen=True)
class Receipt:
    total: float
    lines: int


def test_a_wrongly_typed_field_is_refused_on_decode_naming_each_field() -> None:
    with pytest.raises(InvalidInput) as refused:
        codec.from_json(Order, {"name": 5, "n": "seven"}, what="The input of activity place_order")
    assert str(refused.value) == (
        "The input of activity place_order does not fit Order: name: input should be a valid string (got 5); "
        "n: input should be a valid integer, unable to parse string as an integer (got 'seven').")


def test_a_nested_field_is_named_by_its_path() -> None:
    with pytest.raises(InvalidInput, match=r"lines\.1\.quantity: input should be a valid integer"):
        codec.from_json(Order, {"name": "a", "n": 1, "lines": [{"sku": "x"}, {"sku": "y", "quantity": "many"}]},
                        what="x")


def test_values_that_fit_round_trip_with_defaults_and_undeclared_fields_ignored() -> None:
    order = Order(name="a", n=2, lines=(Line("x"), Line("y", 3)))
    assert codec.from_json(Order, codec.to_json(order), what="x") == order
    assert codec.from_json(Order, {"name": "a", "n": 2, "removed_field": True}, what="x") == Order(name="a", n=2)
    assert codec.from_json(Order | None, None, what="x") is None


def test_a_value_built_with_wrong_types_is_refused_before_it_is_stored() -> None:
    with pytest.raises(InvalidInput, match=r"does not fit Order: name: input should be a valid string \(got 5\)"):
        codec.check(Order(name=5, n="seven"), what="The input of activity place_order")  # type: ignore[arg-type]
    codec.check(Order(name="a", n=1), what="fits")  # no error
    codec.check({"any": "dict"}, what="not a dataclass")  # passes through


def test_a_field_type_pydantic_has_no_schema_for_passes_as_it_is() -> None:
    """A TypedDict (pydantic reads typing's only from Python 3.12) or an arbitrary class: the
    JSON is kept as it was stored, as before these checks."""
    @dataclasses.dataclass
    class Holder:
        lock: threading.Lock  # type: ignore[valid-type]

    assert codec.leaf_validator(threading.Lock) is None
    assert codec.from_json(Holder, {"lock": "kept"}, what="x") == Holder(lock="kept")


# --- through the engine -----------------------------------------------------------------------------

@activity("test_typed_values_place")
def place_order(ctx: ActivityContext, input: Order) -> Receipt:
    if input.note == "bad result":
        return Receipt(total="lots", lines=len(input.lines))  # type: ignore[arg-type]
    return Receipt(total=9.5, lines=len(input.lines))


class PlaceOrder(engine.WorkflowDefinition):
    kind = KIND
    start_node = "PLACE"
    revalidate_node = "PLACE"

    @engine.node("PLACE")
    def place(self, ctx: engine.NodeContext) -> engine.Decision:
        if ctx.goal == "wrong input":
            order = Order(name=5, n="seven")  # type: ignore[arg-type]
        else:
            order = Order(name="o", n=1, lines=(Line("x"),), note=ctx.goal)
        receipt = ctx.activity(place_order, order)
        return engine.Complete({"total": receipt.total})


@pytest.fixture(autouse=True)
def kind_registered() -> Iterator[None]:
    with registered(PlaceOrder, place_order):
        yield


@pytest.mark.django_db
@pytest.mark.usefixtures("rung")
def test_a_handler_passing_a_wrongly_typed_input_goes_through_the_failure_boundary_and_schedules_nothing() -> None:
    workflow = services.workflow_launch(kind=KIND, goal="wrong input")
    failed = Event.objects.get(workflow=workflow, kind="workflow.handler_failed")
    assert failed.data["error_type"] == "InvalidInput"
    assert "does not fit Order: name: input should be a valid string (got 5)" in failed.data["message"]
    assert not Activity.objects.filter(workflow=workflow).exists()
    workflow.refresh_from_db()
    assert workflow.status == "running" and workflow.advance_retry_at is not None  # retried, then paused


@pytest.mark.django_db
@pytest.mark.usefixtures("rung")
def test_an_activity_returning_a_wrongly_typed_result_fails_without_recording_it() -> None:
    workflow = drive(services.workflow_launch(kind=KIND, goal="bad result").pk)
    attempt = Activity.objects.get(workflow=workflow).attempts.get()
    assert attempt.status == "failed"
    assert attempt.error == ("InvalidInput: The result of activity test_typed_values_place does not fit Receipt: "
                             "total: input should be a valid number, unable to parse string as a number "
                             "(got 'lots').")
    assert Activity.objects.get(workflow=workflow).result is None
    assert workflow.status == "failed"


@pytest.mark.django_db
@pytest.mark.usefixtures("rung")
def test_a_typed_result_round_trips_through_the_engine() -> None:
    workflow = drive(services.workflow_launch(kind=KIND, goal="fine").pk)
    assert (workflow.status, workflow.result) == ("completed", {"total": 9.5})
    assert Activity.objects.get(workflow=workflow).input == {
        "name": "o", "n": 1, "lines": [{"sku": "x", "quantity": 1}], "note": "fine"}
