"""The shared rate limiter against a real Redis: each test under a key prefix of its own."""
from __future__ import annotations

import os
import uuid
from collections.abc import Iterator
from typing import Any

import pytest
import redis

from workflows.ratelimits.limiter import Ask, RedisLimiter

# A Redis DB of this engineer's own (the tests add keys under a prefix per test and delete them).
TEST_REDIS_URL = os.environ.get("AGENTOPS_TEST_REDIS_URL", "redis://127.0.0.1:6379/4")
SCOPE = "anthropic:claude-test"


class Clock:
    """The limiter's time, moved by the test (the script takes it instead of Redis's TIME)."""

    def __init__(self) -> None:
        self.now = 1_000_000.0

    def __call__(self) -> float:
        return self.now

    def advance(self, seconds: float) -> None:
        self.now += seconds


@pytest.fixture
def redis_client() -> Iterator[Any]:
    client = redis.Redis.from_url(TEST_REDIS_URL, socket_timeout=10)
    yield client
    client.close()


@pytest.fixture
def prefix(redis_client: Any) -> Iterator[str]:
    value = f"agentops:rl:test-{uuid.uuid4().hex[:12]}:"
    yield value
    for key in redis_client.scan_iter(match=f"{value}*", count=500):
        redis_client.delete(key)


@pytest.fixture
def clock() -> Clock:
    return Clock()


@pytest.fixture
def limiter(redis_client: Any, prefix: str, clock: Clock) -> RedisLimiter:
    """A limiter whose buckets hold a minute of each limit (no pacing): the order and share tests
    count admissions against whole minutes. ``paced`` is the default's burst."""
    return RedisLimiter(redis_client, prefix=prefix, clock=clock, headroom=0.95, burst_seconds=60, alive_seconds=20,
                        slot_seconds=300)


@pytest.fixture
def paced(redis_client: Any, prefix: str, clock: Clock) -> RedisLimiter:
    return RedisLimiter(redis_client, prefix=prefix, clock=clock, headroom=0.95, burst_seconds=3, alive_seconds=20,
                        slot_seconds=300)


def ask(tenant: str = "user:1", *, priority: int = 5, rpm: float = 60, itpm: float = 0, input_tokens: int = 10,
        kind: str = "autonomous", tenant_cap: int = 0, kind_cap: int = 0, output_tokens: int = 10) -> Ask:
    return Ask(scope=SCOPE, tenant=tenant, kind=kind, priority=priority, input_tokens=input_tokens,
               output_tokens=output_tokens, configured=(rpm, itpm, 0), tenant_cap=tenant_cap, kind_cap=kind_cap)
