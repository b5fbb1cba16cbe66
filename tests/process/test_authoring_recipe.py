"""docs/authoring.md section 9, as written (but for the Redis it is pointed at): the example kind,
installed outside the repository, runs on real workers and beat, from a plain shell."""
from __future__ import annotations

import os
import subprocess
import sys
from urllib.parse import urlsplit, urlunsplit

import pytest

from tests.test_docs import install_example
from workflows.testing.cluster import RedisServer

pytestmark = pytest.mark.process


def test_the_authoring_page_s_worker_recipe_passes_from_a_plain_shell(process_redis: RedisServer | None, tmp_path):
    if process_redis is None or not os.environ.get("DATABASE_URL", "").startswith("postgres"):
        pytest.skip("needs this run's own Redis server and DATABASE_URL=postgres://…")
    project, env = install_example(tmp_path)
    recipe = project / "tests" / "test_on_workers.py"
    text = recipe.read_text()
    assert 'BROKER_URL = "redis://127.0.0.1:6379/15"' in text
    port = urlsplit(process_redis.url).port
    recipe.write_text(text.replace("redis://127.0.0.1:6379/15", f"redis://127.0.0.1:{port}/15"))
    database = urlunsplit(urlsplit(os.environ["DATABASE_URL"])._replace(path="/authoring_recipe"))
    done = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "tests/test_on_workers.py"],
                          cwd=project, env={**env, "DATABASE_URL": database}, capture_output=True, text=True,
                          timeout=600)
    assert done.returncode == 0 and "1 passed" in done.stdout, done.stdout[-6000:] + done.stderr[-2000:]
    assert "publish_failed" not in done.stdout + done.stderr
