"""A kind outside the repository: `agent new-kind` writes a project that pip installs, whose entry
point registers the kind, and whose own test passes; the process-test recipe publishes from a
shell that has no CELERY_BROKER_URL."""
from __future__ import annotations

import os
import subprocess
import sys
from io import StringIO
from pathlib import Path

import pytest
import redis
from django.core.management import CommandError, call_command

REPO_ROOT = Path(__file__).resolve().parents[2]


def plain_shell_env(**extra: str) -> dict[str, str]:
    """The environment of a plain shell: no broker, no database, no kinds listed; agentops importable."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("CELERY_", "DATABASE_URL", "AGENTOPS_",
                                                                     "DJANGO_", "PYTEST_"))}
    return {**env, **extra}


def test_new_kind_writes_a_package_that_installs_registers_itself_and_passes_its_test(tmp_path):
    out = StringIO()
    call_command("agent", "new-kind", "followup", "--dir", str(tmp_path), stdout=out)
    project = tmp_path / "followup"
    assert "Wrote the followup kind" in out.getvalue() and (project / "pyproject.toml").is_file()
    # Written against the kind surface alone, with its launch parameters declared (docs/authoring.md).
    written = {path.name: path.read_text() for path in project.rglob("*.py")}
    assert not [name for name, text in written.items() if "from workflows" in text or "import workflows" in text]
    assert "launch_params = FollowupParams" in written["definition.py"]
    assert "def validate_params" not in written["definition.py"]
    with pytest.raises(CommandError, match="already exists"):
        call_command("agent", "new-kind", "followup", "--dir", str(tmp_path))
    with pytest.raises(CommandError, match="must be 1–60 lowercase"):
        call_command("agent", "new-kind", "Follow Up", "--dir", str(tmp_path))

    site = tmp_path / "site"  # `pip install` into a folder of its own: the project is built as a user's would be
    subprocess.run([sys.executable, "-m", "pip", "install", "--quiet", "--no-deps", "--no-build-isolation",
                    "--target", str(site),
                    str(project)], check=True, timeout=300, capture_output=True)
    env = plain_shell_env(PYTHONPATH=f"{site}{os.pathsep}{REPO_ROOT}", AGENTOPS_VAR_DIR=str(tmp_path / "var"))
    tests = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider"], cwd=project, env=env,
                           capture_output=True, text=True, timeout=300)
    assert tests.returncode == 0 and "3 passed" in tests.stdout, tests.stdout + tests.stderr

    # Installed, the entry point registers the kind: no AGENTOPS_AGENT_MODULES needed.
    kinds = subprocess.run([sys.executable, "-c", "import django; django.setup(); from workflows import registry; "
                            "print(registry.definition_kinds())"], cwd=tmp_path, capture_output=True, text=True,
                           env={**env, "DJANGO_SETTINGS_MODULE": "agentops.settings"}, timeout=120)
    assert "'followup'" in kinds.stdout, kinds.stderr
    check = subprocess.run([sys.executable, str(REPO_ROOT / "manage.py"), "check"], cwd=tmp_path, env=env,
                           capture_output=True, text=True, timeout=120)
    assert check.returncode == 0, check.stderr


PUBLISH = """
import django; django.setup()
from agentops.celery import app
from workflows.testing.cluster import publishing_to
with publishing_to({url!r}):
    app.send_task("agentops.probe", queue={queue!r}, routing_key={queue!r})
print(type(app.connection_for_write().transport).__module__)
"""


def test_publishing_to_a_redis_broker_works_from_a_shell_without_celery_broker_url(tmp_path):
    url, queue = os.environ.get("CELERY_BROKER_URL", "redis://127.0.0.1:6379/15"), "newcomer-probe"
    if not url.startswith("redis://"):
        pytest.skip("needs CELERY_BROKER_URL of a Redis DB of these tests")
    client = redis.Redis.from_url(url)
    client.delete(queue)
    env = plain_shell_env(PYTHONPATH=str(REPO_ROOT), DJANGO_SETTINGS_MODULE="agentops.settings",
                          AGENTOPS_VAR_DIR=str(tmp_path / "var"))
    done = subprocess.run([sys.executable, "-c", PUBLISH.format(url=url, queue=queue)], env=env, cwd=tmp_path,
                          capture_output=True, text=True, timeout=120)
    try:
        assert done.returncode == 0, done.stderr
        assert client.llen(queue) == 1, "the message did not reach Redis: " + done.stderr[-2000:]
        assert done.stdout.strip() == "agentops.filesystem_broker"  # and the shell's own broker is back after
    finally:
        client.delete(queue)


def test_a_kind_module_that_imports_as_a_namespace_package_stops_the_start(tmp_path, monkeypatch):
    """The project folder named like its package (``followup/followup/``), on the path because the
    process runs in the folder above: ``followup`` imports as an empty namespace package and no kind
    would register. The start is refused, naming the folder, instead of going on without the kind."""
    from django.core.exceptions import ImproperlyConfigured

    from workflows.apps import agent_module_import

    (tmp_path / "nsfollowup" / "nsfollowup").mkdir(parents=True)
    (tmp_path / "nsfollowup" / "nsfollowup" / "__init__.py").write_text("")
    monkeypatch.syspath_prepend(str(tmp_path))
    with pytest.raises(ImproperlyConfigured, match=r"'nsfollowup', which imported as a namespace package from "
                                                   rf"{tmp_path / 'nsfollowup'}"):
        agent_module_import("nsfollowup")
    monkeypatch.syspath_prepend(str(tmp_path / "nsfollowup"))  # where the installed package imports from
    sys.modules.pop("nsfollowup", None)
    assert agent_module_import("nsfollowup").__file__ == str(tmp_path / "nsfollowup" / "nsfollowup" / "__init__.py")
    sys.modules.pop("nsfollowup", None)
