"""Schedules: launches that recur (docs/operators.md, "Schedules").

A schedule's occurrences are the times its cron expression (UTC) or its interval (from its
anchor) names. Each occurrence is handled once: a ``ScheduleOccurrence`` row, unique per
(schedule, time), is claimed in the same transaction as the launch, under the schedule's row
lock, so two beats, a restarted beat, a redelivered message and the sweep all launch it once.
Its beat entry (a django-celery-beat periodic task) rings at each occurrence; the beat sweep
``fire_schedules`` finds whatever is due besides (a lost message, a jittered occurrence, a
buffered one whose previous run ended). The database is the truth; both are doorbells.
"""
from __future__ import annotations

import hashlib
import json
import logging
import re
from collections.abc import Iterator
from datetime import datetime, timedelta
from typing import Any

from croniter import croniter
from django.db import IntegrityError, transaction
from django.db.models import Q
from django_celery_beat.models import CrontabSchedule, IntervalSchedule, PeriodicTask

from workflows import clock, registry
from workflows.errors import InvalidInput, NotFound, Refused, ScheduleRefused
from workflows.models import Schedule, ScheduleOccurrence, Workflow
from workflows.services.cancellation import workflow_cancel
from workflows.services.common import text_checked
from workflows.services.failures import row_isolated
from workflows.services.labels import labels_checked
from workflows.services.launch_options import LaunchOptions
from workflows.services.steps import MAX_GOAL_CHARS
from workflows.services.workflows import workflow_launch
from workflows.statestore import json_checked

logger = logging.getLogger("agentops.schedules")

FIRE_TASK = "agentops.schedules.fire"
# An occurrence beat reaches this late still launches without a catch-up window (a beat tick, a
# busy worker).
GRACE = timedelta(seconds=60)
MIN_EVERY_SECONDS = 10
MAX_EVERY_SECONDS = 366 * 86400
MAX_WINDOW_SECONDS = 30 * 86400  # catch-up and jitter
# Occurrences one fire handles at most (a long catch-up window of a short interval); the next
# fire takes the rest.
MAX_OCCURRENCES_PER_FIRE = 50
# Missed occurrences are counted up to this many, then reported as "at least".
MAX_MISSED_COUNTED = 10_000
SWEEP_BATCH = 100
EVERY = re.compile(r"(?:(\d+)d)?(?:(\d+)h)?(?:(\d+)m)?(?:(\d+)s)?")


def duration_checked(text: str, *, what: str, minimum: int = 0, maximum: int = MAX_WINDOW_SECONDS) -> int:
    """Seconds of "6h", "90m", "1h30m", "45s", "2d" (or a bare number of seconds)."""
    text = str(text).strip()
    match = EVERY.fullmatch(text)
    if text.isdigit():
        seconds = int(text)
    elif text and match and any(match.groups()):
        days, hours, minutes, secs = (int(g or 0) for g in match.groups())
        seconds = days * 86400 + hours * 3600 + minutes * 60 + secs
    else:
        raise InvalidInput(f"{what} must be a duration such as 6h, 90m, 1h30m, 45s or 2d; got {text[:40]!r}.")
    if not minimum <= seconds <= maximum:
        raise InvalidInput(f"{what} must be from {minimum} s to {maximum:,} s; got {text!r} ({seconds:,} s).")
    return seconds


def cron_checked(expression: str) -> str:
    fields = str(expression).split()
    if len(fields) != 5 or not croniter.is_valid(" ".join(fields)):
        raise InvalidInput(f"The cron expression {str(expression)[:120]!r} must have five fields (minute hour "
                           "day-of-month month day-of-week, in UTC), e.g. \"0 3 * * *\" for 03:00 every day.")
    return " ".join(fields)


def occurrences(schedule: Schedule, *, after: datetime) -> Iterator[datetime]:
    """The schedule's occurrences strictly after ``after``, in order (without end)."""
    if schedule.cron:
        times = croniter(schedule.cron, after, ret_type=datetime)
        while True:
            yield times.get_next(datetime)
    every = timedelta(seconds=schedule.every_seconds or 0)
    steps = max(0, (after - schedule.anchor_at) // every + 1)
    at = schedule.anchor_at + steps * every
    while True:
        yield at
        at += every


def jitter(schedule: Schedule, at: datetime) -> timedelta:
    """The occurrence's delay: the same for the same schedule and time in every process."""
    if not schedule.jitter_seconds:
        return timedelta(0)
    digest = hashlib.sha256(f"{schedule.name}\n{at.isoformat()}".encode()).digest()
    return timedelta(seconds=int.from_bytes(digest[:8], "big") % schedule.jitter_seconds)


def next_due(schedule: Schedule) -> datetime:
    at = next(occurrences(schedule, after=schedule.handled_until))
    return at + jitter(schedule, at)


def schedule_add(*, name: str, kind: str, goal: str, params: dict[str, Any] | None = None, cron: str = "",
                 every: str = "", overlap: str = Schedule.Overlap.SKIP, catch_up: str = "0", jitter: str = "0",
                 user: Any = None, labels: dict[str, str] | None = None) -> Schedule:
    """Add a schedule and its beat entry (``schedule_checked`` first: a bad value raises
    InvalidInput with nothing written).

    Idempotent by name: when a schedule of this name exists with the same values, it is returned
    and nothing is written; with other values, InvalidInput names them and nothing is written.
    Two calls at once add one schedule (the name is unique): the second compares as above."""
    schedule = schedule_checked(name=name, kind=kind, goal=goal, params=params, cron=cron, every=every,
                                overlap=overlap, catch_up=catch_up, jitter=jitter, user=user, labels=labels)
    existing = Schedule.objects.filter(name=name).first()
    if existing is None:
        try:
            with transaction.atomic():
                schedule.save()
                schedule.periodic_task = _beat_entry(schedule)
                schedule.save(update_fields=["periodic_task"])
            return schedule
        except IntegrityError:
            existing = Schedule.objects.get(name=name)  # added meanwhile by another call
    differing = schedule_differences(existing, schedule)
    if differing:
        raise InvalidInput(f"A schedule named {name!r} exists with another {', '.join(differing)}; remove it first "
                           "or choose another name.")
    return existing


# What makes two schedules of one name the same (the values schedule_add takes), as people name them.
COMPARED = {"kind": "kind", "goal": "goal", "params": "params", "labels": "labels", "cron": "cron",
            "every_seconds": "every", "overlap": "overlap", "catch_up_seconds": "catch-up",
            "jitter_seconds": "jitter", "created_by_id": "user"}


def schedule_differences(existing: Schedule, wanted: Schedule) -> list[str]:
    """What differs between a saved schedule and the one these values make (COMPARED's names)."""
    return [said for field, said in COMPARED.items() if getattr(existing, field) != getattr(wanted, field)]


def schedule_checked(*, name: str, kind: str, goal: str, params: dict[str, Any] | None = None, cron: str = "",
                     every: str = "", overlap: str = Schedule.Overlap.SKIP, catch_up: str = "0", jitter: str = "0",
                     user: Any = None, labels: dict[str, str] | None = None) -> Schedule:
    """The schedule these values make, unsaved; every value checked as a launch checks it
    (InvalidInput names the first that is wrong)."""
    name = name_checked(name)
    definition = registry.definition(kind)
    goal = text_checked(goal, what="The goal", max_length=MAX_GOAL_CHARS)
    params = json_checked(definition.validate_params(dict(params or {})), what="The parameters")
    timing = timing_checked(cron=cron, every=every, overlap=overlap, catch_up=catch_up, jitter=jitter)
    now = clock.now().replace(microsecond=0)
    schedule = Schedule(name=name, kind=kind, goal=goal, params=params, labels=labels_checked(labels), **timing,
                        anchor_at=now, created_by=user, created_at=now, handled_until=now, next_due_at=now)
    schedule.next_due_at = next_due(schedule)
    return schedule


def name_checked(name: str) -> str:
    if not re.fullmatch(r"[A-Za-z0-9_-]{1,80}", str(name)):
        raise InvalidInput(f"The schedule name must be 1–80 letters, digits, - or _; got {str(name)[:90]!r}.")
    return name


def timing_checked(*, cron: str, every: str, overlap: str, catch_up: str, jitter: str) -> dict[str, Any]:
    """When a schedule recurs and what its occurrences do, checked: the Schedule fields they make."""
    if bool(cron) == bool(every):
        raise InvalidInput("Give the schedule either --cron \"M H DOM MON DOW\" or --every DURATION (e.g. 6h).")
    if overlap not in Schedule.Overlap.values:
        raise InvalidInput(f"Overlap {overlap!r} is not one of {', '.join(Schedule.Overlap.values)}.")
    every_seconds = duration_checked(every, what="--every", minimum=MIN_EVERY_SECONDS,
                                     maximum=MAX_EVERY_SECONDS) if every else None
    jitter_seconds = duration_checked(jitter, what="--jitter")
    if every_seconds is not None and jitter_seconds >= every_seconds:
        raise InvalidInput(f"--jitter ({jitter_seconds} s) must be shorter than --every ({every_seconds} s).")
    return {"cron": cron_checked(cron) if cron else "", "every_seconds": every_seconds, "overlap": overlap,
            "catch_up_seconds": duration_checked(catch_up, what="--catch-up"), "jitter_seconds": jitter_seconds}


def _beat_entry(schedule: Schedule) -> PeriodicTask:
    return PeriodicTask.objects.create(
        name=f"agentops schedule {schedule.name}", task=FIRE_TASK, kwargs=json.dumps({"schedule_id": schedule.pk}),
        enabled=not schedule.paused, description=_beat_description(schedule), **beat_when(schedule))


def _beat_description(schedule: Schedule) -> str:
    return f"Launches {schedule.kind} for schedule {schedule.name} (manage.py agent schedule)."


def beat_when(schedule: Schedule) -> dict[str, Any]:
    """The beat entry's fields that say when it rings (a crontab, or an interval from the anchor)."""
    if schedule.cron:
        minute, hour, day_of_month, month_of_year, day_of_week = schedule.cron.split()
        crontab, _ = CrontabSchedule.objects.get_or_create(
            minute=minute, hour=hour, day_of_month=day_of_month, month_of_year=month_of_year,
            day_of_week=day_of_week, timezone="UTC")
        return {"crontab": crontab, "interval": None, "start_time": None}
    interval, _ = IntervalSchedule.objects.get_or_create(every=schedule.every_seconds,
                                                         period=IntervalSchedule.SECONDS)
    return {"interval": interval, "crontab": None, "start_time": schedule.anchor_at}


def beat_entry_updated(schedule: Schedule) -> bool:
    """Bring the schedule's beat entry in step with its fields (made again when it went missing);
    whether it had to be made again."""
    task = PeriodicTask.objects.filter(pk=schedule.periodic_task_id).first()
    if task is None:
        schedule.periodic_task = _beat_entry(schedule)
        schedule.save(update_fields=["periodic_task"])
        return True
    for field, value in {**beat_when(schedule), "description": _beat_description(schedule)}.items():
        setattr(task, field, value)
    task.save()  # its post-save signal tells the database scheduler
    return False


def schedule_named(name: str, *, lock: bool = False) -> Schedule:
    rows = Schedule.objects.select_for_update(of=("self",)) if lock else Schedule.objects
    try:
        return rows.select_related("created_by").get(name=name)
    except Schedule.DoesNotExist:
        raise NotFound(f"No schedule is named {str(name)[:90]!r} (manage.py agent schedule list, GET "
                       "/api/schedules).") from None


def schedule_pause(*, name: str) -> Schedule:
    with transaction.atomic():
        schedule = schedule_named(name, lock=True)
        schedule.paused = True
        schedule.save(update_fields=["paused"])
        PeriodicTask.objects.filter(pk=schedule.periodic_task_id).update(enabled=False)
        _beat_changed()
    return schedule


def schedule_resume(*, name: str) -> Schedule:
    """Resume from the next occurrence: those that passed while it was paused are not launched."""
    with transaction.atomic():
        schedule = schedule_named(name, lock=True)
        if schedule.paused:
            schedule.paused = False
            schedule.handled_until = max(schedule.handled_until, clock.now())
            schedule.next_due_at = next_due(schedule)
            schedule.save(update_fields=["paused", "handled_until", "next_due_at"])
            PeriodicTask.objects.filter(pk=schedule.periodic_task_id).update(enabled=True)
            _beat_changed()
    return schedule


def schedule_remove(*, name: str) -> None:
    """Remove the schedule and its beat entry; the workflows it launched go on."""
    with transaction.atomic():
        schedule = schedule_named(name, lock=True)
        PeriodicTask.objects.filter(pk=schedule.periodic_task_id).delete()
        schedule.delete()


def _beat_changed() -> None:
    """A queryset update sends no signal: tell the database scheduler its entries changed."""
    from django_celery_beat.models import PeriodicTasks

    PeriodicTasks.update_changed()


def schedule_trigger(*, name: str, user: Any = None) -> ScheduleOccurrence:
    """An occurrence now, asked by a person (a paused schedule too), under the overlap policy.

    While the run the schedule launched last is live: ``skip`` raises ScheduleRefused (nothing
    written); ``buffer_one`` buffers it (a buffered occurrence before it is replaced) and the sweep
    launches this same row, as ``user``, once that run ends; ``cancel_previous`` cancels the run,
    then launches; ``allow_all`` launches. On a paused schedule a trigger that would be buffered
    raises ScheduleRefused: a paused schedule's sweep launches nothing.
    """
    with transaction.atomic():
        schedule = schedule_named(name, lock=True)
        live = _live_run(schedule) if schedule.overlap != Schedule.Overlap.ALLOW_ALL else None
        if live is not None and schedule.overlap == Schedule.Overlap.SKIP:
            raise ScheduleRefused(
                f"Schedule {name}: workflow {live.pk} it launched is {live.status}, and under overlap skip a "
                f"trigger launches nothing beside it; trigger again once it ends, or cancel it first "
                f"(manage.py agent cancel {live.pk}).", workflow_id=live.pk)
        if live is not None and schedule.overlap == Schedule.Overlap.BUFFER_ONE and schedule.paused:
            raise ScheduleRefused(
                f"Schedule {name} is paused and workflow {live.pk} it launched is {live.status}: a trigger would "
                f"wait behind it, and a paused schedule launches nothing; resume the schedule first, or trigger "
                "once the run ends.", workflow_id=live.pk)
        now = clock.now()
        return _handle(schedule, now, now=now, triggered_by=user)


def schedule_fire(*, schedule_id: int) -> int:
    """Handle what is due of one schedule: a buffered occurrence whose previous run ended, then each
    occurrence whose time (and jitter) has come; returns how many workflows it launched."""
    now = clock.now()
    launched = 0
    with transaction.atomic():
        schedule = Schedule.objects.select_for_update().filter(pk=schedule_id).first()
        if schedule is None or schedule.paused:
            return 0
        launched += _buffered_launched(schedule, now=now)
        _record_missed(schedule, now)
        for _ in range(MAX_OCCURRENCES_PER_FIRE):
            at = next(occurrences(schedule, after=schedule.handled_until))
            if at + jitter(schedule, at) > now:
                break
            launched += _handle(schedule, at, now=now).outcome == ScheduleOccurrence.Outcome.LAUNCHED
            schedule.handled_until = at
        schedule.next_due_at = next_due(schedule)
        schedule.save(update_fields=["handled_until", "next_due_at", "buffered_at"])
    return launched


def _buffered_launched(schedule: Schedule, *, now: datetime) -> int:
    """Launch the buffered occurrence, in its own row, once the run it waited for ended (under the
    schedule's row lock, in the fire's transaction: a second fire finds it launched)."""
    if schedule.buffered_at is None or _live_run(schedule) is not None:
        return 0
    occurrence = (ScheduleOccurrence.objects.select_for_update(of=("self",))
                  .filter(schedule=schedule, at=schedule.buffered_at, outcome=ScheduleOccurrence.Outcome.BUFFERED)
                  .select_related("triggered_by").first())
    schedule.buffered_at = None
    schedule.save(update_fields=["buffered_at"])
    if occurrence is None:
        logger.warning("schedule.buffered_missing", extra={"schedule": schedule.name})
        return 0
    occurrence.reason = f"buffered; launched at {now.isoformat()} once the previous run ended"
    return _launched(schedule, occurrence).outcome == ScheduleOccurrence.Outcome.LAUNCHED


def _record_missed(schedule: Schedule, now: datetime) -> None:
    """Occurrences due (jitter included) before the catch-up window (beat was not running) are
    not launched: one MISSED row, at the newest of them, counts them."""
    window_start = now - GRACE - timedelta(seconds=schedule.catch_up_seconds)
    missed, last = 0, None
    for at in occurrences(schedule, after=schedule.handled_until):
        if at + jitter(schedule, at) >= window_start or missed >= MAX_MISSED_COUNTED:
            break
        missed, last = missed + 1, at
    if last is None:
        return
    more = "at least " if missed >= MAX_MISSED_COUNTED else ""
    ScheduleOccurrence.objects.get_or_create(schedule=schedule, at=last, defaults={
        "outcome": ScheduleOccurrence.Outcome.MISSED, "recorded_at": now,
        "reason": f"{more}{missed} occurrence{'s' if missed > 1 else ''} up to this one passed more than "
                  f"{schedule.catch_up_seconds} s (the catch-up window) + {GRACE.seconds} s before beat reached "
                  "them: not launched."})
    logger.warning("schedule.missed", extra={"schedule": schedule.name, "missed": missed, "until": last.isoformat()})
    schedule.handled_until = last


def _live_run(schedule: Schedule) -> Workflow | None:
    """The run the schedule launched last, while it is live. Last launched, not latest in time: a
    trigger, a buffered or a jittered occurrence launches after occurrences of later times."""
    newest = (ScheduleOccurrence.objects.filter(schedule=schedule, outcome=ScheduleOccurrence.Outcome.LAUNCHED,
                                                workflow__isnull=False)
              .select_related("workflow").order_by("-workflow_id").first())
    workflow = newest.workflow if newest is not None else None
    return workflow if workflow is not None and not workflow.is_terminal else None


def _handle(schedule: Schedule, at: datetime, *, now: datetime, triggered_by: Any = None) -> ScheduleOccurrence:
    """One occurrence under the overlap policy; claimed first, so a second fire of it does nothing."""
    try:
        with transaction.atomic():
            occurrence = ScheduleOccurrence.objects.create(schedule=schedule, at=at, triggered_by=triggered_by,
                                                           outcome=ScheduleOccurrence.Outcome.LAUNCHED,
                                                           recorded_at=now)
    except IntegrityError:
        return ScheduleOccurrence.objects.get(schedule=schedule, at=at)  # handled before
    live = _live_run(schedule) if schedule.overlap != Schedule.Overlap.ALLOW_ALL else None
    if live is not None and schedule.overlap == Schedule.Overlap.SKIP:
        return _ended(occurrence, ScheduleOccurrence.Outcome.SKIPPED, f"workflow {live.pk} was {live.status}")
    if live is not None and schedule.overlap == Schedule.Overlap.BUFFER_ONE:
        return _buffered(schedule, occurrence, live)
    if live is not None and schedule.overlap == Schedule.Overlap.CANCEL_PREVIOUS:
        workflow_cancel(workflow_id=live.pk, reason=f"schedule {schedule.name}: the occurrence at "
                                                    f"{at.isoformat()} replaces it", user=triggered_by,
                        by=f"schedule {schedule.name}")
    return _launched(schedule, occurrence)


def _buffered(schedule: Schedule, occurrence: ScheduleOccurrence, live: Workflow) -> ScheduleOccurrence:
    """The one buffered place: the occurrence waiting there before is replaced, and the schedule
    points at this one (saved here, whoever called)."""
    ScheduleOccurrence.objects.filter(schedule=schedule, outcome=ScheduleOccurrence.Outcome.BUFFERED).exclude(
        pk=occurrence.pk).update(outcome=ScheduleOccurrence.Outcome.REPLACED,
                                 reason=f"the occurrence at {occurrence.at.isoformat()} took its place")
    _ended(occurrence, ScheduleOccurrence.Outcome.BUFFERED, f"waits for workflow {live.pk} to end")
    schedule.buffered_at = occurrence.at
    schedule.save(update_fields=["buffered_at"])
    return occurrence


def _launched(schedule: Schedule, occurrence: ScheduleOccurrence) -> ScheduleOccurrence:
    """Launch the occurrence's workflow, as who triggered it or else who added the schedule; a
    launch the kind refuses leaves the occurrence failed."""
    try:
        with transaction.atomic():
            workflow = workflow_launch(kind=schedule.kind, goal=schedule.goal, params=schedule.params,
                                       user=occurrence.triggered_by or schedule.created_by,
                                       options=LaunchOptions(labels=schedule.labels))
    except (InvalidInput, Refused) as exc:
        logger.warning("schedule.launch_refused", extra={"schedule": schedule.name, "reason": str(exc)})
        return _ended(occurrence, ScheduleOccurrence.Outcome.FAILED, str(exc))
    occurrence.outcome, occurrence.workflow = ScheduleOccurrence.Outcome.LAUNCHED, workflow
    occurrence.save(update_fields=["outcome", "workflow", "reason"])
    logger.info("schedule.launched", extra={"schedule": schedule.name, "at": occurrence.at.isoformat(),
                                            "workflow_id": workflow.pk})
    return occurrence


def _ended(occurrence: ScheduleOccurrence, outcome: str, reason: str) -> ScheduleOccurrence:
    occurrence.outcome, occurrence.reason = outcome, reason
    occurrence.save(update_fields=["outcome", "reason"])
    return occurrence


def schedules_fire_due() -> int:
    """The beat sweep: every schedule with an occurrence due or a buffered one waiting."""
    now = clock.now()
    due = (Schedule.objects.filter(paused=False).filter(Q(next_due_at__lte=now) | Q(buffered_at__isnull=False))
           .order_by("next_due_at").values_list("pk", flat=True)[:SWEEP_BATCH])
    return sum(row_isolated("fire_schedules", pk, lambda pk: schedule_fire(schedule_id=pk),
                            workflow_id=lambda pk: None) for pk in list(due))
