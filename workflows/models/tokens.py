"""API tokens: a user's credentials for the HTTP API, stored as a SHA-256 digest only."""
from __future__ import annotations

from django.conf import settings
from django.db import models
from django.db.models import Q


class ApiToken(models.Model):
    """One bearer token of one user. The secret is shown once, at creation; only its digest is kept.

    A revoked token stays as a row (``revoked_at`` set) so lists and logs can still name it.
    """

    user = models.ForeignKey(
        settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="api_tokens",
        help_text="Who acts when this token is used: the API applies this user's groups and permissions.",
    )
    name = models.CharField(max_length=100, blank=True, help_text="A label to tell tokens apart, e.g. 'ci'.")
    prefix = models.CharField(
        max_length=12, help_text="The token's first characters, to recognise it in lists; not enough to use it.",
    )
    digest = models.CharField(
        max_length=64, help_text="SHA-256 of the token, in hex; the token itself is never stored.",
    )
    created_at = models.DateTimeField(help_text="When the token was created.")
    last_used_at = models.DateTimeField(
        null=True, blank=True, help_text="When a request last authenticated with it (updated at most once a minute).",
    )
    revoked_at = models.DateTimeField(
        null=True, blank=True, help_text="When it was revoked; a revoked token authenticates nothing.",
    )

    class Meta:
        constraints = [models.UniqueConstraint(fields=["digest"], name="uniq_api_token_digest")]
        indexes = [
            models.Index(fields=["user"], name="api_token_active_user_idx", condition=Q(revoked_at__isnull=True)),
        ]
        ordering = ["-pk"]
        verbose_name = "API token"

    def __str__(self) -> str:
        label = f" ({self.name})" if self.name else ""
        return f"API token {self.pk} {self.prefix}… of {self.user}{label}"

    @property
    def is_active(self) -> bool:
        return self.revoked_at is None
