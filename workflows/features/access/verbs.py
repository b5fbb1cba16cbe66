"""`manage.py agent token | role`: who may use the API and who may approve."""
from __future__ import annotations

from typing import Any

from rich.table import Table

from workflows import selectors, services
from workflows.errors import InvalidInput, NotFound
from workflows.features.access import roles, tokens
from workflows.management.verbs.common import (
    Output,
    Verb,
    user_by_name,
)


def add_parsers(verb: Verb) -> None:
    token = verb("token", "Manage API tokens: `token create --user NAME [--name LABEL]` prints a new token once; "
                          "`token list [--user NAME]`; `token revoke ID`.")
    token.add_argument("action", choices=("create", "list", "revoke"))
    token.add_argument("id", type=int, nargs="?", help="the token to revoke")
    token.add_argument("--user", help="create: whose token (the API acts as this user); list: only theirs")
    token.add_argument("--name", default="", help="create: a label to tell tokens apart, e.g. ci")

    role = verb("role", "Approver roles (the groups approval waits name): `role add ROLE --user NAME`, "
                        "`role remove ROLE --user NAME`, `role list [ROLE]`.")
    role.add_argument("action", choices=("add", "remove", "list"))
    role.add_argument("role", nargs="?", help="the role, e.g. release-approvers")
    role.add_argument("--user", action="append", default=[], help="add/remove: a username (repeatable)")


def token(command: Output, options: dict[str, Any]) -> None:
    action, token_id = options["action"], options["id"]
    if (action == "revoke") != (token_id is not None):
        raise InvalidInput("`token revoke` takes the token's id (see `token list`); create and list take none.")
    if action == "create":
        if not options["user"]:
            raise InvalidInput("`token create` needs --user NAME: the user the API will act as.")
        created = tokens.api_token_create(user=user_by_name(options["user"]), name=options["name"])
        command.emit(options, {**selectors.api_token_summary(created.token), "token": created.secret},
                   f"API token {created.token.pk} for {created.token.user.username}: {created.secret}\n"
                   "Store it now: it is not stored and cannot be shown again. Send it as "
                   "`Authorization: Bearer <token>`.")
    elif action == "list":
        rows = [selectors.api_token_summary(t) for t in selectors.api_tokens(username=options["user"] or "")]
        if options["json"]:
            command.emit(options, rows, "")
            return
        table = Table("id", "user", "name", "prefix", "created", "last used", "revoked")
        for row in rows:
            table.add_row(str(row["id"]), row["user"], row["name"], f"{row['prefix']}…", row["created_at"][:19],
                          (row["last_used_at"] or "never")[:19], (row["revoked_at"] or "")[:19])
        command.console.print(table if rows else "No API tokens yet; create one: `agent token create --user NAME`.")
    else:
        token, outcome = tokens.api_token_revoke_if_active(token_id=token_id)
        assert token.revoked_at is not None
        command.emit(options, {"id": token.pk, "outcome": outcome.value},
                   f"API token {token.pk} ({token.prefix}…) of {token.user.username} "
                   + ("revoked." if outcome == services.Outcome.APPLIED else
                      f"was already revoked at {token.revoked_at:%Y-%m-%d %H:%M:%S}; nothing changed."))


def role(command: Output, options: dict[str, Any]) -> None:
    action, role, usernames = options["action"], (options["role"] or "").strip(), options["user"]
    if action == "list":
        if usernames:
            raise InvalidInput("`role list` takes no --user; it lists every role, or the members of ROLE.")
        rows = selectors.roles(name=role)
        if role and not rows:
            raise NotFound(f"No role named {role!r}; create it with `agent role add {role} --user NAME`.")
        if options["json"]:
            command.emit(options, rows, "")
            return
        table = Table("role", "members", "open approvals")
        for row in rows:
            table.add_row(row["role"], ", ".join(row["members"]) or "(none)", str(row["open_approvals"]))
        command.console.print(table if rows else "No roles yet; `agent role add ROLE --user NAME` makes one.")
        return
    if not role or not usernames:
        raise InvalidInput(f"`role {action}` needs ROLE and at least one --user NAME.")
    change = roles.role_member_add if action == "add" else roles.role_member_remove
    results = [(name, change(role=role, user=user_by_name(name))) for name in usernames]
    done = "added to" if action == "add" else "removed from"
    command.emit(options, {"role": role, "users": {name: outcome.value for name, outcome in results}}, "\n".join(
        f"{name} {done} {role}." if outcome == services.Outcome.APPLIED else
        f"{name} was {'already' if action == 'add' else 'not'} a member of {role}; nothing changed."
        for name, outcome in results))


RUN = {"token": token, "role": role}
