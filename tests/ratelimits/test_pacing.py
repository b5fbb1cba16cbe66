"""Pacing: each bucket holds a few seconds of its rate, the provider's bucket is learned from its
answers, and a 429 lowers the pace; a fleet against providers that enforce their limits over 5 s
and over 60 s, and with another client taking part of the organisation's limit."""
from __future__ import annotations

import pytest

from agentops.providers.anthropic import rate_limit_info
from tests.fakes.anthropic_api import OrganisationLimit
from tests.ratelimits.conftest import SCOPE, Clock, ask
from tests.ratelimits.fleet import Other, simulate
from workflows.ratelimits.limiter import Admission, RateLimitInfo, RedisLimiter

RPM, ITPM = 600, 200_000


def admitted_now(limiter: RedisLimiter, request_rpm: float) -> int:
    """How many requests go at once; the first that does not leaves the queue again."""
    for n in range(1000):
        ticket = limiter.new_ticket()
        if not limiter.try_acquire(ask(rpm=request_rpm), ticket).admitted:
            limiter.leave(Admission(ask=ask(rpm=request_rpm), ticket=ticket, waited_seconds=0, tracked=True))
            return n
    raise AssertionError("no limit held")


def test_the_bucket_holds_three_seconds_of_the_rate_and_then_sends_follow_the_refill(paced: RedisLimiter,
                                                                                     clock: Clock) -> None:
    """600 a minute with the default burst: 30 at once (not a minute's 600), then one each 0.1 s."""
    assert admitted_now(paced, 600) == 30
    verdict = paced.try_acquire(ask(rpm=600), "next")
    assert not verdict.admitted and verdict.wait_seconds == pytest.approx(0.1)
    clock.advance(1.05)
    assert paced.try_acquire(ask(rpm=600), "next").admitted
    assert admitted_now(paced, 600) == 9, "a second's refill, no more"


def test_a_request_larger_than_the_bucket_goes_when_it_is_full_and_the_rate_still_holds(paced: RedisLimiter,
                                                                                        clock: Clock) -> None:
    """1,200 input tokens a minute hold 60 in a 3 s bucket: a 300-token request goes when the
    bucket is full and takes all 300, so the next waits 15 s for the refill (300 a minute, not faster)."""
    big = ask(rpm=0, itpm=1200, input_tokens=300)
    assert paced.try_acquire(big, "first").admitted
    verdict = paced.try_acquire(big, "second")
    assert not verdict.admitted and verdict.wait_seconds == pytest.approx(15.0)
    clock.advance(14.9)
    assert not paced.try_acquire(big, "second").admitted
    clock.advance(0.2)
    assert paced.try_acquire(big, "second").admitted


def test_the_providers_bucket_is_learned_from_remaining_and_reset(paced: RedisLimiter, clock: Clock) -> None:
    """An answer from a provider that enforces 600 a minute over 1 s: the request left 4 and the
    bucket is full again 0.6 s after it was sent, so it holds 4 + 10 * 0.6 = 10; the limiter's
    bucket is 95 % of that, below its own 3 s (28.5)."""
    headers = {"anthropic-ratelimit-requests-limit": "600", "anthropic-ratelimit-requests-remaining": "4",
               "anthropic-ratelimit-requests-reset": "2026-12-07T06:00:00.6Z"}
    info = rate_limit_info(headers, status=200)
    assert info is not None and not info.rate_limited
    sent_at = info.reset_at["requests"] - 0.6
    assert info.capacity(sent_at) == {"requests": pytest.approx(10.0)}
    paced.settle(Admission(ask=ask(rpm=0), ticket="t", waited_seconds=0, tracked=False, sent_at=sent_at), info=info)
    state = paced.state(SCOPE)
    assert state["learned"] == {"requests": 600}
    assert state["provider_bucket"] == {"requests": pytest.approx(10.0)}
    assert state["burst"]["requests"] == pytest.approx(9.5)
    assert admitted_now(paced, 0) == 3, "the provider's count holds: 4 less the headroom of its bucket (0.5)"


def test_a_429_lowers_the_pace_once_a_second_and_it_recovers(paced: RedisLimiter, clock: Clock) -> None:
    request = ask(rpm=600)
    limited = RateLimitInfo(limits={}, remaining={"requests": 0}, retry_after_seconds=1, rate_limited=True)
    for _ in range(3):  # three 429s of one burst: one decrease
        paced.settle(Admission(ask=request, ticket=paced.new_ticket(), waited_seconds=0, tracked=True), info=limited)
    state = paced.state(SCOPE, request.configured)
    assert state["pace"] == pytest.approx(0.7)
    assert state["burst"]["requests"] == pytest.approx(0.7 * 30)
    assert state["rate_limited"] == 3
    assert state["last_429"] == {"seconds_ago": 0.0, "reason": "429 from the provider (requests at 0, retry-after 1 s)"}
    clock.advance(1.5)
    verdict_wait = paced.try_acquire(request, "after")
    assert verdict_wait.admitted
    paced.settle(Admission(ask=request, ticket=paced.new_ticket(), waited_seconds=0, tracked=True), info=limited)
    assert paced.state(SCOPE, request.configured)["pace"] == pytest.approx((0.7 + 0.02 * 1.5) * 0.7)
    clock.advance(60)
    assert paced.state(SCOPE, request.configured)["pace"] == 1.0, "recovered: 0.02 a second"


# --- a fleet in simulated time ---------------------------------------------------------------------

def fleet(limiter: RedisLimiter, clock: Clock, *, bucket_seconds: float, other: Other | None = None,
          seconds: float = 75, says: tuple[str, ...] = ("limit", "remaining", "reset")) -> tuple[float, float, float]:
    """100 agents, answers after 1 s, against 600 requests and 200,000 input tokens a minute (the
    input tokens bind, about as the requests do), warmed up by one answer as a fleet would be.
    (share of requests refused, over all; share refused once ``other`` has run 10 s; the binding
    limit's use from 15 s on)."""
    provider = OrganisationLimit(requests_per_minute=RPM, input_tokens_per_minute=ITPM, clock=clock,
                                 bucket_seconds=bucket_seconds)
    simulate(limiter, clock, provider, agents=1, seconds=1.5, scope=SCOPE, says=says)
    run = simulate(limiter, clock, provider, agents=100, seconds=seconds, scope=SCOPE, other=other,
                   says=says)
    requests, tokens = run.rate_per_minute(15, seconds)
    adapted = run.share_refused(since=other.start + 10) if other else run.share_refused()
    return run.share_refused(), adapted, max(requests / RPM, tokens / ITPM)


@pytest.mark.parametrize("bucket_seconds", [5, 60])
def test_a_fleet_uses_the_limit_without_429s_whatever_interval_the_provider_enforces_it_over(
        paced: RedisLimiter, clock: Clock, bucket_seconds: float) -> None:
    refused, _, used = fleet(paced, clock, bucket_seconds=bucket_seconds)
    assert refused <= 0.02, f"{100 * refused:.1f} % of requests answered 429"
    assert used >= 0.85, f"{used:.2f} x the binding limit used once saturated"


def test_without_pacing_a_fleet_meets_a_5_s_bucket_with_429s(limiter: RedisLimiter, paced: RedisLimiter,
                                                              clock: Clock) -> None:
    """What the pace is for, against a provider that says only its limits (no remaining counts,
    no resets): a limiter whose bucket holds a minute bursts into 429s; the default burst keeps the
    same fleet under 2 %."""
    bursting, _, _ = fleet(limiter, clock, bucket_seconds=5, says=("limit",))
    assert bursting > 0.05, f"{100 * bursting:.1f} %"
    clock.advance(3600)
    refused, _, used = fleet(paced, clock, bucket_seconds=5, says=("limit",))
    assert refused <= 0.02 and used >= 0.85, (refused, used)


def test_another_client_taking_30_percent_is_adapted_to_within_10_s(paced: RedisLimiter, clock: Clock) -> None:
    """From 20 s to 60 s another client sends 3 requests a second (30 % of 600 a minute) of the
    fleet's prompts; it shows in the provider's remaining counts, and 10 s after it started the
    fleet's 429s are at most 2 %."""
    other = Other(per_second=3, start=20, stop=60)
    _, adapted, used = fleet(paced, clock, bucket_seconds=5, other=other)
    assert adapted <= 0.02, f"{100 * adapted:.1f} % of requests answered 429 from 10 s after the other client started"
    assert used >= 0.6
