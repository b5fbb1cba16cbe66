"""The one source of time for the durable plane; tests move it with time-machine."""
from datetime import datetime

from django.utils import timezone


def now() -> datetime:
    return timezone.now()
