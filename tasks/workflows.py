"""Celery entry point for advancing a workflow."""
from celery import shared_task


@shared_task(name="agentops.workflow.advance", acks_late=True)
def workflow_advance(workflow_id: int) -> str:
    from workflows import services

    return services.workflow_advance_if_runnable(workflow_id=workflow_id).value


@shared_task(name="agentops.workflow.children_collect", acks_late=True)
def workflow_children_collect(workflow_id: int) -> int:
    from workflows.services.children import children_collect_if_finished

    return children_collect_if_finished(workflow_id=workflow_id)
