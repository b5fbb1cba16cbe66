"""Who a workflow's model calls are shared out by: its tenant, for fair shares and concurrency keys.

The one place that names a workflow's tenant (docs/operators.md, "Rate limits"). With
``AGENTOPS_TENANT_LABEL`` set (say ``team``), a workflow launched with that label is the tenant
``team=<value>`` (``--label team=infra``: ``team=infra``); otherwise, and by default, the user who
launched it (``user:<id>``), or ``system`` for work launched by no one (a schedule without a user,
a shell). The three forms cannot collide: a label's value holds no ``=``.
"""
from __future__ import annotations

from django.conf import settings

from workflows.models import Workflow, WorkflowLabel


def workflow_tenant(workflow: Workflow) -> str:
    """The workflow's tenant: ``KEY=value`` of its tenant label, else ``user:<launcher id>`` or ``system``.
    Without ``AGENTOPS_TENANT_LABEL`` no query is made (labels never change after launch)."""
    key = settings.AGENTOPS_TENANT_LABEL
    if key:
        value = WorkflowLabel.objects.filter(workflow_id=workflow.pk, key=key).values_list("value", flat=True).first()
        if value is not None:
            return f"{key}={value}"
    return f"user:{workflow.launched_by_id}" if workflow.launched_by_id is not None else "system"
