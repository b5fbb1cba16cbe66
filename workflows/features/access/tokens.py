"""API tokens: create (the secret is returned once), revoke, and authenticate a bearer token."""
from __future__ import annotations

import hashlib
import logging
import secrets
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

from workflows import clock
from workflows.errors import InvalidInput, NotFound, Refused
from workflows.models import ApiToken
from workflows.services.common import text_checked
from workflows.services.steps import Outcome

logger = logging.getLogger("agentops.api")

TOKEN_PREFIX = "ao_"
PREFIX_CHARS = 10
MAX_NAME_CHARS = ApiToken._meta.get_field("name").max_length or 100
# Recording every use would write a row per request; once a minute is enough to see idle tokens.
LAST_USED_RESOLUTION = timedelta(minutes=1)


class TokenRefused(Refused):
    """A bearer token that authenticates nobody: unknown, revoked, or its user deactivated."""


@dataclass(frozen=True)
class CreatedToken:
    """A new token and its secret: the only time the secret exists outside the caller's hands."""

    token: ApiToken
    secret: str


def token_digest(secret: str) -> str:
    """SHA-256 of the token, in hex: a token is 256 random bits, so a fast hash is enough (no salt,
    no stretching: nothing to guess), and it lets a request find its row by an indexed lookup."""
    return hashlib.sha256(secret.encode()).hexdigest()


def api_token_create(*, user: Any, name: str = "") -> CreatedToken:
    """Create a token for an active ``user``; the returned secret is never stored nor shown again.

    Not idempotent: every call makes a new token. Raises InvalidInput for a deactivated user or a
    bad label, and then writes nothing.
    """
    if not user.is_active:
        raise InvalidInput(f"User {user.username!r} is deactivated; reactivate them before giving them a token.")
    name = text_checked(name, what="The token name", max_length=MAX_NAME_CHARS) if name.strip() else ""
    secret = TOKEN_PREFIX + secrets.token_urlsafe(32)
    token = ApiToken.objects.create(user=user, name=name, prefix=secret[:PREFIX_CHARS], digest=token_digest(secret),
                                    created_at=clock.now())
    logger.info("api.token.created", extra={"token_id": token.pk, "user": user.username})
    return CreatedToken(token=token, secret=secret)


def api_token_revoke_if_active(*, token_id: int) -> tuple[ApiToken, Outcome]:
    """Revoke a token: every later request with it gets 401.

    Idempotent: conditional UPDATE on ``revoked_at IS NULL``; revoking again returns
    ALREADY_APPLIED and keeps the first revocation time. Raises NotFound for an unknown id.
    """
    updated = ApiToken.objects.filter(pk=token_id, revoked_at__isnull=True).update(revoked_at=clock.now())
    try:
        token = ApiToken.objects.select_related("user").get(pk=token_id)
    except ApiToken.DoesNotExist:
        raise NotFound(f"API token {token_id} does not exist; `manage.py agent token list` shows the tokens.",
                       token_id=token_id) from None
    if updated:
        logger.info("api.token.revoked", extra={"token_id": token.pk, "user": token.user.username})
    return token, Outcome.APPLIED if updated else Outcome.ALREADY_APPLIED


def api_token_authenticate(*, secret: str) -> Any:
    """The active user a bearer token stands for; TokenRefused when it stands for nobody.

    Records the use in ``last_used_at`` at most once a minute (a conditional UPDATE, so
    concurrent requests write it once).
    """
    token = (ApiToken.objects.select_related("user").filter(digest=token_digest(secret.strip())).first()
             if secret.strip() else None)
    if token is None:
        raise TokenRefused("The bearer token is not one this server issued; create one with "
                           "`manage.py agent token create --user NAME`.")
    if token.revoked_at is not None:
        raise TokenRefused(f"API token {token.pk} ({token.prefix}…) was revoked at "
                           f"{token.revoked_at:%Y-%m-%d %H:%M:%S}; ask for a new one.", token_id=token.pk)
    if not token.user.is_active:
        raise TokenRefused(f"The user of API token {token.pk} ({token.user.username}) is deactivated.",
                           token_id=token.pk)
    now = clock.now()
    if token.last_used_at is None or token.last_used_at < now - LAST_USED_RESOLUTION:
        ApiToken.objects.filter(pk=token.pk, last_used_at=token.last_used_at).update(last_used_at=now)
    return token.user

