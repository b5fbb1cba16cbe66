"""`manage.py healthcheck`: the health checks of compose's web and beat say healthy only when the
process answers (web, as a client of its public name) or ticks (beat), and say why otherwise."""
from __future__ import annotations

import datetime as dt
import http.server
import re
import threading
from collections.abc import Iterator
from typing import Any

import pytest
from django.core.management import CommandError, call_command
from django_celery_beat.models import IntervalSchedule, PeriodicTask

from workflows import clock


class Answers:
    """A stand-in for gunicorn: answers every GET with `status` and records the request's headers."""

    def __init__(self) -> None:
        self.status = 200
        self.seen: list[dict[str, str]] = []
        answers = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_GET(self) -> None:  # noqa: N802 (http.server's name)
                answers.seen.append({"path": self.path, **dict(self.headers.items())})
                self.send_response(answers.status)
                self.send_header("Content-Length", "0")
                self.end_headers()

            def log_message(self, *args: Any) -> None:
                pass

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"


@pytest.fixture
def web() -> Iterator[Answers]:
    answers = Answers()
    thread = threading.Thread(target=answers.server.serve_forever, daemon=True)
    thread.start()
    yield answers
    answers.server.shutdown()
    answers.server.server_close()


def check(*args: str) -> str:
    from io import StringIO

    out = StringIO()
    call_command("healthcheck", *args, stdout=out)
    return out.getvalue()


def test_web_is_healthy_when_the_login_page_answers_200_to_the_allowed_host(web, settings):
    settings.ALLOWED_HOSTS = [".example.com", "agentops.example.com"]
    settings.SECURE_PROXY_SSL_HEADER = None
    assert "web answered 200" in check("web", "--url", web.url)
    assert web.seen[-1]["path"] == "/admin/login/"
    assert web.seen[-1]["Host"] == "example.com"
    assert "X-Forwarded-Proto" not in web.seen[-1]


def test_web_behind_a_proxy_is_asked_as_the_proxy_asks(web, settings):
    """DJANGO_BEHIND_PROXY with DJANGO_HTTPS: the check says https, as the proxy would, so it is not redirected."""
    settings.ALLOWED_HOSTS = ["*"]
    settings.SECURE_PROXY_SSL_HEADER = ("HTTP_X_FORWARDED_PROTO", "https")
    check("web", "--url", web.url)
    assert web.seen[-1]["X-Forwarded-Proto"] == "https" and web.seen[-1]["Host"] == "localhost"


def test_the_https_redirect_counts_only_where_the_settings_redirect(web, settings):
    web.status = 301
    settings.SECURE_SSL_REDIRECT = True
    assert "web answered 301" in check("web", "--url", web.url)
    settings.SECURE_SSL_REDIRECT = False
    with pytest.raises(CommandError, match="web answered 301 .*expected 200"):
        check("web", "--url", web.url)


@pytest.mark.parametrize("status", [400, 500, 503])
def test_web_answering_an_error_is_unhealthy(web, status):
    web.status = status
    with pytest.raises(CommandError, match=f"web answered {status} to GET .*/admin/login/ \\(Host: "):
        check("web", "--url", web.url)


def test_web_not_listening_is_unhealthy(web):
    url = web.url
    web.server.shutdown()
    web.server.server_close()
    with pytest.raises(CommandError, match=f"web does not answer at {url}"):
        check("web", "--url", url, "--timeout", "2")


def test_web_refuses_an_address_that_is_not_http():
    with pytest.raises(CommandError, match="must be an http:// address"):
        check("web", "--url", "https://127.0.0.1:8000")


def beat_ran(ago: dt.timedelta | None) -> None:
    every, _ = IntervalSchedule.objects.get_or_create(every=2, period=IntervalSchedule.SECONDS)
    PeriodicTask.objects.create(name=f"sweep {ago}", task="agentops.beat.sweep", interval=every,
                                last_run_at=None if ago is None else clock.now() - ago)


@pytest.mark.django_db
def test_beat_is_healthy_while_it_writes_its_last_runs():
    beat_ran(dt.timedelta(hours=2))
    beat_ran(dt.timedelta(seconds=170))
    assert re.search(r"beat ran a periodic task 17\d s ago", check("beat"))


@pytest.mark.django_db
def test_beat_that_stopped_ticking_is_unhealthy_and_says_since_when():
    beat_ran(dt.timedelta(seconds=700))
    with pytest.raises(CommandError, match=r"beat last ran a periodic task 70\d s ago .*more than 600 s"):
        check("beat")
    assert re.search(r"70\d s ago", check("beat", "--max-age-seconds", "800"))


@pytest.mark.django_db
def test_beat_that_never_ran_is_unhealthy():
    PeriodicTask.objects.all().delete()
    beat_ran(None)
    with pytest.raises(CommandError, match="beat has run no periodic task yet"):
        check("beat")
