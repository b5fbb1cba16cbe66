"""API tokens: made by `agent token create` or the admin, shown once, stored as a digest, listed, revoked."""
from __future__ import annotations

import hashlib
import json
from io import StringIO
from typing import Any

import pytest
from django.contrib.auth.models import User
from django.core.management import CommandError, call_command
from django.test import Client

from workflows.features.access.tokens import TokenRefused, api_token_authenticate
from workflows.models import ApiToken


def agent(*args: str) -> str:
    out = StringIO()
    call_command("agent", *args, stdout=out)
    return out.getvalue()


@pytest.mark.django_db
def test_a_token_is_shown_once_and_only_its_digest_is_stored(requester: User) -> None:
    """create prints the secret; the row holds its SHA-256; list shows neither secret nor digest."""
    created = json.loads(agent("token", "create", "--user", "rita", "--name", "ci", "--json"))
    secret = created["token"]
    row = ApiToken.objects.get(pk=created["id"])
    assert row.digest == hashlib.sha256(secret.encode()).hexdigest()
    assert secret not in {row.prefix, row.digest, row.name}
    assert (created["user"], created["name"], created["prefix"]) == ("rita", "ci", secret[:10])

    listed = agent("token", "list", "--json")
    assert secret not in listed and row.digest not in listed
    assert json.loads(listed) == [{key: value for key, value in created.items() if key != "token"}]
    assert "Store it now" in agent("token", "create", "--user", "rita")
    assert api_token_authenticate(secret=secret) == requester


@pytest.mark.django_db
def test_revoking_twice_keeps_the_first_revocation(requester: User) -> None:
    """revoke is idempotent (conditional UPDATE): the second call changes nothing and says so."""
    token_id = json.loads(agent("token", "create", "--user", "rita", "--json"))["id"]
    assert "revoked." in agent("token", "revoke", str(token_id))
    first = ApiToken.objects.get(pk=token_id).revoked_at
    assert json.loads(agent("token", "revoke", str(token_id), "--json"))["outcome"] == "already_applied"
    assert ApiToken.objects.get(pk=token_id).revoked_at == first


@pytest.mark.django_db
def test_token_commands_refuse_bad_input_with_exit_status_2(requester: User) -> None:
    """An unknown user or token, a deactivated user, a missing id: exit 2, nothing created."""
    for args, message in [
        (("create", "--user", "nobody"), "No user named 'nobody'"),
        (("create",), "needs --user NAME"),
        (("revoke",), "takes the token's id"),
        (("revoke", "99999"), "API token 99999 does not exist"),
    ]:
        with pytest.raises(CommandError, match=message) as raised:
            agent("token", *args)
        assert raised.value.returncode == 2
    requester.is_active = False
    requester.save()
    with pytest.raises(CommandError, match="deactivated"):
        agent("token", "create", "--user", "rita")
    assert ApiToken.objects.count() == 0


@pytest.mark.django_db
def test_a_deactivated_users_token_authenticates_nobody(requester: User) -> None:
    secret = json.loads(agent("token", "create", "--user", "rita", "--json"))["token"]
    requester.is_active = False
    requester.save()
    with pytest.raises(TokenRefused, match="rita\\) is deactivated"):
        api_token_authenticate(secret=secret)


@pytest.mark.django_db
def test_the_admin_shows_a_new_token_once_and_revokes_it(admin_client: Client, requester: User) -> None:
    """Created in the admin, the secret is on the answering page only; the list and the token's page never
    show it; the revoke action revokes."""
    page = admin_client.post("/admin/workflows/apitoken/add/", {"user": requester.pk, "name": "from-admin"})
    assert page.status_code == 200
    token = ApiToken.objects.get(name="from-admin")
    secret = page.context["secret"]
    assert secret.startswith("ao_") and secret in page.content.decode()
    assert token.digest == hashlib.sha256(secret.encode()).hexdigest()
    for url in ("/admin/workflows/apitoken/", f"/admin/workflows/apitoken/{token.pk}/change/"):
        shown = admin_client.get(url)
        assert shown.status_code == 200
        assert secret not in shown.content.decode()
        assert token.digest not in shown.content.decode()

    answer: Any = admin_client.post("/admin/workflows/apitoken/",
                                    {"action": "revoke", "_selected_action": [token.pk]}, follow=True)
    assert "1 API token revoked, 0 already revoked." in answer.content.decode()
    token.refresh_from_db()
    assert token.revoked_at is not None
    assert admin_client.post(f"/admin/workflows/apitoken/{token.pk}/delete/").status_code == 403
