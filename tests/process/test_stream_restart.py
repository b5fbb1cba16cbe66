"""A stream client written from docs/live.md follows a workflow across restarts of a real web server:
every event arrives exactly once, in order, while events keep being recorded."""
from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import threading
import time
import urllib.request
from pathlib import Path
from typing import Any

import pytest
from django.db import connection, transaction

from tests.api.conftest import grant, token_for
from tests.process.harness import REPO_ROOT, launch_release
from workflows import clock
from workflows.models import Workflow
from workflows.services.common import event_record, workflow_lock
from workflows.testing.cluster import free_port, subprocess_database_url, wait_for

pytestmark = [pytest.mark.process, pytest.mark.django_db(transaction=True)]

DOC = REPO_ROOT / "docs" / "live.md"


class WebServer:
    """The documented production server (`gunicorn -c python:agentops.gunicorn`, gthread workers: a
    stream holds a thread) on one port, started and killed by the test."""

    def __init__(self, port: int, log: Path) -> None:
        self.port, self.log = port, log
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self) -> None:
        env = {k: v for k, v in os.environ.items() if not k.startswith(("DATABASE_URL", "AGENTOPS_"))}
        env.update(DATABASE_URL=subprocess_database_url(), AGENTOPS_STREAM_POLL_SECONDS="0.1",
                   AGENTOPS_VAR_DIR=str(self.log.parent / "var"), PYTHONUNBUFFERED="1",
                   AGENTOPS_WEB_BIND=f"127.0.0.1:{self.port}", AGENTOPS_WEB_WORKERS="1", AGENTOPS_WEB_THREADS="4",
                   AGENTOPS_WEB_GRACEFUL_SECONDS="3")
        with open(self.log, "ab") as out:
            self.proc = subprocess.Popen([sys.executable, "-m", "gunicorn", "-c", "python:agentops.gunicorn"],
                                         cwd=REPO_ROOT, env=env, stdout=out, stderr=out, start_new_session=True)
        wait_for(self.answers, timeout=30, what="the web server to answer")

    def answers(self) -> bool:
        try:
            urllib.request.urlopen(f"http://127.0.0.1:{self.port}/api/openapi.json", timeout=1).close()
            return True
        except OSError:
            return False

    def stop(self, sig: int) -> None:
        if self.proc and self.proc.poll() is None:
            os.killpg(self.proc.pid, sig)
            self.proc.wait(15)


def doc_client(tmp_path: Path) -> Path:
    block = re.search(r"### A Python client\n.*?```python\n(.*?)```", DOC.read_text(), re.S)
    assert block is not None, "docs/live.md has no Python client"
    path = tmp_path / "follow.py"
    path.write_text(block.group(1))
    return path


def test_the_documented_client_gets_every_event_once_across_web_server_restarts(
    process_broker: Any, git_repo: Path, requester: Any, tmp_path: Path, figures: Any
) -> None:
    """Events are recorded all along; the server is killed (SIGKILL) and stopped (SIGTERM) under the
    client, which reconnects with Last-Event-ID; it prints seqs 1..N, each once."""
    grant(requester, "view_workflow")
    token = token_for(requester.username)
    workflow_id = launch_release(git_repo, requester, "Publish release notes")
    server = WebServer(free_port(), tmp_path / "web.log")
    server.start()
    client = subprocess.Popen([sys.executable, str(doc_client(tmp_path)), f"http://127.0.0.1:{server.port}",
                               str(workflow_id)], env={**os.environ, "AGENTOPS_TOKEN": token},
                              stdout=subprocess.PIPE, stderr=open(tmp_path / "client.err", "wb"))  # noqa: SIM115
    printed: list[dict[str, Any]] = []
    reader = threading.Thread(target=lambda: printed.extend(json.loads(line) for line in client.stdout or ()))
    reader.start()

    def write(count: int) -> None:
        for n in range(count):
            with transaction.atomic():
                event_record(workflow=workflow_lock(workflow_id), kind="test.tick", at=clock.now(), n=n)
            time.sleep(0.02)
        connection.close()

    try:
        writer = threading.Thread(target=write, args=(150,))
        writer.start()
        wait_for(lambda: len(printed) >= 20, timeout=30, what="the client's first events")
        server.stop(signal.SIGKILL)
        time.sleep(1)  # events are recorded while no server runs
        server.start()
        wait_for(lambda: len(printed) >= 80, timeout=30, what="events after the first restart")
        server.stop(signal.SIGTERM)
        server.start()
        writer.join()
        final = Workflow.objects.get(pk=workflow_id).event_seq
        wait_for(lambda: len(printed) >= final, timeout=30, what="every event")
        time.sleep(0.5)  # anything sent twice would arrive now
    finally:
        client.kill()
        client.wait()
        reader.join(5)
        server.stop(signal.SIGTERM)
    reconnects = (tmp_path / "client.err").read_text().count("reconnecting after event")
    assert [e["seq"] for e in printed] == list(range(1, final + 1))
    assert reconnects >= 2
    figures("stream across restarts", events=final, reconnects=reconnects)
