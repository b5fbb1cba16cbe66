"""The documented production web tier, as a real server: gunicorn with gthread workers
(agentops/gunicorn.py) against PostgreSQL and Redis.

`runserver` is not the production server: it took 97 of PostgreSQL's 100 connections under 4
clients × 275 launches and answered 75 of them with an HTML 500. Through gunicorn the same load gets
0 errors and the web tier never holds more than workers × threads connections. Schemathesis, run
against this server from the OpenAPI document, finds no failure."""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import psycopg
import pytest
from django.contrib.auth.models import User

from tests.conftest import make_git_repo, release_params
from tests.process.harness import REPO_ROOT, Broker, subprocess_database_url
from workflows.features.access.tokens import api_token_create
from workflows.models import Workflow
from workflows.testing.cluster import free_port

pytestmark = [pytest.mark.process, pytest.mark.django_db(transaction=True)]

WORKERS, THREADS = 2, 4
APP_NAME = "agentops-web-test"  # PGAPPNAME of the server's connections, so that they can be counted
SCHEMATHESIS_CONFIG = Path(__file__).with_name("schemathesis.toml")


@dataclass
class Server:
    url: str
    proc: subprocess.Popen[bytes]
    log: Path

    def tail(self, lines: int = 80) -> str:
        return "\n".join(self.log.read_text(errors="replace").splitlines()[-lines:])


@pytest.fixture
def web(process_broker: Broker, tmp_path: Path) -> Iterator[Server]:
    """`gunicorn -c python:agentops.gunicorn` as README's production section runs it, on a free port."""
    port = free_port()
    env = {k: v for k, v in os.environ.items() if not k.startswith(("AGENTOPS_", "DJANGO_"))}
    env.update(DATABASE_URL=subprocess_database_url(), CELERY_BROKER_URL=process_broker.url, PGAPPNAME=APP_NAME,
               AGENTOPS_WEB_BIND=f"127.0.0.1:{port}", AGENTOPS_WEB_WORKERS=str(WORKERS),
               AGENTOPS_WEB_THREADS=str(THREADS), AGENTOPS_LOG_LEVEL="INFO",
               AGENTOPS_WEBHOOK_SECRETS="ci=ci-shared-secret-0123456789abcdef0123",
               # An event stream ends after this long (docs/live.md): schemathesis calls the stream routes too.
               AGENTOPS_STREAM_MAX_SECONDS="0.5", AGENTOPS_STREAM_POLL_SECONDS="0.1")
    log = tmp_path / "gunicorn.log"
    with log.open("wb") as out:
        proc = subprocess.Popen([sys.executable, "-m", "gunicorn", "-c", "python:agentops.gunicorn"], cwd=REPO_ROOT,
                                env=env, stdout=out, stderr=subprocess.STDOUT)
    server = Server(f"http://127.0.0.1:{port}", proc, log)
    deadline = time.monotonic() + 30
    while True:
        try:
            urllib.request.urlopen(f"{server.url}/api/openapi.json", timeout=2).read()
            break
        except (OSError, urllib.error.URLError):
            if proc.poll() is not None or time.monotonic() > deadline:
                raise AssertionError(f"gunicorn did not start:\n{server.tail()}") from None
            time.sleep(0.2)
    try:
        yield server
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def server_connections(database_url: str) -> int:
    with psycopg.connect(database_url, autocommit=True) as conn:
        row = conn.execute("SELECT count(*) FROM pg_stat_activity WHERE application_name = %s", [APP_NAME]).fetchone()
    return int(row[0]) if row else 0


def test_four_clients_times_275_launches_get_no_error_within_the_connection_bound(
        web: Server, tmp_path: Path, figures: Any) -> None:
    user = User.objects.create_superuser("load", password="load-password")
    token = api_token_create(user=user).secret
    body = json.dumps({"kind": "release", "goal": "Publish release notes",
                       "params": release_params(make_git_repo(tmp_path / "repo"))}).encode()
    clients, per_client = 4, 275
    statuses: list[int] = []
    peak, done = 0, threading.Event()
    url = subprocess_database_url()

    def sample() -> None:
        nonlocal peak
        while not done.is_set():
            peak = max(peak, server_connections(url))
            time.sleep(0.05)

    def client() -> None:
        for _ in range(per_client):
            request = urllib.request.Request(f"{web.url}/api/workflows", data=body, method="POST", headers={
                "Authorization": f"Bearer {token}", "Content-Type": "application/json"})
            try:
                with urllib.request.urlopen(request, timeout=60) as answer:
                    statuses.append(answer.status)
            except urllib.error.HTTPError as exc:
                statuses.append(exc.code)
            except OSError:
                statuses.append(0)

    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    started = time.monotonic()
    threads = [threading.Thread(target=client) for _ in range(clients)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    elapsed = time.monotonic() - started
    done.set()
    sampler.join()
    errors = [s for s in statuses if s != 201]
    figures("web tier 4 clients x 275 launches (gunicorn gthread)", launches=len(statuses), errors=len(errors),
            seconds=round(elapsed, 1), launches_per_s=round(len(statuses) / elapsed, 1),
            peak_connections=peak, bound=WORKERS * THREADS)
    assert not errors, (errors[:10], web.tail())
    assert Workflow.objects.count() == clients * per_client
    assert 0 < peak <= WORKERS * THREADS
    # Nothing else is starved: this process opens a connection of its own while the server holds its.
    assert server_connections(url) <= WORKERS * THREADS


def test_schemathesis_finds_no_failure_against_the_live_server(web: Server, tmp_path: Path, figures: Any) -> None:
    """Every check of schemathesis (tests/process/schemathesis.toml says the one exception and why), a bounded
    number of examples per operation so that it stays under about a minute."""
    user = User.objects.create_superuser("fuzz", password="fuzz-password")
    token = api_token_create(user=user).secret
    started = time.monotonic()
    run = subprocess.run(
        [sys.executable, "-m", "schemathesis.cli", "--config-file", str(SCHEMATHESIS_CONFIG), "run",
         f"{web.url}/api/openapi.json", "--header", f"Authorization: Bearer {token}", "--checks", "all",
         "--max-examples", "10", "--seed", "26", "--request-timeout", "30",
         "--report", "junit", "--report-dir", str(tmp_path)],
        cwd=tmp_path, capture_output=True, text=True, timeout=600)
    summary = [line for line in run.stdout.splitlines() if "generated" in line or "passed" in line or "failure" in line]
    figures("schemathesis against gunicorn", seconds=round(time.monotonic() - started, 1),
            summary=" | ".join(s.strip() for s in summary[-3:]))
    assert run.returncode == 0, run.stdout[-6000:] + run.stderr[-2000:] + web.tail(40)
    # The server logged no 500: every answer was a documented one.
    assert "api.internal_error" not in web.log.read_text(errors="replace")
