"""Concurrency keys for activities: at most so many attempts running at once per tenant and per kind.

``AGENTOPS_ACTIVITY_CONCURRENCY`` caps the activity attempts running at once by key:
``tenant:<tenant>`` (workflows.tenancy) and ``kind:<kind>``, with ``tenant:*`` and ``kind:*`` for
every tenant or kind without a key of its own (docs/operators.md, "Concurrency keys"). The
database is the count: a slot is an attempt in status ``running`` (its lease still held, or not
yet reaped), or a slot handed to a waiting activity a moment ago (``slot_granted_at``, kept for
``grant_hold_seconds()`` until its doorbell arrives).

An attempt that finds a key full does not run and holds nothing: its activity stays
``scheduled`` and is marked waiting (``slot_waiting_since``). Whenever a slot frees (an attempt
succeeds, fails, is lost or is voided) the transaction that freed it hands the free slots to the
waiting activities, in order, and rings their doorbells after commit:

- priority first (the workflow's, 10 goes first, strictly), then
- the fair share: the tenant with the fewest attempts running under the key, then
- the longest waiting.

A newcomer queues behind those already waiting. Every waiting activity looks again after
``RECHECK_SECONDS`` even if no one rings it (the redrive sweep rings it then), so a slot freed
by a path that rang no one, or a doorbell lost, is picked up within that. Compensations are
never held back (they undo effects), and count like any attempt.

Handing out slots reads and writes the count under one lock for the whole fleet (a PostgreSQL
advisory lock held until the transaction commits; SQLite's IMMEDIATE transactions already
serialize), so two workers never both take the last slot. With no key configured, nothing here
runs a query.
"""
from __future__ import annotations

import logging
from collections import Counter
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from django.conf import settings
from django.db.models import Count, Q

from workflows import clock, doorbells
from workflows.models import Activity, Workflow
from workflows.ratelimits import concurrency_caps
from workflows.services.common import event_record
from workflows.sql import slots as sql_slots
from workflows.sql.server import advisory_xact_lock

logger = logging.getLogger("agentops.slots")

# A waiting activity is looked at again after this even if no freed slot rang it.
RECHECK_SECONDS = 60
# Each pass looks at the first waiting activities of each tenant (by priority, then age), and at
# most this many in all.
PER_TENANT = 8
MAX_CANDIDATES = 256
# pg_advisory_xact_lock's key for handing out slots ("agentops slots" in ASCII, as a bigint).
LOCK_KEY = 0x61676F70_736C6F74


@dataclass(frozen=True)
class Keys:
    """The capped keys an attempt of ``tenant``'s workflow of ``kind`` takes a slot under."""

    tenant: str
    kind: str
    caps: tuple[tuple[str, int], ...]  # (key, cap) for each key with a cap

    def __bool__(self) -> bool:
        return bool(self.caps)


@dataclass(frozen=True)
class Admission:
    """Whether an attempt may start now, and how long its activity waited for a slot (None: it did not)."""

    admitted: bool
    waited_ms: int | None = None


ADMITTED = Admission(admitted=True)
WAITING = Admission(admitted=False)


def caps_for(tenant: str, kind: str, table: Mapping[str, int] | None = None) -> Keys:
    """The keys of AGENTOPS_ACTIVITY_CONCURRENCY that apply to ``tenant`` and ``kind`` (``*`` rows as defaults)."""
    tenant_cap, kind_cap = concurrency_caps(
        tenant, kind, settings.AGENTOPS_ACTIVITY_CONCURRENCY if table is None else table)
    return Keys(tenant=tenant, kind=kind, caps=tuple(
        (key, cap) for key, cap in ((f"tenant:{tenant}", tenant_cap), (f"kind:{kind}", kind_cap)) if cap))


def grant_hold_seconds() -> int:
    """How long a slot handed to a waiting activity is kept for it: its doorbell, or the redrive
    sweep's ring of it when the doorbell was lost, comes within that."""
    return max(60, 2 * settings.AGENTOPS_REDISPATCH_AFTER_SECONDS)


def capped(tenant: str, kind: str) -> bool:
    """Whether any key caps the attempts of ``tenant``'s workflows of ``kind`` (no query)."""
    return bool(settings.AGENTOPS_ACTIVITY_CONCURRENCY) and bool(caps_for(tenant, kind))


def admit(workflow: Workflow, activity: Activity, *, tenant: str, now: datetime) -> Admission:
    """May the next attempt of ``activity`` (as read, under ``workflow``'s row lock) start now?

    Not when a key it runs under is full, or when others wait ahead of it: it is then marked
    waiting (``activity.waiting_for_slot`` recorded the first time), due again in
    RECHECK_SECONDS, and the free slots go to those ahead of it. An activity that is not due
    (its claim will find nothing to do) and a compensation are admitted without a look.
    """
    if not settings.AGENTOPS_ACTIVITY_CONCURRENCY:
        return ADMITTED
    keys = caps_for(tenant, workflow.kind)
    if not keys or activity.status != Activity.Status.SCHEDULED or activity.next_attempt_at > now:
        return ADMITTED
    since = activity.slot_waiting_since
    if activity.slot_granted_at is not None and activity.slot_granted_at > now - timedelta(
            seconds=grant_hold_seconds()):
        return Admission(admitted=True, waited_ms=_waited_ms(since, now))  # the slot kept for it
    advisory_xact_lock(LOCK_KEY)
    marked = Activity.objects.filter(pk=activity.pk, status=Activity.Status.SCHEDULED, attempt=activity.attempt).update(
        slot_waiting_since=since or now, slot_priority=workflow.priority, tenant=tenant)
    if not marked:
        return ADMITTED  # claimed meanwhile: the claim finds nothing to do
    granted, used = _fill(keys, now=now)
    if any(pk == activity.pk for pk, _ in granted):
        _grant([(pk, name) for pk, name in granted if pk != activity.pk], now=now)
        return Admission(admitted=True, waited_ms=_waited_ms(since, now))
    _grant(granted, now=now)
    Activity.objects.filter(pk=activity.pk).update(next_attempt_at=now + timedelta(seconds=RECHECK_SECONDS),
                                                   dispatched_at=None)
    if since is None:
        event_record(workflow=workflow, kind="activity.waiting_for_slot", at=now, operation_id=activity.operation_id,
                     keys={key: {"cap": cap, "running": used.get(key, 0)} for key, cap in keys.caps})
    return WAITING


def freed(tenant: str, kind: str, *, now: datetime) -> None:
    """An attempt of ``tenant``'s workflow of ``kind`` stopped running (in the caller's
    transaction): hand the free slots of its keys to those waiting, and ring them after commit."""
    if not settings.AGENTOPS_ACTIVITY_CONCURRENCY:
        return
    keys = caps_for(tenant, kind)
    if not keys:
        return
    advisory_xact_lock(LOCK_KEY)
    granted, _ = _fill(keys, now=now)
    _grant(granted, now=now)


def freed_all(rows: Iterable[tuple[str, str]], *, now: datetime) -> None:
    """``freed`` for each distinct (tenant, kind) of attempts that stopped running together."""
    for tenant, kind in sorted(set(rows)):
        freed(tenant, kind, now=now)


def priority_changed(workflow_id: int, priority: int) -> None:
    """The workflow's activities waiting for a slot take their place in ``priority`` at once."""
    if settings.AGENTOPS_ACTIVITY_CONCURRENCY:
        Activity.objects.filter(workflow_id=workflow_id, status=Activity.Status.SCHEDULED,
                                slot_waiting_since__isnull=False).update(slot_priority=priority)


def _waited_ms(since: datetime | None, now: datetime) -> int | None:
    return None if since is None else max(0, round((now - since).total_seconds() * 1000))


@dataclass(frozen=True)
class _Waiting:
    pk: int
    workflow_id: int
    name: str
    tenant: str
    kind: str
    priority: int
    since: datetime


def _fill(trigger: Keys, *, now: datetime) -> tuple[list[tuple[int, str]], dict[str, int]]:
    """Choose which waiting activities near ``trigger`` (its tenant's, or its kind's) get the free
    slots of their keys, in order; the caller holds the lock. Returns them as (id, name), and the
    slots each key of ``trigger`` holds, those handed out included.

    Reads the activity rows (their kind, tenant and priority are on them): the first PER_TENANT
    waiting of each tenant, in the order of ``act_slot_waiting_idx`` (a paused workflow's passed
    over), and the slots held under their keys."""
    hold = now - timedelta(seconds=grant_hold_seconds())
    waiting = [_Waiting(pk, workflow_id, name, tenant, kind, priority or 0, since)
               for pk, workflow_id, name, tenant, kind, priority, since in sql_slots.waiting_heads(
                   tenant=trigger.tenant, kind=trigger.kind, hold=hold, per_tenant=PER_TENANT,
                   limit=MAX_CANDIDATES)]
    used, share = _used({w.tenant for w in waiting} | {trigger.tenant}, {w.kind for w in waiting} | {trigger.kind},
                        hold=hold)
    table = settings.AGENTOPS_ACTIVITY_CONCURRENCY
    caps = {w.pk: caps_for(w.tenant, w.kind, table).caps for w in waiting}
    granted: list[tuple[int, str]] = []
    while waiting:
        room = [w for w in waiting if all(used[key] < cap for key, cap in caps[w.pk])]
        if not room:
            break
        best = min(room, key=lambda w: (-w.priority, share[(w.tenant, w.kind)], w.since, w.pk))
        waiting.remove(best)
        granted.append((best.pk, best.name))
        for key, _ in caps[best.pk]:
            used[key] += 1
        share[(best.tenant, best.kind)] += 1
    return granted, {key: used[key] for key, _ in trigger.caps}


def _used(tenants: set[str], kinds: set[str], *, hold: datetime) -> tuple[Counter[str], Counter[tuple[str, str]]]:
    """Slots held by key, and by (tenant, kind), for every key of ``tenants`` and ``kinds``:
    running attempts, and slots handed out within ``hold``."""
    rows = sql_slots.held_counts(tenants, kinds, hold=hold)
    used: Counter[str] = Counter()
    share: Counter[tuple[str, str]] = Counter()
    for tenant, kind, n in rows:
        share[(tenant, kind)] += n
        if tenant in tenants:
            used[f"tenant:{tenant}"] += n
        if kind in kinds:
            used[f"kind:{kind}"] += n
    return used, share


def _held(hold: datetime) -> Q:
    """Rows that hold a slot: a running attempt, or a slot handed out within ``hold``."""
    return Q(status=Activity.Status.RUNNING) | Q(status=Activity.Status.SCHEDULED, slot_granted_at__gt=hold)


def _grant(granted: list[tuple[int, str]], *, now: datetime) -> None:
    """Keep a slot for each of ``granted`` and ring it after commit. A row another transaction
    holds locked (being voided, say) is skipped: it is looked at again at its recheck."""
    if not granted:
        return
    names = dict(granted)
    free = sql_slots.grant(names, now=now)
    for pk in free:
        doorbells.activity_run(activity_id=pk, name=names[pk])
    logger.info("slots.granted", extra={"activities": free})


def overview() -> dict[str, Any] | None:
    """The keys of AGENTOPS_ACTIVITY_CONCURRENCY in use, for /metrics and the admin: None when none
    is configured; else each key's ``cap``, ``running`` (slots held) and ``waiting``
    ({(tenant, priority): n}), for every configured key and every tenant or kind a ``*`` row covers
    that holds or waits for a slot."""
    table: Mapping[str, int] = settings.AGENTOPS_ACTIVITY_CONCURRENCY
    if not table:
        return None
    hold = clock.now() - timedelta(seconds=grant_hold_seconds())
    running = Activity.objects.filter(_held(hold)).values_list("tenant", "kind").annotate(n=Count("id")).order_by()
    waiting = Activity.objects.filter(status=Activity.Status.SCHEDULED, slot_waiting_since__isnull=False).filter(
        Q(slot_granted_at__isnull=True) | Q(slot_granted_at__lte=hold)).values_list(
        "tenant", "kind", "slot_priority").annotate(n=Count("id")).order_by()
    keys: dict[str, dict[str, Any]] = {}

    def row(key: str, cap: int) -> dict[str, Any]:
        return keys.setdefault(key, {"key": key, "cap": cap, "running": 0, "waiting": Counter()})

    for key, cap in table.items():
        if not key.endswith(":*"):
            row(key, cap)
    for tenant, kind, n in running:
        for key, cap in caps_for(tenant, kind, table).caps:
            row(key, cap)["running"] += n
    for tenant, kind, priority, n in waiting:
        for key, cap in caps_for(tenant, kind, table).caps:
            row(key, cap)["waiting"][(tenant, priority or 0)] += n
    return {"keys": [{**keys[k], "waiting": dict(keys[k]["waiting"])} for k in sorted(keys)]}
