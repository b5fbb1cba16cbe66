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


def settings_read(code: str, **env: str) -> subprocess.CompletedProcess[str]:
    """Run ``code`` after ``django.setup()`` in a process whose settings read ``env`` (PostgreSQL's URL)."""
    clean = {k: v for k, v in os.environ.items() if not k.startswith(("DJANGO_", "DATABASE_URL", "AGENTOPS_DB_"))}
    return subprocess.run([sys.executable, "-c", f"import django; django.setup(); {code}"], cwd=REPO, text=True,
                          capture_output=True, timeout=60, check=False,
                          env={**clean, "DJANGO_SETTINGS_MODULE": "agentops.settings",
                               "DATABASE_URL": "postgres://agentops@db.invalid:5432/agentops", **env})


def database_options(**env: str) -> subprocess.CompletedProcess[str]:
    """The default database's OPTIONS as a process with ``env`` configures them."""
    return settings_read("from django.conf import settings; print(settings.DATABASES['default'].get('OPTIONS'))",
                         **env)


@pytest.mark.parametrize(("threshold", "options"), [
    (None, "{'server_side_binding': True, 'prepare_threshold': 2}"),
    ("5", "{'server_side_binding': True, 'prepare_threshold': 5}"),
    ("0", "{}"),
])
def test_postgresql_prepares_statements_unless_the_threshold_is_zero(threshold, options):
    done = database_options(**({"AGENTOPS_DB_PREPARE_THRESHOLD": threshold} if threshold is not None else {}))
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == options


def test_a_pooled_worker_gets_the_backend_that_checks_idle_connections_and_still_prepares_statements():
    done = settings_read("from django.conf import settings; db = settings.DATABASES['default']; "
                         "print(db['ENGINE'], db['CONN_MAX_AGE'], sorted(db['OPTIONS'].items()))",
                         AGENTOPS_DB_POOL_SIZE="4")
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == ("agentops.db.postgresql 0 [('pool', {'min_size': 1, 'max_size': 4, "
                                   "'timeout': 30.0}), ('prepare_threshold', 2), ('server_side_binding', True)]")


@pytest.mark.parametrize(("threshold", "error"), [("-1", "must be 0 (off) or a count of runs"),
                                                  ("twice", "is not a whole number")])
def test_a_bad_prepare_threshold_is_refused_with_what_to_set(threshold, error):
    done = database_options(AGENTOPS_DB_PREPARE_THRESHOLD=threshold)
    assert done.returncode != 0
    assert "ImproperlyConfigured" in done.stderr and error in done.stderr
    assert "AGENTOPS_DB_PREPARE_THRESHOLD" in done.stderr


@pytest.mark.parametrize(("table", "error"), [
    ('{"team:infra": 3}', "keys are tenant:<tenant> or kind:<kind>"),
    ('{"kind:harness": 0}', "values whole numbers of at least 1"),
    ('{"kind:harness": true}', "values whole numbers of at least 1"),
    ('{"kind:harness": 2.5}', "values whole numbers of at least 1"),
    ('[1]', "must be a JSON object"),
    ('{"kind:', "is not JSON"),
])
@pytest.mark.parametrize("name", ["AGENTOPS_ACTIVITY_CONCURRENCY", "AGENTOPS_MODEL_CALL_CONCURRENCY"])
def test_a_bad_concurrency_key_table_is_refused_with_what_to_set(name, table, error):
    done = settings_read("pass", **{name: table})
    assert done.returncode != 0
    assert "ImproperlyConfigured" in done.stderr and error in done.stderr and name in done.stderr


def test_concurrency_keys_are_read_from_the_environment():
    done = settings_read("from django.conf import settings; print(settings.AGENTOPS_ACTIVITY_CONCURRENCY)",
                         AGENTOPS_ACTIVITY_CONCURRENCY='{"tenant:*": 50, "kind:harness": 8}')
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "{'tenant:*': 50, 'kind:harness': 8}"


@pytest.mark.parametrize(("value", "sent"), [(None, "False False"), ("true", "True True"), ("false", "False False")])
def test_celery_task_events_are_for_flower_to_turn_on_unless_always_asked_for(value, sent):
    """Off by default (Flower's enable_events turns the workers' on while it watches); the setting
    sends both the workers' task events and the publishers' sent events."""
    env = {"AGENTOPS_CELERY_TASK_EVENTS": value} if value is not None else {}
    done = settings_read("from agentops.celery import app; "
                         "print(app.conf.worker_send_task_events, app.conf.task_send_sent_event)", **env)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == sent
