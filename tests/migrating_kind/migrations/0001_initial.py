from django.db import migrations, models


class Migration(migrations.Migration):
    initial = True
    dependencies: list[tuple[str, str]] = []

    operations = [
        migrations.CreateModel(
            name="Contact",
            fields=[
                ("id", models.BigAutoField(auto_created=True, primary_key=True, serialize=False, verbose_name="ID")),
                ("number", models.CharField(help_text="Ticket number.", max_length=40)),
                ("email", models.EmailField(help_text="Address the notification went to.", max_length=254)),
                ("operation_id", models.CharField(help_text="The notify activity that wrote it.", max_length=200,
                                                  unique=True)),
            ],
        ),
    ]
