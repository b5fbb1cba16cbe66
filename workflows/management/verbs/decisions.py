"""`manage.py agent approve | reject | signal | supersede | steer | fork | cancel | budget | priority |
pause | resume`: what a person decides about a running agent."""
from __future__ import annotations

import json
from typing import Any

from workflows import selectors, services
from workflows.errors import InvalidInput
from workflows.features import forks
from workflows.management.verbs.common import (
    Output,
    Verb,
    shell_login,
    usd,
    user_by_name,
    user_or_none,
)
from workflows.models import Signal
from workflows.services.signals import SIGNAL_AUTO_KEY_PREFIX, SIGNAL_WEBHOOK_KEY_PREFIX


def add_parsers(verb: Verb) -> None:
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


def approve(command: Output, options: dict[str, Any]) -> None:
    result = services.wait_approve(
        wait_id=options["wait_id"], user=user_by_name(options["user"]),
        candidate_hash=options["candidate_hash"], comment=options["comment"],
    )
    decision(command, options, result)


def reject(command: Output, options: dict[str, Any]) -> None:
    result = services.wait_reject(
        wait_id=options["wait_id"], user=user_by_name(options["user"]), comment=options["comment"]
    )
    decision(command, options, result)


def decision(command: Output, options: dict[str, Any], result: services.DecisionResult) -> None:
    command.emit(options, {"wait_id": result.wait_id, "workflow_id": result.workflow_id,
                         "outcome": result.outcome.value, "message": result.message}, result.message)


def signal(command: Output, options: dict[str, Any]) -> None:
    try:
        payload = json.loads(options["payload"])
    except json.JSONDecodeError as exc:
        raise InvalidInput(f"--payload is not valid JSON: {exc.msg} at position {exc.pos}.") from None
    result = services.workflow_signal(
        workflow_id=options["id"], name=options["name"], payload=payload, dedupe_key=options["dedupe_key"]
    )
    command.emit(options, result.to_json(), result.message)


def supersede(command: Output, options: dict[str, Any]) -> None:
    result = services.workflow_supersede(
        workflow_id=options["id"], goal=options["goal"], user=user_or_none(options["user"]),
        idempotency_key=options["idempotency_key"],
    )
    command.emit(options, result.to_json(), result.message)


def steer(command: Output, options: dict[str, Any]) -> None:
    result = services.workflow_steer(
        workflow_id=options["id"], message=options["message"], user=user_or_none(options["user"]),
        by=f"shell:{shell_login()}", dedupe_key=options["dedupe_key"],
    )
    command.emit(options, result.to_json(), result.message)


def fork(command: Output, options: dict[str, Any]) -> None:
    fork = forks.workflow_fork(workflow_id=options["id"], from_visit=options["from_visit"],
                                  user=user_or_none(options["user"]), by=f"shell:{shell_login()}")
    command.emit(options, selectors.fork_summary(fork),
               f"Forked workflow {options['id']} at visit {options['from_visit']}: workflow {fork.pk} "
               f"({fork.kind}) reused visits 1–{options['from_visit']} and is {fork.status} at "
               f"{fork.current_node} (visit {fork.node_visit}).\nFollow it with: manage.py agent show {fork.pk}")


def cancel(command: Output, options: dict[str, Any]) -> None:
    result = services.workflow_cancel(
        workflow_id=options["id"], reason=options["reason"], user=user_or_none(options["user"]),
        by=f"shell:{shell_login()}",
    )
    command.emit(options, result.to_json(), result.message)


def budget(command: Output, options: dict[str, Any]) -> None:
    workflow = services.workflow_budget_set(
        workflow_id=options["id"], user=user_by_name(options["user"]), total_usd=options["total"],
        hourly_usd=options["hourly"],
    )
    spend = selectors.spend_summary(workflow)
    command.emit(options, {"id": workflow.pk, "status": workflow.status, "spend": spend},
               f"Workflow {workflow.pk} budget: total {spend['budget_total_usd'] or 'unlimited'} USD, "
               f"hourly {spend['budget_hourly_usd'] or 'unlimited'} USD; it is {workflow.status}.")


def priority(command: Output, options: dict[str, Any]) -> None:
    result = services.workflow_priority_set(workflow_id=options["id"], priority=options["priority"],
                                            user=user_or_none(options["user"]), by=f"shell:{shell_login()}")
    command.emit(options, result.to_json(), result.message)


def pause(command: Output, options: dict[str, Any]) -> None:
    result = services.workflow_pause(workflow_id=options["id"], reason=options["reason"],
                                     user=user_or_none(options["user"]), by=f"shell:{shell_login()}")
    command.emit(options, result.to_json(), result.message)


def resume(command: Output, options: dict[str, Any]) -> None:
    result = services.workflow_resume(workflow_id=options["id"], user=user_or_none(options["user"]),
                                      by=f"shell:{shell_login()}")
    command.emit(options, result.to_json(), result.message)


RUN = {
    "approve": approve, "reject": reject, "signal": signal, "supersede": supersede, "steer": steer, "fork": fork,
    "cancel": cancel, "budget": budget, "priority": priority, "pause": pause, "resume": resume,
}
