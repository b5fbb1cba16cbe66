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
"""
from __future__ import annotations

import logging
from typing import Any

from django.http import HttpRequest, HttpResponse
from ninja import NinjaAPI
from ninja.errors import AuthenticationError, HttpError, ValidationError

from workflows.errors import AgentOpsError, InvalidInput, NotFound, Refused, Retryable
from workflows.services.tokens import TokenRefused

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


def install_error_handlers(api: NinjaAPI) -> None:
    """Map every exception the endpoints can raise; called once, on the API object."""

    @api.exception_handler(AgentOpsError)
    def agentops_error(request: HttpRequest, exc: AgentOpsError) -> HttpResponse:
        status = status_of(exc)
        log = logger.warning if status < 500 else logger.error
        log("api.refused", extra={"status": status, "path": request.path, "error": type(exc).__name__})
        return error_response(api, request, str(exc), status)

    @api.exception_handler(ValidationError)
    def validation_error(request: HttpRequest, exc: ValidationError) -> HttpResponse:
        return error_response(api, request, validation_message(list(exc.errors)), 400)

    @api.exception_handler(HttpError)
    def http_error(request: HttpRequest, exc: HttpError) -> HttpResponse:
        # ninja wraps a body that does not parse in HttpError(400); the parser's InvalidInput says why.
        cause = exc.__cause__
        message = str(cause) if isinstance(cause, AgentOpsError) else str(exc)
        if isinstance(exc, AuthenticationError) and message == "Unauthorized":
            message = ("This endpoint needs an API token: send `Authorization: Bearer <token>`; "
                       "create one with `manage.py agent token create --user NAME`.")
        return error_response(api, request, message, exc.status_code)
