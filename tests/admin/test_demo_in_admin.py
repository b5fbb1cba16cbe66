"""`manage.py demo --approve-in-admin`: a new user approves the demo agent in the admin and it finishes."""
from __future__ import annotations

import http.cookiejar
import os
import re
import subprocess
import sys
import time
import urllib.parse
import urllib.request
from pathlib import Path

import pytest

from agentops.management.commands.demo import free_port

REPO = Path(__file__).resolve().parents[2]


class Browser:
    """Just enough of a browser for Django's admin: cookies, CSRF tokens from forms, form POSTs."""

    def __init__(self, base: str) -> None:
        self.base = base
        self.opener = urllib.request.build_opener(urllib.request.HTTPCookieProcessor(http.cookiejar.CookieJar()))

    def get(self, path: str) -> str:
        with self.opener.open(self.base + path, timeout=10) as response:
            return response.read().decode()

    def post(self, path: str, form: dict[str, str], *, page: str) -> str:
        token = re.search(r'name="csrfmiddlewaretoken" value="([^"]+)"', page).group(1)
        data = urllib.parse.urlencode({"csrfmiddlewaretoken": token, **form}).encode()
        request = urllib.request.Request(self.base + path, data=data, headers={"Referer": self.base + path})
        with self.opener.open(request, timeout=10) as response:
            return response.read().decode()


def wait_for_line(process: subprocess.Popen[str], pattern: str, timeout: float, seen: list[str]) -> re.Match[str]:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        line = process.stdout.readline()
        if not line and process.poll() is not None:
            break
        seen.append(line)
        if match := re.search(pattern, line):
            return match
    raise AssertionError(f"no line matching {pattern!r} in:\n{''.join(seen)[-3000:]}")


@pytest.mark.process
def test_a_new_user_approves_the_demo_agent_in_the_admin_and_watches_it_finish(tmp_path: Path) -> None:
    env = {k: v for k, v in os.environ.items() if k not in ("DATABASE_URL", "CELERY_BROKER_URL")}
    env.update(AGENTOPS_VAR_DIR=str(tmp_path / "var"), PYTHONUNBUFFERED="1", COLUMNS="200")
    manage = [sys.executable, "manage.py"]
    subprocess.run([*manage, "migrate", "--verbosity", "0"], cwd=REPO, env=env, check=True, timeout=120)
    port = free_port()
    demo = subprocess.Popen([*manage, "demo", "--approve-in-admin", "--web-port", str(port), "--timeout", "90"],
                            cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            start_new_session=True)
    seen: list[str] = []
    try:
        login = wait_for_line(demo, r"Approve it in the admin.*(/admin/\S+) as (\S+), password (\S+)", 60, seen)
        queue, username, password = login.groups()
        wait_for_line(demo, r"wait\.opened", 60, seen)
        browser = Browser(f"http://127.0.0.1:{port}")
        for _ in range(50):  # the admin's server starts beside the demo
            try:
                page = browser.get(f"/admin/login/?next={queue}")
                break
            except OSError:
                time.sleep(0.2)
        page = browser.post(f"/admin/login/?next={queue}", {"username": username, "password": password}, page=page)
        decide = re.search(r'<form method="post" action="([^"]+)" class="ao-decide">', page).group(1)
        candidate_hash = re.search(r'name="candidate_hash" value="([0-9a-f]{64})"', page).group(1)

        page = browser.post(decide, {"decision": "approve", "candidate_hash": candidate_hash, "comment": "ok"},
                            page=page)

        assert re.search(r"Wait \d+ approved by demo-approver\.", page)
        out, _ = demo.communicate(timeout=90)
        seen.append(out)
        assert demo.returncode == 0, "".join(seen)[-3000:]
        assert "completed" in out and "wait.approved" in out
    finally:
        if demo.poll() is None:
            os.killpg(demo.pid, 15)
            demo.wait(timeout=30)
