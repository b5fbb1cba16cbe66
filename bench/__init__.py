"""Benchmarks of agentops against plain Celery and DBOS, run by ``make bench`` (``python -m bench``)."""
