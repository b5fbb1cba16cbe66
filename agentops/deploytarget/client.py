"""Client of the deploy target: idempotent create, get and delete, with transport errors mapped once."""
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

MAX_KEY_LENGTH = 200
DEPLOYMENT_STATUSES = frozenset({"deployed", "deleted"})

JSONDict = dict[str, Any]


def create_deployment(
    *, base_url: str, idempotency_key: str, body: Mapping[str, Any], timeout: float
) -> JSONDict:
    """Create the deployment for idempotency_key, or return the one that key already made.

    The key is the idempotency mechanism: retrying with the same key never deploys twice,
    so a Retryable (even after the target executed the request) is safe to retry as is.
    A key reused after a delete returns that deleted deployment (status "deleted").
    Raises Retryable (connection failure, timeout, dropped response, 429, 5xx) or Permanent.
    """
    _check_key(idempotency_key)
    url = _collection_url(base_url)
    try:
        payload = json.dumps(dict(body)).encode("utf-8")
    except (TypeError, ValueError) as exc:
        raise Permanent(
            f"The body for deployment key {idempotency_key!r} is not JSON-serialisable ({exc}); "
            "pass plain dicts, lists, strings and numbers.",
            method="POST", url=url, idempotency_key=idempotency_key,
        ) from None
    status, data = _call("POST", url, key=idempotency_key, payload=payload, timeout=timeout)
    _expect_status(status, {200, 201}, method="POST", url=url, key=idempotency_key)
    return _deployment(data, method="POST", url=url, key=idempotency_key, statuses=DEPLOYMENT_STATUSES)


def get_deployment(*, base_url: str, idempotency_key: str, timeout: float) -> JSONDict | None:
    """Return the deployment made with idempotency_key, or None when the target has none (404).

    Read-only. Raises Retryable or Permanent like create_deployment.
    """
    _check_key(idempotency_key)
    url = _item_url(base_url, idempotency_key)
    status, data = _call("GET", url, key=idempotency_key, payload=None, timeout=timeout, allow_404=True)
    if status == 404:
        return None
    _expect_status(status, {200}, method="GET", url=url, key=idempotency_key)
    return _deployment(data, method="GET", url=url, key=idempotency_key, statuses=DEPLOYMENT_STATUSES)


def delete_deployment(*, base_url: str, idempotency_key: str, timeout: float) -> bool:
    """Delete the deployment made with idempotency_key; False when there never was one (404).

    Idempotent: deleting an already deleted deployment returns True with no second effect.
    Raises Retryable or Permanent like create_deployment.
    """
    _check_key(idempotency_key)
    url = _item_url(base_url, idempotency_key)
    status, data = _call("DELETE", url, key=idempotency_key, payload=None, timeout=timeout, allow_404=True)
    if status == 404:
        return False
    _expect_status(status, {200}, method="DELETE", url=url, key=idempotency_key)
    _deployment(data, method="DELETE", url=url, key=idempotency_key, statuses=frozenset({"deleted"}))
    return True


def _collection_url(base_url: str) -> str:
    return base_url.rstrip("/") + "/deployments"


def _item_url(base_url: str, key: str) -> str:
    # safe="" so a key containing "/" stays one path segment.
    return f"{_collection_url(base_url)}/{quote(key, safe='')}"


def _check_key(key: str) -> None:
    # Checked here because http.client raises a bare ValueError for control characters in headers.
    if not isinstance(key, str) or not key.strip() or any(ord(ch) < 32 or ord(ch) == 127 for ch in key):
        raise Permanent(
            f"Idempotency key {key!r} is empty or contains control characters; "
            "derive it from the activity's operation_id.",
            idempotency_key=key,
        )


def _call(
    method: str, url: str, *, key: str, payload: bytes | None, timeout: float, allow_404: bool = False
) -> tuple[int, JSONDict | None]:
    """Send one request; return (status, JSON object) or (404, None) when allowed; map every failure."""
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
        with urllib.request.urlopen(request, timeout=timeout) as response:
            status, raw = response.status, response.read()
    except urllib.error.HTTPError as exc:
        if exc.code == 404 and allow_404:
            return 404, None
        _raise_for_http_error(exc, method=method, url=url, key=key)
    except urllib.error.URLError as exc:
        # Failures while connecting or sending arrive wrapped; the reason is the real error.
        _raise_for_transport_error(exc.reason, method=method, url=url, key=key, timeout=timeout)
    except (OSError, http.client.HTTPException) as exc:
        # Failures while waiting for or reading the response arrive unwrapped.
        _raise_for_transport_error(exc, method=method, url=url, key=key, timeout=timeout)
    return status, _decode(raw, method=method, url=url, key=key, status=status)


def _raise_for_http_error(exc: urllib.error.HTTPError, *, method: str, url: str, key: str) -> NoReturn:
    retry_after = _retry_after_seconds(exc.headers.get("Retry-After") if exc.headers else None)
    detail = _error_detail(exc)
    where = f"{method} {url} (idempotency key {key!r})"
    attrs: dict[str, Any] = {"method": method, "url": url, "idempotency_key": key, "status": exc.code}
    if exc.code == 429 or exc.code >= 500:
        wait = f"after {retry_after:g}s " if retry_after is not None else ""
        raise Retryable(
            f"{where} was answered {exc.code} {exc.reason}: {detail}. The target is overloaded or "
            f"failing; retry {wait}with the same idempotency key, which cannot deploy twice.",
            retry_after_seconds=retry_after, **attrs,
        ) from None
    raise Permanent(
        f"{where} was rejected with {exc.code} {exc.reason}: {detail}. Retrying will not help; "
        "fix the request (key, body) or the deploy target URL.",
        **attrs,
    ) from None


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
    try:
        data = json.loads(raw.decode("utf-8"))
    except (UnicodeDecodeError, ValueError):
        data = None
    if not isinstance(data, dict):
        raise Permanent(
            f"{method} {url} (idempotency key {key!r}) answered {status} with a body that is not a JSON "
            f"object ({raw[:120]!r}); check that the URL points at a deploy target.",
            method=method, url=url, idempotency_key=key, status=status,
        )
    return data


def _expect_status(status: int, expected: set[int], *, method: str, url: str, key: str) -> None:
    if status not in expected:
        raise Permanent(
            f"{method} {url} (idempotency key {key!r}) answered {status}, expected one of "
            f"{sorted(expected)}; check that the URL points at a deploy target.",
            method=method, url=url, idempotency_key=key, status=status,
        )


def _deployment(
    data: JSONDict | None, *, method: str, url: str, key: str, statuses: frozenset[str]
) -> JSONDict:
    """Return data if it is a well-formed deployment for key; otherwise raise Permanent."""
    data = data or {}
    problems = []
    if not isinstance(data.get("deployment_id"), str) or not data["deployment_id"]:
        problems.append("no deployment_id")
    if data.get("idempotency_key") != key:
        problems.append(f"idempotency_key is {data.get('idempotency_key')!r}")
    if data.get("status") not in statuses:
        problems.append(f"status is {data.get('status')!r}, expected one of {sorted(statuses)}")
    if not isinstance(data.get("body"), dict):
        problems.append("body is not an object")
    if not isinstance(data.get("created_at"), str):
        problems.append("no created_at")
    if problems:
        raise Permanent(
            f"{method} {url} (idempotency key {key!r}) returned a malformed deployment: "
            f"{'; '.join(problems)}. Check that the URL points at a deploy target.",
            method=method, url=url, idempotency_key=key,
        )
    return data
