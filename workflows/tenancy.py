"""Who a workflow's model calls are shared out by: its tenant, for fair shares and concurrency keys.

The one place that names a workflow's tenant (docs/operators.md, "Rate limits"): today the user
who launched it (``user:<id>``), or ``system`` for work launched by no one (a schedule, a shell).
The hook for launch labels: when a workflow carries a tenant label, return it from here, and
every limit, fair share and metric follows.
"""
from __future__ import annotations

from typing import Protocol


class HasLauncher(Protocol):
    launched_by_id: int | None


def workflow_tenant(workflow: HasLauncher) -> str:
    """The workflow's tenant: ``user:<launcher id>``, or ``system`` without a launcher."""
    return f"user:{workflow.launched_by_id}" if workflow.launched_by_id is not None else "system"
