"""The Celery app: configuration from Django settings under the CELERY_ namespace."""
import os

from celery import Celery

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "agentops.settings")

app = Celery("agentops", include=["tasks.activities", "tasks.workflows", "tasks.beat"])
app.config_from_object("django.conf:settings", namespace="CELERY")
