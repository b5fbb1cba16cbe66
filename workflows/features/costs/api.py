"""Cost per step over the API: the usage ledger per node, activity and model (docs/live.md)."""
from __future__ import annotations

from typing import Any

from django.http import HttpRequest
from ninja import Field, Router, Schema

from workflows.api.auth import VIEW_PERMISSIONS, require
from workflows.api.schemas import WORKFLOW_ID, ErrorOut
from workflows.errors import NotFound
from workflows.features.costs.breakdown import cost_breakdown
from workflows.models import Workflow

router = Router(tags=["workflows"])


class CostsOut(Schema):
    """Per node, activity and model: `usd` (as text, 6 decimal places), `calls` and token counts."""
    workflow_id: int
    spent_usd: str = Field(description="what the budget counts; equals agent show's spent_usd")
    by_node: list[dict[str, Any]]
    by_activity: list[dict[str, Any]]
    by_model: list[dict[str, Any]]


@router.get("/workflows/{workflow_id}/costs", response={200: CostsOut, 400: ErrorOut, 401: ErrorOut, 403: ErrorOut,
                                                        404: ErrorOut, 409: ErrorOut}, summary="Spend per step")
def workflow_costs(request: HttpRequest, workflow_id: int = WORKFLOW_ID) -> dict[str, Any]:
    """Spend (USD, as the budget counts it), calls and tokens per node, per activity and per model, the
    costliest first; `spent_usd` equals `agent show`'s. Needs `workflows.view_workflow`."""
    require(request.auth, VIEW_PERMISSIONS, to="see workflows")  # type: ignore[attr-defined]
    workflow = Workflow.objects.filter(pk=workflow_id).first()
    if workflow is None:
        raise NotFound(f"Workflow {workflow_id} does not exist; GET /api/workflows lists the existing ones.",
                       workflow_id=workflow_id)
    return cost_breakdown(workflow)
