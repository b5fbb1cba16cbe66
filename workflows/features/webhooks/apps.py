"""The webhooks feature as a Django app, so the admin finds its pages (``admin.py``) as it finds any app's;
its rows are the kernel's (``workflows.models``), under the kernel's app label."""
from django.apps import AppConfig


class WebhooksConfig(AppConfig):
    name = "workflows.features.webhooks"
    label = "agentops_webhooks"
    verbose_name = "Webhooks"
