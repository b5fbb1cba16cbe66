"""Every message agentops sends, one function each; all are sent after the transaction commits.

A doorbell says "look at row X now". Publishing happens after COMMIT, so a crash or a
broker outage at that moment loses the message but never the state: the beat sweeps in
``workflows.services.sweeps`` re-ring anything runnable whose doorbell went missing.
"""
from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any

from django.core.exceptions import ImproperlyConfigured
from django.db import transaction

if TYPE_CHECKING:
    from celery import Celery

logger = logging.getLogger("agentops.doorbells")

_publisher: Celery | None = None


def publisher_register(app: Celery) -> None:
    """Send every doorbell with ``app``: the project's Celery app registers itself when it is built
    (``agentops/celery.py``), so the kernel never imports the project, and another Celery app made
    in the same process (a benchmark's, a test's) does not take its place as ``current_app`` would."""
    global _publisher
    _publisher = app


def publisher() -> Celery:
    """The Celery app doorbells are sent with."""
    if _publisher is None:
        raise ImproperlyConfigured(
            "No Celery app sends agentops' doorbells: import the project's Celery app (agentops.celery, which "
            "the agentops package imports) before the first workflow is launched.")
    return _publisher


def _publish_on_commit(task_name: str, queue: str | None = None, **kwargs: Any) -> None:
    def publish() -> None:
        app = publisher()
        try:
            app.send_task(task_name, kwargs=kwargs, queue=queue)
        except Exception:
            # The row is committed; the beat sweep re-rings it once the broker is back.
            logger.warning("doorbell.publish_failed", extra={"task": task_name, **kwargs}, exc_info=True)

    transaction.on_commit(publish)


def activity_run(*, activity_id: int, name: str) -> None:
    """Ring an attempt of activity ``name``: an I/O-bound one (``@activity(io_bound=True)``) on
    the I/O queue, for the threads-pool workers that keep many waits in flight; others on the
    default queue (prefork workers, one process per core)."""
    _publish_on_commit("agentops.activity.run", queue=activity_queue(name), activity_id=activity_id)


def activity_queue(name: str) -> str:
    """The queue of activity ``name``'s doorbells (an unknown name, e.g. a kind this host does not
    run, goes to the default queue, whose workers record why they cannot run it)."""
    from django.conf import settings

    from workflows import registry
    from workflows.errors import InvalidInput

    try:
        io_bound = registry.activity_type(name).io_bound
    except InvalidInput:
        io_bound = False
    return settings.AGENTOPS_IO_QUEUE if io_bound else settings.CELERY_TASK_DEFAULT_QUEUE


def workflow_advance(*, workflow_id: int) -> None:
    _publish_on_commit("agentops.workflow.advance", workflow_id=workflow_id)


def children_collect(*, workflow_id: int) -> None:
    """A child of workflow ``workflow_id`` ended: deliver its end to the parent."""
    _publish_on_commit("agentops.workflow.children_collect", workflow_id=workflow_id)


def webhook_deliver(*, delivery_id: int, attempt: int) -> None:
    """Send attempt ``attempt`` of an outbound webhook delivery, on the I/O queue: a receiver's
    answer is a wait, like an I/O-bound activity's."""
    from django.conf import settings

    _publish_on_commit("agentops.webhook.deliver", queue=settings.AGENTOPS_IO_QUEUE, delivery_id=delivery_id,
                       attempt=attempt)
