"""The harness's launch parameters and the shape of its durable state: ``HarnessParams`` (with
the checks a type cannot say), the lease of a session, why the workflow paused, the state's
fields and their bounds, and the lease of a "repair main" session.
"""
from __future__ import annotations

import os
from typing import Any, TypedDict

from pydantic import Field

from agentops.agents.harness.activities import ChecksReport, Prepared, Probe
from agentops.agents.harness.checks import Feature
from agentops.agents.harness.proposals import Staged
from agentops.agents.harness.session import SessionResult
from agentops.kind import ROLE_MAX_LENGTH, InvalidInput, LaunchParams, NodeContext

ISOLATION_LEVELS = ("bwrap", "none")


class HarnessParams(LaunchParams):
    """The harness's launch parameters: the workspace, who approves, the isolation, the budgets
    and the loop breakers' thresholds (docs/harness.md)."""

    workspace: str = Field("", description="absolute path: a new directory, an empty one or a git repository "
                                           "(default: one under AGENTOPS_HARNESS_WORKSPACES)")
    approver_role: str = Field("harness-approvers", description="the Django group that approves the feature list")
    isolation: str = Field("bwrap", description="bwrap (commands under bubblewrap, network off) or none")
    max_sessions: int = Field(40, ge=1, le=1000, description="coding sessions at most")
    max_attempts: int = Field(3, ge=1, le=50, description="sessions per feature before it is blocked")
    feature_budget_usd: float = Field(0.0, ge=0, le=100_000, description="model spend per feature; 0: no limit")
    session_max_turns: int = Field(40, ge=1, le=200, description="model turns per session")
    session_max_tokens: int = Field(400_000, ge=1000, le=10_000_000, description="tokens per session")
    session_max_seconds: float = Field(1800.0, ge=5, le=86_400, description="seconds per session")
    command_timeout_seconds: int = Field(120, ge=1, le=600, description="seconds a command may run")
    command_idle_seconds: int = Field(30, ge=1, le=600, description="seconds a command may print nothing")
    repeat_limit: int = Field(3, ge=2, le=50, description="the same tool call in a row ends the session")
    same_error_limit: int = Field(3, ge=2, le=50, description="sessions failing alike block the feature")
    same_diff_limit: int = Field(3, ge=2, le=50, description="sessions leaving the same diff block the feature")
    stagnation_sessions: int = Field(8, ge=2, le=1000, description="sessions without a new pass pause the run")
    check_timeout_seconds: float = Field(60.0, ge=1, le=600, description="seconds a feature's check may run")
    approval_expiry_hours: float = Field(72.0, ge=0.01, le=8760, description="hours the approval stays open")
    # Regression after an accepted pass (docs/harness.md, "Regression"): at most this many other
    # passing checks, in rotation (0: all of them every time), and all of them every Nth pass (0: never).
    regression_max_checks: int = Field(10, ge=0, le=500, description="other passing checks re-run after a pass; "
                                                                      "0: all")
    regression_full_every: int = Field(10, ge=0, le=1000, description="every Nth pass re-runs all; 0: never")
    # A reviewer child after each accepted feature (docs/harness.md, "Reviewer"): it reviews the
    # feature's diff against its steps with a budget of its own, and the next session reads its findings.
    reviewer: bool = Field(False, description="a reviewer child workflow reviews each accepted feature's diff")
    reviewer_budget_usd: float = Field(0.5, gt=0, le=1000, description="each review's budget (USD), reserved "
                                                                        "from the workflow's")


def params_checked(typed: dict[str, Any]) -> dict[str, Any]:
    """What a type cannot say of the launch parameters (``typed``: typed, defaults filled in): the
    workspace (absolute; absent, an empty directory or a git repository), the approver role's
    length and the isolation required."""
    workspace = typed["workspace"]
    if workspace:
        if not os.path.isabs(workspace) or len(workspace) > 500:
            raise InvalidInput(f"Parameter workspace={workspace!r} must be an absolute path (at most 500 "
                               "characters): a new directory, an empty one or a git repository.")
        if os.path.exists(workspace) and not (
                os.path.isdir(workspace) and (not os.listdir(workspace)
                                              or os.path.isdir(os.path.join(workspace, ".git")))):
            raise InvalidInput(f"Parameter workspace={workspace!r} exists and is neither an empty directory nor "
                               "a git repository; pass a new path.")
    role = typed["approver_role"] or "harness-approvers"
    if len(role) > ROLE_MAX_LENGTH:
        raise InvalidInput(f"Parameter approver_role={role[:40]!r}… is too long for a group name.")
    isolation = typed["isolation"]
    if isolation not in ISOLATION_LEVELS:
        raise InvalidInput(f"Parameter isolation={isolation[:40]!r} must be bwrap (commands run under bubblewrap, "
                           "network off; the workflow pauses where that is unavailable) or none (explicitly "
                           "allow running without isolation).")
    return {**typed, "workspace": workspace, "approver_role": role, "isolation": isolation}


REPAIR = "REPAIR"  # the lease of a "repair main" session
REPAIR_FEATURE: Feature = {"id": REPAIR, "description": "Repair main: the smoke check (init.sh, checks/smoke.sh) "
                           "fails on the last recorded commit", "steps": ["make sh checks/smoke.sh pass again"],
                           "priority": 0, "check": "sh checks/smoke.sh"}
PROGRESS_LINES = 20
REVIEWS_KEPT = 3  # reviews kept for the briefings


class Lease(TypedDict, total=False):
    feature: str
    attempt: int
    session: int
    repair: bool


class PausedFor(TypedDict, total=False):
    kind: str  # isolation, feature_budget, blocked_only, max_sessions, stagnation, repair
    feature: str
    reason: str


class State(TypedDict, total=False):
    workspace: str
    isolation: Probe
    scaffold_sha: str
    contract_sha: str  # the commit of the approved features.json and checks/ (the scaffold, or a proposal)
    contract_hash: str
    features: list[Feature]
    vacuous: list[str]
    approved_by: str
    head: str  # the last commit a session left (or the scaffold)
    sessions: int
    session_limit: int
    sessions_since_pass: int
    regression_passes: int  # accepted passes that ran a regression (version 2 on)
    regression_rotation: int  # where the next regression share starts among the passing checks
    lease: Lease
    previous_lease: Lease | None
    prepared: Prepared
    smoke_seen_green: bool
    repair_attempts: int
    session: SessionResult | None
    progress: list[str]  # one line per session, newest last (bounded)
    memory: list[dict[str, Any]]  # progress rows (breakers.memory_row), newest last (bounded)
    patterns: list[str]  # learnings kept for every briefing (breakers.patterns_with)
    last_verify: ChecksReport
    paused_for: PausedFor | None
    proposal: Staged | None
    proposals: list[dict[str, Any]]
    reviews: list[dict[str, Any]]  # the reviewer children's findings, newest last (bounded: REVIEWS_KEPT)


Ctx = NodeContext[State]
