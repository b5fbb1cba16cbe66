"""Schedules declared in code (docs/authoring.md, "Schedules"): ``agentops.kind.Schedule`` values a
definition lists in ``schedules``, or an app declares from its ``ready()`` with
``agentops.kind.declare_schedules``; ``sync.schedules_sync`` keeps the database in step with them."""
from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from workflows import registry
from workflows.errors import InvalidInput

if TYPE_CHECKING:
    from workflows.models import Schedule as ScheduleRow


@dataclasses.dataclass(frozen=True)
class Schedule:
    """A schedule declared in code: the values ``schedule_add`` takes, checked as it checks them.

    ``kind`` may be left empty on a definition's ``schedules`` (it is the definition's kind). A value
    wrong in itself (the name, the timing, the labels) raises InvalidInput here, where it is
    declared; the kind and the parameters are checked at sync, against the registered kind."""

    name: str
    goal: str
    cron: str = ""
    every: str = ""
    kind: str = ""
    params: Mapping[str, Any] | None = None
    overlap: str = "skip"
    catch_up: str = "0"
    jitter: str = "0"
    labels: Mapping[str, str] | None = None

    def __post_init__(self) -> None:
        # Here, not at the top: agentops.kind (which imports this module) imports before Django's
        # models do, and the checks' module imports them.
        from workflows.features.schedules import services
        from workflows.services.labels import labels_checked

        try:
            services.name_checked(self.name)
            services.timing_checked(cron=self.cron, every=self.every, overlap=self.overlap,
                                    catch_up=self.catch_up, jitter=self.jitter)
            labels_checked(self.labels)
        except InvalidInput as exc:
            raise InvalidInput(f"Schedule {self.name!r} declared in code: {exc}", schedule=self.name) from None


_by_apps: dict[str, Schedule] = {}


def schedule_ensure(schedule: Schedule, *, user: Any = None) -> ScheduleRow:
    """One schedule made where its object is (a reminder per invoice, named from the invoice), not
    declared: a sync leaves it alone. Idempotent by name: again with the same values it returns the
    row it made and writes nothing; with other values InvalidInput names them and nothing is
    written (``schedule_remove`` it first to change it). ``schedule.kind`` must be given."""
    # Here, not at the top: agentops.kind imports this module before Django's models are ready.
    from workflows.features.schedules import services

    if not isinstance(schedule, Schedule):
        raise InvalidInput(f"schedule_ensure takes an agentops.kind.Schedule value; got {schedule!r:.80}.")
    if not schedule.kind:
        raise InvalidInput(f"Schedule {schedule.name!r} made by schedule_ensure must name its kind "
                           "(Schedule(..., kind=\"...\")).", schedule=schedule.name)
    return services.schedule_add(
        name=schedule.name, kind=schedule.kind, goal=schedule.goal,
        params=None if schedule.params is None else dict(schedule.params), cron=schedule.cron, every=schedule.every,
        overlap=schedule.overlap, catch_up=schedule.catch_up, jitter=schedule.jitter, user=user,
        labels=None if schedule.labels is None else dict(schedule.labels))


def schedule_remove(name: str) -> None:
    """Remove the schedule ``name`` and its beat entry (the workflows it launched go on); NotFound
    when there is none."""
    from workflows.features.schedules import services

    services.schedule_remove(name=name)


def declare_schedules(*schedules: Schedule) -> None:
    """Declare schedules of a Django app (call it from the app's ``ready()``); each names its kind.
    Declaring one again with the same values changes nothing; with other values it is refused."""
    for schedule in schedules:
        if not isinstance(schedule, Schedule):
            raise InvalidInput(f"declare_schedules takes agentops.kind.Schedule values; got {schedule!r:.80}.")
        if not schedule.kind:
            raise InvalidInput(f"Schedule {schedule.name!r} declared by an app must name its kind "
                               "(Schedule(..., kind=\"...\")).", schedule=schedule.name)
        if _by_apps.get(schedule.name, schedule) != schedule:
            raise InvalidInput(f"Schedule {schedule.name!r} is declared twice with different values.",
                               schedule=schedule.name)
    _by_apps.update({schedule.name: schedule for schedule in schedules})


def declared() -> dict[str, Schedule]:
    """Every declared schedule by name, with its kind filled in: the registered definitions' and the
    apps'. InvalidInput when one is not a Schedule, names another kind on a definition, or when two
    declare one name."""
    found: dict[str, tuple[Schedule, str]] = {}
    sources = [("apps' declare_schedules", list(_by_apps.values()))]
    for definition in registry.definitions():
        where = f"{definition.__module__}.{definition.__qualname__}.schedules"
        listed = definition.schedules
        if not isinstance(listed, list | tuple) or not all(isinstance(s, Schedule) for s in listed):
            raise InvalidInput(f"{where} must be a tuple of agentops.kind.Schedule values; got {listed!r:.120}.")
        for schedule in listed:
            if schedule.kind not in ("", definition.kind):
                raise InvalidInput(f"Schedule {schedule.name!r} of {where} names kind {schedule.kind!r}; a "
                                   f"definition's schedules launch its own kind ({definition.kind!r}): leave kind "
                                   "out, or declare it with declare_schedules.", schedule=schedule.name)
        sources.append((where, [dataclasses.replace(s, kind=definition.kind) for s in listed]))
    for where, schedules in sources:
        for schedule in schedules:
            if schedule.name in found:
                raise InvalidInput(f"Schedule {schedule.name!r} is declared twice: in {found[schedule.name][1]} "
                                   f"and in {where}.", schedule=schedule.name)
            found[schedule.name] = (schedule, where)
    return {name: schedule for name, (schedule, _) in found.items()}
