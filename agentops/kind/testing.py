"""The test kit for a kind, without a database or a worker (docs/authoring.md, "Testing a kind"):
``WorkflowRun`` drives a definition through its nodes in memory, ``ActivityEnvironment`` runs an
activity with a fake lease and, with ``FakeModel``, fake model calls metered in a ``FakeLedger``;
``replay`` names where a changed definition no longer replays a recorded history; ``registered``
registers a kind for one test. Real workers and beat: ``workflows.testing.cluster``.
"""
from __future__ import annotations

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

__all__ = [
    "ActivityEnvironment", "Divergence", "FakeLease", "FakeLedger", "FakeModel", "LeaseLost", "Reply", "Throttle",
    "WorkflowRun", "cut_off", "deployed", "registered", "replay",
]
