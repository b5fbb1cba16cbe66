"""The test kit's database tier as a pytest plugin. A kind's package declares it in its conftest.py:

    pytest_plugins = ["agentops.kind.pytest_plugin"]

and its tests, marked ``django_db`` (pytest-django, with ``DJANGO_SETTINGS_MODULE=agentops.settings``),
take the fixtures ``doorbells`` (a ``Doorbells``: what would have been published to the broker),
``drive`` (``drive(workflow)``: run it and its children in process to its next wait), ``clock``
(a ``Clock`` the test moves) and ``faults`` (a ``Faults``: crash at a named point). The names they
give are in ``agentops.kind.testing``; docs/authoring.md, "Against the database", shows them used.
``workers`` gives real Celery workers and beat instead (``workflows.testing.cluster``), on a Redis
DB the package names by overriding ``workers_broker_url``.
"""
from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING

import pytest

from agentops.kind.presentation import Workflow
from agentops.kind.testing import Clock, Doorbells, Faults
from workflows.testing import database

if TYPE_CHECKING:
    from workflows.testing.cluster import Cluster


@pytest.fixture
def doorbells() -> Iterator[Doorbells]:
    """The doorbells the services ring during the test, recorded instead of published."""
    with database.doorbells_recorded() as rung:
        yield rung


@pytest.fixture
def drive(doorbells: Doorbells) -> Callable[..., Workflow]:
    """``drive(workflow, *, max_rounds=100, retry_now=False)``: run a workflow and its children to their next wait
    (``workflows.testing.database.drive``); its doorbells are recorded, none published."""
    return database.drive


@pytest.fixture
def clock() -> Iterator[Clock]:
    """The durable clock, from the real time on, moved by ``clock.advance(...)``."""
    with Clock().running() as moving:
        yield moving


@pytest.fixture
def faults(tmp_path: Path) -> Faults:
    """``with faults.crash_at(point, **when): drive(workflow)`` crashes there; ``faults.fired`` lists the crashes."""
    return Faults(log=tmp_path / "faults.log")


@pytest.fixture
def workers_broker_url() -> str:
    """The Redis DB of the ``workers`` fixture, flushed before each test: a package overrides this
    fixture with a DB its tests alone use."""
    raise pytest.UsageError("The workers fixture needs a Redis DB of these tests alone (it is flushed): override "
                            "the workers_broker_url fixture to return its URL, e.g. redis://127.0.0.1:6379/15.")


@pytest.fixture
def workers(transactional_db: None, tmp_path: Path, workers_broker_url: str) -> Iterator[Cluster]:
    """A ``Cluster`` on the test's database, its broker ``workers_broker_url`` (flushed), this process's
    doorbells published there; ``workers.start(workers=("w1",), beats=("beat",))`` starts the processes
    in the current directory, and every one is stopped after the test. Needs psutil (agentops's
    ``test`` extra) and a PostgreSQL test database."""
    from workflows.testing.cluster import Broker, Cluster, publishing_to, subprocess_database_url

    Broker(workers_broker_url).flushdb()
    with publishing_to(workers_broker_url), Cluster(run_dir=tmp_path, database_url=subprocess_database_url(),
                                                    broker_url=workers_broker_url) as cluster:
        yield cluster
