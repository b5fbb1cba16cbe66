"""agentops: a durable runtime for long-lived AI agents."""
from agentops.celery import app as celery_app

__all__ = ["celery_app"]
