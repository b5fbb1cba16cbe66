"""The endpoints: each parses input, checks the permission the admin checks, calls the same service as
`manage.py agent`, and answers with the JSON shape of that verb's ``--json`` (README, "JSON shapes")."""
from __future__ import annotations

from typing import Any

from django.http import HttpRequest
from ninja import Header, NinjaAPI, Status

from workflows import selectors, services
from workflows.api import costs, hooks, streams
from workflows.api.auth import LAUNCH_PERMISSION, OPERATE_PERMISSION, VIEW_PERMISSIONS, JsonParser, TokenAuth, require
from workflows.api.errors import Forbidden, install_error_handlers
from workflows.api.schemas import (
    ApproveIn,
    BudgetIn,
    CancelIn,
    ErrorOut,
    LaunchIn,
    RejectIn,
    SignalIn,
    SupersedeIn,
)
from workflows.errors import InvalidInput, NotFound
from workflows.models import Wait, Workflow
from workflows.services.waits import wait_authority_refusal


class AgentOpsAPI(NinjaAPI):
    def get_openapi_operation_id(self, operation: Any) -> str:
        # "launch", "wait_approve": the function's name, not ninja's module-qualified default.
        return str(operation.view_func.__name__)


api = AgentOpsAPI(
    title="agentops",
    version="1",
    description="Launch, inspect and steer agents: the operations of `manage.py agent`, with the same JSON "
                "shapes as its `--json`. Authenticate with `Authorization: Bearer <token>` "
                "(`manage.py agent token create --user NAME`). Errors are `{\"error\": message}`.",
    auth=TokenAuth(),
    parser=JsonParser(),
    urls_namespace="api",
)
install_error_handlers(api)
api.add_router("", streams.router)
api.add_router("", hooks.router)
api.add_router("", costs.router)

Json = dict[str, Any]
ERRORS: dict[int, Any] = {400: ErrorOut, 401: ErrorOut, 403: ErrorOut, 404: ErrorOut, 409: ErrorOut}


def caller(request: HttpRequest) -> Any:
    """The user whose token authenticated the request (TokenAuth put it there)."""
    return request.auth  # type: ignore[attr-defined]


def workflow_by_id(workflow_id: int) -> Workflow:
    try:
        return Workflow.objects.select_related("release").get(pk=workflow_id)
    except Workflow.DoesNotExist:
        raise NotFound(f"Workflow {workflow_id} does not exist; GET /api/workflows lists the existing ones.",
                       workflow_id=workflow_id) from None


IDEMPOTENCY_KEY = Header(
    default="", alias="Idempotency-Key",
    description="1–200 printable characters, e.g. a UUID made once per request: the same request sent again with "
                "the key returns the first one's result instead of doing it again; the key with another body is "
                "refused with 409. Keys are kept for good, per operation (launch, supersede).",
)


@api.post("/workflows", response={200: Json, 201: Json, **ERRORS}, summary="Launch an agent", tags=["workflows"])
def launch(request: HttpRequest, payload: LaunchIn, idempotency_key: str = IDEMPOTENCY_KEY) -> Status[Json]:
    """`agent launch`: the token's user is the launcher (who may not approve it). Needs `workflows.add_workflow`.
    With an `Idempotency-Key`, launched once: 201 the first time, 200 with the same workflow when the same
    request comes again (a retry after a lost answer), 409 when the key was used with another body."""
    require(caller(request), LAUNCH_PERMISSION, to="launch workflows")
    workflow, created = services.workflow_launch_once(
        idempotency_key=idempotency_key, kind=payload.kind, goal=payload.goal, params=payload.params,
        user=caller(request),
        release_policy=payload.release_policy, max_hours=payload.max_hours, priority=payload.priority,
        budget_total_usd=payload.budget_total_usd, budget_hourly_usd=payload.budget_hourly_usd,
        stagnation_policy=payload.stagnation_policy, fallback_model=payload.fallback_model,
    )
    return Status(201 if created else 200, {"id": workflow.pk, "kind": workflow.kind, "status": workflow.status})


@api.get("/workflows", response={200: list[Json], **ERRORS}, summary="List workflows", tags=["workflows"])
def workflow_list(request: HttpRequest, status: str = "", kind: str = "", limit: int = 50) -> list[Json]:
    """`agent list --json`: summaries, newest first. Needs `workflows.view_workflow`."""
    require(caller(request), VIEW_PERMISSIONS, to="see workflows")
    if status and status not in Workflow.Status.values:
        raise InvalidInput(f"status {status[:30]!r} is not one of {', '.join(Workflow.Status.values)}.")
    if limit < 1:
        raise InvalidInput(f"limit must be at least 1; got {limit}.")
    workflows = selectors.workflow_list(status=status, kind=kind).select_related("release")[:limit]
    return [selectors.workflow_summary(w) for w in workflows]


@api.get("/workflows/{workflow_id}", response={200: Json, **ERRORS}, summary="Show a workflow", tags=["workflows"])
def workflow_show(request: HttpRequest, workflow_id: int, events: int = 50) -> Json:
    """`agent show --json`: the summary plus waits (with candidate hashes), activities, spend, events…"""
    require(caller(request), VIEW_PERMISSIONS, to="see workflows")
    if events < 0:
        raise InvalidInput(f"events must be 0 or more; got {events}.")
    return selectors.workflow_detail(workflow_by_id(workflow_id), events=events)


@api.post("/workflows/{workflow_id}/signal", response={200: Json, **ERRORS}, summary="Deliver a named event",
          tags=["workflows"])
def workflow_signal(request: HttpRequest, workflow_id: int, payload: SignalIn) -> Json:
    """`agent signal`: a repeated `dedupe_key` is delivered once. Needs `workflows.change_workflow`."""
    require(caller(request), OPERATE_PERMISSION, to="signal workflows")
    result = services.workflow_signal(workflow_id=workflow_id, name=payload.name, payload=payload.payload,
                                      dedupe_key=payload.dedupe_key)
    return result.to_json()


@api.post("/workflows/{workflow_id}/supersede", response={200: Json, **ERRORS}, summary="Change the goal",
          tags=["workflows"])
def workflow_supersede(request: HttpRequest, workflow_id: int, payload: SupersedeIn,
                       idempotency_key: str = IDEMPOTENCY_KEY) -> Json:
    """`agent supersede`: a new intent version; open waits are invalidated. Needs `workflows.change_workflow`.
    With an `Idempotency-Key`, once: the same supersede again answers `already_applied` (no second version)."""
    require(caller(request), OPERATE_PERMISSION, to="change the goal of workflows")
    result = services.workflow_supersede(workflow_id=workflow_id, goal=payload.goal, user=caller(request),
                                         idempotency_key=idempotency_key)
    return result.to_json()


@api.post("/workflows/{workflow_id}/cancel", response={200: Json, **ERRORS}, summary="Cancel a workflow",
          tags=["workflows"])
def workflow_cancel(request: HttpRequest, workflow_id: int, payload: CancelIn) -> Json:
    """`agent cancel`: stop the work, compensate commitments, then cancelled. Needs `workflows.change_workflow`."""
    require(caller(request), OPERATE_PERMISSION, to="cancel workflows")
    result = services.workflow_cancel(workflow_id=workflow_id, reason=payload.reason, user=caller(request))
    return result.to_json()


@api.post("/workflows/{workflow_id}/resume", response={200: Json, **ERRORS}, summary="Resume a workflow",
          tags=["workflows"])
def workflow_resume(request: HttpRequest, workflow_id: int) -> Json:
    """`agent resume`: resume a paused workflow or re-ring a running one. Needs `workflows.change_workflow`."""
    require(caller(request), OPERATE_PERMISSION, to="resume workflows")
    result = services.workflow_resume(workflow_id=workflow_id, user=caller(request))
    return result.to_json()


@api.post("/workflows/{workflow_id}/budget", response={200: Json, **ERRORS}, summary="Set the budget",
          tags=["workflows"])
def workflow_budget(request: HttpRequest, workflow_id: int, payload: BudgetIn) -> Json:
    """`agent budget`: audited; a workflow paused for budget resumes. Needs `workflows.change_workflow`."""
    require(caller(request), OPERATE_PERMISSION, to="change the budget of workflows")
    workflow = services.workflow_budget_set(workflow_id=workflow_id, user=caller(request), total_usd=payload.total_usd,
                                            hourly_usd=payload.hourly_usd)
    return {"id": workflow.pk, "status": workflow.status, "spend": selectors.spend_summary(workflow)}


def decidable_wait(wait_id: int, user: Any) -> Wait:
    """The wait, after the admin's check of who may decide it (role, self-approval): Forbidden when not.

    The service checks again under the row lock; this check answers 403 rather than 409."""
    wait = Wait.objects.select_related("workflow").filter(pk=wait_id).first()
    if wait is None:
        raise NotFound(f"Wait {wait_id} does not exist; GET /api/workflows/ID lists a workflow's waits.",
                       wait_id=wait_id)
    if wait.kind == Wait.Kind.APPROVAL:
        refusal = wait_authority_refusal(wait=wait, user=user)
        if refusal:
            raise Forbidden(refusal, wait_id=wait.pk, workflow_id=wait.workflow_id)
    return wait


def decision(result: services.DecisionResult) -> Json:
    return {"wait_id": result.wait_id, "workflow_id": result.workflow_id, "outcome": result.outcome.value,
            "message": result.message}


@api.post("/waits/{wait_id}/approve", response={200: Json, **ERRORS}, summary="Approve a candidate",
          tags=["waits"])
def wait_approve(request: HttpRequest, wait_id: int, payload: ApproveIn) -> Json:
    """`agent approve`: exactly the candidate you reviewed. A member of the wait's role (or a superuser),
    never on a workflow you launched or whose goal you set. A stale candidate hash: 409."""
    wait = decidable_wait(wait_id, caller(request))
    return decision(services.wait_approve(wait_id=wait.pk, user=caller(request), candidate_hash=payload.candidate_hash,
                                          comment=payload.comment))


@api.post("/waits/{wait_id}/reject", response={200: Json, **ERRORS}, summary="Reject a candidate", tags=["waits"])
def wait_reject(request: HttpRequest, wait_id: int, payload: RejectIn) -> Json:
    """`agent reject`: the workflow fails with your comment (and compensates what it made). Who may: as approve."""
    wait = decidable_wait(wait_id, caller(request))
    return decision(services.wait_reject(wait_id=wait.pk, user=caller(request), comment=payload.comment))
