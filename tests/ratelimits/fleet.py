"""A fleet of model calls through the shared limiter against the fake API's organisation limit,
in simulated time: the limiter's script on a real Redis and the fake's buckets read one clock.

Each agent sends one request after another: it waits for its turn (polling when told how long,
or when woken on its wake list, as ``RedisLimiter.acquire`` does), the provider takes or refuses
the request at once, and an answer comes ``latency`` seconds later with the headers the fake set
at the request's arrival, read by the provider's own parser. A refused request is settled at once
and asked again. ``says``: which of the ``anthropic-ratelimit-*`` headers the provider sends.
``other`` is another client of the organisation: requests a second it sends
straight to the provider between two times.
"""
from __future__ import annotations

import heapq
import itertools
import math
from dataclasses import dataclass, field
from typing import Any

from agentops.providers.anthropic import rate_limit_info
from tests.fakes.anthropic_api import OrganisationLimit
from tests.ratelimits.conftest import Clock
from workflows.ratelimits.limiter import Admission, Ask, RedisLimiter

TICK = 0.05


@dataclass
class Other:
    """Another client: ``per_second`` requests of ``input_tokens`` from ``start`` to ``stop``."""

    per_second: float
    start: float
    stop: float
    input_tokens: int = 350


@dataclass
class Run:
    sent: list[tuple[float, int, int]] = field(default_factory=list)  # (when, status, input tokens)
    other_sent: int = 0

    def share_refused(self, since: float = 0.0) -> float:
        mine = [s for at, s, _ in self.sent if at >= since]
        return sum(1 for s in mine if s == 429) / max(1, len(mine))

    def rate_per_minute(self, since: float, until: float) -> tuple[float, float]:
        """Requests and input tokens a minute that the provider took between the two times."""
        ok = [(at, tokens) for at, s, tokens in self.sent if s == 200 and since <= at < until]
        return 60 * len(ok) / (until - since), 60 * sum(t for _, t in ok) / (until - since)


def simulate(limiter: RedisLimiter, clock: Clock, provider: OrganisationLimit, *, agents: int, seconds: float,
             scope: str, latency: float = 1.0, tokens: tuple[int, ...] = (250, 350, 450),
             other: Other | None = None, says: tuple[str, ...] = ("limit", "remaining", "reset")) -> Run:
    start = clock.now
    run = Run()
    ids = itertools.count()
    asks = [Ask(scope=scope, tenant=f"user:{i % 3}", kind="autonomous", priority=5,
                input_tokens=tokens[i % len(tokens)], output_tokens=16) for i in range(agents)]
    waiting: dict[int, str] = {i: limiter.new_ticket() for i in range(agents)}  # agent -> its ticket
    poll_at = dict.fromkeys(range(agents), start)
    answers: list[tuple[float, int, int, Admission, Any]] = []  # (when, seq, agent, admission, info)
    other_due = other.start + start if other else float("inf")
    while clock.now - start < seconds:
        now = clock.now
        while answers and answers[0][0] <= now:
            _, _, agent, admission, info = heapq.heappop(answers)
            limiter.settle(admission, input_tokens=admission.ask.input_tokens, output_tokens=8, info=info)
            waiting[agent] = limiter.new_ticket()
            poll_at[agent] = now
        while other and other_due <= now and other_due - start < other.stop:
            provider.take(input_tokens=other.input_tokens, max_tokens=16)
            run.other_sent += 1
            other_due += 1 / other.per_second
        pipe = limiter.client.pipeline()
        woken = list(waiting)
        for agent in woken:
            pipe.lpop(f"{limiter.prefix}{scope}:w:{waiting[agent]}")
        for agent, popped in zip(woken, pipe.execute(), strict=True):
            if popped is not None:
                poll_at[agent] = now
        for agent in [a for a in waiting if poll_at[a] <= now]:
            ticket = waiting[agent]
            verdict = limiter.try_acquire(asks[agent], ticket)
            if not verdict.admitted:
                poll_at[agent] = now + (1.0 if verdict.wait_seconds is None else max(TICK, verdict.wait_seconds))
                continue
            del waiting[agent]
            admission = Admission(ask=asks[agent], ticket=ticket, waited_seconds=0, tracked=verdict.tracked,
                                  sent_at=now)
            fits, wait, headers = provider.take(input_tokens=asks[agent].input_tokens, max_tokens=16)
            headers = {k: v for k, v in headers.items() if k.rsplit("-", 1)[-1] in says}
            if fits:
                run.sent.append((now - start, 200, asks[agent].input_tokens))
                heapq.heappush(answers, (now + latency, next(ids), agent, admission,
                                         rate_limit_info(headers, status=200)))
            else:
                run.sent.append((now - start, 429, asks[agent].input_tokens))
                info = rate_limit_info({**headers, "retry-after": str(math.ceil(wait))}, status=429)
                limiter.settle(admission, input_tokens=0, output_tokens=0, info=info)
                waiting[agent] = limiter.new_ticket()
                poll_at[agent] = now
        clock.advance(TICK)
    return run
