"""Safe by default outside the demo: DEBUG off, the admin's static files still served, and
`manage.py check --deploy` clean with the production settings docs/operators.md lists."""
from __future__ import annotations

import os
import secrets
import subprocess
import sys
from pathlib import Path

import pytest
from django.conf import settings

REPO = Path(__file__).resolve().parents[1]


def check_deploy(tmp_path: Path, **env: str) -> subprocess.CompletedProcess[str]:
    clean = {k: v for k, v in os.environ.items() if not k.startswith(("DJANGO_", "DATABASE_URL"))}
    return subprocess.run(
        [sys.executable, "manage.py", "check", "--deploy", "--fail-level", "WARNING"], cwd=REPO, text=True,
        capture_output=True, timeout=120, check=False,
        env={**clean, "DATABASE_URL": f"sqlite:///{tmp_path / 'db.sqlite3'}", **env},
    )


def test_debug_is_off_unless_asked_for():
    assert settings.DEBUG is False
    assert "DEBUG = env_bool(\"DJANGO_DEBUG\", False)" in (REPO / "agentops" / "settings.py").read_text()


def test_the_documented_production_settings_pass_check_deploy(tmp_path):
    done = check_deploy(tmp_path, DJANGO_SECRET_KEY=secrets.token_urlsafe(50), DJANGO_HTTPS="true",
                        DJANGO_ALLOWED_HOSTS="agentops.example.com")
    assert done.returncode == 0, done.stdout + done.stderr
    assert "no issues" in done.stdout
    operators = (REPO / "docs" / "operators.md").read_text()
    for name in ("DJANGO_SECRET_KEY", "DJANGO_HTTPS", "DJANGO_ALLOWED_HOSTS", "check --deploy"):
        assert name in operators, name


def test_the_demo_defaults_are_refused_by_check_deploy(tmp_path):
    done = check_deploy(tmp_path)
    assert done.returncode != 0
    assert "security.W009" in done.stderr + done.stdout  # the demo's secret key
    assert "security.W012" in done.stderr + done.stdout  # cookies without HTTPS


@pytest.mark.django_db
def test_the_admins_css_is_served_with_debug_off(client):
    response = client.get("/static/admin/css/base.css")
    assert response.status_code == 200
    assert b"".join(response.streaming_content if response.streaming else [response.content])
