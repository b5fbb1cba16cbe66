"""`manage.py agent <verb>`: launch, inspect and steer agents; --json for scripts.

Exit status: 0 on success, 2 on bad input (unknown ids, malformed arguments), 3 when the
request was refused (stale candidate, wrong role, expired wait, workflow in the wrong state).
"""
from __future__ import annotations

import argparse
import getpass
import json
import sys
import tempfile
from datetime import date
from decimal import Decimal, InvalidOperation
from pathlib import Path
from typing import Any

from django.contrib.auth import get_user_model
from django.core.management.base import BaseCommand, CommandError, CommandParser
from rich.console import Console
from rich.markup import escape
from rich.table import Table

from workflows import histories, registry, replay, selectors, services, skeleton
from workflows.errors import AgentOpsError, InvalidInput, NotFound, Refused
from workflows.management import webhook_verb
from workflows.models import Schedule, Signal, Workflow
from workflows.services import roles, schedules, tokens
from workflows.services.labels import MAX_LABELS, label_filters_parsed, label_pairs_parsed
from workflows.services.workflows import SIGNAL_AUTO_KEY_PREFIX, SIGNAL_WEBHOOK_KEY_PREFIX

EXIT_BAD_INPUT = 2
EXIT_REFUSED = 3


class Command(BaseCommand):
    help = "Launch, inspect and steer agents. Run `agent <verb> --help` for each verb."

    def add_arguments(self, parser: CommandParser) -> None:
        verbs = parser.add_subparsers(dest="verb", required=True, parser_class=CommandParser)

        def verb(name: str, help_text: str) -> CommandParser:
            sub = verbs.add_parser(name, help=help_text, description=help_text)
            sub.add_argument("--json", action="store_true", help="print JSON for scripts")
            return sub

        launch = verb("launch", "Launch an agent; prints its workflow id.")
        # Each kind's parameters as it declares them (WorkflowDefinition.launch_params), line by line.
        launch.formatter_class = argparse.RawDescriptionHelpFormatter
        launch.epilog = registry.launch_params_help()
        launch.add_argument("kind", help="workflow kind, e.g. release")
        launch.add_argument("--goal", required=True, help="what the agent should achieve")
        launch.add_argument("--param", action="append", default=[], metavar="KEY=VALUE", help="launch parameter")
        launch.add_argument("--user", help="username of the requester (may not approve its own candidates)")
        launch.add_argument("--max-hours", type=float, help="time limit; past it the workflow is cancelled")
        launch.add_argument("--budget-total", type=usd, metavar="USD", help="total model spend allowed")
        launch.add_argument("--budget-hourly", type=usd, metavar="USD", help="model spend allowed per hour")
        launch.add_argument("--priority", type=int, default=5, help="0–10; 9 and above may pass the hourly budget")
        launch.add_argument("--stagnation-policy", default=Workflow.StagnationPolicy.RECORD,
                            choices=Workflow.StagnationPolicy.values, help="what beat does when progress stalls")
        launch.add_argument("--release-policy", default="",
                            choices=Workflow.ReleasePolicy.values, help="what to do when the model release changes "
                            "(default: the kind's, revalidate unless it declares another)")
        launch.add_argument("--idempotency-key", default="", metavar="KEY",
                            help="launch at most once per key: the same launch again prints the workflow it made; "
                                 "the key with other values is refused")
        launch.add_argument("--fallback-model", default="", metavar="MODEL",
                            help="model to move to on sustained overload (429/529), e.g. claude-haiku-4-5")
        launch.add_argument("--label", action="append", default=[], metavar="KEY=VALUE", help=LABEL_HELP)

        lst = verb("list", "List workflows, newest first.")
        lst.add_argument("--status", choices=Workflow.Status.values, help="only this status")
        lst.add_argument("--kind", help="only this kind")
        lst.add_argument("--label", action="append", default=[], metavar="KEY=VALUE",
                         help="only workflows with this label (repeatable: all of them)")
        lst.add_argument("--limit", type=int, default=50,
                         help=f"at most this many, 1 to {selectors.MAX_LIST_ROWS:,} (default 50)")

        show = verb("show", "Show a workflow: node, waits, activities, commitments, recent events.")
        show.add_argument("id", type=int)
        show.add_argument("--events", type=int, default=50,
                          help=f"how many recent events, 0 to {selectors.MAX_EVENTS:,} (default 50)")

        approve = verb("approve", "Approve an approval wait for one exact candidate.")
        approve.add_argument("wait_id", type=int)
        approve.add_argument("--user", required=True, help="username of the approver")
        approve.add_argument("--candidate-hash", required=True, help="hash of the candidate you reviewed")
        approve.add_argument("--comment", default="")

        reject = verb("reject", "Reject an approval wait; the workflow fails with your comment.")
        reject.add_argument("wait_id", type=int)
        reject.add_argument("--user", required=True, help="username of the approver")
        reject.add_argument("--comment", default="")

        signal = verb("signal", "Deliver a named event to a workflow.")
        signal.add_argument("id", type=int)
        signal.add_argument("name")
        signal.add_argument("--payload", default="null", help="JSON payload")
        key_limit = Signal._meta.get_field("dedupe_key").max_length
        signal.add_argument("--dedupe-key", default="", help=(
            f"a repeated key is delivered once; at most {key_limit} characters, not starting with "
            f"{SIGNAL_AUTO_KEY_PREFIX!r} (reserved for the keys given to signals sent without one) or "
            f"{SIGNAL_WEBHOOK_KEY_PREFIX!r} (reserved for signed webhook deliveries)"))

        supersede = verb("supersede", "Replace the goal with a new intent version; open waits are invalidated.")
        supersede.add_argument("id", type=int)
        supersede.add_argument("--goal", required=True)
        supersede.add_argument("--user", help="username of who changed the goal")
        supersede.add_argument("--idempotency-key", default="", metavar="KEY",
                               help="supersede at most once per key: the same supersede again changes nothing")

        steer = verb("steer", "Send a running agent a message its next model call receives as a user turn "
                              "(the goal stays; `supersede` replaces it).")
        steer.add_argument("id", type=int)
        steer.add_argument("message", help="what to tell the agent, e.g. \"Also update the changelog.\"")
        steer.add_argument("--user", help="username of who sends it (default: this shell's login, recorded as "
                                          "shell:LOGIN)")
        steer.add_argument("--dedupe-key", default="", metavar="KEY",
                           help="send at most once per key: the same key again changes nothing (at most 200 "
                                "characters)")

        fork = verb("fork", "Start a new workflow that reuses the first N node visits of this one (their recorded "
                            "results, as its state) and runs on from visit N+1 with the current definition.")
        fork.add_argument("id", type=int)
        fork.add_argument("--from-visit", type=int, required=True, metavar="N",
                          help="how many of its node visits to reuse: 1 to its current visit minus one "
                               "(`agent show ID` lists the node.entered events with their visits)")
        fork.add_argument("--user", help="username of who forks it (the fork's launcher; default: this shell's "
                                         "login, recorded as shell:LOGIN)")

        cancel = verb("cancel", "Cancel a workflow; its commitments are compensated first.")
        cancel.add_argument("id", type=int)
        cancel.add_argument("--reason", default="")
        cancel.add_argument("--user", help="username of who cancelled (default: this shell's login, recorded as "
                                           "shell:LOGIN)")

        budget = verb("budget", "Set a workflow's budget (audited); a workflow paused for budget resumes.")
        budget.add_argument("id", type=int)
        budget.add_argument("--total", type=usd, metavar="USD")
        budget.add_argument("--hourly", type=usd, metavar="USD")
        budget.add_argument("--user", required=True, help="username of who changed the budget")

        priority = verb("priority", "Change a workflow's priority (0–10, audited): its next attempts wait in that band "
                                    "of the shared rate limits; 9 and above may pass the hourly budget.")
        priority.add_argument("id", type=int)
        priority.add_argument("priority", type=int, help="0–10")
        priority.add_argument("--user", help="username of who changed it (default: this shell's login, recorded as "
                                             "shell:LOGIN)")

        pause = verb("pause", "Pause a running or waiting workflow: nothing new starts, running activities finish "
                              "(docs/operators.md, \"Pausing a workflow\"); `agent resume` goes on.")
        pause.add_argument("id", type=int)
        pause.add_argument("--reason", default="", help="why, recorded on the workflow and in its history")
        pause.add_argument("--user", help="username of who paused (default: this shell's login, recorded as "
                                          "shell:LOGIN)")

        resume = verb("resume", "Resume a paused workflow (or re-ring a running one).")
        resume.add_argument("id", type=int)
        resume.add_argument("--user", help="username of who resumed")

        export = verb("export-history", "Print a workflow's history as JSON Lines (a header, its node visits, its "
                                        "events, an end line), streamed: a replay-check fixture, the retention "
                                        "archive's format. One snapshot, printed once it is read whole, or an "
                                        "error and nothing printed. An archived workflow's prints its archive.")
        export.add_argument("id", type=int)
        export.add_argument("--output", metavar="PATH",
                            help="write it to PATH instead (mode 0600): the file appears whole when the export "
                                 "succeeds and is left as it was (or absent) when it fails")

        token = verb("token", "Manage API tokens: `token create --user NAME [--name LABEL]` prints a new token once; "
                              "`token list [--user NAME]`; `token revoke ID`.")
        token.add_argument("action", choices=("create", "list", "revoke"))
        token.add_argument("id", type=int, nargs="?", help="the token to revoke")
        token.add_argument("--user", help="create: whose token (the API acts as this user); list: only theirs")
        token.add_argument("--name", default="", help="create: a label to tell tokens apart, e.g. ci")

        sched = verb("schedule", "Recurring launches (docs/operators.md, \"Schedules\"): `schedule add NAME --kind K "
                                 "--goal G (--cron \"0 3 * * *\" | --every 6h)`; `list`; `pause`, `resume`, `remove`, "
                                 "`trigger NAME`.")
        sched.add_argument("action", choices=("add", "list", "pause", "resume", "remove", "trigger"))
        sched.add_argument("name", nargs="?", help="the schedule's name (all but list)")
        sched.add_argument("--kind", help="add: the workflow kind each occurrence launches")
        sched.add_argument("--goal", help="add: the goal of each launch")
        sched.add_argument("--param", action="append", default=[], metavar="KEY=VALUE", help="add: launch parameter")
        sched.add_argument("--label", action="append", default=[], metavar="KEY=VALUE",
                           help="add: a label each launch carries (repeatable)")
        sched.add_argument("--cron", default="", metavar="\"M H DOM MON DOW\"",
                           help="add: when, as a five-field cron expression in UTC")
        sched.add_argument("--every", default="", metavar="DURATION", help="add: or an interval, e.g. 6h, 30m, 1h30m")
        sched.add_argument("--overlap", default=Schedule.Overlap.SKIP, choices=Schedule.Overlap.values,
                           help="add: while the previous run is live: skip (default), buffer_one, cancel_previous, "
                                "allow_all")
        sched.add_argument("--catch-up", default="0", metavar="DURATION",
                           help="add: occurrences missed up to this long ago are still launched (default 0)")
        sched.add_argument("--jitter", default="0", metavar="DURATION",
                           help="add: launch each occurrence up to this long after its time (default 0)")
        sched.add_argument("--user", help="add: whose launches they are; trigger: who asked")

        webhook_verb.add_parser(verb("webhook", webhook_verb.HELP))

        role = verb("role", "Approver roles (the groups approval waits name): `role add ROLE --user NAME`, "
                            "`role remove ROLE --user NAME`, `role list [ROLE]`.")
        role.add_argument("action", choices=("add", "remove", "list"))
        role.add_argument("role", nargs="?", help="the role, e.g. release-approvers")
        role.add_argument("--user", action="append", default=[], help="add/remove: a username (repeatable)")

        new_kind = verb("new-kind", "Write the project of a new agent kind (a pip-installable package with a "
                                    "passing test) into --dir/NAME (docs/authoring.md).")
        new_kind.add_argument("name", help="the kind, e.g. followup")
        new_kind.add_argument("--dir", default=".", help="the folder to write it in (default: the current one)")

        usage = verb("usage", "The usage ledger's requests whose outcome is unknown: `usage uncertain [--workflow ID]` "
                              "lists them; `usage settle --file REPORT.jsonl` charges or releases them from the "
                              "provider's usage (docs/operators.md, \"Settling uncertain requests\").")
        usage.add_argument("action", choices=("uncertain", "settle"))
        usage.add_argument("--workflow", type=int, metavar="ID", help="uncertain: only this workflow's requests")
        usage.add_argument("--file", metavar="PATH", help="settle: the usage report, JSON Lines ('-': standard input)")
        usage.add_argument("--user", help="settle: username of who settled (recorded in the events)")

        check = verb("replay-check", "Replay recorded histories against the current definitions; exit status 1 "
                                     "naming each one that would no longer replay (docs/authoring.md).")
        check.add_argument("--kind", help="only workflows of this kind")
        check.add_argument("--since", type=day, metavar="YYYY-MM-DD", help="only workflows launched on or after")
        check.add_argument("--fixtures", action="append", default=[], metavar="PATH",
                           help="a history file (export-history) or a folder of them, checked at every visit; "
                                "repeatable. Without --fixtures, the workflows in flight are checked.")

    def handle(self, *args: Any, **options: Any) -> None:
        self.console = console_for(self.stdout)
        try:
            numbers_checked(options)
            getattr(self, f"_{options['verb'].replace('-', '_')}")(options)
        except (InvalidInput, NotFound) as exc:
            raise CommandError(str(exc), returncode=EXIT_BAD_INPUT) from exc
        except Refused as exc:
            raise CommandError(str(exc), returncode=EXIT_REFUSED) from exc
        except AgentOpsError as exc:
            raise CommandError(str(exc), returncode=1) from exc

    def _emit(self, options: dict[str, Any], data: Any, text: str) -> None:
        if options["json"]:
            self.stdout.write(json.dumps(data, indent=2, default=str))
        else:
            self.console.print(text)

    def _launch(self, options: dict[str, Any]) -> None:
        params = parse_params(options["param"])
        workflow, created = services.workflow_launch_once(
            idempotency_key=options["idempotency_key"],
            kind=options["kind"], goal=options["goal"], params=params, user=user_or_none(options["user"]),
            release_policy=options["release_policy"], max_hours=options["max_hours"], priority=options["priority"],
            budget_total_usd=options["budget_total"], budget_hourly_usd=options["budget_hourly"],
            stagnation_policy=options["stagnation_policy"], fallback_model=options["fallback_model"],
            labels=label_pairs_parsed(options["label"]),
        )
        what = (f"Launched {workflow.kind} workflow {workflow.pk} on {workflow.release}." if created else
                f"Workflow {workflow.pk} ({workflow.kind}) was launched before with this idempotency key; "
                f"nothing new was launched. It is {workflow.status}.")
        self._emit(options, {"id": workflow.pk, "kind": workflow.kind, "status": workflow.status},
                   f"{what}\nFollow it with: manage.py agent show {workflow.pk}")

    def _list(self, options: dict[str, Any]) -> None:
        workflows = selectors.workflow_list(status=options["status"] or "", kind=options["kind"] or "",
                                            labels=label_filters_parsed(options["label"]))
        rows = [selectors.workflow_summary(w) for w in workflows.select_related("release")[: options["limit"]]]
        if options["json"]:
            self._emit(options, rows, "")
            return
        retrying = selectors.workflows_retrying([row["id"] for row in rows])
        table = Table("id", "kind", "status", "node", "intent", "goal", "labels", "updated")
        for row in rows:
            status = f"{row['status']} (retrying)" if row["id"] in retrying and row["status"] == "running" else \
                row["status"]
            table.add_row(str(row["id"]), row["kind"], status, row["current_node"],
                          f"v{row['intent_version']}", row["goal"][:50], labels_text(row["labels"])[:40],
                          row["updated_at"][:19])
        self.console.print(table if rows else "No workflows yet. Launch one with `manage.py agent launch`.")

    def _show(self, options: dict[str, Any]) -> None:
        workflow = workflow_by_id(options["id"])
        detail = selectors.workflow_detail(workflow, events=options["events"])
        if options["json"]:
            self._emit(options, detail, "")
            return
        self.console.print(render_detail(detail))

    def _approve(self, options: dict[str, Any]) -> None:
        result = services.wait_approve(
            wait_id=options["wait_id"], user=user_by_name(options["user"]),
            candidate_hash=options["candidate_hash"], comment=options["comment"],
        )
        self._decision(options, result)

    def _reject(self, options: dict[str, Any]) -> None:
        result = services.wait_reject(
            wait_id=options["wait_id"], user=user_by_name(options["user"]), comment=options["comment"]
        )
        self._decision(options, result)

    def _decision(self, options: dict[str, Any], result: services.DecisionResult) -> None:
        self._emit(options, {"wait_id": result.wait_id, "workflow_id": result.workflow_id,
                             "outcome": result.outcome.value, "message": result.message}, result.message)

    def _signal(self, options: dict[str, Any]) -> None:
        try:
            payload = json.loads(options["payload"])
        except json.JSONDecodeError as exc:
            raise InvalidInput(f"--payload is not valid JSON: {exc.msg} at position {exc.pos}.") from None
        result = services.workflow_signal(
            workflow_id=options["id"], name=options["name"], payload=payload, dedupe_key=options["dedupe_key"]
        )
        self._emit(options, result.to_json(), result.message)

    def _supersede(self, options: dict[str, Any]) -> None:
        result = services.workflow_supersede(
            workflow_id=options["id"], goal=options["goal"], user=user_or_none(options["user"]),
            idempotency_key=options["idempotency_key"],
        )
        self._emit(options, result.to_json(), result.message)

    def _steer(self, options: dict[str, Any]) -> None:
        result = services.workflow_steer(
            workflow_id=options["id"], message=options["message"], user=user_or_none(options["user"]),
            by=f"shell:{shell_login()}", dedupe_key=options["dedupe_key"],
        )
        self._emit(options, result.to_json(), result.message)

    def _fork(self, options: dict[str, Any]) -> None:
        fork = services.workflow_fork(workflow_id=options["id"], from_visit=options["from_visit"],
                                      user=user_or_none(options["user"]), by=f"shell:{shell_login()}")
        self._emit(options, selectors.fork_summary(fork),
                   f"Forked workflow {options['id']} at visit {options['from_visit']}: workflow {fork.pk} "
                   f"({fork.kind}) reused visits 1–{options['from_visit']} and is {fork.status} at "
                   f"{fork.current_node} (visit {fork.node_visit}).\nFollow it with: manage.py agent show {fork.pk}")

    def _cancel(self, options: dict[str, Any]) -> None:
        result = services.workflow_cancel(
            workflow_id=options["id"], reason=options["reason"], user=user_or_none(options["user"]),
            by=f"shell:{shell_login()}",
        )
        self._emit(options, result.to_json(), result.message)

    def _budget(self, options: dict[str, Any]) -> None:
        workflow = services.workflow_budget_set(
            workflow_id=options["id"], user=user_by_name(options["user"]), total_usd=options["total"],
            hourly_usd=options["hourly"],
        )
        spend = selectors.spend_summary(workflow)
        self._emit(options, {"id": workflow.pk, "status": workflow.status, "spend": spend},
                   f"Workflow {workflow.pk} budget: total {spend['budget_total_usd'] or 'unlimited'} USD, "
                   f"hourly {spend['budget_hourly_usd'] or 'unlimited'} USD; it is {workflow.status}.")

    def _priority(self, options: dict[str, Any]) -> None:
        result = services.workflow_priority_set(workflow_id=options["id"], priority=options["priority"],
                                                user=user_or_none(options["user"]), by=f"shell:{shell_login()}")
        self._emit(options, result.to_json(), result.message)

    def _pause(self, options: dict[str, Any]) -> None:
        result = services.workflow_pause(workflow_id=options["id"], reason=options["reason"],
                                         user=user_or_none(options["user"]), by=f"shell:{shell_login()}")
        self._emit(options, result.to_json(), result.message)

    def _resume(self, options: dict[str, Any]) -> None:
        result = services.workflow_resume(workflow_id=options["id"], user=user_or_none(options["user"]),
                                          by=f"shell:{shell_login()}")
        self._emit(options, result.to_json(), result.message)


    def _token(self, options: dict[str, Any]) -> None:
        action, token_id = options["action"], options["id"]
        if (action == "revoke") != (token_id is not None):
            raise InvalidInput("`token revoke` takes the token's id (see `token list`); create and list take none.")
        if action == "create":
            if not options["user"]:
                raise InvalidInput("`token create` needs --user NAME: the user the API will act as.")
            created = tokens.api_token_create(user=user_by_name(options["user"]), name=options["name"])
            self._emit(options, {**selectors.api_token_summary(created.token), "token": created.secret},
                       f"API token {created.token.pk} for {created.token.user.username}: {created.secret}\n"
                       "Store it now: it is not stored and cannot be shown again. Send it as "
                       "`Authorization: Bearer <token>`.")
        elif action == "list":
            rows = [selectors.api_token_summary(t) for t in selectors.api_tokens(username=options["user"] or "")]
            if options["json"]:
                self._emit(options, rows, "")
                return
            table = Table("id", "user", "name", "prefix", "created", "last used", "revoked")
            for row in rows:
                table.add_row(str(row["id"]), row["user"], row["name"], f"{row['prefix']}…", row["created_at"][:19],
                              (row["last_used_at"] or "never")[:19], (row["revoked_at"] or "")[:19])
            self.console.print(table if rows else "No API tokens yet; create one: `agent token create --user NAME`.")
        else:
            token, outcome = tokens.api_token_revoke_if_active(token_id=token_id)
            assert token.revoked_at is not None
            self._emit(options, {"id": token.pk, "outcome": outcome.value},
                       f"API token {token.pk} ({token.prefix}…) of {token.user.username} "
                       + ("revoked." if outcome == services.Outcome.APPLIED else
                          f"was already revoked at {token.revoked_at:%Y-%m-%d %H:%M:%S}; nothing changed."))

    def _schedule(self, options: dict[str, Any]) -> None:
        action, name = options["action"], options["name"]
        if (action == "list") != (name is None):
            raise InvalidInput(f"`schedule {action}` " + ("takes no name." if action == "list" else "needs the "
                               "schedule's NAME (see `schedule list`)."))
        if action == "add":
            if not options["kind"] or options["goal"] is None:
                raise InvalidInput("`schedule add NAME` needs --kind KIND and --goal GOAL.")
            added = schedules.schedule_add(
                name=name, kind=options["kind"], goal=options["goal"], params=parse_params(options["param"]),
                cron=options["cron"], every=options["every"], overlap=options["overlap"],
                catch_up=options["catch_up"], jitter=options["jitter"], user=user_or_none(options["user"]),
                labels=label_pairs_parsed(options["label"]))
            self._emit(options, selectors.schedule_summary(added),
                       f"Schedule {added.name}: {added.kind}, {added.when}; next at "
                       f"{added.next_due_at:%Y-%m-%d %H:%M:%S} UTC.")
        elif action == "list":
            rows = [selectors.schedule_summary(s) for s in selectors.schedules()]
            if options["json"]:
                self._emit(options, rows, "")
                return
            table = Table("name", "kind", "when", "overlap", "paused", "next (UTC)", "last", "launched")
            for row in rows:
                last = row["last_occurrence"]
                table.add_row(row["name"], row["kind"], row["when"], row["overlap"], "yes" if row["paused"] else "",
                              row["next_due_at"][:19], f"{last['outcome']} {last['at'][:19]}" if last else "—",
                              str(row["launched"]))
            self.console.print(table if rows else "No schedules yet; add one: `agent schedule add NAME --kind K "
                                                  "--goal G --every 6h`.")
        elif action == "trigger":
            occurrence = schedules.schedule_trigger(name=name, user=user_or_none(options["user"]))
            self._emit(options, selectors.occurrence_summary(occurrence),
                       f"Schedule {name}: {occurrence.outcome}"
                       + (f" workflow {occurrence.workflow_id}" if occurrence.workflow_id else "")
                       + (f" ({occurrence.reason})" if occurrence.reason else "") + ".")
        elif action == "remove":
            schedules.schedule_remove(name=name)
            self._emit(options, {"name": name, "removed": True},
                       f"Schedule {name} removed; the workflows it launched go on.")
        else:
            changed = schedules.schedule_pause(name=name) if action == "pause" else schedules.schedule_resume(name=name)
            self._emit(options, selectors.schedule_summary(changed),
                       f"Schedule {name} {'paused' if changed.paused else 'resumed'}.")

    def _webhook(self, options: dict[str, Any]) -> None:
        webhook_verb.run(self, options)

    def _role(self, options: dict[str, Any]) -> None:
        action, role, usernames = options["action"], (options["role"] or "").strip(), options["user"]
        if action == "list":
            if usernames:
                raise InvalidInput("`role list` takes no --user; it lists every role, or the members of ROLE.")
            rows = selectors.roles(name=role)
            if role and not rows:
                raise NotFound(f"No role named {role!r}; create it with `agent role add {role} --user NAME`.")
            if options["json"]:
                self._emit(options, rows, "")
                return
            table = Table("role", "members", "open approvals")
            for row in rows:
                table.add_row(row["role"], ", ".join(row["members"]) or "(none)", str(row["open_approvals"]))
            self.console.print(table if rows else "No roles yet; `agent role add ROLE --user NAME` makes one.")
            return
        if not role or not usernames:
            raise InvalidInput(f"`role {action}` needs ROLE and at least one --user NAME.")
        change = roles.role_member_add if action == "add" else roles.role_member_remove
        results = [(name, change(role=role, user=user_by_name(name))) for name in usernames]
        done = "added to" if action == "add" else "removed from"
        self._emit(options, {"role": role, "users": {name: outcome.value for name, outcome in results}}, "\n".join(
            f"{name} {done} {role}." if outcome == services.Outcome.APPLIED else
            f"{name} was {'already' if action == 'add' else 'not'} a member of {role}; nothing changed."
            for name, outcome in results))

    def _new_kind(self, options: dict[str, Any]) -> None:
        root = skeleton.write_skeleton(options["name"], Path(options["dir"]))
        module = options["name"].replace("-", "_")
        self._emit(options, {"kind": options["name"], "path": str(root)},
                   f"Wrote the {options['name']} kind to {root}. Next:\n"
                   f"  cd {root} && pip install -e . && python -m pytest   # the kit's tests, no database\n"
                   f"  edit {module}/definition.py and {module}/activities.py (docs/authoring.md)")

    def _usage(self, options: dict[str, Any]) -> None:
        if options["action"] == "uncertain":
            if options["file"]:
                raise InvalidInput("`usage uncertain` takes no --file; did you mean `usage settle --file`?")
            rows = selectors.usage_uncertain(workflow_id=options["workflow"])
            if options["json"]:
                self._emit(options, rows, "")
                return
            table = Table("workflow", "key", "model", "held USD", "since", "why")
            for row in rows:
                table.add_row(str(row["workflow_id"]), row["key"], row["model"], row["reserved_usd"],
                              row["created_at"][:19], row["outcome"][:60])
            self.console.print(table if rows else "No uncertain requests: every request's outcome is known.")
            return
        if not options["file"]:
            raise InvalidInput("`usage settle` needs --file PATH: the usage report (JSON Lines), or - for stdin.")
        if options["file"] == "-":
            lines = sys.stdin.read().splitlines()
        else:
            path = Path(options["file"])
            if not path.is_file():
                raise InvalidInput(f"--file {options['file']}: no such file.")
            try:
                lines = path.read_text(encoding="utf-8").splitlines()
            except UnicodeDecodeError:
                raise InvalidInput(f"--file {options['file']} is not UTF-8 text (a JSON Lines report).") from None
        summary = services.usage_settle_from_report(report=services.usage_report_parse(lines),
                                                    user=user_or_none(options["user"]))
        self._emit(options, summary.to_json(), summary.message)

    def _export_history(self, options: dict[str, Any]) -> None:
        workflow = workflow_by_id(options["id"])
        if options["output"]:
            path = Path(options["output"])
            if not path.parent.is_dir():
                raise InvalidInput(f"--output {options['output']}: no folder {path.parent} to write it in.")
            with histories.replaced(path) as out:
                history_copy(workflow, out)
            return
        # Spooled to disk (memory stays flat), printed once whole: a refusal prints nothing.
        with tempfile.TemporaryFile("w+", encoding="utf-8") as spool:
            history_copy(workflow, spool)
            spool.seek(0)
            while chunk := spool.read(COPY_CHARS):
                self.stdout.write(chunk, ending="")

    def _replay_check(self, options: dict[str, Any]) -> None:
        checked: list[tuple[str, replay.Divergence | None]] = []
        if options["fixtures"]:
            for path in fixture_files(options["fixtures"]):
                checked.append((str(path), check_file(path)))
        else:
            for workflow in selectors.workflows_in_flight(kind=options["kind"] or "", since=options["since"]):
                history = replay.history_of(workflow, current_visit_only=True)
                checked.append((f"workflow {workflow.pk}", replay.check(history)))
        found = [(label, d) for label, d in checked if d is not None]
        if options["json"]:
            self.stdout.write(json.dumps({"checked": len(checked), "diverged": [
                {"source": label, "workflow_id": d.workflow_id, "kind": d.kind, "node": d.node, "visit": d.visit,
                 "operation_id": d.operation_id, "reason": d.reason} for label, d in found]}, indent=2))
        else:
            for label, divergence in found:
                self.console.print(f"{label}: {divergence}", markup=False, soft_wrap=True)
            self.console.print(f"{len(checked) - len(found)} of {len(checked)} histories replay on the current "
                               "definitions.")
        if found:
            raise CommandError(f"{len(found)} of {len(checked)} histories would no longer replay; keep the old "
                               "path for them (docs/authoring.md, \"Changing a definition\").", returncode=1)


COPY_CHARS = 1 << 16


def history_copy(workflow: Workflow, out: histories.TextOut) -> None:
    """The history of ``workflow`` as one snapshot, or its archive file when the snapshot shows
    it archived (before the export, or by retention before its snapshot began)."""
    try:
        histories.write(workflow, out)
    except histories.HistoryArchived:
        archive_copy(workflow_by_id(workflow.pk), out)


def archive_copy(workflow: Workflow, out: histories.TextOut) -> None:
    """Copy an archived workflow's archive file to ``out``, a chunk at a time."""
    try:
        with open(workflow.history_archive_path, encoding="utf-8") as archive:
            while chunk := archive.read(COPY_CHARS):
                out.write(chunk)
    except OSError as exc:
        raise NotFound(f"Workflow {workflow.pk}'s history was archived on {workflow.history_archived_at:%Y-%m-%d} to "
                       f"{workflow.history_archive_path}, which cannot be read here ({exc.strerror}); run this where "
                       "AGENTOPS_ARCHIVE_DIR is mounted, or read the file from your backups.") from None


def fixture_files(paths: list[str]) -> list[Path]:
    """The history files named, folders expanded to their *.json and *.jsonl files; InvalidInput
    for a missing path."""
    files: list[Path] = []
    for raw in paths:
        path = Path(raw)
        if path.is_dir():
            files.extend(sorted([*path.glob("*.json"), *path.glob("*.jsonl")]))
        elif path.is_file():
            files.append(path)
        else:
            raise InvalidInput(f"--fixtures {raw}: no such file or folder.")
    return files


def check_file(path: Path) -> replay.Divergence | None:
    """Replay every visit of a history file (JSON Lines, or the older one-object JSON), read as
    it is checked; InvalidInput when the file is not a whole history."""
    try:
        with histories.opened(path) as (history, visits):
            return replay.check_stream(history, visits)
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise InvalidInput(f"{path} is not a history written by `agent export-history`: {exc}") from None


def day(raw: str) -> date:
    """An argparse type: a date as YYYY-MM-DD."""
    try:
        return date.fromisoformat(raw)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{raw!r} is not a date as YYYY-MM-DD") from None


def console_for(stream: Any) -> Console:
    """A rich console on the command's stdout; 120 columns when not a terminal (pipes, logs)."""
    return Console(file=stream, highlight=False, width=None if stream.isatty() else 120)


# The whole-number options and what they may be: an id within PostgreSQL's bigint, a count within what
# one answer holds. Checked before anything runs, so a number out of range is a one-line refusal (exit
# status 2), never a query the database fails on.
NUMBER_RANGES = {
    "id": ("ID", 1, selectors.MAX_ID), "wait_id": ("WAIT_ID", 1, selectors.MAX_ID),
    "workflow": ("--workflow", 1, selectors.MAX_ID), "limit": ("--limit", 1, selectors.MAX_LIST_ROWS),
    "events": ("--events", 0, selectors.MAX_EVENTS), "from_visit": ("--from-visit", 1, 2**31 - 1),
}


def numbers_checked(options: dict[str, Any]) -> None:
    for key, (name, low, high) in NUMBER_RANGES.items():
        value = options.get(key)
        if not isinstance(value, int):
            continue
        if value < low:
            raise InvalidInput(f"{name} must be {low} or more; got {value}." if low == 0 else
                               f"{name} must be at least {low}; got {value}.")
        if value > high:
            raise InvalidInput(f"{name} must be at most {high:,}; got {value}.")


def usd(raw: str) -> Decimal:
    """An argparse type: a positive amount of US dollars."""
    try:
        value = Decimal(raw)
    except InvalidOperation:
        raise argparse.ArgumentTypeError(f"{raw!r} is not an amount of USD, e.g. 12.50") from None
    if not value.is_finite() or value <= 0:
        raise argparse.ArgumentTypeError(f"{raw!r} must be a positive amount of USD")
    return value


def parse_params(pairs: list[str]) -> dict[str, str]:
    params: dict[str, str] = {}
    for pair in pairs:
        key, sep, value = pair.partition("=")
        if not sep or not key.strip():
            raise InvalidInput(f"--param {pair!r} is not KEY=VALUE.")
        if key.strip() in params:
            raise InvalidInput(f"--param {key.strip()} is given twice.")
        params[key.strip()] = value
    return params


LABEL_HELP = (f"a label to find it by (repeatable, at most {MAX_LABELS}): a key of lowercase letters, digits, _ and - "
              "starting with a letter; a value of 1–128 letters, digits and . _ - : / @ +")


def labels_text(labels: dict[str, str]) -> str:
    return ", ".join(f"{key}={value}" for key, value in labels.items())


def user_by_name(username: str) -> Any:
    """The active user named ``username``; a deactivated account may not act (nor log in to the admin)."""
    user_model = get_user_model()
    try:
        user = user_model.objects.get(username=username)
    except user_model.DoesNotExist:
        raise NotFound(f"No user named {username!r}; create one with `manage.py createsuperuser` "
                       "or in the admin.") from None
    if not user.is_active:
        raise InvalidInput(f"User {username!r} is deactivated (Active is off in the admin); act as an active user, "
                           f"or reactivate {username} first.")
    return user


def user_or_none(username: str | None) -> Any:
    return user_by_name(username) if username else None


def workflow_by_id(workflow_id: int) -> Workflow:
    try:
        return Workflow.objects.select_related("release").get(pk=workflow_id)
    except Workflow.DoesNotExist:
        raise NotFound(f"Workflow {workflow_id} does not exist; `manage.py agent list` shows the existing ones.") \
            from None


CANDIDATE_LINES = 60


def candidate_text(candidate: Any) -> str:
    """A candidate as indented JSON for the terminal; past CANDIDATE_LINES lines, cut with a pointer
    to the whole (``agent show --json``)."""
    lines = json.dumps(candidate, indent=2, sort_keys=True, default=str, ensure_ascii=False).splitlines()
    shown = [f"    {line}" for line in lines[:CANDIDATE_LINES]]
    if len(lines) > CANDIDATE_LINES:
        shown.append(f"    … {len(lines) - CANDIDATE_LINES} more lines: `agent show ID --json` prints it whole")
    return escape("\n".join(shown))


def shell_login() -> str:
    """Who runs this command, as the operating system names them (recorded when no --user is given)."""
    try:
        return getpass.getuser()
    except (KeyError, OSError):  # no login name for this uid (a container's)
        import os

        return f"uid {os.getuid()}"


def extra_table(name: str, value: Any) -> Any:
    """A kind's extra key as a table: one row per item of a list of objects, else one row."""
    items = value if isinstance(value, list) else [value]
    objects = [i for i in items if isinstance(i, dict)]
    columns = list(dict.fromkeys(k for i in objects for k in i))[:6] or ["value"]
    table = Table(*columns, title=name.replace("_", " ").capitalize())
    for item in items:
        cells = [item.get(c, "") for c in columns] if isinstance(item, dict) else [item]
        table.add_row(*(str(c)[:70] for c in cells))
    return table


def render_detail(detail: dict[str, Any]) -> Any:
    from rich.console import Group

    head = (f"[bold]Workflow {detail['id']}[/] {detail['kind']} — [bold]{detail['status']}[/] at "
            f"{detail['current_node']} (intent v{detail['intent_version']})\nGoal: {detail['goal']}\n"
            f"Release: {detail['release']['provider']} {detail['release']['model']} "
            f"prompt {detail['release']['prompt_version']}")
    if detail.get("labels"):
        head += f"\nLabels: {escape(labels_text(detail['labels']))}"
    if detail.get("pause_cause"):
        head += f"\nPaused: {detail['pause_cause']}"
    if detail["reason"]:
        head += f"\nReason: {detail['reason']}"
    for r in detail.get("retrying", []):
        head += (f"\nRetrying: {r['name']} ({r['operation_id']}) failed attempt {r['attempts']} of "
                 f"{r['max_attempts']}; next try at {(r['next_attempt_at'] or '')[:19].replace('T', ' ')} UTC: "
                 f"{escape(r['error'][:200])}")
    if detail.get("handler_failures"):
        retry = detail.get("advance_retry_at")
        head += (f"\nHandler failures: {detail['handler_failures']} in a row"
                 + (f"; next try at {retry[:19]}" if retry else "") + " (see the workflow.handler_failed events)")
    archive = detail.get("history_archive")
    if archive:
        head += (f"\nHistory: archived on {archive['archived_at'][:19]} to {archive['path']} (its checkpoints and "
                 f"the events before it); `{archive['export']}` prints it")
    spend = detail["spend"]
    simulated = " (simulated: scripted provider)" if detail["release"]["provider"] == "scripted" else ""
    head += (f"\nSpend{simulated}: {spend['spent_usd']} USD of {spend['budget_total_usd'] or 'unlimited'} "
             f"(last hour {spend['last_hour_usd']} of {spend['budget_hourly_usd'] or 'unlimited'}) over "
             f"{spend['calls']} model calls, {spend['tokens_per_call']} tokens per call"
             + (f"; runway {spend['runway_hours']} h" if spend["runway_hours"] is not None else ""))
    for suggestion in spend["suggestions"]:
        head += f"\n  suggestion: {suggestion}"
    head += f"\nInstallation: {detail['installation_id'] or 'none yet'} (the prefix of its idempotency keys)"
    parent = detail.get("parent")
    if parent:
        head += (f"\nParent: workflow {parent['id']} ({parent['kind']}), as its child {parent['operation_id']}: "
                 f"`agent show {parent['id']}`")
    parts: list[Any] = [head]
    if detail.get("children"):
        children = Table("child", "kind", "status", "operation", "budget USD", "reason", title="Children")
        for c in detail["children"]:
            children.add_row(str(c["id"]), c["kind"], c["status"], c["operation_id"], c["budget_total_usd"] or "-",
                             escape(c["reason"][:60]))
        parts.append(children)
    for w in detail["waits"]:
        line = (f"\n[bold]{w['kind'].capitalize()} wait {w['id']}[/] — {w['status']} (node {w['node']}, "
                f"intent v{w['intent_version']})")
        if w["kind"] == "approval":
            line += (f"\n  role: {w['required_role']}   expires: {w['expires_at']}"
                     f"\n  candidate hash: {w['candidate_hash']}")
            if w["status"] == "open":
                line += (f"\n  state versions: {json.dumps(w.get('state_versions', {}), sort_keys=True)}"
                         f"\n  candidate (what the hash is of):\n{candidate_text(w.get('candidate'))}"
                         f"\n  decide: manage.py agent approve {w['id']} --user NAME "
                         f"--candidate-hash {w['candidate_hash']}")
            elif w["decision"]:
                line += f"\n  {w['decision']} by {w['decided_by']}"
        parts.append(line)
    if detail.get("forked_from"):
        parts.append(f"Forked from workflow {detail['forked_from']}: reused its visits 1–{detail['forked_from_visit']}")
    if detail.get("forks"):
        parts.append("Forks: " + ", ".join(f"workflow {f['id']} (from visit {f['from_visit']}, {f['status']})"
                                           for f in detail["forks"]))
    if detail.get("steering"):
        steering = Table("#", "sent", "by", "status", "taken by", "message", title="Steer messages")
        for m in detail["steering"]:
            where = f"{m['operation_id']} call {m['call']}" if m["operation_id"] else ""
            steering.add_row(str(m["seq"]), m["sent_at"][:19].replace("T", " "), escape(m["sender"]), m["status"],
                             where, escape(m["text"][:70]))
        parts.append(steering)
    if detail["signals_queued"]:
        parts.append("Signals queued for the next wait of their name: " + ", ".join(
            f"{q['name']} ({q['dedupe_key']}, {q['received_at'][:19]})" for q in detail["signals_queued"]))
    if detail["progress"]:
        latest = detail["progress"][0]
        parts.append(f"Progress: {latest['percent']}% (confidence {latest['confidence']:.0%}) at {latest['at'][:19]}; "
                     f"remaining: {', '.join(latest['remaining']) or 'nothing'}")
    parts += [extra_table(name, rows) for name, rows in detail.items()
              if name not in selectors.DETAIL_KEYS and rows]
    left_out = detail["activities_left_out"]
    activities = Table("operation", "activity", "status", "attempts", "error", title="Activities", caption=(
        f"{left_out} older finished activit{'ies' if left_out > 1 else 'y'} not listed: agent export-history "
        f"{detail['id']} has every one" if left_out else None))
    for a in detail["activities"]:
        activities.add_row(a["operation_id"], a["name"], a["status"], str(a["attempts"]), a["error"][:60])
    parts.append(activities)
    if detail["commitments"]:
        commitments = Table("commitment", "kind", "status", "operation", "handed over by", title="Commitments")
        for c in detail["commitments"]:
            handed = c.get("handed_over_by")
            commitments.add_row(str(c["id"]), c["kind"], c["status"], c["operation_id"],
                                f"child {handed}" if handed else "")
        parts.append(commitments)
    events = Table("#", "at", "event", "details", title="Recent events")
    for e in detail["events"]:
        events.add_row(str(e["seq"]), e["at"][11:19], e["kind"], json.dumps(e["data"], default=str)[:80])
    parts.append(events)
    return Group(*parts)
