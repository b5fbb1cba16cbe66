"""`manage.py healthcheck web|beat`: exit 0 when the process answers or ticks, else 1 saying why
(docker-compose.yml's health checks of `web` and `beat`)."""
from __future__ import annotations

import datetime as dt
import http.client
from typing import Any
from urllib.parse import urlsplit

from django.conf import settings
from django.core.management.base import BaseCommand, CommandError, CommandParser

from workflows import clock

# django-celery-beat's DatabaseScheduler writes its entries' last_run_at every 3 minutes (Celery's
# Scheduler.sync_every): a beat that has written none for longer than this has stopped ticking.
BEAT_MAX_AGE_SECONDS = 600
LOGIN_PATH = "/admin/login/"


def host_header() -> str:
    """A Host that DJANGO_ALLOWED_HOSTS accepts, so that a server limited to its public name still
    answers the check instead of refusing it with 400."""
    for host in settings.ALLOWED_HOSTS:
        name = host.lstrip(".")
        if name and name != "*":
            return name
    return "localhost"


def web_check(url: str, *, timeout: float) -> str:
    """GET the admin's login page as a client of the public name would; return what answered, or raise
    CommandError. The redirect of DJANGO_HTTPS counts as an answer: this check speaks plain HTTP to gunicorn."""
    parts = urlsplit(url)
    if parts.scheme != "http" or not parts.hostname:
        raise CommandError(f"--url {url!r} must be an http:// address, e.g. http://127.0.0.1:8000.")
    headers = {"Host": host_header()}
    if settings.SECURE_PROXY_SSL_HEADER:
        # Behind a proxy that terminates TLS, as the proxy would say: otherwise DJANGO_HTTPS redirects.
        headers["X-Forwarded-Proto"] = "https"
    connection = http.client.HTTPConnection(parts.hostname, parts.port or 80, timeout=timeout)
    try:
        connection.request("GET", LOGIN_PATH, headers=headers)
        status = connection.getresponse().status
    except OSError as exc:
        raise CommandError(f"web does not answer at {url}: {exc}.") from None
    finally:
        connection.close()
    if status == 200 or (status in (301, 302) and settings.SECURE_SSL_REDIRECT):
        return f"web answered {status} at {url}{LOGIN_PATH}"
    raise CommandError(f"web answered {status} to GET {url}{LOGIN_PATH} (Host: {headers['Host']}); expected 200.")


def beat_check(*, max_age_seconds: int) -> str:
    """The newest last_run_at beat wrote is at most max_age_seconds old; return it, or raise CommandError."""
    from django.db import DatabaseError
    from django.db.models import Max
    from django_celery_beat.models import PeriodicTask

    try:
        newest: dt.datetime | None = PeriodicTask.objects.aggregate(newest=Max("last_run_at"))["newest"]
    except DatabaseError as exc:
        raise CommandError(f"beat's schedule cannot be read from the database: {str(exc).strip()[:300]}") from None
    if newest is None:
        raise CommandError("beat has run no periodic task yet (no last_run_at in django-celery-beat's table).")
    age = (clock.now() - newest).total_seconds()
    if age > max_age_seconds:
        raise CommandError(f"beat last ran a periodic task {age:.0f} s ago (at {newest.isoformat()}), more than "
                           f"{max_age_seconds} s: it has stopped ticking; restart it.")
    return f"beat ran a periodic task {max(age, 0):.0f} s ago"


class Command(BaseCommand):
    help = ("Check a process for a container's health check: `web` GETs the admin's login page (exit 1 unless it "
            "answers 200, or the https redirect of DJANGO_HTTPS); `beat` reads when beat last ran a periodic task "
            f"(exit 1 if never or longer ago than --max-age-seconds, default {BEAT_MAX_AGE_SECONDS}).")
    # Run every few seconds by Docker: the process it checks ran the system checks when it started.
    requires_system_checks: list[str] = []

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("process", choices=["web", "beat"], help="what to check")
        parser.add_argument("--url", default="http://127.0.0.1:8000", help="web: where gunicorn listens")
        parser.add_argument("--timeout", type=float, default=5.0, help="web: seconds to wait for the answer")
        parser.add_argument("--max-age-seconds", type=int, default=BEAT_MAX_AGE_SECONDS,
                            help="beat: the oldest last run that still counts as ticking")

    def handle(self, *args: Any, **options: Any) -> None:
        if options["process"] == "web":
            self.stdout.write(web_check(options["url"], timeout=options["timeout"]))
        else:
            self.stdout.write(beat_check(max_age_seconds=options["max_age_seconds"]))
