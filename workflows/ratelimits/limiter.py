"""The shared rate limiter: token buckets, fair queues and concurrency slots in Redis, one Lua script.

Every worker of every host runs the same script on the same Redis, so the limits hold for the
fleet, not per process. Each scope (``<provider>:<model>``) has three token buckets (requests,
input tokens, output tokens per minute; refilled continuously, holding ``burst_seconds`` of the
rate or the provider's own bucket if smaller, at a pace a 429 lowers), a queue per tenant of
the requests waiting for them, and a start-time fair queueing order between tenants
(docs/architecture.md, "Shared rate limits").
Time is Redis's ``TIME``: one clock for every host, whatever theirs say.

A waiting request holds a *ticket*: ``acquire`` either admits it (the buckets are charged its
estimate and its concurrency slots taken) or tells it how long to wait; it then blocks on its
own wake list (``BLPOP``) until a pass of the script, run by whichever request comes next,
admits it or names it the next to go. Keys (prefix ``agentops:rl:``): per scope ``b`` (bucket
levels, refill time, blocked-until, pace, 429s), ``lim`` (limits and buckets learned from
answers, expiring), ``f`` (tenants waiting, by priority band then fair tag), ``q:<tenant>`` (a tenant's tickets by
priority band then arrival), ``t`` (each waiting ticket's costs and caps), ``ok`` (admitted,
not yet picked up), ``alive`` (each ticket's expiry: a dead waiter's ticket is dropped), ``st``,
``ft``, ``vt`` (fair-queueing tags), ``seq``, ``next``, ``w:<ticket>`` (wake lists); global
``c:<key>`` (concurrency slots, each with an expiry) and ``scopes``. Standalone Redis (or a
primary): the script builds key names itself, so it does not run on Redis Cluster.
"""
from __future__ import annotations

import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

PREFIX = "agentops:rl:"
DIMENSIONS = ("requests", "input_tokens", "output_tokens")
PRIORITY_BANDS = 11  # priorities 0..10; band = 10 - priority, lower goes first
# How many requests one pass of the script may admit, and how many waiting tenants it looks at.
MAX_ADMIT_PER_PASS = 64

SCRIPT = r"""
local op, P, G = ARGV[1], ARGV[2], ARGV[3]
local now = tonumber(ARGV[4])
if now <= 0 then local t = redis.call('TIME'); now = tonumber(t[1]) + tonumber(t[2]) / 1000000 end
local conf = {tonumber(ARGV[5]), tonumber(ARGV[6]), tonumber(ARGV[7])}
local headroom, alive_s, slot_s = tonumber(ARGV[8]), tonumber(ARGV[9]), tonumber(ARGV[10])
local me, max_admit, burst_s = ARGV[11], tonumber(ARGV[12]), tonumber(ARGV[13])
local BAND = 1e12
-- The pace: the share of the effective rate (and burst) sent; a 429 multiplies it by DECREASE
-- (once a second at most), and it recovers by RECOVER a second, to 1.
local RECOVER, DECREASE, PACE_MIN = 0.02, 0.7, 0.1

local function f6(x) return string.format('%.6f', x) end
local function f0(x) return string.format('%.0f', x) end

-- Per dimension: the effective limit a minute (configured, or learned less the headroom; the
-- lower), and the bucket's capacity at full pace: burst_s of that rate, or less when the
-- provider's own bucket (learned) holds less.
local function limits()
  local learned = redis.call('HMGET', P .. 'lim', 'r', 'i', 'o', 'cr', 'ci', 'co')
  local eff, cap = {}, {}
  for k = 1, 3 do
    local e = conf[k]
    local l = tonumber(learned[k])
    if l and l > 0 then l = l * headroom; if e <= 0 or l < e then e = l end end
    eff[k] = e
    local c = e * burst_s / 60
    local lc = tonumber(learned[k + 3])
    if lc and lc > 0 and lc * headroom < c then c = lc * headroom end
    cap[k] = c
  end
  return eff, cap, learned
end

local eff, cap, learned = limits()
local b = redis.call('HMGET', P .. 'b', 'r', 'i', 'o', 'ts', 'blk', 'pace', 'at429')
local ts = tonumber(b[4]) or now
local pace = math.min(1, (tonumber(b[6]) or 1) + RECOVER * math.max(0, now - ts))
local at429 = tonumber(b[7]) or 0
local lv, rate, full = {}, {}, {}
local function paced()
  for k = 1, 3 do rate[k] = eff[k] * pace / 60; full[k] = cap[k] * pace end
end
paced()
for k = 1, 3 do
  local x = tonumber(b[k])
  if eff[k] > 0 then
    if x == nil then x = full[k] end
    x = math.min(full[k], x + rate[k] * math.max(0, now - ts))
  else x = 0 end
  lv[k] = x
end
local blk = tonumber(b[5]) or 0

local function save()
  redis.call('HSET', P .. 'b', 'r', f6(lv[1]), 'i', f6(lv[2]), 'o', f6(lv[3]), 'ts', f6(now), 'blk', f6(blk),
             'pace', f6(pace), 'at429', f6(at429))
  redis.call('EXPIRE', P .. 'b', 86400)
end

local function wake(ticket)
  if ticket ~= me then
    redis.call('LPUSH', P .. 'w:' .. ticket, '1')
    redis.call('EXPIRE', P .. 'w:' .. ticket, 60)
  end
end

local function refresh_flow(tenant)
  local head = redis.call('ZRANGE', P .. 'q:' .. tenant, 0, 0, 'WITHSCORES')
  if #head == 0 then
    redis.call('ZREM', P .. 'f', tenant); redis.call('HDEL', P .. 'st', tenant); return
  end
  local band = math.floor(tonumber(head[2]) / BAND)
  local s = tonumber(redis.call('HGET', P .. 'st', tenant))
  if s == nil then
    local vt = tonumber(redis.call('GET', P .. 'vt')) or 0
    local ft = tonumber(redis.call('HGET', P .. 'ft', tenant)) or 0
    s = math.max(vt, ft)
    redis.call('HSET', P .. 'st', tenant, f0(s))
  end
  redis.call('ZADD', P .. 'f', f0(band * BAND + s), tenant)
end

local function drop(ticket)
  local rec = redis.call('HGET', P .. 't', ticket)
  if rec then
    local r = cjson.decode(rec)
    redis.call('ZREM', P .. 'q:' .. r.t, ticket)
    redis.call('HDEL', P .. 't', ticket)
    refresh_flow(r.t)
  end
  redis.call('HDEL', P .. 'ok', ticket)
  redis.call('ZREM', P .. 'alive', ticket)
end

local function slots_free(key, cap)
  if cap <= 0 then return true end
  redis.call('ZREMRANGEBYSCORE', G .. 'c:' .. key, '-inf', f6(now))
  return redis.call('ZCARD', G .. 'c:' .. key) < cap
end

local function take_slot(key, cap, ticket)
  if cap > 0 then redis.call('ZADD', G .. 'c:' .. key, f6(now + slot_s), ticket) end
end

-- Admit waiting tickets in order while the buckets allow; returns the ticket that must wait
-- next (nil when none can go: empty, or every waiting tenant at its cap) and its wait.
local function pass()
  local dead = redis.call('ZRANGEBYSCORE', P .. 'alive', '-inf', f6(now), 'LIMIT', 0, 100)
  for _, ticket in ipairs(dead) do drop(ticket) end
  if blk > now then return nil, blk - now end
  local admitted = 0
  while admitted < max_admit do
    local chosen, rec, tenant = nil, nil, nil
    for _, t in ipairs(redis.call('ZRANGE', P .. 'f', 0, 63)) do
      -- The tenant's first ticket whose slots are free (a kind at its cap does not hold up the
      -- tenant's other kinds; a tenant at its cap is passed over whole).
      for _, ticket in ipairs(redis.call('ZRANGE', P .. 'q:' .. t, 0, 7)) do
        local raw = redis.call('HGET', P .. 't', ticket)
        if not raw then
          redis.call('ZREM', P .. 'q:' .. t, ticket)
        else
          local r = cjson.decode(raw)
          if not slots_free('tenant:' .. r.t, r.tc) then break end
          if slots_free('kind:' .. r.k, r.kc) then chosen, rec, tenant = ticket, r, t; break end
        end
      end
      if chosen then break end
      refresh_flow(t)
    end
    if not chosen then return nil, 0 end
    local cost = {1, rec.ci, rec.co}
    local wait = 0
    for k = 1, 3 do
      -- A request goes when the bucket holds its cost (or is full, for one larger than the
      -- bucket) and takes its whole cost: the level may go below 0, so the rate holds.
      if eff[k] > 0 then
        local c = math.min(cost[k], full[k])
        if lv[k] < c then wait = math.max(wait, (c - lv[k]) / rate[k]) end
      end
    end
    if wait > 0 then return chosen, wait end
    for k = 1, 3 do if eff[k] > 0 then lv[k] = lv[k] - cost[k] end end
    take_slot('tenant:' .. rec.t, rec.tc, chosen)
    take_slot('kind:' .. rec.k, rec.kc, chosen)
    redis.call('ZREM', P .. 'q:' .. tenant, chosen)
    redis.call('HDEL', P .. 't', chosen)
    redis.call('HSET', P .. 'ok', chosen, f6(now))
    local s = tonumber(redis.call('HGET', P .. 'st', tenant)) or 0
    redis.call('SET', P .. 'vt', f0(s))
    redis.call('HSET', P .. 'ft', tenant, f0(s + 1))
    redis.call('HDEL', P .. 'st', tenant)
    refresh_flow(tenant)
    wake(chosen)
    admitted = admitted + 1
  end
  return nil, 0
end

local function run_pass()
  local nxt, wait = pass()
  if nxt and redis.call('GET', P .. 'next') ~= nxt then
    redis.call('SET', P .. 'next', nxt, 'EX', 600)
    wake(nxt)
  end
  save()
  return nxt, wait
end

if op == 'acquire' then
  -- ARGV[14..]: tenant, kind, priority, input cost, output cost, tenant cap, kind cap, scope
  local tenant, kind, prio = ARGV[14], ARGV[15], tonumber(ARGV[16])
  local ci, co, tc, kc = tonumber(ARGV[17]), tonumber(ARGV[18]), tonumber(ARGV[19]), tonumber(ARGV[20])
  redis.call('SADD', G .. 'scopes', ARGV[21])
  if redis.call('HDEL', P .. 'ok', me) == 1 then
    redis.call('ZREM', P .. 'alive', me); save(); return {1, '0', 1}
  end
  if not redis.call('HGET', P .. 't', me) then
    if eff[1] <= 0 and eff[2] <= 0 and eff[3] <= 0 and tc <= 0 and kc <= 0 then
      return {1, '0', 0}  -- nothing to enforce: not tracked
    end
    local band = 10 - prio
    local seq = redis.call('INCR', P .. 'seq')
    redis.call('HSET', P .. 't', me, cjson.encode({t = tenant, k = kind, ci = ci, co = co, tc = tc, kc = kc}))
    redis.call('ZADD', P .. 'q:' .. tenant, f0(band * BAND + seq), me)
    refresh_flow(tenant)
  end
  redis.call('ZADD', P .. 'alive', f6(now + alive_s), me)
  local nxt, wait = run_pass()
  if redis.call('HDEL', P .. 'ok', me) == 1 then
    redis.call('ZREM', P .. 'alive', me); redis.call('DEL', P .. 'w:' .. me); return {1, '0', 1}
  end
  if nxt == me or (nxt == nil and wait > 0) then return {0, f6(wait), 1} end
  return {0, '-1', 1}
end

if op == 'settle' or op == 'leave' then
  -- ARGV[14..]: tenant, kind, requests, input and output tokens to give back (negative: to take),
  -- learned limits r i o (0: none), remaining r i o (-1: none), the provider's bucket capacity
  -- r i o (-1: not known), retry-after (-1: none), 1 for a 429, learn TTL, the 429's reason
  local tenant, kind = ARGV[14], ARGV[15]
  local give = {tonumber(ARGV[16]), tonumber(ARGV[17]), tonumber(ARGV[18])}
  if op == 'leave' then
    -- Admitted meanwhile but never sent: its request and tokens come back; still queued: nothing was taken.
    if redis.call('HEXISTS', P .. 'ok', me) == 0 then give = {0, 0, 0} end
    drop(me)
  end
  redis.call('ZREM', G .. 'c:tenant:' .. tenant, me)
  redis.call('ZREM', G .. 'c:kind:' .. kind, me)
  local lr = {tonumber(ARGV[19]), tonumber(ARGV[20]), tonumber(ARGV[21])}
  local rem = {tonumber(ARGV[22]), tonumber(ARGV[23]), tonumber(ARGV[24])}
  local lc = {tonumber(ARGV[25]), tonumber(ARGV[26]), tonumber(ARGV[27])}
  local retry_after, limited, ttl = tonumber(ARGV[28]), tonumber(ARGV[29]), tonumber(ARGV[30])
  local fields = {}
  local names = {'r', 'i', 'o'}
  for k = 1, 3 do
    if lr[k] > 0 then table.insert(fields, names[k]); table.insert(fields, f0(lr[k])) end
    if lc[k] >= 0 then
      -- The provider's bucket: estimates fall short of it by up to the headers' rounding, so a
      -- larger one is taken at once and a smaller one moves the learned capacity a tenth of the way.
      local known = tonumber(learned[k + 3])
      local c = lc[k]
      if known and c < known then c = known + 0.1 * (c - known) end
      table.insert(fields, 'c' .. names[k]); table.insert(fields, f6(math.max(1, c)))
    end
  end
  if #fields > 0 then
    redis.call('HSET', P .. 'lim', unpack(fields))
    redis.call('EXPIRE', P .. 'lim', ttl)
    local before = eff
    eff, cap, learned = limits()
    paced()
    for k = 1, 3 do
      if eff[k] > 0 and before[k] <= 0 then lv[k] = full[k] end  -- a newly known limit starts full
      if eff[k] > 0 then lv[k] = math.min(lv[k], full[k]) end
    end
  end
  for k = 1, 3 do if eff[k] > 0 then lv[k] = math.min(full[k], lv[k] + give[k]) end end
  for k = 1, 3 do
    local l = tonumber(learned[k])
    if rem[k] >= 0 and eff[k] > 0 and l and l > 0 then
      -- The server's own count (at the request's arrival), less our headroom of its bucket:
      -- never above it. Another client of the organisation shows here first.
      local size = tonumber(learned[k + 3]) or l
      lv[k] = math.min(lv[k], rem[k] - (1 - headroom) * size)
    end
  end
  if retry_after >= 0 then blk = math.max(blk, now + retry_after) end
  if limited == 1 then
    if now - at429 >= 1 then
      pace = math.max(PACE_MIN, pace * DECREASE)
      paced()
      for k = 1, 3 do lv[k] = math.min(lv[k], full[k]) end
    end
    at429 = now
    redis.call('HINCRBY', P .. 'b', 'n429', 1)
    redis.call('HSET', P .. 'b', 'why429', ARGV[31])
  end
  run_pass()
  return {1, '0', 1}
end

if op == 'peek' then
  save()
  local blocked = 0
  if blk > now then blocked = blk - now end
  local more = redis.call('HMGET', P .. 'b', 'n429', 'why429')
  local since429 = -1
  if at429 > 0 then since429 = now - at429 end
  return {f6(eff[1]), f6(eff[2]), f6(eff[3]), f6(lv[1]), f6(lv[2]), f6(lv[3]), f6(blocked),
          tostring(learned[1] or ''), tostring(learned[2] or ''), tostring(learned[3] or ''),
          f6(full[1]), f6(full[2]), f6(full[3]), tostring(learned[4] or ''), tostring(learned[5] or ''),
          tostring(learned[6] or ''), f6(pace), tostring(more[1] or '0'), f6(since429), tostring(more[2] or '')}
end
return redis.error_reply('unknown op ' .. tostring(op))
"""


@dataclass(frozen=True)
class Ask:
    """What one request asks of the limits: its scope, whose it is, and what it may cost."""

    scope: str  # "<provider>:<model>"
    tenant: str
    kind: str
    priority: int
    input_tokens: int
    output_tokens: int
    # Per-minute limits configured for the scope (0: none) and concurrency caps (0: none).
    configured: tuple[float, float, float] = (0, 0, 0)
    tenant_cap: int = 0
    kind_cap: int = 0


@dataclass
class Admission:
    """An admitted request: its ticket, how long it waited, and whether the limiter tracks it
    (False when nothing was enforced: no limit known, no cap, or the limiter failed open);
    ``sent_at`` (this host's clock) dates what its answer's headers say."""

    ask: Ask
    ticket: str
    waited_seconds: float
    tracked: bool
    settled: bool = False
    sent_at: float = field(default_factory=time.time)


@dataclass(frozen=True)
class Verdict:
    """One ``acquire`` pass: admitted, or how long to wait (None: until woken or the poll interval)."""

    admitted: bool
    wait_seconds: float | None
    tracked: bool


@dataclass(frozen=True)
class RateLimitInfo:
    """What one answer said about the limits, by dimension (``requests``, ``input_tokens``,
    ``output_tokens``): per-minute limits, what remains, when the provider's bucket is full again
    (``reset_at``, seconds since the epoch); whether it was a 429, and its retry-after."""

    limits: dict[str, int]
    remaining: dict[str, int]
    retry_after_seconds: float | None = None
    reset_at: dict[str, float] = field(default_factory=dict)
    rate_limited: bool = False

    def capacity(self, sent_at: float) -> dict[str, float]:
        """The provider's bucket per dimension, from a request sent at ``sent_at``: what remained
        at its arrival and what the refill adds until the bucket is full (``reset_at``), at most a
        minute's limit. A provider that enforces its limit over seconds shows a bucket of seconds."""
        found = {}
        for dimension, limit in self.limits.items():
            remaining, reset_at = self.remaining.get(dimension), self.reset_at.get(dimension)
            if limit > 0 and remaining is not None and reset_at is not None:
                found[dimension] = min(float(limit), remaining + limit / 60 * max(0.0, reset_at - sent_at))
        return found

    def reason(self) -> str:
        """A 429 as the Rate limits page shows it."""
        empty = [d for d, n in self.remaining.items() if n <= 0]
        wait = "" if self.retry_after_seconds is None else f", retry-after {self.retry_after_seconds:g} s"
        return f"429 from the provider ({', '.join(empty) or 'no dimension'} at 0{wait})"


class WaitAbandoned(Exception):  # noqa: N818 - an outcome, raised to unwind the wait
    """The request stopped waiting (see ``reason``); its ticket left the queue."""

    def __init__(self, reason: str, waited_seconds: float) -> None:
        super().__init__(reason)
        self.reason, self.waited_seconds = reason, waited_seconds


class RedisLimiter:
    """The limiter's operations on one Redis client. ``clock`` (tests only) replaces Redis's
    ``TIME`` with a given time in seconds."""

    def __init__(self, client: Any, *, headroom: float = 0.95, burst_seconds: float = 3.0, alive_seconds: float = 20.0,
                 slot_seconds: float = 300.0, learn_ttl_seconds: int = 3600,
                 clock: Callable[[], float] | None = None, prefix: str = PREFIX) -> None:
        self.client, self.headroom, self.burst_seconds, self.prefix = client, headroom, burst_seconds, prefix
        self.alive_seconds, self.slot_seconds, self.learn_ttl_seconds = alive_seconds, slot_seconds, learn_ttl_seconds
        self.clock = clock
        self._script = client.register_script(SCRIPT)

    def _run(self, op: str, scope: str, ticket: str, configured: tuple[float, float, float], *extra: Any) -> Any:
        now = self.clock() if self.clock is not None else 0
        return self._script(args=[op, f"{self.prefix}{scope}:", self.prefix, repr(float(now)),
                                  *(repr(float(c)) for c in configured), repr(self.headroom),
                                  repr(self.alive_seconds), repr(self.slot_seconds), ticket, MAX_ADMIT_PER_PASS,
                                  repr(float(self.burst_seconds)), *extra])

    @staticmethod
    def new_ticket() -> str:
        return uuid.uuid4().hex

    def try_acquire(self, ask: Ask, ticket: str) -> Verdict:
        """Enter the queue (or refresh the ticket's place in it), run a pass, and say whether
        ``ticket`` was admitted. Idempotent while it waits: a ticket is queued once (a ticket
        admitted and picked up that asks again is a new request)."""
        admitted, wait, tracked = self._run(
            "acquire", ask.scope, ticket, ask.configured, ask.tenant, ask.kind, max(0, min(10, ask.priority)),
            max(0, ask.input_tokens), max(0, ask.output_tokens), ask.tenant_cap, ask.kind_cap, ask.scope)
        seconds = float(wait)
        return Verdict(admitted=bool(admitted), wait_seconds=None if seconds < 0 else seconds, tracked=bool(tracked))

    def wait_woken(self, ask: Ask, ticket: str, timeout: float) -> None:
        """Block until the ticket is woken (admitted, or named next) or ``timeout`` passes."""
        if timeout < 0.01:
            time.sleep(max(0.0, timeout))
            return
        self.client.blpop([f"{self.prefix}{ask.scope}:w:{ticket}"], timeout=timeout)

    def acquire(self, ask: Ask, *, poll_seconds: float, max_wait_seconds: float,
                stop: Callable[[], str | None] = lambda: None) -> Admission:
        """Wait for the request's turn; raises WaitAbandoned (the ticket left the queue) when
        ``stop`` gives a reason or the wait would pass ``max_wait_seconds``."""
        ticket = self.new_ticket()
        started = time.monotonic()
        while True:
            verdict = self.try_acquire(ask, ticket)
            waited = time.monotonic() - started
            if verdict.admitted:
                return Admission(ask=ask, ticket=ticket, waited_seconds=waited, tracked=verdict.tracked)
            reason = stop()
            if reason is None and (waited >= max_wait_seconds or (
                    verdict.wait_seconds is not None and waited + verdict.wait_seconds > max_wait_seconds)):
                reason = f"the wait would pass {max_wait_seconds:g} s"
            if reason is not None:
                self.leave(Admission(ask=ask, ticket=ticket, waited_seconds=waited, tracked=True))
                raise WaitAbandoned(reason, waited)
            timeout = poll_seconds if verdict.wait_seconds is None else min(poll_seconds, verdict.wait_seconds)
            self.wait_woken(ask, ticket, timeout)

    def leave(self, admission: Admission) -> None:
        """Take a waiting ticket out of the queue; one admitted meanwhile gives back its slots,
        its request and its tokens: it was not sent."""
        self._settle("leave", admission, give=(1, admission.ask.input_tokens, admission.ask.output_tokens))

    def unsend(self, admission: Admission) -> None:
        """An admitted request that was not sent after all (the budget or the fence stopped it):
        its slots, its request and its tokens come back. Once per admission."""
        if admission.settled:
            return
        admission.settled = True
        self._settle("settle", admission, give=(1, admission.ask.input_tokens, admission.ask.output_tokens))

    def settle(self, admission: Admission, *, input_tokens: int | None = None, output_tokens: int | None = None,
               info: RateLimitInfo | None = None) -> None:
        """After the answer (or its loss): free the concurrency slots, correct the buckets from
        the estimate to what the request cost (None: keep the estimate), and learn from the
        answer's headers; then admit whoever can go now. Once per admission."""
        if admission.settled:
            return
        admission.settled = True
        if not admission.tracked and info is None:
            return
        give = (0, 0 if input_tokens is None else admission.ask.input_tokens - input_tokens,
                0 if output_tokens is None else admission.ask.output_tokens - output_tokens)
        self._settle("settle", admission, give=give, info=info)

    def _settle(self, op: str, admission: Admission, *, give: tuple[int, int, int],
                info: RateLimitInfo | None = None) -> None:
        limits = [int((info.limits if info else {}).get(d, 0)) for d in DIMENSIONS]
        remaining = [int((info.remaining if info else {}).get(d, -1)) for d in DIMENSIONS]
        capacity = info.capacity(admission.sent_at) if info else {}
        sizes = [repr(float(capacity.get(d, -1))) for d in DIMENSIONS]
        retry = info.retry_after_seconds if info and info.retry_after_seconds is not None else -1
        limited = info is not None and info.rate_limited
        ask = admission.ask
        self._run(op, ask.scope, admission.ticket, ask.configured, ask.tenant, ask.kind, *give,
                  *limits, *remaining, *sizes, repr(float(retry)), int(limited), self.learn_ttl_seconds,
                  info.reason() if limited and info else "")

    # --- reads, for /metrics and the admin -------------------------------------------------

    def scopes(self) -> list[str]:
        return sorted(s.decode() if isinstance(s, bytes) else s for s in self.client.smembers(f"{self.prefix}scopes"))

    def state(self, scope: str, configured: tuple[float, float, float] = (0, 0, 0)) -> dict[str, Any]:
        """A scope's effective limits, bucket levels and capacities (``burst``, at the pace now),
        learned limits and provider buckets, block, pace, 429s (how many, the last one's reason
        and age in seconds, None for none), and waiting tickets by tenant and priority."""
        row = [v.decode() if isinstance(v, bytes) else str(v) for v in self._run("peek", scope, "", configured)]
        effective = dict(zip(DIMENSIONS, map(float, row[0:3]), strict=True))
        available = dict(zip(DIMENSIONS, map(float, row[3:6]), strict=True))
        learned = {d: int(v) for d, v in zip(DIMENSIONS, row[7:10], strict=True) if v not in ("", "false")}
        burst = dict(zip(DIMENSIONS, map(float, row[10:13]), strict=True))
        provider_bucket = {d: float(v) for d, v in zip(DIMENSIONS, row[13:16], strict=True) if v not in ("", "false")}
        since_429 = float(row[18])
        waiting: dict[tuple[str, int], int] = {}
        base = f"{self.prefix}{scope}:"
        for raw in self.client.zrange(f"{base}f", 0, -1):
            tenant = raw.decode() if isinstance(raw, bytes) else raw
            for band in range(PRIORITY_BANDS):
                n = self.client.zcount(f"{base}q:{tenant}", band * 1e12, (band + 1) * 1e12 - 1)
                if n:
                    waiting[(tenant, 10 - band)] = int(n)
        return {"effective": effective, "available": available, "learned": learned, "burst": burst,
                "provider_bucket": provider_bucket, "pace": float(row[16]), "rate_limited": int(row[17] or 0),
                "last_429": {"seconds_ago": since_429, "reason": row[19]} if since_429 >= 0 else None,
                "blocked_seconds": float(row[6]), "waiting": waiting}

    def slots(self) -> dict[str, int]:
        """Concurrency slots held now, by key (``tenant:<t>``, ``kind:<k>``)."""
        now = self.clock() if self.clock is not None else _redis_time(self.client)
        found = {}
        for raw in self.client.scan_iter(match=f"{self.prefix}c:*", count=200):
            key = raw.decode() if isinstance(raw, bytes) else raw
            found[key.removeprefix(f"{self.prefix}c:")] = int(self.client.zcount(key, now, "+inf"))
        return found


def _redis_time(client: Any) -> float:
    seconds, micros = client.time()
    return float(seconds) + float(micros) / 1e6

