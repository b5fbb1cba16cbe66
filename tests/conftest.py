"""Shared fixtures: a git repository, the deploy target, users, and an in-process driver."""
from __future__ import annotations

import os
import subprocess
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from django.contrib.auth.models import Group, User
from django.core.management.sql import emit_post_migrate_signal
from django.db import connection, connections, transaction
from django.test import TransactionTestCase

from agentops.deploytarget.server import DeployTargetServer
from workflows import doorbells
from workflows.activity_context import ActivityContext
from workflows.engine import Complete, Decision, NodeContext, WorkflowDefinition, node
from workflows.leases import Claim
from workflows.models import Wait
from workflows.registry import ActivityType
from workflows.services.activities import DatabaseLease
from workflows.testing.inprocess import drive  # noqa: F401 - the tests import it from here

# A package outside agentops, tested in a session of its own (tests/test_outside_kind.py).
collect_ignore = ["outside_kind"]
# The kit's fixtures (drive, clock, doorbells, faults), as a kind's package declares them: the
# example's tests use them as its author would.
pytest_plugins = ["agentops.kind.pytest_plugin"]


def worker_context(claim: Claim) -> ActivityContext:
    """The context a worker gives a claimed attempt: heartbeats and notes go to the database."""
    return ActivityContext(claim=claim, lease=DatabaseLease())


def run_claimed(activity: ActivityType[Any, Any], claim: Claim) -> Any:
    """Run a claimed attempt's activity as the worker does, without recording its result (its JSON)."""
    return activity.execute(worker_context(claim), claim.input)


@pytest.fixture(scope="session")
def django_db_modify_db_settings(django_db_modify_db_settings_parallel_suffix: None) -> None:
    """Give each pytest run its own PostgreSQL test database, so runs side by side never collide."""
    from django.conf import settings

    db = settings.DATABASES["default"]
    if db["ENGINE"] != "django.db.backends.sqlite3":
        db.setdefault("TEST", {})["NAME"] = f"test_{db['NAME']}_{os.getpid()}"


def write_while_held(hold: Callable[[], object], write: Callable[[], object], *,
                     then: Callable[[], object] = lambda: None) -> tuple[object, object]:
    """Run ``hold`` in a transaction of one thread and keep it open; meanwhile run ``write`` in
    another and assert it waits for that transaction's locks (not done half a second later); then
    run ``then`` in the held transaction and commit it. Returns what the held transaction's last
    call and ``write`` returned, or the exception each raised. Needs ``transaction=True``."""
    held, go_on, done = threading.Event(), threading.Event(), threading.Event()
    outcome: dict[str, object] = {}

    def holder() -> None:
        try:
            with transaction.atomic():
                hold()
                held.set()
                go_on.wait(10)
                outcome["held"] = then()
        except Exception as exc:  # noqa: BLE001 - returned for the test to judge (a deadlock's error, say)
            outcome["held"] = exc
        finally:
            held.set()
            connection.close()

    def writer() -> None:
        try:
            outcome["write"] = write()
        except Exception as exc:  # noqa: BLE001 - returned for the test to judge
            outcome["write"] = exc
        finally:
            done.set()
            connection.close()

    holding = threading.Thread(target=holder)
    holding.start()
    assert held.wait(10)
    writing = threading.Thread(target=writer)
    writing.start()
    try:
        assert not done.wait(0.5), "the write did not wait for the held transaction's locks"
    finally:
        go_on.set()
        holding.join(15)
        writing.join(15)
    return outcome.get("held"), outcome.get("write")


# Left as they are: the post_migrate signal below writes back any of their rows a test removed.
KEPT_TABLES = {"django_content_type", "auth_permission"}


def _empty_the_tables(self: TransactionTestCase) -> None:
    """A transactional test leaves empty tables and sends post_migrate, as Django's flush does, but by
    DELETE in one transaction: TRUNCATE makes new files for every table and index, and then post_migrate
    writes every content type and permission back (0.2-0.3 s after each of the suite's 200 transactional
    tests; this takes a tenth of it)."""
    for db_name in self._databases_names(include_mirrors=False):
        conn = connections[db_name]
        tables = sorted(set(conn.introspection.django_table_names(only_existing=True, include_views=False))
                        - KEPT_TABLES)
        with transaction.atomic(using=db_name), conn.cursor() as cursor:
            for table in tables:
                cursor.execute(f"DELETE FROM {conn.ops.quote_name(table)}")
        # Its receivers make missing content types and permissions, and forget the installation id.
        emit_post_migrate_signal(verbosity=0, interactive=False, db=db_name)


@pytest.fixture(scope="session", autouse=True)
def transactional_tests_empty_tables_by_delete() -> Iterator[None]:
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(TransactionTestCase, "_fixture_teardown", _empty_the_tables)
        yield


@pytest.fixture(autouse=True)
def fast_password_hashing(settings: Any) -> None:
    """The user fixtures hash passwords; PBKDF2 costs half a second per user."""
    settings.PASSWORD_HASHERS = ["django.contrib.auth.hashers.MD5PasswordHasher"]


@pytest.fixture(autouse=True)
def one_activity_per_task(settings: Any) -> None:
    """Service tests step workflows one activity at a time; tests of chaining turn it back on
    (the process tests run workers with the product default)."""
    settings.AGENTOPS_ACTIVITY_CHAIN_SECONDS = 0


@pytest.fixture(autouse=True)
def no_shared_rate_limiter(settings: Any) -> None:
    """Service tests call models without the shared rate limiter (its Redis keeps real time and
    outlives a test); tests/ratelimits turn it on against a Redis DB of their own."""
    settings.AGENTOPS_RATE_LIMIT_REDIS_URL = ""


@pytest.fixture
def rung(monkeypatch: pytest.MonkeyPatch) -> list[tuple[str, int]]:
    """Doorbells rung by the services, recorded instead of published (service tests that commit)."""
    calls: list[tuple[str, int]] = []
    monkeypatch.setattr(doorbells, "activity_run",
                        lambda *, activity_id, name: calls.append(("activity", activity_id)))
    monkeypatch.setattr(doorbells, "workflow_advance",
                        lambda *, workflow_id: calls.append(("workflow", workflow_id)))
    monkeypatch.setattr(doorbells, "children_collect",
                        lambda *, workflow_id: calls.append(("children", workflow_id)))
    return calls


GIT_IDENTITY = ["-c", "user.name=agentops tests", "-c", "user.email=tests@agentops.local"]


def make_git_repo(path: Path, *, test_script: str = "print('tests pass')\n") -> Path:
    path.mkdir(parents=True, exist_ok=True)
    (path / "check.py").write_text(test_script)
    subprocess.run(["git", "init", "-q", str(path)], check=True)
    subprocess.run(["git", "-C", str(path), "add", "."], check=True)
    subprocess.run(["git", *GIT_IDENTITY, "-C", str(path), "commit", "-qm", "initial"], check=True)
    return path


def git_commit(path: Path, name: str, content: str) -> None:
    (path / name).write_text(content)
    subprocess.run(["git", "-C", str(path), "add", "."], check=True)
    subprocess.run(["git", *GIT_IDENTITY, "-C", str(path), "commit", "-qm", f"change {name}"], check=True)


@pytest.fixture
def git_repo(tmp_path: Path) -> Path:
    return make_git_repo(tmp_path / "repo")


@pytest.fixture
def deploy_target(tmp_path: Path, settings: Any) -> Iterator[DeployTargetServer]:
    server = DeployTargetServer(host="127.0.0.1", port=0, state_path=tmp_path / "deploy-target.json")
    server.start()
    settings.AGENTOPS_DEPLOY_TARGET_URL = server.url
    settings.AGENTOPS_WORKSPACE_DIR = tmp_path / "workspaces"
    yield server
    server.stop()


@pytest.fixture
def approver(db: None) -> User:
    user = User.objects.create_user("alice", password="alice-password")
    user.groups.add(Group.objects.get_or_create(name="release-approvers")[0])
    return user


@pytest.fixture
def requester(db: None) -> User:
    return User.objects.create_user("rita", password="rita-password")


@pytest.fixture
def outsider(db: None) -> User:
    return User.objects.create_user("oscar", password="oscar-password")


def release_params(repo: Path, **extra: Any) -> dict[str, Any]:
    return {"repo": str(repo), "test_command": "python3 check.py", **extra}


def open_approval(workflow_id: int) -> Wait:
    return Wait.objects.get(workflow_id=workflow_id, kind=Wait.Kind.APPROVAL, status=Wait.Status.OPEN)


def run_at_once(fn: Callable[[], Any], *, count: int = 2) -> list[Any]:
    """Call ``fn`` from ``count`` threads released together by a barrier, as racing workers or
    beats would; each thread's result, or the exception it raised, in thread order."""
    barrier = threading.Barrier(count)
    results: list[Any] = [None] * count

    def run(i: int) -> None:
        try:
            barrier.wait(timeout=10)
            results[i] = fn()
        except Exception as exc:  # noqa: BLE001 - returned for the caller to assert on
            results[i] = exc
        finally:
            connection.close()

    threads = [threading.Thread(target=run, args=(i,)) for i in range(count)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=30)
    return results


def one_event_kind(kind: str, event: str = "go") -> type[WorkflowDefinition]:
    """A definition of ``kind`` that opens an event wait for ``event`` at once (a launch returns
    with the workflow waiting) and completes with the signal's payload under the event's name."""

    class WaitForOneEvent(WorkflowDefinition):
        start_node = "WAIT"
        revalidate_node = "WAIT"

        @node("WAIT")
        def wait(self, ctx: NodeContext[Any]) -> Decision:
            return Complete({event: ctx.wait_for_event(event).payload})

    WaitForOneEvent.kind = kind
    return WaitForOneEvent
