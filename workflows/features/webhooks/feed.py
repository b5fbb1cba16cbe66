"""Reading the event history forward from a cursor, for the live streams and the outbound webhooks.

One workflow's events are read by ``seq``: the workflow's row lock orders their commits, so a
reader that saw ``seq`` N has seen every event before it and misses none after it.

Across workflows the cursor is the event's primary key, which transactions take in the order they
insert, not the order they commit: key 41 may commit after 42. ``GlobalCursor`` therefore stops
at a hole in the keys and passes it only when nothing can fill it any more. On PostgreSQL that is
when every transaction of the database that was open once the hole had stood for
AGENTOPS_STREAM_GAP_SECONDS has ended (``pg_stat_activity.backend_xid``): the transaction that took
the missing key is one of them, so its events are read in their place however long it runs, and
a rolled-back one leaves a hole that is passed as soon as it is gone. The wait lets a transaction
that took a key get its transaction id (a statement's work of microseconds). SQLite has one writer
at a time, so its keys commit in order and a hole is one that was rolled back: it is passed after
the wait alone.
"""
from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from django.conf import settings
from django.db import connection
from django.db.models import Max

from workflows.models import Event, Workflow
from workflows.sql.server import open_transaction_ids


def event_json(event: Event, *, workflow_id: int | None = None) -> dict[str, Any]:
    """The JSON of one history event: ``agent show --json``'s shape, with its workflow."""
    return {"workflow_id": workflow_id if workflow_id is not None else event.workflow_id, "seq": event.seq,
            "kind": event.kind, "at": event.created_at.isoformat(), "data": event.data}


def workflow_events_after(workflow_id: int, seq: int, *, limit: int) -> list[Event]:
    """The workflow's events after ``seq``, oldest first (index ``uniq_event_seq``)."""
    return list(Event.objects.filter(workflow_id=workflow_id, seq__gt=seq).order_by("seq")[:limit])


def latest_event_pk() -> int:
    return Event.objects.aggregate(top=Max("pk"))["top"] or 0


@dataclass
class EventFilter:
    """Which workflows' events a stream or a subscription wants; empty fields match all."""

    kinds: tuple[str, ...] = ()
    statuses: tuple[str, ...] = ()
    launchers: tuple[str, ...] = ()
    event_kinds: tuple[str, ...] = ()

    def apply(self, qs: Any) -> Any:
        if self.kinds:
            qs = qs.filter(workflow__kind__in=self.kinds)
        if self.statuses:
            qs = qs.filter(workflow__status__in=self.statuses)
        if self.launchers:
            qs = qs.filter(workflow__launched_by__username__in=self.launchers)
        if self.event_kinds:
            qs = qs.filter(kind__in=self.event_kinds)
        return qs


@dataclass
class GlobalCursor:
    """Where a reader of every workflow's events stands: the last key it has passed (see above)."""

    after: int
    gap_seconds: float = field(default_factory=lambda: float(settings.AGENTOPS_STREAM_GAP_SECONDS))
    monotonic: Callable[[], float] = time.monotonic
    # When the reader first met the hole after ``after`` (on the ``monotonic`` clock); None: no hole.
    hole_seen_at: float | None = None
    # The transactions, open once the hole had stood for ``gap_seconds``, that it waits on to end;
    # None: not yet looked at.
    hole_waits_on: frozenset[str] | None = None

    def read(self, event_filter: EventFilter, *, limit: int) -> list[Event]:
        """The next events that match, oldest first; ``after`` moves past every key read, matching or not."""
        keys = list(Event.objects.filter(pk__gt=self.after).order_by("pk").values_list("pk", flat=True)[:limit])
        upto = self.after
        for key in keys:
            if key != upto + 1 and not self._hole_passable():
                break
            upto = key
            self.hole_seen_at, self.hole_waits_on = None, None
        if upto == self.after:
            return []
        # Read after the hole was judged: an event whose transaction ended meanwhile is read here.
        events = list(event_filter.apply(Event.objects.filter(pk__gt=self.after, pk__lte=upto)).order_by("pk"))
        self.after = upto
        return events

    def _hole_passable(self) -> bool:
        now = self.monotonic()
        if self.hole_seen_at is None:
            self.hole_seen_at = now
        if now - self.hole_seen_at < self.gap_seconds:
            return False
        if connection.vendor != "postgresql":
            return True
        still_open = open_transaction_ids()
        self.hole_waits_on = still_open if self.hole_waits_on is None else self.hole_waits_on & still_open
        return not self.hole_waits_on


def workflow_is_finished(workflow_id: int) -> bool:
    return Workflow.objects.filter(pk=workflow_id, status__in=Workflow.TERMINAL).exists()
