"""A schedule has one buffered occurrence at most, and ``Schedule.buffered_at`` points at it.

Before this, a trigger behind a live run left its occurrence ``buffered`` without pointing the
schedule at it: a schedule may have several buffered rows, or point at one since replaced. The
newest recorded buffered row keeps the place (as a newer occurrence always took it); the others
become ``replaced``; a schedule pointing at no buffered row points at that one, or at none.

The run a schedule launched last (its live run, for the overlap policies) is found by an index of
its launched occurrences by workflow.
"""
from django.db import migrations, models


def buffered_repaired(apps, schema_editor):
    Schedule = apps.get_model("workflows", "Schedule")
    ScheduleOccurrence = apps.get_model("workflows", "ScheduleOccurrence")
    for schedule in Schedule.objects.all():
        buffered = list(ScheduleOccurrence.objects.filter(schedule=schedule, outcome="buffered")
                        .order_by("-recorded_at", "-pk"))
        newest = buffered[0] if buffered else None
        for older in buffered[1:]:
            older.outcome = "replaced"
            older.reason = f"the occurrence at {newest.at.isoformat()} took its place"
            older.save(update_fields=["outcome", "reason"])
        at = newest.at if newest is not None else None
        if schedule.buffered_at != at:
            schedule.buffered_at = at
            schedule.save(update_fields=["buffered_at"])


class Migration(migrations.Migration):

    dependencies = [
        ("workflows", "0022_tree_owns_commitments"),
    ]

    operations = [
        migrations.RunPython(buffered_repaired, migrations.RunPython.noop),
        migrations.AddConstraint(
            model_name="scheduleoccurrence",
            constraint=models.UniqueConstraint(condition=models.Q(("outcome", "buffered")), fields=("schedule",),
                                               name="schedule_one_buffered_occurrence"),
        ),
        migrations.AddIndex(
            model_name="scheduleoccurrence",
            index=models.Index(condition=models.Q(("outcome", "launched")), fields=["schedule", "-workflow"],
                               name="schedule_occurrence_launched"),
        ),
    ]
