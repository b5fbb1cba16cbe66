"""Idempotency keys of client requests (launch, supersede): the same request sent again returns
the first one's result; the same key with another request is refused."""
from __future__ import annotations

import hashlib
import json
from datetime import datetime
from typing import Any

from django.db import IntegrityError, transaction

from workflows.errors import IdempotencyKeyReused, InvalidInput
from workflows.models import ClientRequest

MAX_KEY_LENGTH = 200  # ClientRequest.key


def idempotency_key_checked(key: str) -> str:
    """The key as given, or InvalidInput: 1–200 printable ASCII characters ("" means none)."""
    if not isinstance(key, str):
        raise InvalidInput("The idempotency key must be a string of 1–200 printable characters.")
    if key and (len(key) > MAX_KEY_LENGTH or not key.isascii() or not key.isprintable() or key != key.strip()):
        raise InvalidInput(
            f"The idempotency key {key[:40]!r}{'…' if len(key) > 40 else ''} must be 1–{MAX_KEY_LENGTH} printable "
            "ASCII characters without surrounding spaces, e.g. a UUID made once per request; nothing was changed."
        )
    return key


def request_fingerprint(body: dict[str, Any]) -> str:
    """SHA-256 of the request's body as JSON with sorted keys (values already checked and normalised)."""
    return hashlib.sha256(json.dumps(body, sort_keys=True, default=str).encode()).hexdigest()


def client_request_claim_once(
    *, operation: str, key: str, body: dict[str, Any], user: Any, now: datetime
) -> tuple[ClientRequest, bool]:
    """Claim ``key`` for this request inside the caller's transaction: (row, True) when this call
    is the first with the key, and must do the work and record its result on the row;
    (row, False) when the same request was applied before (its result is on the row).

    Race-safe: unique constraint ``uniq_client_request_key``. A concurrent request with the key
    waits on the constraint until the first one's transaction ends; then it finds the first
    one's row (committed), or claims the key itself (the first one rolled back).
    Raises IdempotencyKeyReused, before anything is written, when the key was used for another
    request (another body, another workflow, another user).
    """
    fingerprint = request_fingerprint(body)
    try:
        with transaction.atomic():
            row = ClientRequest.objects.create(operation=operation, key=key, fingerprint=fingerprint,
                                               requested_by=user, created_at=now)
        return row, True
    except IntegrityError:
        row = ClientRequest.objects.select_related("workflow").get(operation=operation, key=key)
    if row.fingerprint != fingerprint:
        first = f" (workflow {row.workflow_id})" if row.workflow_id else ""
        raise IdempotencyKeyReused(
            f"Idempotency key {key!r} was used for another {operation} request{first}, with other values; nothing "
            f"was changed. Send that request again to get its result, or use a new key for a new {operation}.",
            key=key, operation=operation, workflow_id=row.workflow_id,
        )
    return row, False
