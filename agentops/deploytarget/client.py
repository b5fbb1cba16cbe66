"""Client of the deploy protocol (docs/deploy-protocol.md): idempotent create, get and delete, errors mapped once."""
from __future__ import annotations

import http.client
import json
import urllib.error
import urllib.request
from collections.abc import Mapping
from datetime import UTC, datetime
from email.utils import parsedate_to_datetime
from typing import Any, NoReturn
from urllib.parse import quote

from workflows.errors import Permanent, Retryable

PROTOCOL_DOC = "docs/deploy-protocol.md"
# Targets must accept keys up to this length (docs/deploy-protocol.md); longer ones may be refused with 400.
MAX_KEY_LENGTH = 200
DEPLOYED = "deployed"
DELETED = "deleted"
# Every deployment this client returns has exactly these keys; the protocol promises only deployment_id.
DEPLOYMENT_FIELDS = ("deployment_id", "idempotency_key", "status", "body", "created_at", "deleted_at")
# Optional fields: when present and not null they must have this type, or the answer is refused.
OPTIONAL_FIELD_TYPES: dict[str, tuple[type, str]] = {
    "idempotency_key": (str, "a string"),
    "status": (str, "a non-empty string"),
    "body": (dict, "a JSON object"),
    "created_at": (str, "a string"),
    "deleted_at": (str, "a string"),
}
# 4xx answers worth retrying with the same key; every other 4xx is Permanent, every 5xx Retryable.
RETRYABLE_4XX = {
    408: "The target timed out reading the request",
    409: "The target is still processing an earlier request with this key",
    429: "The target is overloaded or failing",
}

JSONDict = dict[str, Any]


def create_deployment(
    *, base_url: str, idempotency_key: str, body: Mapping[str, Any], timeout: float
) -> JSONDict:
    """Create the deployment for idempotency_key, or return the one that key already made.

    The key is the idempotency mechanism: retrying with the same key never deploys twice,
    so a Retryable (even after the target executed the request) is safe to retry as is.
    A key whose deployment was deleted never deploys again: the target returns that deployment
    (status "deleted") or answers 410, which raises Permanent.
    Returns the deployment in the shape of DEPLOYMENT_FIELDS (see _deployment). Its body, when the
    target returns one, is the first body sent with this key; check_postcondition compares it.
    Raises Retryable (connection failure, timeout, dropped response, 408, 409, 429, 5xx) or Permanent.
    """
    _check_key(idempotency_key)
    url = _collection_url(base_url)
    try:
        # allow_nan=False: NaN and Infinity are not JSON, and a strict target would refuse them.
        payload = json.dumps(dict(body), allow_nan=False).encode("utf-8")
    except (TypeError, ValueError) as exc:
        raise Permanent(
            f"The body for deployment key {idempotency_key!r} is not JSON-serialisable ({exc}); "
            "pass plain dicts, lists, strings and finite numbers.",
            method="POST", url=url, idempotency_key=idempotency_key,
        ) from None
    status, raw = _call("POST", url, key=idempotency_key, payload=payload, timeout=timeout)
    _expect_status(status, {200, 201}, method="POST", url=url, key=idempotency_key)
    data = _decode(raw, method="POST", url=url, key=idempotency_key, status=status)
    return _deployment(data, method="POST", url=url, key=idempotency_key)


def get_deployment(*, base_url: str, idempotency_key: str, timeout: float) -> JSONDict | None:
    """Return the deployment made with idempotency_key, or None when the target has none (404 or 410).

    Read-only. A 200 without a status means the deployment is in place: status is "deployed".
    Raises Retryable or Permanent like create_deployment; Permanent also when the answer names
    another idempotency key.
    """
    _check_key(idempotency_key)
    url = _item_url(base_url, idempotency_key)
    status, raw = _call("GET", url, key=idempotency_key, payload=None, timeout=timeout, absent={404, 410})
    if status in (404, 410):
        return None
    _expect_status(status, {200}, method="GET", url=url, key=idempotency_key)
    data = _decode(raw, method="GET", url=url, key=idempotency_key, status=status)
    return _deployment(data, method="GET", url=url, key=idempotency_key)


def delete_deployment(*, base_url: str, idempotency_key: str, timeout: float) -> bool:
    """Delete the deployment made with idempotency_key.

    True when the target answered 200 or 204 (deleted now or before) or 410 (deleted before);
    False on 404: the target holds no deployment for the key (never made, or forgotten after a delete).
    Idempotent on the target: a second delete has no second effect. The answer's body is not read,
    since the protocol promises none. Raises Retryable or Permanent like create_deployment.
    """
    _check_key(idempotency_key)
    url = _item_url(base_url, idempotency_key)
    status, _ = _call("DELETE", url, key=idempotency_key, payload=None, timeout=timeout, absent={404, 410})
    if status in (404, 410):
        return status == 410
    _expect_status(status, {200, 204}, method="DELETE", url=url, key=idempotency_key)
    return True


def check_postcondition(
    found: Mapping[str, Any] | None, *, deployment_id: str, body: Mapping[str, Any] | None = None
) -> tuple[bool, str]:
    """Decide whether deployment_id is in place: (True, "") or (False, the reason for a person).

    Pure: judges get_deployment's answer for the key that made deployment_id (None: 404 or 410)
    by what the protocol guarantees. In place means the key still names deployment_id, its status
    is "deployed" (absent counts as deployed) and, where the target returns the body, every field
    of ``body`` equals the returned one. Pass the whole body sent to check all of it, or the fields
    that identify the change (e.g. candidate_hash); a target that returns no body is judged on
    deployment_id and status alone.
    """
    if found is None:
        return False, f"deployment {deployment_id} is not on the deploy target (GET by its key found nothing)"
    if found.get("deployment_id") != deployment_id:
        return False, (
            f"the key of deployment {deployment_id} now names deployment {found.get('deployment_id')!r} "
            "on the deploy target"
        )
    status = found.get("status") or DEPLOYED
    if status != DEPLOYED:
        since = f" since {found['deleted_at']}" if found.get("deleted_at") else ""
        return False, f"deployment {deployment_id} is {status}{since}"
    returned = found.get("body")
    if body is None or returned is None:
        return True, ""
    # Compare as JSON: what was sent went through json.dumps, what came back through json.loads.
    expected = json.loads(json.dumps(dict(body)))
    if not isinstance(returned, Mapping):
        return False, f"deployment {deployment_id} carries a body that is not an object: {_short(returned)}"
    differing = [name for name in expected if name not in returned or returned[name] != expected[name]]
    if not differing:
        return True, ""
    name = differing[0]
    more = f" (and {len(differing) - 1} more fields)" if len(differing) > 1 else ""
    actual = _short(returned[name]) if name in returned else "missing"
    return False, (
        f"deployment {deployment_id} carries another body: {name} is {actual}, expected {_short(expected[name])}{more}"
    )


def _short(value: object) -> str:
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


def _collection_url(base_url: str) -> str:
    return base_url.rstrip("/") + "/deployments"


def _item_url(base_url: str, key: str) -> str:
    # safe="" so a key containing "/" stays one path segment.
    return f"{_collection_url(base_url)}/{quote(key, safe='')}"


def _check_key(key: str) -> None:
    # Checked here because http.client raises a bare ValueError for control characters in headers,
    # and a UnicodeEncodeError for characters outside Latin-1.
    if (
        not isinstance(key, str) or not key.strip() or not key.isascii()
        or any(ord(ch) < 32 or ord(ch) == 127 for ch in key)
    ):
        raise Permanent(
            f"Idempotency key {key!r} is empty or contains control or non-ASCII characters; "
            "send the activity's ctx.idempotency_key.",
            idempotency_key=key,
        )


class _NoRedirect(urllib.request.HTTPRedirectHandler):
    """Refuse redirects: urllib would resend a redirected POST as a GET and report that GET's answer."""

    def redirect_request(self, req: Any, fp: Any, code: Any, msg: Any, headers: Any, newurl: Any) -> None:
        return None


_OPENER = urllib.request.build_opener(_NoRedirect)


def _call(
    method: str, url: str, *, key: str, payload: bytes | None, timeout: float, absent: set[int] | None = None
) -> tuple[int, bytes]:
    """Send one request; return (status, raw body) of a 2xx, or (status, b"") for a status in absent.

    Every other answer and every transport failure raises Retryable or Permanent.
    """
    headers = {"Idempotency-Key": key, "Accept": "application/json"}
    if payload is not None:
        headers["Content-Type"] = "application/json"
    try:
        request = urllib.request.Request(url, data=payload, method=method, headers=headers)
    except ValueError as exc:
        raise Permanent(
            f"Deploy target URL {url!r} is not usable ({exc}); set it to e.g. http://127.0.0.1:8765.",
            method=method, url=url, idempotency_key=key,
        ) from None
    try:
        with _OPENER.open(request, timeout=timeout) as response:
            status, raw = response.status, response.read()
    except urllib.error.HTTPError as exc:
        if exc.code in (absent or set()):
            return exc.code, b""
        _raise_for_http_error(exc, method=method, url=url, key=key)
    except urllib.error.URLError as exc:
        # Failures while connecting or sending arrive wrapped; the reason is the real error.
        _raise_for_transport_error(exc.reason, method=method, url=url, key=key, timeout=timeout)
    except (OSError, http.client.HTTPException) as exc:
        # Failures while waiting for or reading the response arrive unwrapped.
        _raise_for_transport_error(exc, method=method, url=url, key=key, timeout=timeout)
    return status, raw


def _raise_for_http_error(exc: urllib.error.HTTPError, *, method: str, url: str, key: str) -> NoReturn:
    retry_after = _retry_after_seconds(exc.headers.get("Retry-After") if exc.headers else None)
    detail = _error_detail(exc)
    where = f"{method} {url} (idempotency key {key!r})"
    attrs: dict[str, Any] = {"method": method, "url": url, "idempotency_key": key, "status": exc.code}
    if exc.code in RETRYABLE_4XX or exc.code >= 500:
        cause = RETRYABLE_4XX.get(exc.code, "The target is overloaded or failing")
        wait = f"after {retry_after:g}s " if retry_after is not None else ""
        raise Retryable(
            f"{where} was answered {exc.code} {exc.reason}: {detail}. {cause}; "
            f"retry {wait}with the same idempotency key, which cannot deploy twice.",
            retry_after_seconds=retry_after, **attrs,
        ) from None
    raise Permanent(
        f"{where} was rejected with {exc.code} {exc.reason}: {detail}. {_next_step(exc, method=method)}",
        **attrs,
    ) from None


def _next_step(exc: urllib.error.HTTPError, *, method: str) -> str:
    """What a person should do about a refusal that retrying cannot fix."""
    if 300 <= exc.code < 400:
        location = exc.headers.get("Location") if exc.headers else None
        to = f" ({location})" if location else ""
        return ("The client does not follow redirects (a redirected POST would come back as a GET); "
                f"set the deploy target URL to the address that answers{to}.")
    if exc.code in (401, 403):
        return "The target refuses this worker; the protocol has no authentication, so allow it on the target."
    if exc.code == 404 and method == "POST":
        return ("There is no deployments collection at this URL; set the deploy target URL to the base "
                "address, without /deployments.")
    if exc.code == 410 and method == "POST":
        return ("This key's deployment was deleted and a key never deploys twice; "
                "a new deployment needs a new operation, with a new idempotency key.")
    if exc.code == 422:
        return ("The target refuses this body for this key: the key was used before with another body, or "
                "the body is invalid. A key names one deployment; a changed body needs a new operation.")
    return "Retrying will not help; fix the request (key, body) or the deploy target URL."


def _raise_for_transport_error(
    error: object, *, method: str, url: str, key: str, timeout: float
) -> NoReturn:
    where = f"{method} {url} (idempotency key {key!r})"
    attrs: dict[str, Any] = {"method": method, "url": url, "idempotency_key": key, "retry_after_seconds": None}
    # RemoteDisconnected is a ConnectionResetError, so it must be matched first.
    if isinstance(error, http.client.RemoteDisconnected):
        what = "the target closed the connection without a response"
    elif isinstance(error, TimeoutError):
        what = f"no answer within {timeout:g}s"
    elif isinstance(error, ConnectionRefusedError):
        what = "the connection was refused (is the deploy target running?)"
    elif isinstance(error, ConnectionResetError):
        what = "the connection was reset"
    elif isinstance(error, http.client.IncompleteRead):
        what = "the response was cut off"
    elif isinstance(error, OSError):
        what = f"network error: {error}"
    else:
        raise Permanent(
            f"{where} failed: {error}. This is not a transient failure; check that the URL points at "
            "a deploy target speaking HTTP.",
            **attrs,
        ) from None
    raise Retryable(
        f"{where} failed: {what}. The target may or may not have executed it; retry with the same "
        "idempotency key, which cannot deploy twice.",
        **attrs,
    ) from None


def _retry_after_seconds(value: str | None) -> float | None:
    """Parse Retry-After as seconds or an HTTP date; None when absent or unreadable."""
    if not value:
        return None
    try:
        return max(0.0, float(value))
    except ValueError:
        pass
    try:
        when = parsedate_to_datetime(value)
    except (TypeError, ValueError):
        return None
    if when.tzinfo is None:
        when = when.replace(tzinfo=UTC)
    return max(0.0, (when - datetime.now(UTC)).total_seconds())


def _error_detail(exc: urllib.error.HTTPError) -> str:
    try:
        raw = exc.read()
    except (OSError, http.client.HTTPException):
        return "no error body"
    try:
        data = json.loads(raw.decode("utf-8"))
    except (UnicodeDecodeError, ValueError):
        return repr(raw[:200].decode("utf-8", "replace")) if raw else "no error body"
    if isinstance(data, dict) and isinstance(data.get("error"), str):
        return str(data["error"])
    return repr(data)[:200]


def _decode(raw: bytes, *, method: str, url: str, key: str, status: int) -> JSONDict:
    # The Content-Type is not checked: a JSON object is a deployment whatever the header says.
    try:
        data = json.loads(raw.decode("utf-8"))
    except (UnicodeDecodeError, ValueError):
        data = None
    if not isinstance(data, dict):
        raise Permanent(
            f"{method} {url} (idempotency key {key!r}) answered {status} with a body that is not a JSON "
            f"object ({raw[:120]!r}); the deploy protocol ({PROTOCOL_DOC}) answers with a deployment "
            "object. Check that the URL points at a deploy target.",
            method=method, url=url, idempotency_key=key, status=status,
        )
    return data


def _expect_status(status: int, expected: set[int], *, method: str, url: str, key: str) -> None:
    if status not in expected:
        raise Permanent(
            f"{method} {url} (idempotency key {key!r}) answered {status}, expected one of "
            f"{sorted(expected)} ({PROTOCOL_DOC}); check that the URL points at a deploy target.",
            method=method, url=url, idempotency_key=key, status=status,
        )


def _deployment(data: JSONDict, *, method: str, url: str, key: str) -> JSONDict:
    """Return the deployment in data in the shape of DEPLOYMENT_FIELDS; raise Permanent if it is not one.

    Demands only what the protocol promises (a non-empty string deployment_id); optional fields may be
    absent or null, unknown fields are dropped. Absent values become: idempotency_key the key asked
    for, status "deployed", body/created_at/deleted_at None.
    """
    where = f"{method} {url} (idempotency key {key!r})"
    problems = []
    deployment_id = data.get("deployment_id")
    if deployment_id is None:
        problems.append("no deployment_id")
    elif not isinstance(deployment_id, str) or not deployment_id:
        problems.append(f"deployment_id is {_short(deployment_id)}, not a non-empty string")
    for name, (kind, described) in OPTIONAL_FIELD_TYPES.items():
        value = data.get(name)
        if value is not None and (not isinstance(value, kind) or (name == "status" and not value)):
            problems.append(f"{name} is {_short(value)}, not {described} or null")
    if problems:
        raise Permanent(
            f"{where} returned a malformed deployment: {'; '.join(problems)}. The deploy protocol "
            f"({PROTOCOL_DOC}) requires a string deployment_id and gives optional fields fixed types; "
            "check that the URL points at a deploy target that speaks it.",
            method=method, url=url, idempotency_key=key,
        )
    their_key = data.get("idempotency_key")
    if their_key is not None and their_key != key:
        raise Permanent(
            f"{where} returned the deployment of idempotency key {their_key!r}: the target confuses keys. "
            f"It must read the key from the header (POST) or from the one percent-encoded path segment "
            f"(GET, DELETE) as {PROTOCOL_DOC} says; fix the target before deploying through it.",
            method=method, url=url, idempotency_key=key,
        )
    return {
        "deployment_id": deployment_id,
        "idempotency_key": key,
        "status": data.get("status") or DEPLOYED,
        "body": data.get("body"),
        "created_at": data.get("created_at"),
        "deleted_at": data.get("deleted_at"),
    }
