"""The shared limiter's script on a real Redis: buckets, fair shares, priorities, slots, learning."""
from __future__ import annotations

import statistics
import threading
import time
from typing import Any

import pytest

from tests.ratelimits.conftest import SCOPE, Clock, ask
from workflows.ratelimits.limiter import Admission, Ask, RateLimitInfo, RedisLimiter, WaitAbandoned


def drain(limiter: RedisLimiter, request: Ask, n: int) -> None:
    for i in range(n):
        verdict = limiter.try_acquire(request, limiter.new_ticket())
        assert verdict.admitted, f"request {i} of the full bucket was not admitted: {verdict}"


def admit_in_order(limiter: RedisLimiter, clock: Clock, waiting: dict[str, Ask], *, step: float) -> list[str]:
    """Move the clock ``step`` at a time, each waiter polling, until all are admitted; their order."""
    order: list[str] = []
    for _ in range(10 * len(waiting) + 10):
        if not waiting:
            break
        clock.advance(step)
        for ticket, request in list(waiting.items()):
            if limiter.try_acquire(request, ticket).admitted:
                order.append(ticket)
                del waiting[ticket]
    assert not waiting, f"never admitted: {sorted(waiting)}"
    return order


def test_a_full_bucket_admits_a_minute_of_requests_then_says_how_long_to_wait(limiter: RedisLimiter,
                                                                              clock: Clock) -> None:
    """Capacity is one minute's limit (as the API's buckets); then the next request waits for the
    refill, 1 s at 60 requests a minute, and goes once that has passed."""
    drain(limiter, ask(), 60)
    verdict = limiter.try_acquire(ask(), "late")
    assert not verdict.admitted and verdict.wait_seconds == pytest.approx(1.0)
    clock.advance(0.5)
    assert not limiter.try_acquire(ask(), "late").admitted
    clock.advance(0.6)
    assert limiter.try_acquire(ask(), "late").admitted


def test_input_tokens_are_reserved_at_the_estimate_and_corrected_at_the_answer(limiter: RedisLimiter,
                                                                              clock: Clock) -> None:
    """600 input tokens a minute: two 300-token estimates fill it; the answers say 100 each were
    counted, which gives 400 back, so a third request of 300 goes at once."""
    big = ask(rpm=0, itpm=600, input_tokens=300)
    first = Admission(ask=big, ticket="a", waited_seconds=0, tracked=True)
    second = Admission(ask=big, ticket="b", waited_seconds=0, tracked=True)
    assert limiter.try_acquire(big, "a").admitted and limiter.try_acquire(big, "b").admitted
    assert not limiter.try_acquire(big, "c").admitted
    limiter.settle(first, input_tokens=100, output_tokens=10)
    limiter.settle(second, input_tokens=100, output_tokens=10)
    assert limiter.try_acquire(big, "c").admitted
    assert limiter.state(SCOPE, big.configured)["available"]["input_tokens"] == pytest.approx(100, abs=1)


def test_two_tenants_of_equal_demand_alternate(limiter: RedisLimiter, clock: Clock) -> None:
    drain(limiter, ask("user:0"), 60)
    waiting = {f"{t}{i}": ask(f"user:{t}") for i in range(6) for t in "AB"}
    order = admit_in_order(limiter, clock, waiting, step=1.0)
    tenants = [ticket[0] for ticket in order]
    assert all(tenants[i] != tenants[i + 1] for i in range(len(tenants) - 1)), tenants


def test_a_small_tenant_is_not_starved_behind_a_large_one(limiter: RedisLimiter, clock: Clock) -> None:
    """90 requests of one launcher queued before 1 of another: the small one goes within two."""
    drain(limiter, ask("user:big"), 60)
    waiting = {f"big{i}": ask("user:big") for i in range(90)}
    for ticket, request in waiting.items():
        limiter.try_acquire(request, ticket)
    waiting["small"] = ask("user:small")
    limiter.try_acquire(waiting["small"], "small")
    order = admit_in_order(limiter, clock, waiting, step=1.0)
    assert order.index("small") <= 1, order[:5]


def test_equal_demand_gets_equal_waits(limiter: RedisLimiter, clock: Clock) -> None:
    """Two tenants of 20 agents each, every agent asking again 2 s after it was admitted, against
    a limit of 10 a second: neither tenant's p99 wait is more than 1.25 times the other's (the
    bound asked for is 2)."""
    rate = ask("user:x", rpm=600)
    drain(limiter, rate, 600)
    agents = {f"{t}{i}": ask(f"user:{t}", rpm=600) for t in "AB" for i in range(20)}
    asked_at = dict.fromkeys(agents, clock.now)
    ticket_of = {agent: f"{agent}-0" for agent in agents}
    waits: dict[str, list[float]] = {"A": [], "B": []}
    back_at: dict[str, float] = {}
    for _ in range(600):  # 60 s of 0.1 s steps
        clock.advance(0.1)
        for agent, request in agents.items():
            if agent in back_at:
                if clock.now >= back_at[agent]:
                    del back_at[agent]
                    asked_at[agent] = clock.now
                    ticket_of[agent] = f"{agent}-{clock.now}"
                continue
            if limiter.try_acquire(request, ticket_of[agent]).admitted:
                waits[agent[0]].append(clock.now - asked_at[agent])
                back_at[agent] = clock.now + 2.0
    p99 = {t: sorted(w)[int(0.99 * len(w)) - 1] for t, w in waits.items()}
    assert min(len(w) for w in waits.values()) > 100
    assert max(p99.values()) <= 1.25 * min(p99.values()), p99
    assert abs(len(waits["A"]) - len(waits["B"])) <= 0.1 * len(waits["A"]), {t: len(w) for t, w in waits.items()}


def test_priority_nine_goes_first_and_priorities_order_a_tenants_own_calls(limiter: RedisLimiter,
                                                                          clock: Clock) -> None:
    drain(limiter, ask(), 60)
    waiting = {f"low{i}": ask("user:A", priority=2) for i in range(3)}
    waiting |= {f"mid{i}": ask("user:B", priority=5) for i in range(3)}
    for ticket, request in waiting.items():
        limiter.try_acquire(request, ticket)
    waiting["urgent"] = ask("user:A", priority=9)
    limiter.try_acquire(waiting["urgent"], "urgent")
    order = admit_in_order(limiter, clock, waiting, step=1.0)
    assert order[0] == "urgent"
    assert order[1:4] == ["mid0", "mid1", "mid2"], "priority 5 before priority 2, whoever's it is"
    assert order[4:] == ["low0", "low1", "low2"]


def test_a_tenant_at_its_concurrency_cap_waits_without_holding_up_others(limiter: RedisLimiter,
                                                                         clock: Clock) -> None:
    capped = ask("user:A", rpm=0, tenant_cap=2)
    other = ask("user:B", rpm=0, tenant_cap=2)
    held = []
    for ticket in ("a1", "a2"):
        assert limiter.try_acquire(capped, ticket).admitted
        held.append(Admission(ask=capped, ticket=ticket, waited_seconds=0, tracked=True))
    verdict = limiter.try_acquire(capped, "a3")
    assert not verdict.admitted and verdict.wait_seconds is None, "no time helps: it waits to be woken"
    assert limiter.try_acquire(other, "b1").admitted, "another tenant goes past it"
    limiter.settle(held[0], input_tokens=1, output_tokens=1)
    assert limiter.try_acquire(capped, "a3").admitted, "a slot given back admits the next of that tenant"
    assert limiter.slots()["tenant:user:A"] == 2


def test_a_kind_cap_holds_across_tenants(limiter: RedisLimiter) -> None:
    first = ask("user:A", rpm=0, kind="harness", kind_cap=1)
    second = ask("user:B", rpm=0, kind="harness", kind_cap=1)
    assert limiter.try_acquire(first, "h1").admitted
    assert not limiter.try_acquire(second, "h2").admitted
    assert limiter.try_acquire(ask("user:B", rpm=0, kind="autonomous", kind_cap=1), "x1").admitted


def test_a_dead_waiters_ticket_is_dropped_and_holds_no_one_up(limiter: RedisLimiter, clock: Clock) -> None:
    drain(limiter, ask(), 60)
    assert not limiter.try_acquire(ask("user:dead"), "dead").admitted  # then it never polls again
    assert not limiter.try_acquire(ask("user:live"), "live").admitted
    clock.advance(25)  # past the dead ticket's 20 s of life; the live one polls and is still alive
    assert limiter.try_acquire(ask("user:live"), "live").admitted
    clock.advance(25)
    assert limiter.state(SCOPE, ask().configured)["waiting"] == {}


def test_limits_are_learned_from_answers_with_headroom_and_the_servers_count(limiter: RedisLimiter) -> None:
    """Nothing configured: nothing is enforced (not tracked) until an answer reports the limits;
    then 0.95 of them hold, and the server's remaining count lowers the bucket."""
    free = ask(rpm=0)
    verdict = limiter.try_acquire(free, "first")
    assert verdict.admitted and not verdict.tracked
    info = RateLimitInfo(limits={"requests": 100, "input_tokens": 10_000}, remaining={"requests": 30})
    limiter.settle(Admission(ask=free, ticket="first", waited_seconds=0, tracked=False), info=info)
    state = limiter.state(SCOPE)
    assert state["learned"] == {"requests": 100, "input_tokens": 10_000}
    assert state["effective"] == {"requests": 95.0, "input_tokens": 9500.0, "output_tokens": 0.0}
    assert state["available"]["requests"] == pytest.approx(30 - 5), "the server's 30 less the 5 % headroom"
    configured_lower = ask(rpm=50)
    assert limiter.state(SCOPE, configured_lower.configured)["effective"]["requests"] == 50.0, "the lower one holds"


def test_a_429s_retry_after_holds_every_request_of_the_scope(limiter: RedisLimiter, clock: Clock) -> None:
    request = ask(rpm=600)
    assert limiter.try_acquire(request, "a").admitted
    limiter.settle(Admission(ask=request, ticket="a", waited_seconds=0, tracked=True), input_tokens=0,
                   output_tokens=0, info=RateLimitInfo(limits={}, remaining={}, retry_after_seconds=7))
    verdict = limiter.try_acquire(request, "b")
    assert not verdict.admitted and verdict.wait_seconds == pytest.approx(7.0)
    clock.advance(7.1)
    assert limiter.try_acquire(request, "b").admitted


def test_a_request_admitted_but_not_sent_gives_its_share_back(limiter: RedisLimiter) -> None:
    request = ask(rpm=2)
    assert limiter.try_acquire(request, "a").admitted and limiter.try_acquire(request, "b").admitted
    assert not limiter.try_acquire(request, "c").admitted
    limiter.unsend(Admission(ask=request, ticket="b", waited_seconds=0, tracked=True))
    assert limiter.try_acquire(request, "c").admitted
    limiter.leave(Admission(ask=request, ticket="queued", waited_seconds=0, tracked=True))
    assert not limiter.try_acquire(request, "d").admitted, "leaving a ticket never admitted gives nothing back"


# --- the waiting loop in real time ---------------------------------------------------------------

@pytest.fixture
def realtime(redis_client: Any, prefix: str) -> RedisLimiter:
    return RedisLimiter(redis_client, prefix=prefix, headroom=0.95, burst_seconds=60, alive_seconds=20,
                        slot_seconds=300)


def test_waiters_are_woken_in_turn_at_the_limits_pace(realtime: RedisLimiter) -> None:
    """A drained bucket of 600 a minute (10 a second) and 20 waiting threads: each is woken when
    its turn comes (not at the 5 s poll), so all 20 go in about 2 s, in arrival order within the tenant."""
    request = ask(rpm=600)
    drain(realtime, request, 600)
    while realtime.try_acquire(request, realtime.new_ticket()).admitted:
        pass  # what refilled while draining
    admitted: list[tuple[float, int]] = []
    lock = threading.Lock()

    def call(i: int) -> None:
        realtime.acquire(request, poll_seconds=5.0, max_wait_seconds=30)
        with lock:
            admitted.append((time.monotonic(), i))

    threads = []
    started = time.monotonic()
    for i in range(20):
        threads.append(threading.Thread(target=call, args=(i,)))
        threads[-1].start()
        time.sleep(0.005)
    for thread in threads:
        thread.join(timeout=30)
    took = time.monotonic() - started
    assert len(admitted) == 20
    gaps = [b - a for (a, _), (b, _) in zip(admitted, admitted[1:], strict=False)]
    assert 1.7 <= took <= 4.0, f"20 at 10 a second took {took:.2f} s"
    assert statistics.mean(gaps) == pytest.approx(0.1, abs=0.05)


def test_a_waiter_stops_when_told_and_when_the_wait_would_be_too_long(realtime: RedisLimiter) -> None:
    request = ask(rpm=60)
    drain(realtime, request, 60)
    with pytest.raises(WaitAbandoned, match="lease lost"):
        realtime.acquire(request, poll_seconds=0.2, max_wait_seconds=30, stop=lambda: "lease lost")
    with pytest.raises(WaitAbandoned, match="would pass 0.5 s"):
        realtime.acquire(request, poll_seconds=0.2, max_wait_seconds=0.5)
    assert realtime.state(SCOPE, request.configured)["waiting"] == {}, "both tickets left the queue"
