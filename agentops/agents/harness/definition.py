"""The ``harness`` definition: initializer, an approved feature list, then one engine-graded feature per session."""
from __future__ import annotations

import os
from collections.abc import Mapping
from typing import Any, TypedDict, cast

from pydantic import Field

from agentops.agents.harness import breakers
from agentops.agents.harness.activities import (
    AdoptInput,
    AssessInput,
    ChecksInput,
    ChecksReport,
    InitInput,
    InitResult,
    Limits,
    Prepared,
    PrepareInput,
    Probe,
    ProbeInput,
    ProposalInput,
    SessionInput,
    SessionResult,
    Staged,
    ValidateInput,
    Validation,
    harness_adopt_proposal,
    harness_assess,
    harness_initialize,
    harness_prepare,
    harness_probe,
    harness_run_checks,
    harness_session,
    harness_stage_proposal,
    harness_validate,
)
from agentops.agents.harness.checks import CheckResult, Feature
from agentops.kind import (
    EMPTY_QUERY,
    ROLE_MAX_LENGTH,
    ActivityFailed,
    AdminPanel,
    CandidateView,
    Complete,
    Decision,
    Fail,
    Goto,
    InvalidInput,
    LaunchParams,
    NodeContext,
    WorkflowDefinition,
    node,
    register_definition,
    state_of,
)

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


def _with(features: list[Feature], fid: str, **changes: Any) -> list[Feature]:
    return [cast(Feature, {**f, **changes}) if f["id"] == fid else f for f in features]


def _apply(features: list[Feature], results: list[CheckResult]) -> list[Feature]:
    """Each result decides its feature's status (a blocked feature stays blocked), with its evidence."""
    by_id = {r["feature"]: r for r in results}
    out: list[Feature] = []
    for f in features:
        r = by_id.get(f["id"])
        if r is None:
            out.append(f)
            continue
        status = "passing" if r["passed"] else ("blocked" if f.get("status") == "blocked" else "failing")
        out.append(cast(Feature, {**f, "status": status, "evidence": r}))
    return out


def _to_run(features: list[Feature]) -> list[Feature]:
    """What a check run needs of each feature (its id and check): a run's input stays small at 500."""
    return [cast(Feature, {"id": f["id"], "check": f["check"]}) for f in features]


def regression_share(others: list[Feature], *, passes: int, rotation: int, max_checks: int,
                     full_every: int) -> tuple[list[Feature], int]:
    """Which passing checks a regression run takes after an accepted pass, and the next rotation.

    All of them when ``max_checks`` is 0, when there are no more than that, or on every
    ``full_every``-th pass; else the next ``max_checks`` in feature-list order from ``rotation``
    (wrapping round), so every passing check runs at least once every ceil(passing / max_checks)
    passes, and VERIFY_ALL runs every check before the run can complete.
    """
    if not max_checks or len(others) <= max_checks or (full_every and (passes + 1) % full_every == 0):
        return others, rotation
    start = rotation % len(others)
    chosen = (others[start:] + others[:start])[:max_checks]
    return chosen, (start + max_checks) % len(others)


def _board(features: list[Feature]) -> list[dict[str, str]]:
    return [{"id": f["id"], "status": f.get("status", "failing")} for f in features]


def _lines(ctx: Ctx, line: str) -> list[str]:
    return [*ctx.state.get("progress", []), line][-PROGRESS_LINES:]


def _unblocked(feature: Feature, extra_attempts: int) -> Feature:
    """A fresh allotment for a blocked feature: more attempts, a zero spend, loop breakers reset."""
    return cast(Feature, {**feature, "status": "failing", "reason": "", "spent_usd": "0", "error_streak": 0,
                          "diff_streak": 0, "attempt_limit": feature.get("attempts", 0) + extra_attempts})


def _summary(session: SessionResult | None) -> dict[str, Any]:
    """What the breakers read of a session (a crashed one: nothing but its outcome)."""
    if session is None:
        return {"outcome": "crashed", "cost_usd": "0", "tree": ""}
    return {k: session[k] for k in ("outcome", "cost_usd", "tree")}  # type: ignore[literal-required]


def _pause_text(ctx: Ctx, why: str, then: str) -> str:
    wf = ctx.snapshot.workflow_id
    return (f"Paused for a person: {why}. `manage.py agent resume {wf}` {then}; `manage.py agent cancel {wf}` "
            "gives up. Recorded work is kept.")


def _isolation_pause(ctx: Ctx, probe: Probe) -> str:
    if probe["level"] == "refused":
        # A real model and no bubblewrap: the worker runs none of its commands (sandbox.isolation).
        return _pause_text(ctx, probe["detail"].rstrip("."), "probes again after bubblewrap is installed or the "
                           "worker's AGENTOPS_SANDBOX changed")
    return _pause_text(
        ctx, f"commands must run under bubblewrap (isolation=bwrap) and this worker has {probe['level']} "
             f"({probe['detail']})", "probes again after bubblewrap is installed (apt-get install "
             "bubblewrap; AGENTOPS_SANDBOX=auto or bwrap); to run without isolation, launch again with "
             "--param isolation=none")


@register_definition
class Harness(WorkflowDefinition):
    kind = "harness"
    # 2: regression in rotation (regression_max_checks, regression_full_every); workflows launched
    # on 1 keep running every passing check after each pass.
    version = 2
    start_node = "INITIALIZE"
    revalidate_node = "INITIALIZE"
    launch_params = HarnessParams
    reads_steering = True  # every turn of the initializer's and the coding sessions
    fork_refusal = ("A harness workflow works in a git workspace on disk (its workspace parameter) whose history "
                    "moved on since that visit; a fork would share it with the original. Launch a new harness "
                    "workflow on a copy of the workspace instead.")

    def validate_params(self, params: dict[str, Any]) -> dict[str, Any]:
        """The workspace (absolute; absent, an empty directory or a git repository), the isolation
        required, the budgets and the loop breakers' thresholds."""
        typed = super().validate_params(params)
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

    def _limits(self, ctx: Ctx) -> Limits:
        p = ctx.params
        return Limits(max_turns=p["session_max_turns"], max_tokens=p["session_max_tokens"],
                      max_seconds=p["session_max_seconds"], command_timeout_seconds=p["command_timeout_seconds"],
                      idle_seconds=p["command_idle_seconds"], repeat_limit=p["repeat_limit"],
                      require_isolation=p["isolation"])

    @node("INITIALIZE")
    def initialize(self, ctx: Ctx) -> Decision:
        """Probe the isolation first (below the required level: pause); then session 0, the model
        writes the feature list, checks, init.sh, progress.md, a stub; first commit."""
        probe: Probe = ctx.activity(harness_probe, ProbeInput(required=ctx.params["isolation"]))
        if not probe["enough"]:
            return Goto("INITIALIZE", {"isolation": probe, "paused_for": {"kind": "isolation"}},
                        pause=_isolation_pause(ctx, probe))
        try:
            init: InitResult = ctx.activity(harness_initialize, InitInput(
                goal=ctx.goal, workspace=ctx.params["workspace"], require_isolation=ctx.params["isolation"]))
        except ActivityFailed as exc:
            return Fail(f"The initializer session failed: {exc.error}")
        return Goto("VALIDATE_FEATURE_LIST", {
            "isolation": probe, "paused_for": None, "workspace": init["workspace"],
            "scaffold_sha": init["scaffold_sha"], "contract_sha": init["scaffold_sha"], "head": init["scaffold_sha"],
            "sessions": 0, "session_limit": ctx.params["max_sessions"], "sessions_since_pass": 0, "progress": [],
            "memory": [], "repair_attempts": 0, "smoke_seen_green": False})

    @node("VALIDATE_FEATURE_LIST")
    def validate_feature_list(self, ctx: Ctx) -> Decision:
        """Schema, then every check on the scaffold: all must be red, or the list cannot be approved."""
        try:
            report: Validation = ctx.activity(harness_validate, ValidateInput(
                workspace=ctx.state["workspace"], commit=ctx.state["scaffold_sha"],
                check_timeout_seconds=ctx.params["check_timeout_seconds"],
                require_isolation=ctx.params["isolation"]))
        except ActivityFailed as exc:
            return Fail(f"The feature list at {ctx.state['scaffold_sha'][:12]} cannot be used: {exc.error}")
        features = [cast(Feature, {**f, "status": "failing", "attempts": 0,
                                   "attempt_limit": ctx.params["max_attempts"]}) for f in report["features"]]
        features = _apply(features, report["results"])
        if report["vacuous"]:
            return Fail(f"The checks of {', '.join(report['vacuous'])} already pass on the scaffold commit "
                        f"{ctx.state['scaffold_sha'][:12]}, so they prove nothing; the feature list cannot be "
                        "approved as it is. Fix those checks and launch again.")
        return Goto("WAIT_FOR_APPROVAL", {"features": features, "contract_hash": report["contract_hash"],
                                          "vacuous": report["vacuous"]})

    @node("WAIT_FOR_APPROVAL")
    def wait_for_approval(self, ctx: Ctx) -> Decision:
        """A person approves this exact feature list and these checks (the hash of their blobs)."""
        features = ctx.state["features"]
        candidate = {"scaffold_sha": ctx.state["scaffold_sha"], "contract_hash": ctx.state["contract_hash"],
                     "workspace": ctx.state["workspace"],
                     "features": [{k: f[k] for k in ("id", "description", "priority", "check")}  # type: ignore[literal-required]
                                  for f in features],
                     "scaffold_checks": {f["id"]: f["evidence"]["exit_code"] for f in features}}
        outcome = ctx.approval(candidate=candidate, candidate_hash=ctx.state["contract_hash"],
                               role=ctx.params["approver_role"],
                               expires_in_seconds=ctx.params["approval_expiry_hours"] * 3600,
                               state_versions={"intent_version": ctx.intent_version,
                                               "scaffold_sha": ctx.state["scaffold_sha"]})
        if outcome.approved:
            return Goto("SELECT_FEATURE", {"approved_by": outcome.decided_by})
        if outcome.expired:
            return Fail("The approval of the feature list expired before anyone decided.")
        return Fail(f"The feature list was rejected by {outcome.decided_by}: {outcome.comment or 'no comment'}")

    @node("SELECT_FEATURE")
    def select_feature(self, ctx: Ctx) -> Decision:
        """The engine picks the feature: the highest-priority failing one that is not blocked. Only
        blocked ones left, or the sessions' budget used: a person decides."""
        features = ctx.state["features"]
        failing = [f for f in features if f.get("status") == "failing"]
        if not failing:
            blocked = [f for f in features if f.get("status") == "blocked"]
            if not blocked:
                return Goto("VERIFY_ALL")
            why = "; ".join(f"{f['id']}: {f.get('reason', 'blocked')}" for f in blocked)
            return Goto("DECIDE", {"paused_for": {"kind": "blocked_only", "reason": why[:1000]}}, pause=_pause_text(
                ctx, f"only blocked features are left ({why[:600]})", "gives each of them "
                     f"{ctx.params['max_attempts']} more attempts with its loop breakers reset"))
        sessions = ctx.state.get("sessions", 0)
        limit = ctx.state.get("session_limit", ctx.params["max_sessions"])
        if sessions >= limit:
            return Goto("DECIDE", {"paused_for": {"kind": "max_sessions"}}, pause=_pause_text(
                ctx, f"{sessions} coding sessions used (the workflow's budget, max_sessions); still failing: "
                     f"{', '.join(f['id'] for f in failing)}", f"allows {ctx.params['max_sessions']} more sessions"))
        chosen = min(failing, key=lambda f: (f["priority"], features.index(f)))
        lease: Lease = {"feature": chosen["id"], "attempt": chosen.get("attempts", 0) + 1, "session": sessions + 1}
        return Goto("PREPARE_SESSION", {"lease": lease, "previous_lease": ctx.state.get("lease"),
                                        "sessions": sessions + 1,
                                        "features": _with(features, chosen["id"], attempts=lease["attempt"])})

    @node("PREPARE_SESSION")
    def prepare_session(self, ctx: Ctx) -> Decision:
        """Record the base commit (leftovers of an earlier session go to a wip/ ref first), run init.sh
        and the smoke check: red after it was once green, and the session repairs main instead."""
        previous = ctx.state.get("previous_lease")
        # Leftovers belong to the session before this one (or to someone outside the harness).
        wip_name = f"{previous['feature']}/{previous['attempt']}" if previous else "before-first-session"
        prepared: Prepared = ctx.activity(harness_prepare, PrepareInput(
            workspace=ctx.state["workspace"], expected_head=ctx.state["head"], wip_name=wip_name,
            check_timeout_seconds=ctx.params["check_timeout_seconds"],
            require_isolation=ctx.params["isolation"]))
        smoke = prepared["smoke"]
        updates: dict[str, Any] = {"prepared": prepared}
        if smoke and smoke["passed"]:
            updates["smoke_seen_green"] = True
        elif smoke and smoke["ran"] and ctx.state.get("smoke_seen_green"):
            lease = ctx.state["lease"]
            repairs = ctx.state.get("repair_attempts", 0) + 1
            fid = lease["feature"]
            updates.update(
                lease={"feature": REPAIR, "attempt": repairs, "session": lease["session"], "repair": True},
                repair_attempts=repairs,
                features=_with(ctx.state["features"], fid, attempts=lease["attempt"] - 1))
        return Goto("CODING_SESSION", updates)

    @node("CODING_SESSION")
    def coding_session(self, ctx: Ctx) -> Decision:
        lease = ctx.state["lease"]
        repair = bool(lease.get("repair"))
        smoke: dict[str, Any] = {}
        if repair:
            feature: Feature = REPAIR_FEATURE
            smoke = dict(ctx.state["prepared"]["smoke"] or {})
            budget = f"repair session {lease['attempt']} of at most {ctx.params['max_attempts']} in a row"
        else:
            feature = next(f for f in ctx.state["features"] if f["id"] == lease["feature"])
            budget = (f"feature attempts {lease['attempt']} of {feature.get('attempt_limit')}; sessions "
                      f"{lease['session']} of {ctx.state.get('session_limit')}")
        evidence = feature.get("evidence") or {}
        try:
            result: SessionResult = ctx.activity(harness_session, SessionInput(
                goal=ctx.goal, workspace=ctx.state["workspace"], feature=feature, attempt=lease["attempt"],
                session=lease["session"], base_sha=ctx.state["prepared"]["base_sha"],
                protected_sha=ctx.state.get("contract_sha", ctx.state["scaffold_sha"]),
                board=_board(ctx.state["features"]), last_output=str(evidence.get("output_tail", "")),
                wip=ctx.state["prepared"]["wip"], progress=ctx.state.get("progress", []), limits=self._limits(ctx),
                memory=ctx.state.get("memory", [])[-5:], repair=str(smoke.get("output_tail", "")),
                budget_note=budget, patterns=ctx.state.get("patterns", []), reviews=ctx.state.get("reviews", [])))
        except ActivityFailed as exc:
            line = f"session {lease['session']} {lease['feature']}#{lease['attempt']}: crashed ({exc.error[:200]})"
            return Goto("ASSESS", {"session": None, "progress": _lines(ctx, line)})
        return Goto("VERIFY_FEATURE", {"session": result, "head": result["head"]})

    @node("VERIFY_FEATURE")
    def verify_feature(self, ctx: Ctx) -> Decision:
        """Only the leased feature, only on request, only on exit 0 of its check in a clean worktree
        (for a repair: the smoke check)."""
        session, lease = ctx.state["session"], ctx.state["lease"]
        features = ctx.state["features"]
        if not session or not session["pass_requested"]:
            return Goto("ASSESS")
        repair = bool(lease.get("repair"))
        feature = REPAIR_FEATURE if repair else next(f for f in features if f["id"] == lease["feature"])
        report: ChecksReport = ctx.activity(harness_run_checks, ChecksInput(
            workspace=ctx.state["workspace"], commit=session["head"], features=_to_run([feature]),
            purpose="repair" if repair else "verify", check_timeout_seconds=ctx.params["check_timeout_seconds"],
            require_isolation=ctx.params["isolation"]))
        return Goto("REGRESSION", {"features": _apply(features, report["results"]), "last_verify": report})

    @node("REGRESSION")
    def regression(self, ctx: Ctx) -> Decision:
        """After a pass (or a repaired main), every other passing check runs again on the same
        commit; regressions flip back, with the failing run as their evidence. A check that passes
        again leaves its feature as it was (the run that made it pass stays its evidence; this run
        is in the activity's result and the check events): a step writes what changed, not 499
        features that did not."""
        lease, features = ctx.state["lease"], ctx.state["features"]
        if lease.get("repair"):
            accepted = ctx.state["last_verify"]["results"][0]["passed"]
        else:
            accepted = next(f for f in features if f["id"] == lease["feature"]).get("status") == "passing"
        others = [f for f in features if f.get("status") == "passing" and f["id"] != lease["feature"]]
        after = "REVIEW_FEATURE" if accepted and ctx.params.get("reviewer") and not lease.get("repair") else "ASSESS"
        if not accepted or not others:
            return Goto(after)
        passes = ctx.state.get("regression_passes", 0)
        chosen, rotation = regression_share(others, passes=passes, rotation=ctx.state.get("regression_rotation", 0),
                                            max_checks=ctx.params.get("regression_max_checks", 0)
                                            if ctx.definition_version >= 2 else 0,
                                            full_every=ctx.params.get("regression_full_every", 0))
        report: ChecksReport = ctx.activity(harness_run_checks, ChecksInput(
            workspace=ctx.state["workspace"], commit=ctx.state["session"]["head"], features=_to_run(chosen),  # type: ignore[index]
            purpose="regression", check_timeout_seconds=ctx.params["check_timeout_seconds"],
            require_isolation=ctx.params["isolation"]))
        regressed = [r for r in report["results"] if not r["passed"]]
        updates: dict[str, Any] = {"features": _apply(features, regressed)} if regressed else {}
        if ctx.definition_version >= 2:
            updates |= {"regression_passes": passes + 1, "regression_rotation": rotation}
        return Goto(after, updates)

    @node("REVIEW_FEATURE")
    def review_feature(self, ctx: Ctx) -> Decision:
        """A reviewer child reviews the accepted feature's diff (the session's base to its head)
        against the feature's steps, with a budget of its own reserved from this workflow's; its
        findings (or why there are none) go into the next sessions' briefings."""
        lease, session = ctx.state["lease"], ctx.state["session"]
        assert session is not None  # only an accepted session's pass comes here
        feature = next(f for f in ctx.state["features"] if f["id"] == lease["feature"])
        handle = ctx.child("reviewer", f"Review {feature['id']} (session {lease['session']})", {
            "workspace": ctx.state["workspace"], "base_sha": session["base_sha"], "head": session["head"],
            "feature": feature["id"], "description": feature["description"][:2000],
            "steps": [str(s)[:300] for s in feature.get("steps", [])][:50],
        }, budget=f"{ctx.params['reviewer_budget_usd']:.4f}")
        (outcome,) = ctx.wait_children(handle)
        review: dict[str, Any] = {"feature": feature["id"], "session": lease["session"], "child": outcome.workflow_id}
        if outcome.completed and isinstance(outcome.result, dict):
            review |= {"verdict": outcome.result.get("verdict", ""), "findings": outcome.result.get("findings", [])}
        else:
            review |= {"verdict": "unavailable", "findings": [f"the review {outcome.status}: {outcome.reason[:200]}"]}
        return Goto("ASSESS", {"reviews": [*ctx.state.get("reviews", []), review][-REVIEWS_KEPT:]})

    @node("ASSESS")
    def assess(self, ctx: Ctx) -> Decision:
        """Progress row; budgets and loop breakers (``harness_assess``): block the feature, or pause
        for a person; a proposal goes to review; a claim of "all done" only triggers VERIFY_ALL."""
        lease, features = ctx.state["lease"], ctx.state["features"]
        session = ctx.state.get("session")
        if lease.get("repair"):
            return self._assess_repair(ctx, session)
        feature = next(f for f in features if f["id"] == lease["feature"])
        passed = feature.get("status") == "passing"
        verdict: breakers.Verdict = ctx.activity(harness_assess, AssessInput(
            feature=feature, session=_summary(session), passed=passed,
            evidence=feature.get("evidence") if session and session["pass_requested"] else None,
            sessions_since_pass=ctx.state.get("sessions_since_pass", 0),
            limits={"same_error_limit": ctx.params["same_error_limit"],
                    "same_diff_limit": ctx.params["same_diff_limit"],
                    "stagnation_sessions": ctx.params["stagnation_sessions"],
                    "feature_budget_usd": ctx.params["feature_budget_usd"]}))
        changes = dict(verdict["feature"])
        if verdict["block"]:
            changes.update(status="blocked", reason=verdict["block"])
        features = _with(features, lease["feature"], **{k: v for k, v in changes.items() if k != "id"})
        status = "blocked" if verdict["block"] else feature.get("status", "failing")
        outcome = session["outcome"] if session else "crashed"
        row = breakers.memory_row(lease=dict(lease), status=status, session=dict(session) if session else None,
                                  outcome=outcome)
        updates: dict[str, Any] = {
            "features": features, "sessions_since_pass": verdict["sessions_since_pass"],
            "memory": [*ctx.state.get("memory", []), row][-breakers.MEMORY_ROWS:],
            "patterns": breakers.patterns_with(ctx.state.get("patterns", []), row)}
        if session is not None:
            updates["progress"] = _lines(ctx, breakers.render_row(row))
        if verdict["pause"]:
            updates["paused_for"] = {"kind": verdict["pause_kind"], "feature": lease["feature"],
                                     "reason": verdict["pause"]}
            then = (f"gives {lease['feature']} {ctx.params['max_attempts']} more attempts and a fresh spend"
                    if verdict["pause_kind"] == "feature_budget" else "starts the count of sessions again")
            return Goto("DECIDE", updates, pause=_pause_text(ctx, verdict["pause"], then))
        if session and session.get("proposal"):
            return Goto("REVIEW_PROPOSAL", updates)
        claims_done = bool(session and session["report"].get("all_done"))
        if claims_done or all(f.get("status") == "passing" for f in features):
            return Goto("VERIFY_ALL", updates)
        return Goto("SELECT_FEATURE", updates)

    def _assess_repair(self, ctx: Ctx, session: SessionResult | None) -> Decision:
        lease = ctx.state["lease"]
        verify = ctx.state.get("last_verify")
        repaired = bool(session and session["pass_requested"] and verify and verify["commit"] == session["head"]
                        and verify["results"][0]["feature"] == REPAIR and verify["results"][0]["passed"])
        row = breakers.memory_row(lease=dict(lease), status="repaired" if repaired else "main still red",
                                  session=dict(session) if session else None,
                                  outcome=session["outcome"] if session else "crashed")
        updates: dict[str, Any] = {"memory": [*ctx.state.get("memory", []), row][-breakers.MEMORY_ROWS:],
                                   "patterns": breakers.patterns_with(ctx.state.get("patterns", []), row),
                                   "progress": _lines(ctx, breakers.render_row(row))}
        if repaired:
            return Goto("SELECT_FEATURE", {**updates, "repair_attempts": 0})
        if lease["attempt"] >= ctx.params["max_attempts"]:
            updates["paused_for"] = {"kind": "repair", "reason": "main is still broken"}
            return Goto("DECIDE", updates, pause=_pause_text(
                ctx, f"the smoke check is still red on main after {lease['attempt']} repair sessions",
                "tries again with a fresh count of repair sessions"))
        return Goto("SELECT_FEATURE", updates)

    @node("DECIDE")
    def decide(self, ctx: Ctx) -> Decision:
        """A person resumed the workflow: a fresh allotment of what ran out, then on."""
        paused = ctx.state.get("paused_for") or {}
        kind = paused.get("kind", "")
        features = ctx.state["features"]
        extra = ctx.params["max_attempts"]
        updates: dict[str, Any] = {"paused_for": None}
        if kind == "feature_budget":
            updates["features"] = [_unblocked(f, extra) if f["id"] == paused.get("feature") else f
                                   for f in features]
            updates["sessions_since_pass"] = 0
        elif kind == "blocked_only":
            updates["features"] = [_unblocked(f, extra) if f.get("status") == "blocked" else f for f in features]
        elif kind == "max_sessions":
            updates["session_limit"] = ctx.state.get("session_limit", 0) + ctx.params["max_sessions"]
        elif kind == "stagnation":
            updates["sessions_since_pass"] = 0
        elif kind == "repair":
            updates["repair_attempts"] = 0
        updates["progress"] = _lines(ctx, f"resumed by a person after a pause ({kind}): "
                                          f"{str(paused.get('reason', ''))[:200]}")
        return Goto("SELECT_FEATURE", updates)

    @node("REVIEW_PROPOSAL")
    def review_proposal(self, ctx: Ctx) -> Decision:
        """A session proposed a new feature list or checks: staged on a ref, validated, its checks
        run, then a new approval bound to the new contract hash. Until approved, the approved list
        stands; rejected, nothing changes."""
        session = ctx.state["session"]
        assert session is not None
        staged: Staged = ctx.activity(harness_stage_proposal, ProposalInput(
            workspace=ctx.state["workspace"], head=ctx.state["head"], proposal=session["proposal"],
            session=ctx.state["lease"]["session"], check_timeout_seconds=ctx.params["check_timeout_seconds"],
            require_isolation=ctx.params["isolation"]))
        record = {"session": ctx.state["lease"]["session"], "ref": staged["ref"], "commit": staged["commit"],
                  "contract_hash": staged["contract_hash"], "reason": staged["reason"][:300]}
        if not staged["valid"]:
            return Goto("SELECT_FEATURE", {"proposals": [*ctx.state.get("proposals", []),
                                                         {**record, "outcome": "invalid",
                                                          "error": staged["error"][:300]}]})
        results = {r["feature"]: r for r in staged["results"]}
        candidate = {"kind": "feature_change", "scaffold_sha": staged["commit"],
                     "contract_hash": staged["contract_hash"], "workspace": ctx.state["workspace"],
                     "reason": staged["reason"], "replaces": ctx.state["contract_hash"],
                     "features": [{k: f[k] for k in ("id", "description", "priority", "check")}  # type: ignore[literal-required]
                                  for f in staged["features"]],
                     "scaffold_checks": {fid: r["exit_code"] for fid, r in results.items()}}
        outcome = ctx.approval(candidate=candidate, candidate_hash=staged["contract_hash"],
                               role=ctx.params["approver_role"],
                               expires_in_seconds=ctx.params["approval_expiry_hours"] * 3600,
                               state_versions={"intent_version": ctx.intent_version, "head": ctx.state["head"],
                                               "replaces": ctx.state["contract_hash"]})
        if not outcome.approved:
            decided = "expired" if outcome.expired else f"rejected by {outcome.decided_by}"
            return Goto("SELECT_FEATURE", {"proposals": [*ctx.state.get("proposals", []),
                                                         {**record, "outcome": decided}]})
        head = ctx.activity(harness_adopt_proposal, AdoptInput(workspace=ctx.state["workspace"],
                                                               commit=staged["commit"]))["head"]
        old = {f["id"]: f for f in ctx.state["features"]}
        features = []
        for f in staged["features"]:
            kept = old.get(f["id"], {"attempts": 0, "attempt_limit": ctx.params["max_attempts"]})
            r = results[f["id"]]
            features.append(cast(Feature, {**kept, **f, "status": "passing" if r["passed"] else "failing",
                                           "evidence": r}))
        return Goto("SELECT_FEATURE", {
            "features": features, "contract_sha": head, "contract_hash": staged["contract_hash"], "head": head,
            "proposals": [*ctx.state.get("proposals", []), {**record, "outcome": f"approved by {outcome.decided_by}"}]})

    @node("VERIFY_ALL")
    def verify_all(self, ctx: Ctx) -> Decision:
        """Every check on a fresh clone of HEAD, and a clean tree: the only way to "done"."""
        features = ctx.state["features"]
        report: ChecksReport = ctx.activity(harness_run_checks, ChecksInput(
            workspace=ctx.state["workspace"], commit=ctx.state["head"], features=_to_run(features),
            purpose="verify_all",
            where="clone", check_timeout_seconds=ctx.params["check_timeout_seconds"],
            require_isolation=ctx.params["isolation"]))
        features = _apply(features, report["results"])
        done = all(r["passed"] for r in report["results"]) and report["clean_tree"] \
            and report["head"] == ctx.state["head"]
        return Goto("COMPLETE" if done else "SELECT_FEATURE", {"features": features, "last_verify": report})

    @node("COMPLETE")
    def complete(self, ctx: Ctx) -> Decision:
        features = ctx.state["features"]
        return Complete({
            "head": ctx.state["head"], "sessions": ctx.state.get("sessions", 0),
            "features_passing": sum(f.get("status") == "passing" for f in features), "features": len(features),
            "isolation": ctx.state["isolation"]["level"] if ctx.state.get("isolation") else "",
            "evidence": {f["id"]: {k: f["evidence"][k] for k in ("commit", "command", "exit_code", "duration_ms")}
                         for f in features},
        })

    def describe_candidate(self, candidate: Any) -> CandidateView:
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

    def admin_panels(self, workflow: Any, query: Mapping[str, str] = EMPTY_QUERY) -> list[AdminPanel]:
        from agentops.agents.harness.presentation import harness_panels

        return harness_panels(workflow, query)

    def show_extras(self, workflow: Any) -> dict[str, Any]:
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
