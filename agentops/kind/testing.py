"""The test kit for a kind, without a database or a worker (docs/authoring.md, "Testing a kind"):
``WorkflowRun`` drives a definition through its nodes and its lifecycle in memory (its ``Event``s,
``Commitment``s and ``Child`` workflows readable), ``ActivityEnvironment`` runs an
activity with a fake lease and, with ``FakeModel``, fake model calls metered in a ``FakeLedger``;
``replay`` names where a changed definition no longer replays a recorded history; ``registered``
registers a kind for one test. Against the database (pytest-django's), in process: ``launch`` and
``drive`` a workflow, read its ``events``, ``signal``, ``approve``, ``reject``, ``cancel``,
``supersede`` or ``resume`` it and ``set_budget`` as people do, with ``Doorbells`` recorded, a
``Clock`` the test moves and ``Faults`` that crash at a named point of ``FAULT_POINTS`` (the
fixtures of ``agentops.kind.pytest_plugin``). Real workers and beat: ``workflows.testing.cluster``.
"""
from __future__ import annotations

from workflows.faults import Crashed
from workflows.testing import (
    ActivityEnvironment,
    Child,
    Commitment,
    Divergence,
    Event,
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
    events,
    launch,
    reject,
    resume,
    set_budget,
    signal,
    supersede,
)

__all__ = [
    "ActivityEnvironment", "Child", "Clock", "Commitment", "Crashed", "Divergence", "Doorbell", "Doorbells",
    "Event", "FAULT_POINTS", "FakeLease", "FakeLedger", "FakeModel", "Faults", "LeaseLost", "Reply", "Throttle",
    "WorkflowRun", "approve", "cancel", "cut_off", "deployed", "drive", "events", "launch", "registered", "reject",
    "replay", "resume", "set_budget", "signal", "supersede",
]
