"""The ``harness`` definition: initializer, an approved feature list, then one engine-graded feature per session."""
from __future__ import annotations

from collections.abc import Mapping
from typing import Any, cast

from agentops.agents.harness import breakers
from agentops.agents.harness.activities import (
    AssessInput,
    ChecksInput,
    ChecksReport,
    Prepared,
    PrepareInput,
    Probe,
    ProbeInput,
    ValidateInput,
    Validation,
    harness_assess,
    harness_prepare,
    harness_probe,
    harness_run_checks,
    harness_validate,
)
from agentops.agents.harness.board import apply_results, board_rows, regression_share, to_run, unblocked, with_changes
from agentops.agents.harness.checks import Feature
from agentops.agents.harness.proposals import (
    AdoptInput,
    ProposalInput,
    Staged,
    harness_adopt_proposal,
    harness_stage_proposal,
)
from agentops.agents.harness.readouts import candidate_view, isolation_pause, pause_text, show_json
from agentops.agents.harness.session import (
    InitInput,
    InitResult,
    Limits,
    SessionInput,
    SessionResult,
    harness_initialize,
    harness_session,
)
from agentops.agents.harness.state import (
    PROGRESS_LINES,
    REPAIR,
    REPAIR_FEATURE,
    REVIEWS_KEPT,
    Ctx,
    HarnessParams,
    Lease,
    params_checked,
)
from agentops.kind import (
    EMPTY_QUERY,
    ActivityFailed,
    AdminPanel,
    CandidateView,
    Complete,
    Decision,
    Fail,
    Goto,
    WorkflowDefinition,
    node,
    register_definition,
)


def _lines(ctx: Ctx, line: str) -> list[str]:
    return [*ctx.state.get("progress", []), line][-PROGRESS_LINES:]


def _summary(session: SessionResult | None) -> dict[str, Any]:
    """What the breakers read of a session (a crashed one: nothing but its outcome)."""
    if session is None:
        return {"outcome": "crashed", "cost_usd": "0", "tree": ""}
    return {k: session[k] for k in ("outcome", "cost_usd", "tree")}  # type: ignore[literal-required]


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
        return params_checked(super().validate_params(params))

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
                        pause=isolation_pause(ctx, probe))
        try:
            init: InitResult = ctx.activity(harness_initialize, InitInput(
                goal=ctx.goal, workspace=ctx.params["workspace"], require_isolation=ctx.params["isolation"]))
        except ActivityFailed as exc:
            return Fail(f"The initializer session failed: {exc.error}")
        return Goto("VALIDATE_FEATURE_LIST", {
            "isolation": probe, "paused_for": None, "workspace": init["workspace"],
            "scaffold_sha": init["scaffold_sha"], "contract_sha": init["scaffold_sha"], "head": init["scaffold_sha"],
            # The count of sessions and its limit carry over a later visit (a release change revalidates
            # here), so max_sessions bounds the workflow, not each visit.
            "sessions": ctx.state.get("sessions", 0),
            "session_limit": ctx.state.get("session_limit", ctx.params["max_sessions"]),
            "sessions_since_pass": 0, "progress": [],
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
        features = apply_results(features, report["results"])
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
            return Goto("DECIDE", {"paused_for": {"kind": "blocked_only", "reason": why[:1000]}}, pause=pause_text(
                ctx, f"only blocked features are left ({why[:600]})", "gives each of them "
                     f"{ctx.params['max_attempts']} more attempts with its loop breakers reset"))
        sessions = ctx.state.get("sessions", 0)
        limit = ctx.state.get("session_limit", ctx.params["max_sessions"])
        if sessions >= limit:
            return Goto("DECIDE", {"paused_for": {"kind": "max_sessions"}}, pause=pause_text(
                ctx, f"{sessions} coding sessions used (the workflow's budget, max_sessions); still failing: "
                     f"{', '.join(f['id'] for f in failing)}", f"allows {ctx.params['max_sessions']} more sessions"))
        chosen = min(failing, key=lambda f: (f["priority"], features.index(f)))
        lease: Lease = {"feature": chosen["id"], "attempt": chosen.get("attempts", 0) + 1, "session": sessions + 1}
        return Goto("PREPARE_SESSION", {"lease": lease, "previous_lease": ctx.state.get("lease"),
                                        "sessions": sessions + 1,
                                        "features": with_changes(features, chosen["id"], attempts=lease["attempt"])})

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
                features=with_changes(ctx.state["features"], fid, attempts=lease["attempt"] - 1))
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
                board=board_rows(ctx.state["features"]), last_output=str(evidence.get("output_tail", "")),
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
            workspace=ctx.state["workspace"], commit=session["head"], features=to_run([feature]),
            purpose="repair" if repair else "verify", check_timeout_seconds=ctx.params["check_timeout_seconds"],
            require_isolation=ctx.params["isolation"]))
        return Goto("REGRESSION", {"features": apply_results(features, report["results"]), "last_verify": report})

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
            workspace=ctx.state["workspace"], commit=ctx.state["session"]["head"], features=to_run(chosen),  # type: ignore[index]
            purpose="regression", check_timeout_seconds=ctx.params["check_timeout_seconds"],
            require_isolation=ctx.params["isolation"]))
        regressed = [r for r in report["results"] if not r["passed"]]
        updates: dict[str, Any] = {"features": apply_results(features, regressed)} if regressed else {}
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
        features = with_changes(features, lease["feature"], **{k: v for k, v in changes.items() if k != "id"})
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
            return Goto("DECIDE", updates, pause=pause_text(ctx, verdict["pause"], then))
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
            return Goto("DECIDE", updates, pause=pause_text(
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
            updates["features"] = [unblocked(f, extra) if f["id"] == paused.get("feature") else f
                                   for f in features]
            updates["sessions_since_pass"] = 0
        elif kind == "blocked_only":
            updates["features"] = [unblocked(f, extra) if f.get("status") == "blocked" else f for f in features]
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
            workspace=ctx.state["workspace"], commit=ctx.state["head"], features=to_run(features),
            purpose="verify_all",
            where="clone", check_timeout_seconds=ctx.params["check_timeout_seconds"],
            require_isolation=ctx.params["isolation"]))
        features = apply_results(features, report["results"])
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
        return candidate_view(candidate)

    def admin_panels(self, workflow: Any, query: Mapping[str, str] = EMPTY_QUERY) -> list[AdminPanel]:
        from agentops.agents.harness.presentation import harness_panels

        return harness_panels(workflow, query)

    def show_extras(self, workflow: Any) -> dict[str, Any]:
        return show_json(workflow)
