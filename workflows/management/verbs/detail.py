"""A workflow as `agent show` prints it (and the demo, as it goes)."""
from __future__ import annotations

import json
from typing import Any

from rich.markup import escape
from rich.table import Table

from workflows import selectors
from workflows.management.verbs.common import labels_text

CANDIDATE_LINES = 60


def candidate_text(candidate: Any) -> str:
    """A candidate as indented JSON for the terminal; past CANDIDATE_LINES lines, cut with a pointer
    to the whole (``agent show --json``)."""
    lines = json.dumps(candidate, indent=2, sort_keys=True, default=str, ensure_ascii=False).splitlines()
    shown = [f"    {line}" for line in lines[:CANDIDATE_LINES]]
    if len(lines) > CANDIDATE_LINES:
        shown.append(f"    … {len(lines) - CANDIDATE_LINES} more lines: `agent show ID --json` prints it whole")
    return escape("\n".join(shown))



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
