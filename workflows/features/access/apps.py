"""The access feature as a Django app, so the admin finds its token pages (``admin.py``) as it finds
any app's; its rows are the kernel's (``workflows.models``), under the kernel's app label."""
from django.apps import AppConfig


class AccessConfig(AppConfig):
    name = "workflows.features.access"
    label = "agentops_access"
    verbose_name = "Access"
