"""The Celery app: configuration from Django settings under the CELERY_ namespace."""
import gc
import logging
import os
import sys
from typing import Any

from celery import Celery, signals

from workflows import doorbells

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "agentops.settings")

app = Celery("agentops", include=["tasks.activities", "tasks.workflows", "tasks.beat", "tasks.webhooks"])
app.config_from_object("django.conf:settings", namespace="CELERY")
# Celery's Django fixup closes every database connection around every task unless this is set,
# whatever CONN_MAX_AGE says; it is set out of reach so that the handler below decides instead.
app.conf.CELERY_DB_REUSE_MAX = sys.maxsize
doorbells.publisher_register(app)


@signals.task_prerun.connect
@signals.task_postrun.connect
def recycle_db_connections(sender: Any = None, **_: Any) -> None:
    """Treat each task as Django treats a request: close connections that broke or outlived
    CONN_MAX_AGE, and health-check a kept one before its first query (CONN_HEALTH_CHECKS)."""
    if getattr(getattr(sender, "request", None), "is_eager", False):
        return  # an eager task runs inside its caller's transaction
    from django.db import close_old_connections

    close_old_connections()


@signals.worker_init.connect
def mark_worker_process(sender: Any = None, **_: Any) -> None:
    """This process (and the pool it forks) runs activities: its own settings are the current
    release. On a threads pool, I/O-bound activities chain for AGENTOPS_IO_ACTIVITY_CHAIN_SECONDS
    and AGENTOPS_IO_ENGINE_THREADS threads run the engine's bookkeeping at once (``workflows.lane``)."""
    from celery.concurrency import get_implementation
    from celery.concurrency.thread import TaskPool as ThreadsPool
    from django.conf import settings

    from workflows import lane
    from workflows.services import activities, common

    common.in_worker = True
    if settings.AGENTOPS_MODEL_PROVIDER == "anthropic":
        # The SDK takes seconds to import: once here, before the pool forks, not in a first model call.
        import agentops.providers.anthropic  # noqa: F401
    pool = get_implementation(getattr(sender, "pool_cls", None) or "prefork")
    if isinstance(pool, type) and issubclass(pool, ThreadsPool):
        activities.io_chain_seconds = settings.AGENTOPS_IO_ACTIVITY_CHAIN_SECONDS
        lane.configure(settings.AGENTOPS_IO_ENGINE_THREADS)


@signals.worker_ready.connect
@signals.worker_process_init.connect
def settle_the_heap(**_: Any) -> None:
    """A worker process's start (the main process, whose threads pool runs the tasks; a prefork
    pool's child): what it imported and built so far lives as long as the process, so the cyclic
    garbage collector's passes skip it from now on (``gc.freeze``), and its youngest generation
    is collected every AGENTOPS_WORKER_GC_THRESHOLD allocations (0: Python's defaults, nothing frozen)."""
    from django.conf import settings

    threshold = settings.AGENTOPS_WORKER_GC_THRESHOLD
    if not threshold:
        return
    gc.collect()
    gc.freeze()
    gc.set_threshold(threshold, *gc.get_threshold()[1:])


@signals.worker_shutting_down.connect
def stop_chaining(**_: Any) -> None:
    """A warm shutdown waits for running tasks: let each finish its activity, not its chain."""
    from workflows.services import activities

    activities.shutting_down.set()


@signals.worker_process_shutdown.connect
def export_spans(**_: Any) -> None:
    """A pool process exits without running atexit handlers: export the spans it still buffers."""
    from workflows import telemetry

    telemetry.flush()


@signals.worker_ready.connect
def announce_release(**_: Any) -> None:
    """Say which behavioral release this worker runs, so launches from a shell or the admin record
    it instead of their own settings (``workflows.services.common.release_current``)."""
    from django.db import connection

    from workflows import clock
    from workflows.services.common import release_announce

    try:
        release = release_announce(at=clock.now())
    except Exception:  # a worker that cannot reach the database yet still starts; launches fall back
        logging.getLogger("agentops.celery").warning("release.announce.failed", exc_info=True)
        return
    finally:
        # The main process runs no task that would close it: it would keep the connection idle
        # for good, and on a threads worker hold one of AGENTOPS_DB_POOL_SIZE's for good.
        connection.close()
    logging.getLogger("agentops.celery").info("release.announced", extra={"release": str(release)})


@signals.worker_ready.connect
@signals.beat_init.connect
def sync_declared_schedules(**_: Any) -> None:
    """Bring the schedules declared in code in step with the database and the beat entries
    (docs/authoring.md, "Schedules"); several processes starting at once sync one after another."""
    from workflows.features.schedules.sync import sync_at_start

    sync_at_start()


@signals.worker_ready.connect
def report_isolation(**_: Any) -> None:
    """Say what a model's commands get on this worker: bubblewrap, or why they are refused or not
    isolated (the start-up check agentops.W010-W012, in the worker's log)."""
    from agentops import sandbox

    sandbox.log_isolation()
