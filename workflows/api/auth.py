"""Bearer-token authentication and the permission checks the admin applies."""
from __future__ import annotations

import json
from typing import Any

from django.http import HttpRequest
from ninja.errors import AuthenticationError
from ninja.parser import Parser
from ninja.security import HttpBearer

from workflows.api.errors import Forbidden
from workflows.errors import InvalidInput
from workflows.features.access.tokens import api_token_authenticate

# The admin's permissions (docs/operators.md, "Who may do what"), held by the user or a group.
VIEW_PERMISSIONS = ("workflows.view_workflow", "workflows.change_workflow")
LAUNCH_PERMISSION = "workflows.add_workflow"
OPERATE_PERMISSION = "workflows.change_workflow"


class TokenAuth(HttpBearer):
    """``Authorization: Bearer <token>``: the token's active user, or 401 saying what is wrong."""

    def __call__(self, request: HttpRequest) -> Any:
        scheme, _, secret = request.headers.get("Authorization", "").partition(" ")
        if not scheme:
            raise AuthenticationError()
        if scheme.lower() != "bearer":
            raise AuthenticationError(message=f"The Authorization header uses {scheme[:20]!r}; send "
                                              "`Authorization: Bearer <token>`.")
        return self.authenticate(request, secret)

    def authenticate(self, request: HttpRequest, token: str) -> Any:
        return api_token_authenticate(secret=token)


class JsonParser(Parser):
    """JSON bodies; a body that does not parse is refused saying where (ninja answers 400)."""

    def parse_body(self, request: HttpRequest) -> Any:
        try:
            data = json.loads(request.body)
        except (UnicodeDecodeError, ValueError) as exc:
            where = f": {exc.msg} at position {exc.pos}" if isinstance(exc, json.JSONDecodeError) else ""
            raise InvalidInput(f"The request body is not valid JSON{where}; nothing was changed.") from None
        if not isinstance(data, dict):
            raise InvalidInput(f"The request body must be a JSON object, not {type(data).__name__}; "
                               "nothing was changed.")
        return data


def require(user: Any, permissions: tuple[str, ...] | str, *, to: str) -> None:
    """Forbidden unless ``user`` holds one of ``permissions`` (superusers hold all)."""
    wanted = (permissions,) if isinstance(permissions, str) else permissions
    if any(user.has_perm(p) for p in wanted):
        return
    raise Forbidden(f"{user.username} may not {to}: that needs the permission {wanted[0]!r}; ask an administrator "
                    "to grant it to them or to their group.")
