"""Budgets and loop breakers of the harness, decided from structured results (never from model text).

``assess`` is a pure function of a session's recorded result and the counters kept in the
workflow's state, so the counters survive restarts and a replay decides the same. The
``harness_assess`` activity runs it and records each breaker and budget that fired as an event.

- same diff: the session left the same tree as the feature's previous session,
  ``same_diff_limit`` times: the feature is blocked;
- same error: a failed check's fingerprint (exit code, output with numbers and paths masked)
  equal to the feature's previous one, ``same_error_limit`` times: the feature is blocked;
- feature budget: its attempts, or the model spend of its sessions: the feature is blocked and
  the workflow pauses for a person;
- no new pass: ``stagnation_sessions`` sessions since a feature last became passing: the
  workflow pauses for a person.
"""
from __future__ import annotations

import hashlib
import re
from decimal import Decimal
from typing import Any, TypedDict

_MASKS = [(re.compile(r"/[\w./-]*(tmp|workspaces|checks-)[\w./-]*"), "<path>"),
          (re.compile(r"\b[0-9a-f]{7,40}\b"), "<sha>"), (re.compile(r"\d+"), "<n>")]
MEMORY_ROWS = 20
ROW_FIELD_CHARS = 300
PATTERNS = 10  # learnings kept for every briefing ("codebase patterns"), newest last


class Limits(TypedDict):
    same_error_limit: int
    same_diff_limit: int
    stagnation_sessions: int
    feature_budget_usd: float  # 0: no limit


class Verdict(TypedDict):
    feature: dict[str, Any]  # the feature's counters (and status) after the session
    sessions_since_pass: int
    block: str  # why the feature is now blocked; "" when it is not
    pause: str  # why a person must decide; "" when the workflow goes on
    pause_kind: str  # feature_budget, stagnation
    events: list[dict[str, Any]]  # harness.loop_breaker / harness.budget_exhausted, for the history


def error_fingerprint(evidence: dict[str, Any] | None, outcome: str) -> str:
    """The same failure gives the same fingerprint across sessions; a session without a verdict is
    fingerprinted by how it ended."""
    if not evidence:
        return hashlib.sha256(f"no-verdict:{outcome}".encode()).hexdigest()[:16]
    text = str(evidence.get("output_tail", ""))
    for pattern, mask in _MASKS:
        text = pattern.sub(mask, text)
    return hashlib.sha256(f"{evidence.get('exit_code')}:{text}".encode()).hexdigest()[:16]


def assess(*, feature: dict[str, Any], session: dict[str, Any], passed: bool, evidence: dict[str, Any] | None,
           sessions_since_pass: int, limits: Limits) -> Verdict:
    """Update one feature's counters after a session on it and say what follows."""
    f = dict(feature)
    events: list[dict[str, Any]] = []
    f["spent_usd"] = str(Decimal(str(f.get("spent_usd", "0"))) + Decimal(str(session.get("cost_usd", "0"))))
    if passed:
        f.update(error_fp="", error_streak=0, tree="", diff_streak=0)
        return {"feature": f, "sessions_since_pass": 0, "block": "", "pause": "", "pause_kind": "", "events": []}
    fingerprint = error_fingerprint(evidence, str(session.get("outcome", "")))
    f["error_streak"] = f.get("error_streak", 0) + 1 if fingerprint == f.get("error_fp") else 1
    f["error_fp"] = fingerprint
    tree = str(session.get("tree", ""))
    f["diff_streak"] = f.get("diff_streak", 0) + 1 if tree and tree == f.get("tree") else 1
    f["tree"] = tree
    since = sessions_since_pass + 1
    fid = f["id"]
    block = pause = kind = ""
    # The same tree fails the same way: name the more specific breaker first.
    if f["diff_streak"] >= limits["same_diff_limit"]:
        block = f"the same diff {f['diff_streak']} sessions in a row (tree {tree[:12]})"
        events.append({"kind": "harness.loop_breaker", "breaker": "same_diff", "feature": fid,
                       "count": f["diff_streak"], "tree": tree, "consequence": "feature blocked"})
    elif f["error_streak"] >= limits["same_error_limit"]:
        block = f"the same failure {f['error_streak']} sessions in a row (fingerprint {fingerprint})"
        events.append({"kind": "harness.loop_breaker", "breaker": "same_error", "feature": fid,
                       "count": f["error_streak"], "fingerprint": fingerprint, "consequence": "feature blocked"})
    else:
        budget = _feature_budget(f, limits)
        if budget:
            block = pause = f"feature {fid} {budget}"
            kind = "feature_budget"
            events.append({"kind": "harness.budget_exhausted", "level": "feature", "feature": fid, "what": budget,
                           "attempts": f.get("attempts", 0), "spent_usd": f["spent_usd"],
                           "consequence": "feature blocked, workflow paused for a person"})
    if not pause and since >= limits["stagnation_sessions"]:
        pause, kind = f"{since} sessions since a feature last became passing", "stagnation"
        events.append({"kind": "harness.loop_breaker", "breaker": "no_new_pass", "count": since,
                       "consequence": "workflow paused for a person"})
    return {"feature": f, "sessions_since_pass": since, "block": block, "pause": pause, "pause_kind": kind,
            "events": events}


def _feature_budget(f: dict[str, Any], limits: Limits) -> str:
    if f.get("attempts", 0) >= f.get("attempt_limit", 0):
        return f"used its {f.get('attempt_limit')} attempts"
    budget = Decimal(str(limits["feature_budget_usd"]))
    if budget > 0 and Decimal(f["spent_usd"]) >= budget:
        return f"spent {f['spent_usd']} USD of its {budget} USD budget"
    return ""


def memory_row(*, lease: dict[str, Any], status: str, session: dict[str, Any] | None, outcome: str) -> dict[str, Any]:
    """One progress row, each field bounded: what the next sessions read in their briefing."""
    report = (session or {}).get("report") or {}
    row = {"session": lease["session"], "feature": lease["feature"], "attempt": lease["attempt"], "status": status,
           "outcome": outcome, "summary": str(report.get("summary") or report.get("note") or "")[:ROW_FIELD_CHARS],
           "files": list((session or {}).get("files", []))[:10],
           "learnings": str(report.get("learnings", ""))[:ROW_FIELD_CHARS],
           "next_step": str(report.get("next_step", ""))[:ROW_FIELD_CHARS]}
    if session and session.get("crashed_attempts"):
        row["crashed_attempts"] = session["crashed_attempts"]
    return row


def patterns_with(patterns: list[str], row: dict[str, Any]) -> list[str]:
    """The codebase patterns with a row's learnings added (once; the oldest go past PATTERNS)."""
    learned = str(row.get("learnings", "")).strip()
    if not learned or learned in patterns:
        return patterns
    return [*patterns, learned][-PATTERNS:]


def render_row(row: dict[str, Any]) -> str:
    text = (f"session {row['session']} {row['feature']}#{row['attempt']}: {row['status']} ({row['outcome']})"
            + (f"; {row['summary']}" if row.get("summary") else "")
            + (f"; files {', '.join(row['files'])}" if row.get("files") else "")
            + (f"; learned: {row['learnings']}" if row.get("learnings") else "")
            + (f"; next: {row['next_step']}" if row.get("next_step") else "")
            + (f"; {row['crashed_attempts']} attempt(s) crashed" if row.get("crashed_attempts") else ""))
    return text[:800]
