"""Celery entry point for activity attempts."""
import os

from celery import Task, shared_task


@shared_task(name="agentops.activity.run", bind=True, acks_late=True)
def activity_run(self: Task, activity_id: int) -> str:
    from workflows import services

    worker = f"{self.request.hostname}:{os.getpid()}"
    outcome = services.activity_run_if_runnable(activity_id=activity_id, worker=worker, task_id=self.request.id or "")
    return outcome.value
