"""The endpoints: each parses input, checks the permission the admin checks, calls the same service as
`manage.py agent`, and answers with the JSON shape of that verb's ``--json`` (docs/cli.md, "JSON shapes")."""
from __future__ import annotations

from http import HTTPStatus
from typing import Annotated, Any

from django.http import HttpRequest, HttpResponse
from ninja import Header, NinjaAPI, Path, Query, Status
from pydantic import StringConstraints

from workflows import registry, selectors, services
from workflows.api import paging, streams
from workflows.api.auth import LAUNCH_PERMISSION, OPERATE_PERMISSION, VIEW_PERMISSIONS, JsonParser, TokenAuth, require
from workflows.api.errors import Forbidden, install_error_handlers, statuses_answered
from workflows.api.schemas import (
    KIND,
    LABEL_PAIR,
    SIGNAL_NAME,
    WORKFLOW_ID,
    ApproveIn,
    BudgetIn,
    BudgetOut,
    CancelIn,
    DecisionOut,
    ErrorOut,
    EventPage,
    ForkIn,
    ForkOut,
    KindList,
    LaunchIn,
    LaunchOut,
    OccurrenceOut,
    PauseIn,
    PriorityIn,
    RejectIn,
    ResultOut,
    ScheduleIn,
    ScheduleList,
    ScheduleOut,
    ScheduleRemovedOut,
    SignalIn,
    StatusName,
    SteerIn,
    SteerOut,
    SupersedeIn,
    WebhookIn,
    WorkflowDetailOut,
    WorkflowPage,
)
from workflows.authority import wait_authority_refusal
from workflows.errors import NotFound
from workflows.features import forks
from workflows.features.costs import api as costs
from workflows.features.schedules import services as schedules
from workflows.features.webhooks import api as hooks
from workflows.features.webhooks import inbound as webhooks
from workflows.models import Event, Wait, Workflow
from workflows.services.labels import MAX_LABELS, label_filters_parsed


class AgentOpsAPI(NinjaAPI):
    def get_openapi_operation_id(self, operation: Any) -> str:
        # "launch", "wait_approve": the function's name, not ninja's module-qualified default.
        return str(operation.view_func.__name__)

    def get_openapi_schema(self, *, path_prefix: str | None = None, path_params: Any = None) -> Any:
        """The document, with every error status an operation can answer (errors.statuses_answered) and
        each kind's launch parameters as a schema of their own
        (``LaunchParams_<kind>``, from the kind's ``launch_params``: the declaration `agent launch
        --help` and the admin's launch form read too)."""
        schema = super().get_openapi_schema(path_prefix=path_prefix, path_params=path_params)
        components = schema.setdefault("components", {}).setdefault("schemas", {})
        error_shape = {"content": {"application/json": {"schema": {"$ref": "#/components/schemas/ErrorOut"}}}}
        for operations in schema["paths"].values():
            for method, operation in operations.items():
                for status in statuses_answered(method):
                    operation["responses"].setdefault(
                        status, {"description": HTTPStatus(status).phrase, **error_shape})
        for kind in registry.definition_kinds():
            declared = registry.launch_params_schema(kind)
            if declared is not None:
                components[f"LaunchParams_{kind}"] = {**declared, "title": f"Launch parameters of {kind}"}
        return schema


api = AgentOpsAPI(
    title="agentops",
    version="1",
    description="Launch, inspect and steer agents: the operations of `manage.py agent`, with the same JSON "
                "shapes as its `--json`. Authenticate with `Authorization: Bearer <token>` "
                "(`manage.py agent token create --user NAME`). Every 4xx and 5xx answer, of every route, is "
                "`{\"error\": message}`; every answer carries `X-Request-Id` (send one to choose it), which the "
                "server's log lines name. "
                "Lists are cursor-paged: pass a page's `next_cursor` as `cursor`.",
    auth=TokenAuth(),
    parser=JsonParser(),
    urls_namespace="api",
)
install_error_handlers(api)
api.add_router("", streams.router)
api.add_router("", hooks.router)
api.add_router("", costs.router)

Json = dict[str, Any]
# The routes' own refusals; the document adds the rest (413 and 415 for a body) from errors.statuses_answered.
ERRORS: dict[int, Any] = {code: ErrorOut for code in (400, 401, 403, 404, 409, 500, 503)}
WAIT_ID = Path(..., ge=1, le=selectors.MAX_ID, description="the wait's id", examples=[3])
STATUS_FILTER = Query(None, description="only this status")
KIND_FILTER = Query("", pattern=f"^({KIND[1:-1]})?$", max_length=60, description="only this kind")
LABEL_FILTER = Query([], max_length=MAX_LABELS, description=(
    f"only workflows with this label, as key=value (repeatable, at most {MAX_LABELS}: all of them), e.g. "
    "label=team=infra"))
LAUNCHER_FILTER = Query("", max_length=150, pattern=r"^[\w.@+-]*$",
                        description="only workflows launched by this username")
EVENTS_SHOWN = Query(50, ge=0, le=paging.MAX_PAGE, description=f"how many recent events, 0–{paging.MAX_PAGE}; "
                     "older ones: GET /api/workflows/{id}/events")
EVENT_KIND_FILTER = Query("", max_length=60, pattern=r"^[A-Za-z0-9_.-]*$",
                          description="only events of this kind, e.g. wait.opened")
WEBHOOK_SOURCE = Path(..., max_length=40, pattern=r"^[a-z0-9][a-z0-9-]{0,39}$",
                      description="the source, as named in AGENTOPS_WEBHOOK_SECRETS", examples=["ci"])
LabelPair = Annotated[str, StringConstraints(pattern=LABEL_PAIR, max_length=192)]
SIGNAL_NAME_PATH = Path(..., pattern=SIGNAL_NAME, description="the signal's name")


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
    max_length=200, pattern=r"^([\x21-\x7e]([\x20-\x7e]{0,198}[\x21-\x7e])?)?$",
    description="1–200 printable ASCII characters, e.g. a UUID made once per request: the same request sent again with "
                "the key returns the first one's result instead of doing it again; the key with another body is "
                "refused with 409. Keys are kept for good, per operation (launch, supersede).",
)


@api.post("/workflows", response={200: LaunchOut, 201: LaunchOut, **ERRORS}, summary="Launch an agent",
          tags=["workflows"])
def launch(request: HttpRequest, payload: LaunchIn, idempotency_key: str = IDEMPOTENCY_KEY) -> Status[Json]:
    """`agent launch`: the token's user is the launcher (who may not approve it). Needs `workflows.add_workflow`.
    With an `Idempotency-Key`, launched once: 201 the first time, 200 with the same workflow when the same
    request comes again (a retry after a lost answer), 409 when the key was used with another body."""
    require(caller(request), LAUNCH_PERMISSION, to="launch workflows")
    workflow, created = services.workflow_launch_once(
        idempotency_key=idempotency_key, kind=payload.kind, goal=payload.goal, params=payload.params,
        user=caller(request), options=services.LaunchOptions.of(dict(payload)),
    )
    return Status(201 if created else 200, {"id": workflow.pk, "kind": workflow.kind, "status": workflow.status})


@api.get("/workflows", response={200: WorkflowPage, **ERRORS}, summary="List workflows", tags=["workflows"])
def workflow_list(request: HttpRequest, status: StatusName | None = STATUS_FILTER, kind: str = KIND_FILTER,
                  launcher: str = LAUNCHER_FILTER, label: list[LabelPair] = LABEL_FILTER,
                  cursor: str = paging.CURSOR, limit: int = paging.LIMIT) -> Json:
    """`agent list --json`, a page at a time: summaries, newest first. Needs `workflows.view_workflow`."""
    require(caller(request), VIEW_PERMISSIONS, to="see workflows")
    rows = selectors.workflow_list(status=status or "", kind=kind, launcher=launcher,
                                   labels=label_filters_parsed(label, what="label")).select_related("release")
    return paging.keyset_page(rows, key="pk", cursor=cursor, limit=limit, descending=True,
                              shape=selectors.workflow_summary)


@api.get("/workflows/{workflow_id}", response={200: WorkflowDetailOut, **ERRORS}, summary="Show a workflow",
         tags=["workflows"])
def workflow_show(request: HttpRequest, workflow_id: int = WORKFLOW_ID, events: int = EVENTS_SHOWN) -> Json:
    """`agent show --json`: the summary plus waits (with candidate hashes), activities, spend, events…"""
    require(caller(request), VIEW_PERMISSIONS, to="see workflows")
    return selectors.workflow_detail(workflow_by_id(workflow_id), events=events)


@api.get("/workflows/{workflow_id}/events", response={200: EventPage, **ERRORS}, summary="Page a workflow's history",
         tags=["workflows"])
def workflow_events(request: HttpRequest, workflow_id: int = WORKFLOW_ID, kind: str = EVENT_KIND_FILTER,
                    cursor: str = paging.CURSOR, limit: int = paging.LIMIT) -> Json:
    """The event history, oldest first, a page at a time; `next_cursor` is where the next poll starts (the
    history grows). Events moved to an archive by retention are not here (`history_archive` in show says
    where). Needs `workflows.view_workflow`."""
    require(caller(request), VIEW_PERMISSIONS, to="see workflows")
    workflow = workflow_by_id(workflow_id)
    rows = Event.objects.filter(workflow=workflow)
    if kind:
        rows = rows.filter(kind=kind)
    return paging.keyset_page(rows, key="seq", cursor=cursor, limit=limit, descending=False, keep_position=True,
                              shape=lambda e: {"seq": e.seq, "kind": e.kind, "at": e.created_at.isoformat(),
                                               "data": e.data})


@api.post("/workflows/{workflow_id}/signal", response={200: ResultOut, **ERRORS}, summary="Deliver a named event",
          tags=["workflows"])
def workflow_signal(request: HttpRequest, payload: SignalIn, workflow_id: int = WORKFLOW_ID) -> Json:
    """`agent signal`: a repeated `dedupe_key` is delivered once. Needs `workflows.change_workflow`."""
    require(caller(request), OPERATE_PERMISSION, to="signal workflows")
    result = services.workflow_signal(workflow_id=workflow_id, name=payload.name, payload=payload.payload,
                                      dedupe_key=payload.dedupe_key)
    return result.to_json()


@api.post("/workflows/{workflow_id}/supersede", response={200: ResultOut, **ERRORS}, summary="Change the goal",
          tags=["workflows"])
def workflow_supersede(request: HttpRequest, payload: SupersedeIn, workflow_id: int = WORKFLOW_ID,
                       idempotency_key: str = IDEMPOTENCY_KEY) -> Json:
    """`agent supersede`: a new intent version; open waits are invalidated. Needs `workflows.change_workflow`.
    With an `Idempotency-Key`, once: the same supersede again answers `already_applied` (no second version)."""
    require(caller(request), OPERATE_PERMISSION, to="change the goal of workflows")
    result = services.workflow_supersede(workflow_id=workflow_id, goal=payload.goal, user=caller(request),
                                         idempotency_key=idempotency_key)
    return result.to_json()


@api.post("/workflows/{workflow_id}/steer", response={200: SteerOut, **ERRORS}, summary="Steer a running agent",
          tags=["workflows"])
def workflow_steer(request: HttpRequest, payload: SteerIn, workflow_id: int = WORKFLOW_ID) -> Json:
    """`agent steer`: a durable message the agent's next model call receives as a user turn, recorded with who
    sent it; the goal stays (supersede replaces it). A finished workflow, or a kind that reads no steering: 409.
    Needs `workflows.change_workflow`."""
    require(caller(request), OPERATE_PERMISSION, to="steer workflows")
    result = services.workflow_steer(workflow_id=workflow_id, message=payload.message, user=caller(request),
                                     dedupe_key=payload.dedupe_key)
    return result.to_json()


@api.post("/workflows/{workflow_id}/fork", response={201: ForkOut, **ERRORS}, summary="Fork a workflow",
          tags=["workflows"])
def workflow_fork(request: HttpRequest, payload: ForkIn, workflow_id: int = WORKFLOW_ID) -> Status[Json]:
    """`agent fork`: a new workflow of the same kind, parameters and goal that reuses the original's first
    `from_visit` node visits (their recorded results, as its state) and runs on with the current definition;
    the token's user launched it. A visit the original has not finished: 409. Needs `workflows.add_workflow`."""
    require(caller(request), LAUNCH_PERMISSION, to="fork workflows")
    fork = forks.workflow_fork(workflow_id=workflow_id, from_visit=payload.from_visit, user=caller(request))
    return Status(201, selectors.fork_summary(fork))


@api.post("/workflows/{workflow_id}/cancel", response={200: ResultOut, **ERRORS}, summary="Cancel a workflow",
          tags=["workflows"])
def workflow_cancel(request: HttpRequest, payload: CancelIn, workflow_id: int = WORKFLOW_ID) -> Json:
    """`agent cancel`: stop the work, compensate commitments, then cancelled. Needs `workflows.change_workflow`."""
    require(caller(request), OPERATE_PERMISSION, to="cancel workflows")
    result = services.workflow_cancel(workflow_id=workflow_id, reason=payload.reason, user=caller(request))
    return result.to_json()


@api.post("/workflows/{workflow_id}/pause", response={200: ResultOut, **ERRORS}, summary="Pause a workflow",
          tags=["workflows"])
def workflow_pause(request: HttpRequest, payload: PauseIn, workflow_id: int = WORKFLOW_ID) -> Json:
    """`agent pause`: nothing new starts; running activities finish and their results are recorded; resume goes
    on from there. Pausing again answers `already_applied`; a workflow paused for another cause, cancelling or
    finished: 409. Needs `workflows.change_workflow`."""
    require(caller(request), OPERATE_PERMISSION, to="pause workflows")
    result = services.workflow_pause(workflow_id=workflow_id, reason=payload.reason, user=caller(request))
    return result.to_json()


@api.post("/workflows/{workflow_id}/resume", response={200: ResultOut, **ERRORS}, summary="Resume a workflow",
          tags=["workflows"])
def workflow_resume(request: HttpRequest, workflow_id: int = WORKFLOW_ID) -> Json:
    """`agent resume`: resume a paused workflow or re-ring a running one. Needs `workflows.change_workflow`."""
    require(caller(request), OPERATE_PERMISSION, to="resume workflows")
    result = services.workflow_resume(workflow_id=workflow_id, user=caller(request))
    return result.to_json()


@api.post("/workflows/{workflow_id}/priority", response={200: ResultOut, **ERRORS}, summary="Change the priority",
          tags=["workflows"])
def workflow_priority(request: HttpRequest, payload: PriorityIn, workflow_id: int = WORKFLOW_ID) -> Json:
    """`agent priority`: audited (`priority.changed`); from the workflow's next activity attempt on, its model
    calls wait in that band of the shared rate limits. The same priority again answers `already_applied`; a
    finished workflow: 409. Needs `workflows.change_workflow`."""
    require(caller(request), OPERATE_PERMISSION, to="change the priority of workflows")
    result = services.workflow_priority_set(workflow_id=workflow_id, priority=payload.priority, user=caller(request))
    return result.to_json()


@api.post("/workflows/{workflow_id}/budget", response={200: BudgetOut, **ERRORS}, summary="Set the budget",
          tags=["workflows"])
def workflow_budget(request: HttpRequest, payload: BudgetIn, workflow_id: int = WORKFLOW_ID) -> Json:
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


@api.post("/waits/{wait_id}/approve", response={200: DecisionOut, **ERRORS}, summary="Approve a candidate",
          tags=["waits"])
def wait_approve(request: HttpRequest, payload: ApproveIn, wait_id: int = WAIT_ID) -> Json:
    """`agent approve`: exactly the candidate you reviewed. A member of the wait's role (or a superuser),
    never on a workflow you launched or whose goal you set. A stale candidate hash: 409."""
    wait = decidable_wait(wait_id, caller(request))
    return decision(services.wait_approve(wait_id=wait.pk, user=caller(request), candidate_hash=payload.candidate_hash,
                                          comment=payload.comment))


@api.post("/waits/{wait_id}/reject", response={200: DecisionOut, **ERRORS}, summary="Reject a candidate",
          tags=["waits"])
def wait_reject(request: HttpRequest, payload: RejectIn, wait_id: int = WAIT_ID) -> Json:
    """`agent reject`: the workflow fails with your comment (and compensates what it made). Who may: as approve."""
    wait = decidable_wait(wait_id, caller(request))
    return decision(services.wait_reject(wait_id=wait.pk, user=caller(request), comment=payload.comment))


@api.get("/kinds", response={200: KindList, **ERRORS}, summary="List the agent kinds", tags=["workflows"])
def kind_list(request: HttpRequest) -> Json:
    """The kinds a launch may name, each with its launch parameters' JSON schema (the kind's
    declaration; also `LaunchParams_<kind>` in this document's components), or null for a kind that
    takes none. Needs `workflows.add_workflow` or a view permission."""
    require(caller(request), (LAUNCH_PERMISSION, *VIEW_PERMISSIONS), to="see the kinds")
    return {"items": [{"kind": kind, "version": registry.definition(kind).version,
                       "params_schema": registry.launch_params_schema(kind)} for kind in registry.definition_kinds()]}


SCHEDULE_NAME = Path(..., pattern=r"^[A-Za-z0-9_-]{1,80}$", description="the schedule's name", examples=["nightly"])


@api.get("/schedules", response={200: ScheduleList, **ERRORS}, summary="List schedules", tags=["schedules"])
def schedule_list(request: HttpRequest) -> Json:
    """`agent schedule list --json`, by name. Needs `workflows.view_schedule`."""
    require(caller(request), ("workflows.view_schedule", "workflows.change_schedule"), to="see schedules")
    return {"items": [selectors.schedule_summary(s) for s in selectors.schedules()[:paging.MAX_PAGE]]}


@api.post("/schedules", response={201: ScheduleOut, **ERRORS}, summary="Add a schedule", tags=["schedules"])
def schedule_add(request: HttpRequest, payload: ScheduleIn) -> Status[Json]:
    """`agent schedule add`: each occurrence launches as the token's user (docs/operators.md, "Schedules").
    Needs `workflows.add_schedule`; 400 for a bad value or a name in use with other values, with nothing
    written (the same name and values again answer with that schedule, nothing written)."""
    require(caller(request), "workflows.add_schedule", to="add schedules")
    added = schedules.schedule_add(name=payload.name, kind=payload.kind, goal=payload.goal, params=payload.params,
                                   cron=payload.cron, every=payload.every, overlap=payload.overlap,
                                   catch_up=payload.catch_up, jitter=payload.jitter, user=caller(request),
                                   labels=payload.labels)
    return Status(201, selectors.schedule_summary(added))


@api.post("/schedules/{name}/pause", response={200: ScheduleOut, **ERRORS}, summary="Pause a schedule",
          tags=["schedules"])
def schedule_pause(request: HttpRequest, name: str = SCHEDULE_NAME) -> Json:
    """`agent schedule pause`: launches nothing until resumed. Needs `workflows.change_schedule`."""
    require(caller(request), "workflows.change_schedule", to="pause schedules")
    return selectors.schedule_summary(schedules.schedule_pause(name=name))


@api.post("/schedules/{name}/resume", response={200: ScheduleOut, **ERRORS}, summary="Resume a schedule",
          tags=["schedules"])
def schedule_resume(request: HttpRequest, name: str = SCHEDULE_NAME) -> Json:
    """`agent schedule resume`: from the next occurrence. Needs `workflows.change_schedule`."""
    require(caller(request), "workflows.change_schedule", to="resume schedules")
    return selectors.schedule_summary(schedules.schedule_resume(name=name))


@api.post("/schedules/{name}/trigger", response={200: OccurrenceOut, **ERRORS}, summary="Trigger a schedule now",
          tags=["schedules"])
def schedule_trigger(request: HttpRequest, name: str = SCHEDULE_NAME) -> Json:
    """`agent schedule trigger`: an occurrence now, under the overlap policy, launched as the token's user;
    behind a live run `buffered` (buffer_one: launched once it ends) or 409 (skip, or a paused schedule it
    would wait on; nothing written). Needs `workflows.change_schedule`."""
    require(caller(request), "workflows.change_schedule", to="trigger schedules")
    return selectors.occurrence_summary(schedules.schedule_trigger(name=name, user=caller(request)))


@api.delete("/schedules/{name}", response={200: ScheduleRemovedOut, **ERRORS}, summary="Remove a schedule",
            tags=["schedules"])
def schedule_remove(request: HttpRequest, name: str = SCHEDULE_NAME) -> Json:
    """`agent schedule remove`: the schedule and its beat entry; the workflows it launched go on. Needs
    `workflows.delete_schedule`."""
    require(caller(request), "workflows.delete_schedule", to="remove schedules")
    schedules.schedule_remove(name=name)
    return {"name": name, "removed": True}


WEBHOOK_HEADERS = [
    {"name": webhooks.TIMESTAMP_HEADER, "in": "header", "required": True, "example": "1764633600",
     "schema": {"type": "string", "pattern": "^[0-9]{1,12}$"},
     "description": "the time of sending, Unix seconds; refused beyond AGENTOPS_WEBHOOK_TOLERANCE_SECONDS"},
    {"name": webhooks.DELIVERY_HEADER, "in": "header", "required": True, "example": "build-812",
     "schema": {"type": "string", "pattern": "^[\\x21-\\x7e]{1,100}$"},
     "description": "the source's id of the delivery: the same id again is answered already_applied"},
    {"name": webhooks.SIGNATURE_HEADER, "in": "header", "required": True,
     "schema": {"type": "string", "pattern": "^v2=[0-9a-f]{64}$"},
     "description": "v2=<hex HMAC-SHA256 of v2\\n<timestamp>\\n<delivery id>\\nPOST\\n<path>\\n<body>> "
                    "keyed with the source's secret (README, \"Webhooks\")"},
]


@api.post("/hooks/{source}/workflows/{workflow_id}/signals/{name}", auth=None,
          response={200: ResultOut, **ERRORS}, summary="Deliver a signed webhook", tags=["webhooks"],
          openapi_extra={"parameters": WEBHOOK_HEADERS, "requestBody": {"required": True, "content": {
              "application/json": {"schema": WebhookIn.model_json_schema(),
                                   "example": {"payload": {"build": 812, "passed": True}}}}}})
def webhook_deliver(request: HttpRequest, source: str = WEBHOOK_SOURCE, workflow_id: int = WORKFLOW_ID,
                    name: str = SIGNAL_NAME_PATH) -> HttpResponse:
    """A signal from an outside system, authenticated by its signature instead of a token (README, "Webhooks"):
    the same delivery id again answers `already_applied`, even after the workflow finished. 401: a bad
    signature or timestamp; 404: an unknown source or workflow; 409: a finished workflow; 413: over 256 KiB."""
    return webhooks.deliver(request, source, workflow_id, name)
