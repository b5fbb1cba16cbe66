"""Keeping the schedules declared in code (``declared``) in step with the database and the beat
entries: a sync adds the new, changes the changed and removes the ones no longer declared, and
touches only schedules that came from code (``Schedule.declared``), never one made by hand. It runs
at each worker's and beat's start and as `manage.py agent schedule sync`.

What the code owns: the launch (kind, goal, parameters, labels) and the timing (cron or interval,
overlap, catch-up, jitter). What the operator owns: pause and resume, which a sync never changes.
"""
from __future__ import annotations

import dataclasses
import logging
from typing import Any

from django.db import connection, transaction
from django.db.models import Q

from workflows import registry
from workflows.errors import AgentOpsError, InvalidInput
from workflows.features.schedules import services
from workflows.features.schedules.declared import Schedule, declared
from workflows.models import Schedule as ScheduleRow
from workflows.sql.server import advisory_xact_lock

logger = logging.getLogger("agentops.schedules")

# pg_advisory_xact_lock's key for syncing declared schedules ("aosched" in ASCII, as a bigint).
LOCK_KEY = int.from_bytes(b"aosched", "big")


@dataclasses.dataclass(frozen=True)
class Change:
    """What a sync did (or, dry, would do) to one schedule."""

    action: str  # "added", "changed", "removed"
    name: str
    what: str = ""  # for "changed": the values that changed

    def __str__(self) -> str:
        return f"{self.action} {self.name}" + (f" ({self.what})" if self.what else "")


def schedules_sync(*, dry_run: bool = False) -> list[Change]:
    """Bring the schedules that came from code in step with the declarations; the changes, in name
    order (empty when in step). Every declaration is checked first, as ``schedule_add`` checks it:
    a wrong one, or one whose name a schedule made by hand has, raises InvalidInput and nothing is
    written. Several processes may sync at once: one at a time (an advisory lock on PostgreSQL),
    each finding what the one before did."""
    wanted = {name: _checked(schedule) for name, schedule in sorted(declared().items())}
    with transaction.atomic():
        advisory_xact_lock(LOCK_KEY)
        rows = {row.name: row for row in ScheduleRow.objects.select_for_update()
                .filter(Q(declared=True) | Q(name__in=wanted))}
        by_hand = sorted(name for name, row in rows.items() if not row.declared)
        if by_hand:
            raise InvalidInput(f"The code declares schedule{'s' if len(by_hand) > 1 else ''} {', '.join(by_hand)}, "
                               "and a schedule made by hand has that name; remove the one made by hand "
                               "(manage.py agent schedule remove NAME) or rename the declaration. Nothing was "
                               "changed.")
        changes = [*_added_or_changed(wanted, rows, dry_run=dry_run), *_removed(wanted, rows, dry_run=dry_run)]
        if changes and not dry_run:
            logger.info("schedules.synced", extra={"changes": [str(c) for c in changes]})
    return sorted(changes, key=lambda change: change.name)


def _checked(schedule: Schedule) -> ScheduleRow:
    try:
        row = services.schedule_checked(
            name=schedule.name, kind=schedule.kind, goal=schedule.goal, params=dict(schedule.params or {}),
            cron=schedule.cron, every=schedule.every, overlap=schedule.overlap, catch_up=schedule.catch_up,
            jitter=schedule.jitter, labels=dict(schedule.labels or {}))
    except InvalidInput as exc:
        raise InvalidInput(f"Schedule {schedule.name!r} declared in code: {exc} Nothing was changed.",
                           schedule=schedule.name) from None
    row.declared = True
    return row


def _added_or_changed(wanted: dict[str, ScheduleRow], rows: dict[str, ScheduleRow], *,
                      dry_run: bool) -> list[Change]:
    changes = []
    for name, new in wanted.items():
        row = rows.get(name)
        if row is None:
            changes.append(Change("added", name))
            if not dry_run:
                new.save()
                services.beat_entry_updated(new)
            continue
        differing = services.schedule_differences(row, new)
        beat_missing = row.periodic_task_id is None
        if differing or beat_missing:
            changes.append(Change("changed", name, ", ".join(differing + ["beat entry"] * beat_missing)))
            if not dry_run:
                _update(row, new)
    return changes


def _update(row: ScheduleRow, new: ScheduleRow) -> None:
    """The declared values onto the saved schedule, its next occurrence and beat entry with them;
    its pause, its anchor and what it handled stay."""
    fields = [field for field in services.COMPARED if field != "created_by_id"]
    for field in fields:
        setattr(row, field, getattr(new, field))
    row.next_due_at = services.next_due(row)
    row.save(update_fields=[*fields, "next_due_at"])
    services.beat_entry_updated(row)


def _removed(wanted: dict[str, ScheduleRow], rows: dict[str, ScheduleRow], *, dry_run: bool) -> list[Change]:
    """The declared schedules no longer declared, of the kinds this process has: one of a kind it
    does not have (a process started with other AGENTOPS_AGENT_MODULES) is another's to keep."""
    kinds = set(registry.definition_kinds())
    gone = [row for name, row in rows.items() if name not in wanted and row.kind in kinds]
    if not dry_run:
        for row in gone:
            services.schedule_remove(name=row.name)
    return [Change("removed", row.name) for row in gone]


def sync_at_start(**_: Any) -> None:
    """A worker's or beat's start: sync, and say what changed. A declaration the sync refuses, or a
    database it cannot reach, is logged and the process starts anyway (its schedules unsynced)."""
    try:
        changes = schedules_sync()
    except AgentOpsError as exc:
        logger.error("schedules.sync.refused", extra={"reason": str(exc)})
    except Exception:
        logger.warning("schedules.sync.failed", exc_info=True)
    else:
        logger.info("schedules.sync.done", extra={"changed": len(changes)})
    finally:
        connection.close()
