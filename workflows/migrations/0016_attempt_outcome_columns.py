"""An attempt says in columns whether it was throttled, given back to the retry policy, and the
retry window its failure opened; the activity's and attempt's statuses become FSM fields with
declared transitions (no change to the tables' columns).

Attempts recorded before this migration said so only in their error text, which the throttle
streak parsed ("Throttled: ..."): the backfill reads it once. Throttled attempts and budget
waits ("BudgetDeferred: ...", "BudgetExhausted: ...") were given back, except the last attempt of
an activity that failed with it (its policy made the error final). Their retry windows were not
recorded and stay empty.
"""
import django_fsm
from django.db import migrations, models

THROTTLED = "Throttled: "
GIVEN_BACK = (THROTTLED, "BudgetDeferred: ", "BudgetExhausted: ")


def outcomes_from_error_text(apps, schema_editor):
    ActivityAttempt = apps.get_model("workflows", "ActivityAttempt")
    Activity = apps.get_model("workflows", "Activity")
    ActivityAttempt.objects.filter(status="failed", error__startswith=THROTTLED).update(throttled=True)
    waits = models.Q()
    for prefix in GIVEN_BACK:
        waits |= models.Q(error__startswith=prefix)
    final = Activity.objects.filter(pk=models.OuterRef("activity_id"), status="failed",
                                    attempt=models.OuterRef("number"))
    ActivityAttempt.objects.filter(waits, status="failed").exclude(models.Exists(final)).update(refunded=True)


class Migration(migrations.Migration):

    dependencies = [
        ('workflows', '0015_outbound_webhooks'),
    ]

    operations = [
        migrations.AddField(
            model_name='activityattempt',
            name='refunded',
            field=models.BooleanField(default=False, help_text="Given back to the retry policy: a wait for the provider's capacity or for money (throttled, budget deferred or exhausted), not a failed try; the activity's max_attempts grew by one."),
        ),
        migrations.AddField(
            model_name='activityattempt',
            name='retry_after_seconds',
            field=models.FloatField(blank=True, help_text='The retry window this failure opened: the wait the provider or the budget named, else the backoff. Empty when no retry followed.', null=True),
        ),
        migrations.AddField(
            model_name='activityattempt',
            name='throttled',
            field=models.BooleanField(default=False, help_text='The provider refused the call for capacity (429/529, errors.Throttled). A run of these moves a workflow with a fallback model to it.'),
        ),
        migrations.AlterField(
            model_name='activity',
            name='status',
            field=django_fsm.FSMField(choices=[('scheduled', 'Scheduled'), ('running', 'Running'), ('succeeded', 'Succeeded'), ('failed', 'Failed'), ('cancelled', 'Cancelled')], default='scheduled', max_length=12, protected=True),
        ),
        migrations.AlterField(
            model_name='activityattempt',
            name='status',
            field=django_fsm.FSMField(choices=[('running', 'Running'), ('succeeded', 'Succeeded'), ('failed', 'Failed'), ('lost', 'Lost: the lease expired before a result was recorded'), ('stale', 'Stale: finished after its lease was taken over; result discarded'), ('cancelled', 'Cancelled: its work was no longer wanted (cancel, new goal, node left, failure)')], default='running', max_length=12, protected=True),
        ),
        migrations.RunPython(outcomes_from_error_text, migrations.RunPython.noop),
    ]
