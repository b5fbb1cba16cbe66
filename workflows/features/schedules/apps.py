"""The schedules feature as a Django app, so the admin finds its pages (``admin.py``) as it finds any app's;
its rows are the kernel's (``workflows.models``), under the kernel's app label."""
from django.apps import AppConfig


class SchedulesConfig(AppConfig):
    name = "workflows.features.schedules"
    label = "agentops_schedules"
    verbose_name = "Schedules"
