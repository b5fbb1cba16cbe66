"""Every answer of ``/api`` (the webhooks included) in the one error shape, and a request id on every request.

The endpoints' own errors are mapped by errors.install_error_handlers; this middleware catches what
happens around them: Django's refusals of a request before any endpoint runs (a body over
DATA_UPLOAD_MAX_MEMORY_SIZE: 413; a malformed request: 400), a path no route has (404), a method a
route does not take (405, ``OPTIONS`` included), a body that is not ``application/json`` (415), and an
exception nothing handled (500, logged with its traceback). Each request gets an id, taken from a
sane ``X-Request-Id`` header or made here, returned as ``X-Request-Id`` and put on every log line
(workflows/logs.py), so a client's report of a 500 finds its traceback.
"""
from __future__ import annotations

import logging
import re
import uuid
from collections.abc import Callable, Iterable, Iterator

from django.conf import settings
from django.core.exceptions import BadRequest, PermissionDenied, RequestDataTooBig, SuspiciousOperation
from django.http import Http404, HttpRequest, HttpResponse, JsonResponse

from workflows.logs import REQUEST_ID

logger = logging.getLogger("agentops.api")

REQUEST_ID_HEADER = "X-Request-Id"
SANE_REQUEST_ID = re.compile(r"^[A-Za-z0-9._:-]{8,64}$")
API_PREFIX = "/api/"
# Readable without a token, and not JSON: the OpenAPI document's HTML viewer.
NOT_JSON = ("/api/docs",)
BODY_METHODS = {"POST", "PUT", "PATCH"}


def is_api(request: HttpRequest) -> bool:
    return request.path_info.startswith(API_PREFIX) and not request.path_info.startswith(NOT_JSON)


def error(message: str, status: int) -> JsonResponse:
    return JsonResponse({"error": message}, status=status)


def internal_error(request: HttpRequest, exc: BaseException) -> JsonResponse:
    """The 500 of an exception nothing handled: its traceback logged under the request id, which the answer names."""
    request_id = REQUEST_ID.get()
    logger.error("api.internal_error", exc_info=(type(exc), exc, exc.__traceback__),
                 extra={"status": 500, "method": request.method, "path": request.path[:300],
                        "error": type(exc).__name__})
    response = error(f"Internal error (request id {request_id}); nothing is known to have changed. The server "
                     "logged its traceback under this id: give it to the operator.", 500)
    response._has_been_logged = True  # type: ignore[attr-defined]  # django.request need not log it again
    return response


def refusal_of(request: HttpRequest, exc: BaseException) -> HttpResponse | None:
    """The answer to an exception Django would turn into an HTML page, or None for one it does not know."""
    if isinstance(exc, RequestDataTooBig):
        return error(f"The request body is over {settings.DATA_UPLOAD_MAX_MEMORY_SIZE} bytes; nothing was changed.",
                     413)
    if isinstance(exc, SuspiciousOperation | BadRequest):
        return error(f"The request was refused: {str(exc)[:200] or type(exc).__name__}; nothing was changed.", 400)
    if isinstance(exc, PermissionDenied):
        return error("Forbidden; nothing was changed.", 403)
    if isinstance(exc, Http404):
        return not_found(request)
    return None


def not_found_message(request: HttpRequest) -> str:
    return f"No route {request.method} {request.path[:200]}: GET /api/openapi.json lists them all."


def not_found(request: HttpRequest) -> JsonResponse:
    return error(not_found_message(request), 404)


def as_error_shape(request: HttpRequest, response: HttpResponse) -> HttpResponse:
    """A 4xx or 5xx that is not JSON (Django's and ninja's plain pages) rewritten as ``{"error": message}``."""
    if response.status_code < 400 or response.streaming or "json" in response.get("Content-Type", ""):
        return response
    if response.status_code == 404:
        rewritten = not_found(request)
    elif response.status_code == 405:
        allowed = response.get("Allow", "")
        rewritten = error(f"{request.method} is not allowed on {request.path[:200]}; it takes {allowed}.", 405)
        rewritten["Allow"] = allowed
    elif response.status_code == 413:
        rewritten = error("The request body is too large; nothing was changed.", 413)
    else:
        text = response.content[:200].decode("utf-8", "replace").strip() if not response.streaming else ""
        what = text if text and "<" not in text else f"status {response.status_code}"
        rewritten = error(f"The request was refused ({what}); nothing was changed.", response.status_code)
    for header in ("WWW-Authenticate", "Retry-After"):
        if header in response:
            rewritten[header] = response[header]
    return rewritten


def unsupported_body(request: HttpRequest) -> HttpResponse | None:
    """415 for a body that is not declared JSON; an empty body (``resume``) needs no Content-Type."""
    if request.method not in BODY_METHODS:
        return None
    length = request.headers.get("Content-Length", "")
    if not length or length == "0":
        return None
    ctype = request.headers.get("Content-Type", "").split(";")[0].strip().lower()
    if ctype == "application/json":
        return None
    return error(f"The body must be sent as Content-Type: application/json, not {ctype[:60] or 'none'!r}; "
                 "nothing was changed.", 415)


def with_request_id(chunks: Iterable[bytes], request_id: str) -> Iterator[bytes]:
    iterator = iter(chunks)
    while True:
        token = REQUEST_ID.set(request_id)
        try:
            chunk = next(iterator)
        except StopIteration:
            return
        finally:
            REQUEST_ID.reset(token)
        yield chunk


class ApiMiddleware:
    """Request ids for every request; for ``/api``, the one error shape for whatever Django or ninja answers."""

    def __init__(self, get_response: Callable[[HttpRequest], HttpResponse]) -> None:
        self.get_response = get_response

    def __call__(self, request: HttpRequest) -> HttpResponse:
        given = request.headers.get(REQUEST_ID_HEADER, "")
        request_id = given if SANE_REQUEST_ID.match(given) else uuid.uuid4().hex
        token = REQUEST_ID.set(request_id)
        try:
            if not is_api(request):
                response = self.get_response(request)
            else:
                response = unsupported_body(request) or as_error_shape(request, self.get_response(request))
        finally:
            REQUEST_ID.reset(token)
        response[REQUEST_ID_HEADER] = request_id
        if response.streaming and not getattr(response, "is_async", False):
            # A stream (server-sent events) runs after this returns: its log lines keep the id too.
            response.streaming_content = with_request_id(response.streaming_content, request_id)  # type: ignore[attr-defined]
        return response

    def process_exception(self, request: HttpRequest, exc: Exception) -> HttpResponse | None:
        if not is_api(request):
            return None
        return refusal_of(request, exc) or internal_error(request, exc)

