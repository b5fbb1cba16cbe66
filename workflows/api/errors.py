"""The one place where exceptions become HTTP answers: always ``{"error": message}``.

| raised | status |
|---|---|
| ``InvalidInput``, a body that fails its schema, a body that is not JSON | 400 |
| ``TokenRefused``, no bearer token | 401 |
| ``Forbidden`` (missing permission, wrong role, self-approval) | 403 |
| ``NotFound`` | 404 |
| any other ``Refused`` (``WaitRefused``, ``TransitionRefused``: stale candidate, wrong state) | 409 |
| ``Retryable`` | 503 |
| any other ``AgentOpsError`` | 500 |
| ``Http404`` (no such route) | 404 |
| Django's refusals of the request (``RequestDataTooBig``: 413, ``SuspiciousOperation``: 400) | as Django's |
| any other exception | 500, logged with its traceback and the request id (middleware.internal_error) |

Routers added to ``api`` (endpoints.py, and any other module's) inherit these handlers; what happens
outside any endpoint (an unknown path, a refused method, a body too large) is middleware.py's.
"""
from __future__ import annotations

import logging
from typing import Any

from django.http import Http404, HttpRequest, HttpResponse
from ninja import NinjaAPI
from ninja.errors import AuthenticationError, HttpError, ValidationError

from workflows.api import middleware
from workflows.errors import AgentOpsError, InvalidInput, NotFound, Refused, Retryable
from workflows.features.access.tokens import TokenRefused

logger = logging.getLogger("agentops.api")


class Forbidden(Refused):
    """The token's user may not make this request: a permission they lack, a role they do not hold,
    or a decision on their own workflow. Nothing was changed."""


# First match wins: subclasses before their bases.
STATUS_BY_ERROR: tuple[tuple[type[AgentOpsError], int], ...] = (
    (InvalidInput, 400),
    (TokenRefused, 401),
    (Forbidden, 403),
    (NotFound, 404),
    (Refused, 409),
    (Retryable, 503),
    (AgentOpsError, 500),
)


# What any operation can answer besides its own successes, whatever its handler does: a malformed
# request (400), a refused token or signature (401), a missing permission (403), an unknown id (404),
# a state that refuses (409), an error nothing handled (500), a database away for a moment (503); with
# a body, one too large (413) or not sent as JSON (415, middleware.py). The OpenAPI document lists
# them on every operation (endpoints.AgentOpsAPI), so a client meets no status the document does not name.
ANSWERED_BY_EVERY_OPERATION = (400, 401, 403, 404, 409, 500, 503)
ANSWERED_WITH_A_BODY = (413, 415)


def statuses_answered(method: str) -> tuple[int, ...]:
    """The error statuses an operation of this HTTP method can answer."""
    body = method.upper() in middleware.BODY_METHODS
    return tuple(sorted(ANSWERED_BY_EVERY_OPERATION + ANSWERED_WITH_A_BODY * body))


def status_of(exc: AgentOpsError) -> int:
    return next(status for cls, status in STATUS_BY_ERROR if isinstance(exc, cls))


def error_response(api: NinjaAPI, request: HttpRequest, message: str, status: int) -> HttpResponse:
    response = api.create_response(request, {"error": message}, status=status)
    if status == 401:
        response["WWW-Authenticate"] = 'Bearer realm="agentops"'
    return response


def validation_message(errors: list[dict[str, Any]]) -> str:
    """Pydantic's errors as one sentence naming each field: "goal: Field required; priority: …"."""
    parts = []
    for error in errors:
        # The location starts with where the value came from (body, query, path) and the parameter.
        loc = [str(p) for p in error.get("loc", ()) if p not in ("body", "query", "path", "payload")]
        parts.append(f"{'.'.join(loc) or 'body'}: {error.get('msg', 'invalid')}")
    return "Bad input, nothing was changed: " + "; ".join(parts) + "."


def refused_log(request: HttpRequest, status: int, message: str, *, event: str = "api.refused",
                source: str = "", workflow_id: Any = None, error: str = "", into: logging.Logger = logger) -> None:
    """One line per refusal: its status and reason, who sent it (the token's user, or a webhook's
    source) and the workflow it named, so an operator can answer "why was my call refused?"."""
    match = getattr(request, "resolver_match", None)
    if workflow_id is None and match is not None:
        workflow_id = match.kwargs.get("workflow_id")
    user = getattr(request, "auth", None)
    log = into.warning if status < 500 else into.error
    log(event, extra={"status": status, "reason": message[:300], "method": request.method,
                      "path": request.path[:300], "source": source or getattr(user, "username", "") or "anonymous",
                      "workflow_id": workflow_id, "error": error})


def install_error_handlers(api: NinjaAPI) -> None:
    """Map every exception the endpoints can raise; called once, on the API object, so that every
    router added to it (its routes, and any module's) answers in the one shape."""

    def refuse(request: HttpRequest, message: str, status: int, *, error: str, workflow_id: Any = None) -> HttpResponse:
        refused_log(request, status, message, workflow_id=workflow_id, error=error)
        return error_response(api, request, message, status)

    @api.exception_handler(AgentOpsError)
    def agentops_error(request: HttpRequest, exc: AgentOpsError) -> HttpResponse:
        return refuse(request, str(exc), status_of(exc), error=type(exc).__name__,
                      workflow_id=exc.attrs.get("workflow_id"))

    @api.exception_handler(ValidationError)
    def validation_error(request: HttpRequest, exc: ValidationError) -> HttpResponse:
        return refuse(request, validation_message(list(exc.errors)), 400, error="ValidationError")

    @api.exception_handler(HttpError)
    def http_error(request: HttpRequest, exc: HttpError) -> HttpResponse:
        # ninja wraps a body that does not parse in HttpError(400); the parser's InvalidInput says why.
        cause = exc.__cause__
        message = str(cause) if isinstance(cause, AgentOpsError) else str(exc)
        if isinstance(exc, AuthenticationError) and message == "Unauthorized":
            message = ("This endpoint needs an API token: send `Authorization: Bearer <token>`; "
                       "create one with `manage.py agent token create --user NAME`.")
        return refuse(request, message, exc.status_code, error=type(cause or exc).__name__)

    @api.exception_handler(Http404)
    def not_found(request: HttpRequest, exc: Http404) -> HttpResponse:
        return refuse(request, middleware.not_found_message(request), 404, error="Http404")

    @api.exception_handler(Exception)
    def unhandled(request: HttpRequest, exc: Exception) -> HttpResponse:
        # Django's own refusals (a body too large: 413) keep their status; anything else is a 500,
        # logged with its traceback under the request id.
        return middleware.refusal_of(request, exc) or middleware.internal_error(request, exc)
