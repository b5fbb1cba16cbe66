"""The engine lane (``workflows.lane``, AGENTOPS_IO_ENGINE_THREADS): on a threads-pool worker, at
most N threads run the engine's bookkeeping at once; the activity function, the model's answer
and every other wait run outside it; a thread in a transaction never waits for a turn, and one
that waits gives its pooled connection back first."""
from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from django.db import connection, transaction

from tests.conftest import drive
from workflows import engine, lane, services
from workflows.activity_context import ActivityContext
from workflows.metering import metered_complete
from workflows.models import Activity, Workflow
from workflows.registry import activity
from workflows.services import activities
from workflows.testing import ActivityEnvironment, FakeLedger, FakeModel, registered

JOIN_SECONDS = 10


@pytest.fixture(autouse=True)
def lane_off_after() -> Iterator[None]:
    yield
    lane.configure(0)


def in_thread(target: Callable[[], None]) -> threading.Thread:
    errors: list[BaseException] = []

    def run() -> None:
        try:
            target()
        except BaseException as exc:  # noqa: BLE001 - re-raised in the test's thread
            errors.append(exc)
        finally:
            connection.close()

    thread = threading.Thread(target=run)
    thread.errors = errors  # type: ignore[attr-defined]
    thread.start()
    return thread


def joined(thread: threading.Thread) -> None:
    thread.join(JOIN_SECONDS)
    assert not thread.is_alive(), "the thread is still waiting for a turn"
    assert not thread.errors, thread.errors  # type: ignore[attr-defined]


def test_off_unless_configured_every_block_runs_at_once() -> None:
    assert lane.size() == 0
    with lane.turn():
        assert not lane.holding()
        with lane.waiting():
            assert not lane.holding()


def test_a_negative_size_is_refused() -> None:
    with pytest.raises(ValueError, match="0 \\(off\\) or more threads, not -1"):
        lane.configure(-1)


def test_at_most_n_threads_hold_a_turn_at_once() -> None:
    lane.configure(2)
    lock, inside, most, done = threading.Lock(), [0], [0], []

    def work() -> None:
        with lane.turn():
            assert lane.holding()
            with lock:
                inside[0] += 1
                most[0] = max(most[0], inside[0])
            time.sleep(0.02)
            with lock:
                inside[0] -= 1
            done.append(1)
        assert not lane.holding()

    threads = [in_thread(work) for _ in range(8)]
    for thread in threads:
        joined(thread)
    assert len(done) == 8
    assert most[0] == 2


def test_a_thread_that_holds_a_turn_takes_no_second_one() -> None:
    lane.configure(1)

    def nested() -> None:
        with lane.turn(), lane.turn():
            assert lane.holding()
        assert not lane.holding()

    joined(in_thread(nested))


def test_a_thread_waiting_lets_another_take_its_turn_and_takes_one_back_after() -> None:
    lane.configure(1)
    waiting, other_ran, order = threading.Event(), threading.Event(), []

    def holder() -> None:
        with lane.turn():
            with lane.waiting():
                assert not lane.holding()
                waiting.set()
                assert other_ran.wait(JOIN_SECONDS)
            assert lane.holding()
            order.append("holder back")

    def other() -> None:
        assert waiting.wait(JOIN_SECONDS)
        with lane.turn():
            order.append("other")
        other_ran.set()

    threads = [in_thread(holder), in_thread(other)]
    for thread in threads:
        joined(thread)
    assert order == ["other", "holder back"]


def test_turns_are_handed_out_in_the_order_they_were_asked_for() -> None:
    """A turn given back passes to the thread that waited longest, not to whichever asks next."""
    let_go, holder = holding_the_only_turn()
    turns = lane._turns
    assert turns is not None
    order: list[str] = []
    waiters: list[threading.Thread] = []
    for name in ("first", "second", "third"):
        waiters.append(in_thread(lambda name=name: turn_noted(order, name)))  # type: ignore[misc]
        queued_behind(waiters, turns._in_hand)
    let_go.set()
    joined(holder)
    turn_noted(order, "came last")
    for waiter in waiters:
        joined(waiter)
    assert order == ["first", "second", "third", "came last"]


def turn_noted(order: list[str], name: str, *, new_work: bool = False) -> None:
    """Take a turn in the lane (as new work, or with work in hand) and note ``name`` in it."""
    with lane.turn(new_work=new_work):
        order.append(name)


def queued_behind(waiters: list[threading.Thread], line: Any) -> None:
    """Wait until the lane's line holds as many threads as ``waiters``."""
    deadline = time.monotonic() + JOIN_SECONDS
    while len(line) < len(waiters) and time.monotonic() < deadline:
        time.sleep(0.005)
    assert len(line) == len(waiters), "a thread did not queue for a turn"


def test_a_thread_with_work_in_hand_gets_a_turn_before_threads_about_to_claim_new_work() -> None:
    """A thousand agents launched at once: each thread takes its agent on to its model call
    before the next claim, not every claim first and every call behind them."""
    let_go, holder = holding_the_only_turn()
    turns = lane._turns
    assert turns is not None
    order: list[str] = []
    claims: list[threading.Thread] = []
    for name in ("claim 1", "claim 2"):
        claims.append(in_thread(lambda name=name: turn_noted(order, name, new_work=True)))  # type: ignore[misc]
        queued_behind(claims, turns._new_work)
    in_hand: list[threading.Thread] = []
    for name in ("in hand 1", "in hand 2"):
        in_hand.append(in_thread(lambda name=name: turn_noted(order, name)))  # type: ignore[misc]
        queued_behind(in_hand, turns._in_hand)
    let_go.set()
    for thread in (holder, *claims, *in_hand):
        joined(thread)
    assert order == ["in hand 1", "in hand 2", "claim 1", "claim 2"]


def test_new_work_that_has_waited_its_limit_goes_before_work_in_hand(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(lane, "NEW_WORK_WAIT_SECONDS", 0.2)
    let_go, holder = holding_the_only_turn()
    turns = lane._turns
    assert turns is not None
    order: list[str] = []
    claim = in_thread(lambda: turn_noted(order, "claim", new_work=True))
    queued_behind([claim], turns._new_work)
    in_hand = in_thread(lambda: turn_noted(order, "in hand"))
    queued_behind([in_hand], turns._in_hand)
    time.sleep(0.25)
    let_go.set()
    for thread in (holder, claim, in_hand):
        joined(thread)
    assert order == ["claim", "in hand"]


def holding_the_only_turn() -> tuple[threading.Event, threading.Thread]:
    """A thread that holds the lane's only turn until the returned event is set."""
    lane.configure(1)
    taken, let_go = threading.Event(), threading.Event()

    def hold() -> None:
        with lane.turn():
            taken.set()
            assert let_go.wait(JOIN_SECONDS)

    thread = in_thread(hold)
    assert taken.wait(JOIN_SECONDS)
    return let_go, thread


@pytest.mark.django_db(transaction=True)
def test_a_thread_in_a_transaction_does_not_wait_for_a_turn() -> None:
    """It may hold row locks that a thread in the lane waits for."""
    let_go, holder = holding_the_only_turn()
    ran = []

    def in_transaction() -> None:
        with transaction.atomic():
            Workflow.objects.exists()
            with lane.turn():
                ran.append(lane.holding())

    try:
        joined(in_thread(in_transaction))
    finally:
        let_go.set()
        joined(holder)
    assert ran == [False]


def test_a_thread_that_must_wait_for_a_turn_gives_its_connection_back_first(monkeypatch: pytest.MonkeyPatch) -> None:
    """A thread in the lane may be waiting for a pooled connection that a waiting thread would hold."""
    given_back: list[str] = []
    monkeypatch.setattr(lane, "connection_release_while_waiting",
                        lambda: given_back.append(threading.current_thread().name))

    def take() -> None:
        with lane.turn():
            pass

    lane.configure(1)
    joined(in_thread(take))
    assert given_back == []  # a free turn is taken at once, the connection kept
    let_go, holder = holding_the_only_turn()
    waiter = in_thread(take)
    deadline = time.monotonic() + JOIN_SECONDS
    while not given_back and time.monotonic() < deadline:
        time.sleep(0.01)
    assert given_back == [waiter.name]
    let_go.set()
    joined(holder)
    joined(waiter)


class LaneSeenLedger(FakeLedger):
    """Notes whether the thread held a turn when the call's request was reserved and charged."""

    def __init__(self) -> None:
        super().__init__()
        self.reserved_holding: list[bool] = []
        self.charged_holding: list[bool] = []

    def reserve(self, **kwargs: Any) -> bool:
        self.reserved_holding.append(lane.holding())
        return super().reserve(**kwargs)

    def charge(self, **kwargs: Any) -> bool:
        self.charged_holding.append(lane.holding())
        return super().charge(**kwargs)


class LaneSeenModel(FakeModel):
    """Notes whether the thread held a turn while the answer was awaited."""

    def __init__(self, answers: list[Any]) -> None:
        super().__init__(answers)
        self.answered_holding: list[bool] = []

    def complete(self, **kwargs: Any) -> Any:
        self.answered_holding.append(lane.holding())
        return super().complete(**kwargs)


@activity("test_lane_model_call")
def model_call(ctx: ActivityContext, input: dict[str, Any]) -> dict[str, Any]:
    answer = metered_complete(ctx, call=0, system="Say hello.", messages=[{"role": "user", "content": "Hi"}],
                              max_tokens=50)
    return {"text": answer.text, "holding_after": lane.holding()}


def test_a_model_call_reserves_in_the_lane_and_awaits_its_answer_outside_it() -> None:
    lane.configure(1)
    model, ledger = LaneSeenModel(["hello"]), LaneSeenLedger()
    result: dict[str, Any] = {}

    def run() -> None:
        result.update(ActivityEnvironment(model=model, ledger=ledger).run(model_call, {}))

    with registered(model_call):
        joined(in_thread(run))
    assert result == {"text": "hello", "holding_after": False}
    assert model.answered_holding == [False]
    assert ledger.reserved_holding == [True]
    assert ledger.charged_holding == [True]


LANE_KIND = "test-lane"


HELD_IN_FUNCTION: list[bool] = []


@activity("test_lane_step", io_bound=True)
def lane_step(ctx: ActivityContext, input: dict[str, Any]) -> dict[str, Any]:
    HELD_IN_FUNCTION.append(lane.holding())
    ctx.note("test.lane")
    return {}


class OneStep(engine.WorkflowDefinition):
    kind = LANE_KIND
    start_node = "STEP"
    revalidate_node = "STEP"

    @engine.node("STEP")
    def step(self, ctx: engine.NodeContext) -> engine.Decision:
        ctx.activity(lane_step, {})
        return engine.Complete()


@pytest.mark.django_db(transaction=True)
@pytest.mark.usefixtures("rung")
def test_an_attempt_is_claimed_and_recorded_in_the_lane_and_its_function_runs_outside_it(
        monkeypatch: pytest.MonkeyPatch) -> None:
    lane.configure(1)
    HELD_IN_FUNCTION.clear()
    seen: dict[str, list[bool]] = {"claim": [], "record": [], "note": []}
    asked_as_new_work: list[bool] = []
    real_take = lane.Turns.take

    def take(self: lane.Turns, *, new_work: bool = False) -> None:
        asked_as_new_work.append(new_work)
        real_take(self, new_work=new_work)

    monkeypatch.setattr(lane.Turns, "take", take)
    for name, key in (("activity_claim_if_runnable", "claim"), ("activity_result_record_if_current", "record"),
                      ("activity_note_if_current", "note")):
        real = getattr(activities, name)

        def spied(*args: Any, _real: Any = real, _key: str = key, **kwargs: Any) -> Any:
            seen[_key].append(lane.holding())
            return _real(*args, **kwargs)

        monkeypatch.setattr(activities, name, spied)
    with registered(OneStep, lane_step):
        workflow = services.workflow_launch(kind=LANE_KIND, goal="One step", params={})
        services.workflow_advance_if_runnable(workflow_id=workflow.pk)
        step = Activity.objects.get(workflow=workflow)
        joined(in_thread(lambda: activities.activity_run_if_runnable(activity_id=step.pk)))
        drive(workflow.pk)
    workflow.refresh_from_db()
    assert workflow.status == Workflow.Status.COMPLETED
    assert HELD_IN_FUNCTION == [False]
    assert seen == {"claim": [True], "record": [True], "note": [True]}
    # The claim's turn is new work's; the note's and the result's are work in hand.
    assert asked_as_new_work == [True, False, False]
