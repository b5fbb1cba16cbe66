"""Bench-only Celery tasks: the no-op steps of the plain Celery chain baseline."""
from __future__ import annotations

import time

from celery import shared_task

CHAIN_DONE_KEY = "bench:chain_done"
_redis = None


@shared_task(name="bench.chain.step")
def chain_step(chain: int, step: int) -> None:
    """A no-op step (the chain itself sends the next one)."""


@shared_task(name="bench.chain.last")
def chain_last(chain: int, step: int) -> None:
    """The last step: push the finishing time, so the run knows when every chain is done."""
    global _redis
    if _redis is None:
        import redis
        from django.conf import settings

        _redis = redis.Redis.from_url(settings.CELERY_BROKER_URL)
    _redis.rpush(CHAIN_DONE_KEY, f"{time.time():.6f}")
