"""The Celery app: configuration from Django settings under the CELERY_ namespace."""
import os
import sys
from typing import Any

from celery import Celery, signals

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "agentops.settings")

app = Celery("agentops", include=["tasks.activities", "tasks.workflows", "tasks.beat"])
app.config_from_object("django.conf:settings", namespace="CELERY")
# Celery's Django fixup closes every database connection around every task unless this is set,
# whatever CONN_MAX_AGE says; it is set out of reach so that the handler below decides instead.
app.conf.CELERY_DB_REUSE_MAX = sys.maxsize


@signals.task_prerun.connect
@signals.task_postrun.connect
def recycle_db_connections(sender: Any = None, **_: Any) -> None:
    """Treat each task as Django treats a request: close connections that broke or outlived
    CONN_MAX_AGE, and health-check a kept one before its first query (CONN_HEALTH_CHECKS)."""
    if getattr(getattr(sender, "request", None), "is_eager", False):
        return  # an eager task runs inside its caller's transaction
    from django.db import close_old_connections

    close_old_connections()
