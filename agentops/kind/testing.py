"""The test kit for a kind, without a database or a worker (docs/authoring.md, "Testing a kind"):
``WorkflowRun`` drives a definition through its nodes in memory, ``ActivityEnvironment`` runs an
activity with a fake lease and, with ``FakeModel``, fake model calls metered in a ``FakeLedger``;
``replay`` names where a changed definition no longer replays a recorded history; ``registered``
registers a kind for one test. Against the database (pytest-django's), in process: ``launch`` and
``drive`` a workflow, ``signal``, ``approve``, ``reject``, ``cancel`` or ``supersede`` it as people
do, with ``Doorbells`` recorded, a ``Clock`` the test moves and ``Faults`` that crash at a named
point of ``FAULT_POINTS`` (the fixtures of ``agentops.kind.pytest_plugin``). Real workers and beat:
``workflows.testing.cluster``.
"""
from __future__ import annotations

from workflows.faults import Crashed
from workflows.testing import (
    ActivityEnvironment,
    Divergence,
    FakeLease,
    FakeLedger,
    FakeModel,
    LeaseLost,
    Reply,
    Throttle,
    WorkflowRun,
    cut_off,
    deployed,
    registered,
    replay,
)
from workflows.testing.database import (
    FAULT_POINTS,
    Clock,
    Doorbell,
    Doorbells,
    Faults,
    approve,
    cancel,
    drive,
    launch,
    reject,
    signal,
    supersede,
)

__all__ = [
    "ActivityEnvironment", "Clock", "Crashed", "Divergence", "Doorbell", "Doorbells", "FAULT_POINTS", "FakeLease",
    "FakeLedger", "FakeModel", "Faults", "LeaseLost", "Reply", "Throttle", "WorkflowRun", "approve", "cancel",
    "cut_off", "deployed", "drive", "launch", "registered", "reject", "replay", "signal", "supersede",
]
