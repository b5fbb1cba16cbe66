"""Version 2 of the kind renames a ticket's ``email`` to ``contact_email``: in its table, and in the
state and activity inputs stored for workflows already in flight (parked at an approval, or
with an activity scheduled), so they resume on the new code. docs/authoring.md, "Migrations of
stored state", walks through it."""
from typing import Any

from django.db import migrations, models

KIND = "test-migrating"


def _renamed(value: Any, old: str, new: str) -> Any:
    if isinstance(value, dict) and old in value and new not in value:
        return {(new if k == old else k): v for k, v in value.items()}
    return value


def _reshape(apps: Any, old: str, new: str) -> None:
    Workflow = apps.get_model("workflows", "Workflow")
    Checkpoint = apps.get_model("workflows", "Checkpoint")
    Activity = apps.get_model("workflows", "Activity")
    unfinished = ("created", "running", "waiting", "paused", "cancelling")
    for workflow in Workflow.objects.filter(kind=KIND, status__in=unfinished).iterator():
        state = dict(workflow.state)
        if "ticket" in state:
            state["ticket"] = _renamed(state["ticket"], old, new)
            # .update(): the status field is protected (django-fsm), and only the state changes.
            Workflow.objects.filter(pk=workflow.pk).update(state=state)
        # The current visit's entry state, which `agent replay-check` replays from.
        if workflow.checkpoint_id is not None:
            checkpoint = Checkpoint.objects.get(pk=workflow.checkpoint_id)
            if "ticket" in checkpoint.state:
                Checkpoint.objects.filter(pk=checkpoint.pk).update(
                    state={**checkpoint.state, "ticket": _renamed(checkpoint.state["ticket"], old, new)})
        # Inputs fixed at scheduling, decoded by the new activity code when an attempt starts.
        for activity in Activity.objects.filter(workflow_id=workflow.pk, name="test_migrating_notify",
                                                status__in=("scheduled", "running")):
            Activity.objects.filter(pk=activity.pk).update(input=_renamed(activity.input, old, new))


def forward(apps: Any, schema_editor: Any) -> None:
    _reshape(apps, "email", "contact_email")


def backward(apps: Any, schema_editor: Any) -> None:
    _reshape(apps, "contact_email", "email")


class Migration(migrations.Migration):
    dependencies = [
        ("migrating_kind", "0001_initial"),
        ("workflows", "0007_api_token"),
    ]

    operations = [
        migrations.RenameField(model_name="contact", old_name="email", new_name="contact_email"),
        migrations.AlterField(
            model_name="contact", name="contact_email",
            field=models.EmailField(help_text="Address the notification went to (``email`` before 0002).",
                                    max_length=254),
        ),
        migrations.RunPython(forward, backward),
    ]
