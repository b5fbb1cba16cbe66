"""The test kit's database tier as a pytest plugin. A kind's package declares it in its conftest.py:

    pytest_plugins = ["agentops.kind.pytest_plugin"]

and its tests, marked ``django_db`` (pytest-django, with ``DJANGO_SETTINGS_MODULE=agentops.settings``),
take the fixtures ``doorbells`` (a ``Doorbells``: what would have been published to the broker),
``drive`` (``drive(workflow)``: run it and its children in process to its next wait), ``clock``
(a ``Clock`` the test moves) and ``faults`` (a ``Faults``: crash at a named point). The names they
give are in ``agentops.kind.testing``; docs/authoring.md, "Against the database", shows them used.
"""
from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from agentops.kind.presentation import Workflow
from agentops.kind.testing import Clock, Doorbells, Faults
from workflows.testing import database


@pytest.fixture
def doorbells() -> Iterator[Doorbells]:
    """The doorbells the services ring during the test, recorded instead of published."""
    with database.doorbells_recorded() as rung:
        yield rung


@pytest.fixture
def drive(doorbells: Doorbells) -> Callable[..., Workflow]:
    """``drive(workflow, *, max_rounds=100)``: run a workflow and its children to their next wait
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
