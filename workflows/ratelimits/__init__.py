"""Shared rate limits, fair shares and priorities for model calls (docs/operators.md, "Rate limits").

Each request a model call sends waits here for its turn (``RateGate``, through ``GatedMeter``,
the request meter the provider reports to), in the worker thread that makes the call: it holds
no database connection while it waits (given back first) and keeps its lease (the call's
``keep_alive`` heartbeats it). The order, the buckets and the slots are in Redis
(``workflows.ratelimits.limiter``), shared by every worker of every host.
"""
from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Mapping
from typing import Any

from django.conf import settings

from workflows.errors import Throttled
from workflows.ratelimits.limiter import DIMENSIONS, Admission, Ask, RateLimitInfo, RedisLimiter, WaitAbandoned

__all__ = ["Admission", "Ask", "GatedMeter", "RateGate", "RateLimitInfo", "RedisLimiter", "configured_limits",
           "limiter", "overview", "redis_errors", "scope_of"]

log = logging.getLogger("agentops.ratelimits")

# After Redis failed, this process skips the limiter (fails open or closed at once) for this
# long instead of paying a connection timeout on every request.
REDIS_DOWN_RECHECK_SECONDS = 5.0
# The most connections this process's limiter opens to Redis. Every call waiting for its share
# holds one (BLPOP), so a threads worker needs about as many as its threads; redis-py's default
# of 100 raised "Too many connections" past that, which the limiter took for Redis down: it
# failed open (or closed) exactly when most calls were waiting. Redis's own maxclients is as many.
MAX_CONNECTIONS = 10_000
_limiters: dict[tuple[Any, ...], RedisLimiter] = {}
_lock = threading.Lock()
_down_until = 0.0


def limiter() -> RedisLimiter | None:
    """This process's limiter on AGENTOPS_RATE_LIMIT_REDIS_URL, or None when it is off."""
    url = settings.AGENTOPS_RATE_LIMIT_REDIS_URL
    if not url:
        return None
    key = (url, settings.AGENTOPS_RATE_LIMIT_HEADROOM, settings.AGENTOPS_RATE_LIMIT_BURST_SECONDS,
           settings.AGENTOPS_RATE_LIMIT_POLL_SECONDS,
           settings.AGENTOPS_RATE_LIMIT_SLOT_SECONDS, settings.AGENTOPS_RATE_LIMIT_LEARN_TTL_SECONDS)
    with _lock:
        if key not in _limiters:
            import redis

            poll = settings.AGENTOPS_RATE_LIMIT_POLL_SECONDS
            # A waiting thread blocks in BLPOP up to the poll interval: the socket must outlast it.
            client = redis.Redis.from_url(url, socket_timeout=poll + 5, socket_connect_timeout=1.0,
                                          max_connections=MAX_CONNECTIONS)
            _limiters[key] = RedisLimiter(
                client, headroom=settings.AGENTOPS_RATE_LIMIT_HEADROOM,
                burst_seconds=settings.AGENTOPS_RATE_LIMIT_BURST_SECONDS, alive_seconds=4 * poll,
                slot_seconds=settings.AGENTOPS_RATE_LIMIT_SLOT_SECONDS,
                learn_ttl_seconds=settings.AGENTOPS_RATE_LIMIT_LEARN_TTL_SECONDS)
        return _limiters[key]


def scope_of(provider: str, model: str) -> str:
    return f"{provider}:{model}"


def configured_limits(scope: str) -> tuple[float, float, float]:
    """AGENTOPS_RATE_LIMITS for ``scope`` (else its provider's ``<provider>:*``), per minute; 0: none."""
    table: Mapping[str, Mapping[str, float]] = settings.AGENTOPS_RATE_LIMITS
    row = table.get(scope) or table.get(scope.split(":", 1)[0] + ":*") or {}
    return (float(row.get("requests_per_minute", 0)), float(row.get("input_tokens_per_minute", 0)),
            float(row.get("output_tokens_per_minute", 0)))


def concurrency_caps(tenant: str, kind: str, table: Mapping[str, int] | None = None) -> tuple[int, int]:
    """The caps of a table of concurrency keys for the tenant and the kind (``*`` rows as defaults;
    0: none): AGENTOPS_MODEL_CALL_CONCURRENCY's unless ``table`` is given (the activities' keys,
    ``workflows.services.slots``, read the same way)."""
    table = settings.AGENTOPS_MODEL_CALL_CONCURRENCY if table is None else table
    return (int(table.get(f"tenant:{tenant}", table.get("tenant:*", 0))),
            int(table.get(f"kind:{kind}", table.get("kind:*", 0))))


def redis_errors() -> tuple[type[BaseException], ...]:
    """What an unreachable or failing limiter Redis raises."""
    import redis

    return (redis.RedisError, OSError)


def _redis_down(exc: BaseException, what: str) -> None:
    global _down_until
    _down_until = time.monotonic() + REDIS_DOWN_RECHECK_SECONDS
    log.warning("ratelimits.redis_unreachable", extra={"what": what, "error": f"{type(exc).__name__}: {exc}"[:200],
                                                        "policy": settings.AGENTOPS_RATE_LIMIT_ON_REDIS_DOWN})


def overview() -> dict[str, Any] | None:
    """What the limiter holds now, for /metrics and the admin: None when it is off; ``up`` False
    when its Redis does not answer; else each scope's limits by source and dimension
    (``configured``, ``learned``, ``effective``), ``available``, ``blocked_seconds`` and
    ``waiting`` ({(tenant, priority): n}), and the concurrency ``slots`` held with their ``caps``."""
    shared = limiter()
    if shared is None:
        return None
    try:
        names = set(shared.scopes()) | {s for s in settings.AGENTOPS_RATE_LIMITS if not s.endswith(":*")}
        scopes = []
        for scope in sorted(names):
            configured = configured_limits(scope)
            state = shared.state(scope, configured)
            provider, _, model = scope.partition(":")
            scopes.append({"scope": scope, "provider": provider, "model": model,
                           "configured": dict(zip(DIMENSIONS, configured, strict=True)), **state})
        slots = shared.slots()
    except redis_errors() as exc:
        _redis_down(exc, "overview")
        return {"up": False, "scopes": [], "slots": {}, "caps": {}}
    return {"up": True, "scopes": scopes, "slots": slots, "caps": dict(settings.AGENTOPS_MODEL_CALL_CONCURRENCY)}


class RateGate:
    """The shared limits of one model call: each request it sends is admitted here first.

    ``stop`` says why the call must not go on (its lease was lost) or None; it is asked while
    the request waits. Raises Throttled (its attempt given back, retried in a stored window)
    when the wait passes AGENTOPS_RATE_LIMIT_MAX_WAIT_SECONDS, or when Redis cannot be reached
    and AGENTOPS_RATE_LIMIT_ON_REDIS_DOWN=closed; re-raises what ``stop`` reports otherwise.
    """

    def __init__(self, *, limiter: RedisLimiter, provider: str, model: str, tenant: str, kind: str,
                 priority: int, input_tokens: int, max_tokens: int,
                 stop: Callable[[], BaseException | None] = lambda: None) -> None:
        scope = scope_of(provider, model)
        tenant_cap, kind_cap = concurrency_caps(tenant, kind)
        self.ask = Ask(scope=scope, tenant=tenant or "system", kind=kind or "-", priority=priority,
                       input_tokens=input_tokens, output_tokens=max_tokens, configured=configured_limits(scope),
                       tenant_cap=tenant_cap, kind_cap=kind_cap)
        self.limiter, self.stop = limiter, stop
        self.waited_seconds = 0.0
        self._open: dict[int, Admission] = {}
        self._answered: dict[int, RateLimitInfo | None] = {}
        self._sent_at: dict[int, float] = {}  # each request's admission, which its answer's headers are dated by

    def admit(self, n: int) -> None:
        """Wait until request ``n`` may be sent."""
        self._sent_at[n] = time.time()
        if time.monotonic() < _down_until:
            return self._without_redis(None)
        try:
            admission = self.limiter.acquire(
                self.ask, poll_seconds=settings.AGENTOPS_RATE_LIMIT_POLL_SECONDS,
                max_wait_seconds=settings.AGENTOPS_RATE_LIMIT_MAX_WAIT_SECONDS, stop=self._stop_reason)
        except WaitAbandoned as exc:
            self.waited_seconds += exc.waited_seconds
            lost = self.stop()
            if lost is not None:
                raise lost from None
            raise Throttled(
                f"Model call to {self.ask.scope} waited {exc.waited_seconds:.0f} s for its share of the rate limit "
                f"and stopped waiting: {exc.reason} (AGENTOPS_RATE_LIMIT_MAX_WAIT_SECONDS). It was not sent; the "
                "activity will try again.", retry_after_seconds=None, waited_seconds=exc.waited_seconds,
            ) from None
        except redis_errors() as exc:
            _redis_down(exc, "acquire")
            return self._without_redis(exc)
        self.waited_seconds += admission.waited_seconds
        self._sent_at[n] = admission.sent_at
        self._open[n] = admission
        return None

    def _stop_reason(self) -> str | None:
        lost = self.stop()
        return None if lost is None else f"{type(lost).__name__}: {lost}"

    def _without_redis(self, exc: BaseException | None) -> None:
        if settings.AGENTOPS_RATE_LIMIT_ON_REDIS_DOWN == "closed":
            raise Throttled(
                "The rate limiter's Redis (AGENTOPS_RATE_LIMIT_REDIS_URL) cannot be reached and "
                "AGENTOPS_RATE_LIMIT_ON_REDIS_DOWN=closed: the model call was not sent; the activity will try again "
                f"({type(exc).__name__ if exc else 'down a moment ago'}).", retry_after_seconds=None) from exc
        return None

    def not_sent(self, n: int) -> None:
        """Request ``n`` was admitted but not sent (the budget or the fence stopped it)."""
        admission = self._open.pop(n, None)
        if admission is not None:
            self._safely(self.limiter.unsend, admission)

    def answered(self, n: int, *, status: int, rate: RateLimitInfo | None) -> None:
        """An answer to request ``n``: learned from at once, settled now when it is an error (the
        API counts no tokens of it), or when its usage comes (``finish``)."""
        if 200 <= status < 300:
            self._answered[n] = rate
            return
        admission = self._open.pop(n, None)
        if admission is not None:
            self._safely(self.limiter.settle, admission, input_tokens=0, output_tokens=0, info=rate)
        elif rate is not None:
            self._learn_untracked(n, rate)

    def lost(self, n: int) -> None:
        """Request ``n`` got no answer: its slots come back, its estimate stays spent."""
        admission = self._open.pop(n, None)
        if admission is not None:
            self._safely(self.limiter.settle, admission)

    def finish(self, *, input_tokens: int, output_tokens: int) -> None:
        """The answered request's usage: the buckets are corrected from its estimate."""
        for n, rate in list(self._answered.items()):
            admission = self._open.pop(n, None)
            if admission is not None:
                self._safely(self.limiter.settle, admission, input_tokens=input_tokens, output_tokens=output_tokens,
                             info=rate)
            elif rate is not None:
                self._learn_untracked(n, rate)
        self._answered.clear()

    def close(self) -> None:
        """Settle whatever is still open (a call that ended in an error): slots back, estimates spent."""
        for n in list(self._answered):
            admission = self._open.pop(n, None)
            if admission is not None:
                self._safely(self.limiter.settle, admission, info=self._answered[n])
        self._answered.clear()
        for n in list(self._open):
            self._safely(self.limiter.settle, self._open.pop(n))

    def _learn_untracked(self, n: int, rate: RateLimitInfo) -> None:
        if time.monotonic() < _down_until:
            return
        admission = Admission(ask=self.ask, ticket=RedisLimiter.new_ticket(), waited_seconds=0.0, tracked=False,
                              sent_at=self._sent_at.get(n, time.time()))
        self._safely(self.limiter.settle, admission, info=rate)

    @staticmethod
    def _safely(fn: Callable[..., None], *args: Any, **kwargs: Any) -> None:
        """Settling never fails a call: a lost settle costs at most a slot until it expires."""
        try:
            fn(*args, **kwargs)
        except redis_errors() as exc:
            _redis_down(exc, fn.__name__)


class GatedMeter:
    """A request meter (``workflows.provider.RequestMeter``) that admits each request through
    the call's ``RateGate`` before the inner meter (the usage ledger) reserves and sends it."""

    def __init__(self, inner: Any, gate: RateGate) -> None:
        self.inner, self.gate = inner, gate

    def sending(self, n: int) -> dict[str, str]:
        self.gate.admit(n)
        try:
            headers: dict[str, str] = self.inner.sending(n)
        except BaseException:
            self.gate.not_sent(n)
            raise
        return headers

    def answered(self, n: int, *, status: int, request_id: str, rate: RateLimitInfo | None = None) -> None:
        self.gate.answered(n, status=status, rate=rate)
        self.inner.answered(n, status=status, request_id=request_id, rate=rate)

    def lost(self, n: int, *, sent: bool, reason: str) -> None:
        self.gate.lost(n)
        self.inner.lost(n, sent=sent, reason=reason)
