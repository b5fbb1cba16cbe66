"""Schedules: recurring launches (cron or every N), their occurrences, overlap policies and manual
triggers; their admin pages and `manage.py agent schedule`. Beat fires them (``tasks.beat``)."""
