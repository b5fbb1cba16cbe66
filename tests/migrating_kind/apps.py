from django.apps import AppConfig


class MigratingKindConfig(AppConfig):
    name = "tests.migrating_kind"
    label = "migrating_kind"
    default_auto_field = "django.db.models.BigAutoField"
