"""Installations get an id of their own (created here, once), part of every idempotency key sent out;
client launches and supersedes take an idempotency key.

Activities scheduled before this migration keep an empty ``idempotency_key``: they go on sending
their operation id, the key an attempt of theirs may already have sent.
"""
import uuid

import django.db.models.deletion
from django.conf import settings
from django.db import migrations, models


def installation_create(apps, schema_editor):
    """The installation's row, made once; a database migrated again keeps the one it has."""
    Installation = apps.get_model("workflows", "Installation")
    from django.utils import timezone

    Installation.objects.get_or_create(id=1, defaults={"installation_id": uuid.uuid4().hex,
                                                       "created_at": timezone.now()})


class Migration(migrations.Migration):

    dependencies = [
        ('workflows', '0010_pause_cause_definition'),
        migrations.swappable_dependency(settings.AUTH_USER_MODEL),
    ]

    operations = [
        migrations.AddField(
            model_name='activity',
            name='idempotency_key',
            field=models.CharField(blank=True, help_text='The key sent to external systems: the installation id, then the operation id, fixed when the activity is scheduled. Empty for activities scheduled before installations had ids: they send their operation id, as they always did.', max_length=240),
        ),
        migrations.AlterField(
            model_name='activity',
            name='operation_id',
            field=models.CharField(help_text='Stable identity across attempts and workers, within this installation.', max_length=200, unique=True),
        ),
        migrations.CreateModel(
            name='Installation',
            fields=[
                ('id', models.PositiveSmallIntegerField(default=1, editable=False, help_text='Always 1: there is one row.', primary_key=True, serialize=False)),
                ('installation_id', models.CharField(editable=False, help_text='Random hex (a UUID4), made once: the prefix of the idempotency keys this installation sends.', max_length=32, unique=True)),
                ('created_at', models.DateTimeField(help_text='When this installation was first migrated or used.')),
            ],
            options={
                'constraints': [models.CheckConstraint(condition=models.Q(('id', 1)), name='installation_singleton')],
            },
        ),
        migrations.CreateModel(
            name='ClientRequest',
            fields=[
                ('id', models.BigAutoField(auto_created=True, primary_key=True, serialize=False, verbose_name='ID')),
                ('operation', models.CharField(choices=[('launch', 'Launch'), ('supersede', 'Supersede')], help_text='What the request asked.', max_length=12)),
                ('key', models.CharField(help_text="The client's idempotency key (Idempotency-Key header, --idempotency-key).", max_length=200)),
                ('fingerprint', models.CharField(help_text="SHA-256 of the request's body as the service received it; the same key with another body is refused.", max_length=64)),
                ('intent_version', models.PositiveIntegerField(blank=True, help_text='The intent version a supersede made (empty for a launch).', null=True)),
                ('created_at', models.DateTimeField(help_text='When the request was first applied.')),
                ('requested_by', models.ForeignKey(blank=True, help_text='Who sent it.', null=True, on_delete=django.db.models.deletion.SET_NULL, related_name='+', to=settings.AUTH_USER_MODEL)),
                ('workflow', models.ForeignKey(blank=True, help_text='The workflow launched, or whose goal was superseded.', null=True, on_delete=django.db.models.deletion.CASCADE, related_name='client_requests', to='workflows.workflow')),
            ],
            options={
                'constraints': [models.UniqueConstraint(fields=('operation', 'key'), name='uniq_client_request_key')],
            },
        ),
        migrations.RunPython(installation_create, migrations.RunPython.noop),
    ]
