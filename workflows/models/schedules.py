"""Launches that recur: a schedule names a launch (kind, goal, parameters) and when it recurs; each
occurrence it handled is a row, unique per (schedule, time), so one occurrence launches once
however many beats fire it (docs/operators.md, "Schedules")."""
from __future__ import annotations

from django.conf import settings
from django.db import models


class Schedule(models.Model):
    """A recurring launch. Its beat entry (a django-celery-beat periodic task, ``periodic_task``)
    rings at each occurrence; the beat sweep ``fire_schedules`` also finds due occurrences, so a
    lost message, a jitter delay or a buffered occurrence is never left behind."""

    class Overlap(models.TextChoices):
        SKIP = "skip", "skip: no launch while the previous run is live"
        BUFFER_ONE = "buffer_one", "buffer_one: launch once the previous run ends (one waits at most)"
        CANCEL_PREVIOUS = "cancel_previous", "cancel_previous: cancel the live run, then launch"
        ALLOW_ALL = "allow_all", "allow_all: launch every time"

    name = models.SlugField(max_length=80, unique=True, help_text="The schedule's name: letters, digits, - and _.")
    kind = models.CharField(max_length=60, help_text="Workflow kind each occurrence launches.")
    goal = models.TextField(help_text="The goal of each launch.")
    params = models.JSONField(default=dict, blank=True, help_text="Launch parameters, as checked by the kind.")
    labels = models.JSONField(default=dict, blank=True,
                              help_text="Labels (key to value) each launch carries, as checked at launch.")
    cron = models.CharField(max_length=120, blank=True,
                            help_text="Five-field cron expression in UTC (minute hour day month weekday), or empty.")
    every_seconds = models.PositiveIntegerField(null=True, blank=True,
                                                help_text="The interval between occurrences, when not a cron.")
    anchor_at = models.DateTimeField(help_text="Interval schedules occur at this time plus whole intervals.")
    overlap = models.CharField(max_length=16, choices=Overlap.choices, default=Overlap.SKIP,
                               help_text="What an occurrence does while the previous run is still live.")
    catch_up_seconds = models.PositiveIntegerField(
        default=0, help_text="Occurrences missed (beat down) up to this long ago are still launched; older ones "
                             "are recorded as missed.")
    jitter_seconds = models.PositiveIntegerField(
        default=0, help_text="Each occurrence launches up to this long after its time (the same delay every time "
                             "it is computed).")
    paused = models.BooleanField(default=False, help_text="A paused schedule launches nothing; resume takes it up "
                                                          "from the next occurrence.")
    created_by = models.ForeignKey(settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.SET_NULL,
                                   related_name="+", help_text="Who added it: each launch is theirs.")
    created_at = models.DateTimeField()
    handled_until = models.DateTimeField(
        help_text="Occurrences up to this time are handled (launched, skipped, buffered or missed).")
    next_due_at = models.DateTimeField(db_index=True, help_text="When the next occurrence launches (jitter included).")
    buffered_at = models.DateTimeField(null=True, blank=True,
                                       help_text="buffer_one: the occurrence waiting for the live run to end.")
    declared = models.BooleanField(
        default=False, help_text="Declared in code (agentops.kind.Schedule): `agent schedule sync` and each worker's "
                                 "and beat's start keep it in step with the code; made by hand when false.")
    periodic_task = models.OneToOneField("django_celery_beat.PeriodicTask", null=True, blank=True,
                                         on_delete=models.SET_NULL, related_name="+",
                                         help_text="The beat entry that rings at each occurrence.")

    class Meta:
        constraints = [
            models.CheckConstraint(
                condition=(models.Q(cron="") & models.Q(every_seconds__gt=0))
                | (~models.Q(cron="") & models.Q(every_seconds__isnull=True)),
                name="schedule_cron_or_every"),
        ]

    def __str__(self) -> str:
        return f"schedule {self.name}"

    @property
    def when(self) -> str:
        """How it recurs, as people write it: the cron expression, or "every 6h"."""
        if self.cron:
            return f"cron {self.cron}"
        seconds = self.every_seconds or 0
        for unit, size in (("d", 86400), ("h", 3600), ("m", 60)):
            if seconds % size == 0:
                return f"every {seconds // size}{unit}"
        return f"every {seconds}s"


class ScheduleOccurrence(models.Model):
    """What one occurrence of a schedule did: launched a workflow, or skipped, buffered, missed."""

    class Outcome(models.TextChoices):
        LAUNCHED = "launched"
        SKIPPED = "skipped", "skipped: the previous run was live (overlap skip)"
        BUFFERED = "buffered", "buffered: launches when the previous run ends"
        REPLACED = "replaced", "replaced: a later occurrence took the one buffered place"
        MISSED = "missed", "missed: older than the catch-up window when beat reached it"
        FAILED = "failed", "failed: the launch was refused (the reason says why)"

    schedule = models.ForeignKey(Schedule, on_delete=models.CASCADE, related_name="occurrences")
    at = models.DateTimeField(help_text="The occurrence's scheduled time (a trigger: when it was asked).")
    triggered_by = models.ForeignKey(settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.SET_NULL,
                                     related_name="+", help_text="Set for an occurrence asked for by a person.")
    outcome = models.CharField(max_length=12, choices=Outcome.choices)
    workflow = models.ForeignKey("workflows.Workflow", null=True, blank=True, on_delete=models.SET_NULL,
                                 related_name="+", help_text="The workflow it launched.")
    reason = models.TextField(blank=True)
    recorded_at = models.DateTimeField()

    class Meta:
        constraints = [
            models.UniqueConstraint(fields=["schedule", "at"], name="uniq_schedule_occurrence"),
            # buffer_one's one place: a newer buffered occurrence replaces the older in the same transaction.
            models.UniqueConstraint(fields=["schedule"], condition=models.Q(outcome="buffered"),
                                    name="schedule_one_buffered_occurrence"),
        ]
        indexes = [
            models.Index(fields=["schedule", "-at"], name="schedule_occurrence_newest"),
            # The run a schedule launched last (the overlap policies' live run).
            models.Index(fields=["schedule", "-workflow"], condition=models.Q(outcome="launched"),
                         name="schedule_occurrence_launched"),
        ]

    def __str__(self) -> str:
        return f"{self.schedule.name} at {self.at:%Y-%m-%d %H:%M:%S} ({self.outcome})"
