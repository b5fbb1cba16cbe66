"""Celery entry point for sending one outbound webhook delivery (on the I/O queue)."""
from celery import shared_task


@shared_task(name="agentops.webhook.deliver", acks_late=True)
def webhook_deliver(delivery_id: int, attempt: int) -> str:
    from workflows.features.webhooks import services as hooks

    return hooks.webhook_delivery_send_if_claimed(delivery_id=delivery_id, attempt=attempt).value
