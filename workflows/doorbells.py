"""Every message agentops sends, one function each; all are sent after the transaction commits.

A doorbell says "look at row X now". Publishing happens after COMMIT, so a crash or a
broker outage at that moment loses the message but never the state: the beat sweeps in
``workflows.services.sweeps`` re-ring anything runnable whose doorbell went missing.
"""
from __future__ import annotations

import logging
from typing import Any

from django.db import transaction

logger = logging.getLogger("agentops.doorbells")


def _publish_on_commit(task_name: str, **kwargs: Any) -> None:
    def publish() -> None:
        from agentops.celery import app

        try:
            app.send_task(task_name, kwargs=kwargs)
        except Exception:
            # The row is committed; the beat sweep re-rings it once the broker is back.
            logger.warning("doorbell.publish_failed", extra={"task": task_name, **kwargs}, exc_info=True)

    transaction.on_commit(publish)


def activity_run(*, activity_id: int) -> None:
    _publish_on_commit("agentops.activity.run", activity_id=activity_id)


def workflow_advance(*, workflow_id: int) -> None:
    _publish_on_commit("agentops.workflow.advance", workflow_id=workflow_id)
