"""Inbound webhooks: outside systems (a CI, a ticket tracker) deliver signals to workflows, signed.

``POST /api/hooks/<source>/workflows/<id>/signals/<name>`` with a JSON object body; the signal's
payload is the body's ``payload`` (absent: null). The source signs each delivery with its shared
secret, signature scheme v2 (the contract, for senders: README, "Webhooks"):

- ``X-Agentops-Timestamp``: the time of sending, in Unix seconds; refused when it is more than
  AGENTOPS_WEBHOOK_TOLERANCE_SECONDS from the server's clock (an old delivery replayed);
- ``X-Agentops-Delivery``: the source's id of this delivery (1-100 printable ASCII characters);
- ``X-Agentops-Signature``: ``v2=`` and the lowercase hex HMAC-SHA256 of ``signed_message``:
  ``v2``, the timestamp, the delivery id, the method, the path and the body bytes, joined by
  newlines (none of the first five can hold one, so no two deliveries share a message). A
  captured delivery thus verifies under no other delivery id, for no other workflow, signal
  or source. Compared in constant time against the source's secret in AGENTOPS_WEBHOOK_SECRETS
  and, during a rotation, its previous one in AGENTOPS_WEBHOOK_PREVIOUS_SECRETS.

The retired unversioned scheme (``sha256=`` over ``<timestamp>.<body>``) is refused, unless the
source is listed in AGENTOPS_WEBHOOK_UNVERSIONED_SOURCES while its sender upgrades.

The signal is stored under ``webhook:<source>:<delivery id>`` (services.workflow_signal_from_webhook),
a namespace the HTTP API and the command line refuse: the same delivery again is answered
``already_applied`` and changes nothing, and no token holder can take its key first. A delivery
refused for any reason changes nothing and is logged (``webhook.refused``).
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

from workflows import services
from workflows.api.errors import refused_log, status_of
from workflows.errors import AgentOpsError

logger = logging.getLogger("agentops.webhooks")  # webhook.delivered; refusals: errors.refused_log

TIMESTAMP_HEADER = "X-Agentops-Timestamp"
SIGNATURE_HEADER = "X-Agentops-Signature"
DELIVERY_HEADER = "X-Agentops-Delivery"
DELIVERY_ID = re.compile(r"^[\x21-\x7e]{1,100}$")
SCHEME = "v2"
UNVERSIONED_PREFIX = "sha256="
HOW_TO_SIGN = ('sign "v2\\n<timestamp>\\n<delivery id>\\n<method>\\n<path>\\n<body>" with HMAC-SHA256 and the '
               "source's secret, and send v2=<lowercase hex> (README, \"Webhooks\")")


class Refusal(Exception):
    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status


def deliver(request: HttpRequest, source: str, workflow_id: int, name: str) -> JsonResponse:
    """The answer to one delivery (the route, with its OpenAPI description, is endpoints.webhook_deliver)."""
    try:
        body, delivery, secret = verified_delivery(request, source)
        result = services.workflow_signal_from_webhook(workflow_id=workflow_id, name=name,
                                                       payload=body.get("payload"), source=source,
                                                       delivery_id=delivery)
    except Refusal as exc:
        return refused(request, source, workflow_id, exc.status, str(exc), error="Refusal")
    except AgentOpsError as exc:
        return refused(request, source, workflow_id, status_of(exc), str(exc), error=type(exc).__name__)
    # "secret": "previous" says a sender still signs with the secret being rotated out.
    logger.info("webhook.delivered", extra={"source": source, "workflow_id": workflow_id, "signal": name,
                                            "delivery": delivery, "secret": secret, "outcome": result.outcome.value})
    return JsonResponse(result.to_json())


def signed_message(*, timestamp: str, delivery: str, method: str, path: str, body: bytes) -> bytes:
    """What scheme v2 signs: ``v2\\n<timestamp>\\n<delivery id>\\n<method>\\n<path>\\n<body>``."""
    return b"\n".join([SCHEME.encode(), timestamp.encode(), delivery.encode(), method.encode(),
                       path.encode("utf-8"), body])


def verified_delivery(request: HttpRequest, source: str) -> tuple[dict[str, Any], str, str]:
    """The delivery's JSON object, its id and which secret verified it ("current" or "previous"),
    once its source, size, timestamp, delivery id and signature are checked."""
    secrets = source_secrets(source)
    length = request.headers.get("Content-Length", "")
    if not length.isdigit() or int(length) > settings.AGENTOPS_WEBHOOK_MAX_BODY_BYTES:
        raise Refusal(413, f"A delivery's body must be at most {settings.AGENTOPS_WEBHOOK_MAX_BODY_BYTES} bytes.")
    raw = request.body
    stamp = request.headers.get(TIMESTAMP_HEADER, "")
    if not stamp.isdigit() or abs(time.time() - int(stamp)) > settings.AGENTOPS_WEBHOOK_TOLERANCE_SECONDS:
        raise Refusal(401, f"{TIMESTAMP_HEADER} must be the time of sending in Unix seconds, within "
                           f"{settings.AGENTOPS_WEBHOOK_TOLERANCE_SECONDS} s of the server's clock.")
    delivery = request.headers.get(DELIVERY_HEADER, "")
    if not DELIVERY_ID.match(delivery):
        raise Refusal(400, f"{DELIVERY_HEADER} must be the delivery's id: 1-100 printable ASCII characters.")
    path = request.path_info
    if "\n" in path or "\r" in path:
        raise Refusal(400, "The path holds a line break; name the workflow's signal without one.")
    message = signed_message(timestamp=stamp, delivery=delivery, method=request.method or "POST", path=path, body=raw)
    secret = signature_verified(request.headers.get(SIGNATURE_HEADER, ""), source, secrets, message_v2=message,
                                message_unversioned=stamp.encode() + b"." + raw)
    try:
        body = json.loads(raw)
    except (UnicodeDecodeError, json.JSONDecodeError):
        raise Refusal(400, "The body must be a JSON object.") from None
    if not isinstance(body, dict):
        raise Refusal(400, "The body must be a JSON object.")
    return body, delivery, secret


def source_secrets(source: str) -> list[tuple[str, str]]:
    """The source's secrets that verify a delivery: its current one, and its previous one during a rotation."""
    current = settings.AGENTOPS_WEBHOOK_SECRETS.get(source)
    if current is None:
        raise Refusal(404, f"No webhook source {source!r} is configured (AGENTOPS_WEBHOOK_SECRETS).")
    previous = settings.AGENTOPS_WEBHOOK_PREVIOUS_SECRETS.get(source)
    return [("current", current)] + ([("previous", previous)] if previous else [])


def signature_verified(given: str, source: str, secrets: list[tuple[str, str]], *, message_v2: bytes,
                       message_unversioned: bytes) -> str:
    """Which secret signed the delivery ("current" or "previous"); every secret is tried, in constant time each."""
    if given.startswith(f"{SCHEME}="):
        prefix, message = f"{SCHEME}=", message_v2
    elif given.startswith(UNVERSIONED_PREFIX):
        if source not in settings.AGENTOPS_WEBHOOK_UNVERSIONED_SOURCES:
            raise Refusal(401, f"{SIGNATURE_HEADER} uses the unversioned scheme (sha256=), which covers neither the "
                               f"delivery id nor the path and is refused; {HOW_TO_SIGN}.")
        prefix, message = UNVERSIONED_PREFIX, message_unversioned
    else:
        raise Refusal(401, f"{SIGNATURE_HEADER} must name its scheme; {HOW_TO_SIGN}.")
    expected = [(label, prefix + hmac.new(secret.encode(), message, hashlib.sha256).hexdigest())
                for label, secret in secrets]
    matched = [label for label, signature in expected if hmac.compare_digest(given.encode(), signature.encode())]
    if not matched:
        raise Refusal(401, f"{SIGNATURE_HEADER} does not match this delivery; {HOW_TO_SIGN}.")
    if prefix == UNVERSIONED_PREFIX:
        logger.warning("webhook.unversioned_accepted", extra={"source": source})
    return matched[0]


def refused(request: HttpRequest, source: str, workflow_id: int, status: int, message: str, *,
            error: str) -> JsonResponse:
    refused_log(request, status, message, event="webhook.refused", source=f"webhook:{source[:60]}",
                workflow_id=workflow_id, error=error, into=logger)
    return JsonResponse({"error": message}, status=status)
