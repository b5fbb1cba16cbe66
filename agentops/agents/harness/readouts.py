"""What people read of a harness workflow outside its admin panels: why it paused and what
resuming does, the approval queue's view of a feature list or a proposed change of it, and the
extras of ``agent show --json``.
"""
from __future__ import annotations

from typing import Any

from agentops.agents.harness import breakers
from agentops.agents.harness.activities import Probe
from agentops.agents.harness.state import Ctx
from agentops.kind import CandidateView, state_of


def pause_text(ctx: Ctx, why: str, then: str) -> str:
    wf = ctx.snapshot.workflow_id
    return (f"Paused for a person: {why}. `manage.py agent resume {wf}` {then}; `manage.py agent cancel {wf}` "
            "gives up. Recorded work is kept.")


def isolation_pause(ctx: Ctx, probe: Probe) -> str:
    if probe["level"] == "refused":
        # A real model and no bubblewrap: the worker runs none of its commands (sandbox.isolation).
        return pause_text(ctx, probe["detail"].rstrip("."), "probes again after bubblewrap is installed or the "
                           "worker's AGENTOPS_SANDBOX changed")
    return pause_text(
        ctx, f"commands must run under bubblewrap (isolation=bwrap) and this worker has {probe['level']} "
             f"({probe['detail']})", "probes again after bubblewrap is installed (apt-get install "
             "bubblewrap; AGENTOPS_SANDBOX=auto or bwrap); to run without isolation, launch again with "
             "--param isolation=none")


def candidate_view(candidate: Any) -> CandidateView:
    candidate = candidate if isinstance(candidate, dict) else {}
    features = candidate.get("features", [])
    contract = str(candidate.get("contract_hash", ""))[:12]
    if candidate.get("kind") == "feature_change":
        return CandidateView(
            title=f"Proposed change of the feature list ({len(features)} features)",
            summary=(f"A session proposes commit {str(candidate.get('scaffold_sha', ''))[:12]}: "
                     f"{str(candidate.get('reason', ''))[:300]}. Approving replaces the approved contract "
                     f"{str(candidate.get('replaces', ''))[:12]} by {contract}; each feature starts from its "
                     "check's result on that commit (exit codes below)."),
            facts=[(f["id"], f"{f['description']} ({f['check']}; exit "
                             f"{candidate.get('scaffold_checks', {}).get(f['id'])})") for f in features])
    return CandidateView(
        title=f"Feature list of {len(features)} features",
        summary=(f"Scaffold {str(candidate.get('scaffold_sha', ''))[:12]} in {candidate.get('workspace')}; every "
                 "check fails on the scaffold. Approving freezes features.json and checks/ (contract "
                 f"{contract})."),
        facts=[(f["id"], f"{f['description']} ({f['check']})") for f in features])


def show_json(workflow: Any) -> dict[str, Any]:
    """``agent show --json``: the feature board with the engine's evidence, budgets and breakers,
    the isolation, why it is paused, progress rows and proposals."""
    state = state_of(workflow) if isinstance(workflow.state, dict) else {}
    params = workflow.params if isinstance(workflow.params, dict) else {}
    board = []
    for f in state.get("features", []):
        evidence = f.get("evidence") or {}
        board.append({"id": f.get("id"), "status": f.get("status"), "attempts": f.get("attempts", 0),
                      "attempt_limit": f.get("attempt_limit", params.get("max_attempts")),
                      "spent_usd": f.get("spent_usd", "0"), "error_streak": f.get("error_streak", 0),
                      "diff_streak": f.get("diff_streak", 0),
                      "commit": str(evidence.get("commit", ""))[:12], "exit_code": evidence.get("exit_code"),
                      "duration_ms": evidence.get("duration_ms"), "reason": f.get("reason", "")})
    isolation = state.get("isolation") or {}
    smoke = (state.get("prepared") or {}).get("smoke") or {}
    lease = state.get("lease") or {}
    return {
        "features": board, "sessions": state.get("sessions", 0), "harness_progress": state.get("progress", []),
        "isolation": {"level": isolation.get("level", ""), "required": params.get("isolation", ""),
                      "detail": isolation.get("detail", "")},
        "paused_for": state.get("paused_for"),
        "lease": {"feature": lease.get("feature", ""), "attempt": lease.get("attempt", 0),
                  "session": lease.get("session", 0), "repair": bool(lease.get("repair"))},
        "budgets": {"sessions": state.get("sessions", 0), "session_limit": state.get("session_limit"),
                    "sessions_since_pass": state.get("sessions_since_pass", 0),
                    "stagnation_sessions": params.get("stagnation_sessions"),
                    "repair_attempts": state.get("repair_attempts", 0),
                    **{k: params.get(k) for k in ("session_max_turns", "session_max_tokens",
                                                  "session_max_seconds", "command_timeout_seconds",
                                                  "command_idle_seconds", "feature_budget_usd")}},
        "smoke": {k: smoke.get(k) for k in ("ran", "passed", "exit_code")} if smoke else None,
        "memory": state.get("memory", [])[-breakers.MEMORY_ROWS:],
        "patterns": state.get("patterns", []),
        "reviews": state.get("reviews", []),
        "proposals": state.get("proposals", []),
    }
