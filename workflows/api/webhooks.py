"""Inbound webhooks: outside systems (a CI, a ticket tracker) deliver signals to workflows, signed.

``POST /api/hooks/<source>/workflows/<id>/signals/<name>`` with a JSON object body; the signal's
payload is the body's ``payload`` (absent: null). The source signs each delivery with its shared
secret (AGENTOPS_WEBHOOK_SECRETS):

- ``X-Agentops-Timestamp``: the time of sending, in Unix seconds; refused when it is more than
  AGENTOPS_WEBHOOK_TOLERANCE_SECONDS from the server's clock (an old delivery replayed);
- ``X-Agentops-Signature``: ``sha256=`` and the hex HMAC-SHA256 of ``<timestamp>.<body bytes>``,
  compared in constant time;
- ``X-Agentops-Delivery``: the source's id of this delivery (1-100 printable characters), the
  signal's dedupe key: a delivery sent again is answered ``already_applied`` and changes nothing.

A delivery refused for any reason changes nothing and is logged (``webhook.refused``).
"""
from __future__ import annotations

import hashlib
import hmac
import json
import logging
import re
import time
from typing import Any

from django.conf import settings
from django.http import HttpRequest, JsonResponse
from django.views.decorators.csrf import csrf_exempt
from django.views.decorators.http import require_POST

from workflows import services
from workflows.api.errors import status_of
from workflows.errors import AgentOpsError

logger = logging.getLogger("agentops.webhooks")

TIMESTAMP_HEADER = "X-Agentops-Timestamp"
SIGNATURE_HEADER = "X-Agentops-Signature"
DELIVERY_HEADER = "X-Agentops-Delivery"
DELIVERY_ID = re.compile(r"^[\x21-\x7e]{1,100}$")


class Refusal(Exception):
    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status


@csrf_exempt  # authenticated by its signature, not by a session
@require_POST
def deliver(request: HttpRequest, source: str, workflow_id: int, name: str) -> JsonResponse:
    try:
        body = verified_body(request, source)
        delivery = request.headers.get(DELIVERY_HEADER, "")
        if not DELIVERY_ID.match(delivery):
            raise Refusal(400, f"{DELIVERY_HEADER} must be the delivery's id: 1-100 printable characters.")
        result = services.workflow_signal(workflow_id=workflow_id, name=name, payload=body.get("payload"),
                                          dedupe_key=f"{source}:{delivery}")
    except Refusal as exc:
        return refused(source, exc.status, str(exc))
    except AgentOpsError as exc:
        return refused(source, status_of(exc), str(exc))
    logger.info("webhook.delivered", extra={"source": source, "workflow_id": workflow_id, "signal": name})
    return JsonResponse(result.to_json())


def verified_body(request: HttpRequest, source: str) -> dict[str, Any]:
    """The delivery's JSON object, once its source, size, timestamp and signature are checked."""
    secret = settings.AGENTOPS_WEBHOOK_SECRETS.get(source)
    if secret is None:
        raise Refusal(404, f"No webhook source {source!r} is configured (AGENTOPS_WEBHOOK_SECRETS).")
    length = request.headers.get("Content-Length", "")
    if not length.isdigit() or int(length) > settings.AGENTOPS_WEBHOOK_MAX_BODY_BYTES:
        raise Refusal(413, f"A delivery's body must be at most {settings.AGENTOPS_WEBHOOK_MAX_BODY_BYTES} bytes.")
    raw = request.body
    stamp = request.headers.get(TIMESTAMP_HEADER, "")
    if not stamp.isdigit() or abs(time.time() - int(stamp)) > settings.AGENTOPS_WEBHOOK_TOLERANCE_SECONDS:
        raise Refusal(401, f"{TIMESTAMP_HEADER} must be the time of sending in Unix seconds, within "
                           f"{settings.AGENTOPS_WEBHOOK_TOLERANCE_SECONDS} s of the server's clock.")
    expected = "sha256=" + hmac.new(secret.encode(), stamp.encode() + b"." + raw, hashlib.sha256).hexdigest()
    if not hmac.compare_digest(expected.encode(), request.headers.get(SIGNATURE_HEADER, "").encode()):
        raise Refusal(401, f"{SIGNATURE_HEADER} does not match the body: sign \"<timestamp>.<body>\" with "
                           "HMAC-SHA256 and the source's secret.")
    try:
        body = json.loads(raw)
    except (UnicodeDecodeError, json.JSONDecodeError):
        raise Refusal(400, "The body must be a JSON object.") from None
    if not isinstance(body, dict):
        raise Refusal(400, "The body must be a JSON object.")
    return body


def refused(source: str, status: int, message: str) -> JsonResponse:
    logger.warning("webhook.refused", extra={"source": source, "status": status, "reason": message[:300]})
    return JsonResponse({"error": message}, status=status)
