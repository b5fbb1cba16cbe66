"""Real HTTP against the live server: tokens made by the command, users with the admin's permissions."""
from __future__ import annotations

import json
import urllib.error
import urllib.request
from dataclasses import dataclass
from io import StringIO
from typing import Any

import pytest
from django.contrib.auth.models import Group, Permission, User
from django.core.management import call_command


@dataclass
class Answer:
    status: int
    body: Any
    headers: Any


class Http:
    """A tiny client for the live server: JSON in, JSON out, errors as answers rather than exceptions."""

    def __init__(self, base_url: str) -> None:
        self.base_url = base_url

    def request(self, method: str, path: str, *, token: str | None = None, json_body: Any = None,
                raw: bytes | None = None, headers: dict[str, str] | None = None) -> Answer:
        data = raw if raw is not None else (json.dumps(json_body).encode() if json_body is not None else None)
        req = urllib.request.Request(self.base_url + path, data=data, method=method)
        if data is not None:
            req.add_header("Content-Type", "application/json")
        if token is not None:
            req.add_header("Authorization", f"Bearer {token}")
        for name, value in (headers or {}).items():
            req.add_header(name, value)
        try:
            with urllib.request.urlopen(req, timeout=30) as response:
                status, payload, got = response.status, response.read(), response.headers
        except urllib.error.HTTPError as exc:
            status, payload, got = exc.code, exc.read(), exc.headers
        ctype = got.get("Content-Type", "")
        return Answer(status, json.loads(payload) if "json" in ctype else payload.decode(), got)

    def get(self, path: str, **kw: Any) -> Answer:
        return self.request("GET", path, **kw)

    def post(self, path: str, body: Any = None, **kw: Any) -> Answer:
        return self.request("POST", path, json_body=body if body is not None else {}, **kw)


@pytest.fixture
def http(live_server: Any) -> Http:
    return Http(f"{live_server.url}/api")


def token_for(username: str, name: str = "") -> str:
    """A token made as an operator makes one: `manage.py agent token create --user NAME --json`."""
    out = StringIO()
    call_command("agent", "token", "create", "--user", username, "--name", name, "--json", stdout=out)
    return str(json.loads(out.getvalue())["token"])


def grant(user: User, *codenames: str) -> User:
    user.user_permissions.add(*Permission.objects.filter(content_type__app_label="workflows",
                                                         codename__in=codenames))
    return user


@pytest.fixture
def approver_token(approver: User) -> str:
    """alice: in release-approvers, whose group may view workflows (docs/operators.md's setup)."""
    group = Group.objects.get(name="release-approvers")
    group.permissions.add(Permission.objects.get(content_type__app_label="workflows", codename="view_workflow"))
    return token_for(approver.username)


@pytest.fixture
def requester_token(requester: User) -> str:
    """rita: may launch and view workflows, and is an approver too (so only self-approval stops her)."""
    grant(requester, "add_workflow", "view_workflow")
    requester.groups.add(Group.objects.get_or_create(name="release-approvers")[0])
    return token_for(requester.username, "rita-ci")


@pytest.fixture
def operator_token(db: None) -> str:
    """olga: may cancel, resume, re-goal, re-budget and signal (workflows.change_workflow)."""
    return token_for(grant(User.objects.create_user("olga"), "change_workflow").username)
