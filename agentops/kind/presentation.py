"""What a kind's admin panels render with (``AdminPanel.render``, docs/authoring.md, "Admin
panels"): the workflow's rows to read and the admin's own formats, so that a kind's page looks like
the rest of the admin; its stored state is ``agentops.kind.state_of``. Read only: a panel changes
nothing.

Imported by a kind's ``presentation`` module when a panel renders (the models need Django's apps
loaded), not by its definition at import.
"""
from __future__ import annotations

from workflows.admin.charts import Reading, TimeChart, time_chart
from workflows.admin.display import usd, when
from workflows.admin.inspection import duration, page_links
from workflows.models import Activity, Checkpoint, ProgressSample, UsageEntry, Wait, Workflow

__all__ = [
    "Activity", "Checkpoint", "ProgressSample", "Reading", "TimeChart", "UsageEntry", "Wait", "Workflow", "duration",
    "page_links", "time_chart", "usd", "when",
]
