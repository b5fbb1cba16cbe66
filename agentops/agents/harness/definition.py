"""The ``harness`` definition: initializer, an approved feature list, then one engine-graded feature per session."""
from __future__ import annotations

import os
from typing import Any, TypedDict, cast

from agentops.agents.harness.activities import (
    ChecksInput,
    ChecksReport,
    InitInput,
    InitResult,
    Prepared,
    PrepareInput,
    SessionInput,
    SessionResult,
    ValidateInput,
    Validation,
    harness_initialize,
    harness_prepare,
    harness_run_checks,
    harness_session,
    harness_validate,
)
from agentops.agents.harness.checks import CheckResult, Feature
from workflows.engine import ActivityFailed, Complete, Decision, Fail, Goto, NodeContext, WorkflowDefinition, node
from workflows.errors import InvalidInput
from workflows.models import Wait
from workflows.presentation import AdminPanel, CandidateView
from workflows.registry import register_definition

DEFAULTS = {"max_sessions": 40, "max_attempts": 3, "check_timeout_seconds": 60.0,
            "approver_role": "harness-approvers", "approval_expiry_hours": 72.0}
PARAMS = ("workspace", *DEFAULTS)


class Lease(TypedDict):
    feature: str
    attempt: int
    session: int


class State(TypedDict, total=False):
    workspace: str
    scaffold_sha: str
    contract_hash: str
    features: list[Feature]
    vacuous: list[str]
    approved_by: str
    head: str  # the last commit a session left (or the scaffold)
    sessions: int
    lease: Lease
    previous_lease: Lease | None
    prepared: Prepared
    session: SessionResult
    progress: list[str]  # one line per session, newest last (bounded)
    last_verify: ChecksReport


Ctx = NodeContext[State]


def _number(params: dict[str, Any], name: str, low: float, high: float, kind: type) -> Any:
    try:
        value = kind(params.get(name, DEFAULTS[name]))
    except (TypeError, ValueError):
        raise InvalidInput(f"Parameter {name} must be a number: --param {name}={DEFAULTS[name]}.") from None
    if not low <= value <= high:
        raise InvalidInput(f"Parameter {name}={value} must be between {low:g} and {high:g}.")
    return value


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


def _board(features: list[Feature]) -> list[dict[str, str]]:
    return [{"id": f["id"], "status": f.get("status", "failing")} for f in features]


@register_definition
class Harness(WorkflowDefinition):
    kind = "harness"
    version = 1
    start_node = "INITIALIZE"
    revalidate_node = "INITIALIZE"

    def validate_params(self, params: dict[str, Any]) -> dict[str, Any]:
        """The workspace (absolute; absent, an empty directory or a git repository) and the limits."""
        unknown = sorted(set(params) - set(PARAMS))
        if unknown:
            raise InvalidInput(f"Unknown parameter(s) {', '.join(unknown)} for kind 'harness'; allowed: "
                               f"{', '.join(PARAMS)}.")
        workspace = str(params.get("workspace", "")).strip()
        if workspace:
            if not os.path.isabs(workspace) or len(workspace) > 500:
                raise InvalidInput(f"Parameter workspace={workspace!r} must be an absolute path (at most 500 "
                                   "characters): a new directory, an empty one or a git repository.")
            if os.path.exists(workspace) and not (
                    os.path.isdir(workspace) and (not os.listdir(workspace)
                                                  or os.path.isdir(os.path.join(workspace, ".git")))):
                raise InvalidInput(f"Parameter workspace={workspace!r} exists and is neither an empty directory nor "
                                   "a git repository; pass a new path.")
        role = str(params.get("approver_role", DEFAULTS["approver_role"])).strip() or str(DEFAULTS["approver_role"])
        if len(role) > (Wait._meta.get_field("required_role").max_length or 0):
            raise InvalidInput(f"Parameter approver_role={role[:40]!r}… is too long for a group name.")
        return {
            "workspace": workspace,
            "max_sessions": _number(params, "max_sessions", 1, 1000, int),
            "max_attempts": _number(params, "max_attempts", 1, 50, int),
            "check_timeout_seconds": _number(params, "check_timeout_seconds", 1, 600, float),
            "approver_role": role,
            "approval_expiry_hours": _number(params, "approval_expiry_hours", 0.01, 8760, float),
        }

    @node("INITIALIZE")
    def initialize(self, ctx: Ctx) -> Decision:
        """Session 0: the model writes the feature list, checks, init.sh, progress.md, a stub; first commit."""
        try:
            init: InitResult = ctx.activity(harness_initialize, InitInput(goal=ctx.goal,
                                                                         workspace=ctx.params["workspace"]))
        except ActivityFailed as exc:
            return Fail(f"The initializer session failed: {exc.error}")
        return Goto("VALIDATE_FEATURE_LIST", {"workspace": init["workspace"], "scaffold_sha": init["scaffold_sha"],
                                              "head": init["scaffold_sha"], "sessions": 0, "progress": []})

    @node("VALIDATE_FEATURE_LIST")
    def validate_feature_list(self, ctx: Ctx) -> Decision:
        """Schema, then every check on the scaffold: all must be red, or the list cannot be approved."""
        try:
            report: Validation = ctx.activity(harness_validate, ValidateInput(
                workspace=ctx.state["workspace"], commit=ctx.state["scaffold_sha"],
                check_timeout_seconds=ctx.params["check_timeout_seconds"]))
        except ActivityFailed as exc:
            return Fail(f"The feature list at {ctx.state['scaffold_sha'][:12]} cannot be used: {exc.error}")
        features = [cast(Feature, {**f, "status": "failing", "attempts": 0}) for f in report["features"]]
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
        """The engine picks the feature: the highest-priority failing one that is not blocked."""
        features = ctx.state["features"]
        failing = [f for f in features if f.get("status") == "failing"]
        if not failing:
            blocked = [f["id"] for f in features if f.get("status") == "blocked"]
            if blocked:
                return Fail(f"Features {', '.join(blocked)} are blocked after {ctx.params['max_attempts']} attempts "
                            "each; the list is not done.")
            return Goto("VERIFY_ALL")
        sessions = ctx.state.get("sessions", 0)
        if sessions >= ctx.params["max_sessions"]:
            return Fail(f"{sessions} coding sessions used (max_sessions); still failing: "
                        f"{', '.join(f['id'] for f in failing)}.")
        chosen = min(failing, key=lambda f: (f["priority"], features.index(f)))
        lease: Lease = {"feature": chosen["id"], "attempt": chosen.get("attempts", 0) + 1, "session": sessions + 1}
        return Goto("PREPARE_SESSION", {"lease": lease, "previous_lease": ctx.state.get("lease"),
                                        "sessions": sessions + 1,
                                        "features": _with(features, chosen["id"], attempts=lease["attempt"])})

    @node("PREPARE_SESSION")
    def prepare_session(self, ctx: Ctx) -> Decision:
        """Record the base commit; leftovers of an earlier session go to a wip/ ref first."""
        previous = ctx.state.get("previous_lease")
        # Leftovers belong to the session before this one (or to someone outside the harness).
        wip_name = f"{previous['feature']}/{previous['attempt']}" if previous else "before-first-session"
        prepared: Prepared = ctx.activity(harness_prepare, PrepareInput(
            workspace=ctx.state["workspace"], expected_head=ctx.state["head"], wip_name=wip_name))
        return Goto("CODING_SESSION", {"prepared": prepared})

    @node("CODING_SESSION")
    def coding_session(self, ctx: Ctx) -> Decision:
        lease = ctx.state["lease"]
        feature = next(f for f in ctx.state["features"] if f["id"] == lease["feature"])
        evidence = feature.get("evidence") or {}
        try:
            result: SessionResult = ctx.activity(harness_session, SessionInput(
                goal=ctx.goal, workspace=ctx.state["workspace"], feature=feature, attempt=lease["attempt"],
                session=lease["session"], base_sha=ctx.state["prepared"]["base_sha"],
                protected_sha=ctx.state["scaffold_sha"], board=_board(ctx.state["features"]),
                last_output=str(evidence.get("output_tail", "")), wip=ctx.state["prepared"]["wip"],
                progress=ctx.state.get("progress", [])))
        except ActivityFailed as exc:
            line = f"session {lease['session']} {lease['feature']}#{lease['attempt']}: failed ({exc.error[:200]})"
            return Goto("ASSESS", {"session": None, "progress": [*ctx.state.get("progress", []), line][-20:]})
        return Goto("VERIFY_FEATURE", {"session": result, "head": result["head"]})

    @node("VERIFY_FEATURE")
    def verify_feature(self, ctx: Ctx) -> Decision:
        """Only the leased feature, only on request, only on exit 0 of its check in a clean worktree."""
        session, lease = ctx.state["session"], ctx.state["lease"]
        features = ctx.state["features"]
        if not session["pass_requested"]:
            return Goto("ASSESS")
        feature = next(f for f in features if f["id"] == lease["feature"])
        report: ChecksReport = ctx.activity(harness_run_checks, ChecksInput(
            workspace=ctx.state["workspace"], commit=session["head"], features=[feature], purpose="verify",
            check_timeout_seconds=ctx.params["check_timeout_seconds"]))
        return Goto("REGRESSION", {"features": _apply(features, report["results"]), "last_verify": report})

    @node("REGRESSION")
    def regression(self, ctx: Ctx) -> Decision:
        """After a pass, every other passing check runs again on the same commit; regressions flip back."""
        lease, features = ctx.state["lease"], ctx.state["features"]
        leased = next(f for f in features if f["id"] == lease["feature"])
        others = [f for f in features if f.get("status") == "passing" and f["id"] != lease["feature"]]
        if leased.get("status") != "passing" or not others:
            return Goto("ASSESS")
        report: ChecksReport = ctx.activity(harness_run_checks, ChecksInput(
            workspace=ctx.state["workspace"], commit=ctx.state["session"]["head"], features=others,
            purpose="regression", check_timeout_seconds=ctx.params["check_timeout_seconds"]))
        return Goto("ASSESS", {"features": _apply(features, report["results"])})

    @node("ASSESS")
    def assess(self, ctx: Ctx) -> Decision:
        """Record the session's outcome; block a feature out of attempts; a claim of "all done" only
        triggers VERIFY_ALL."""
        lease, features = ctx.state["lease"], ctx.state["features"]
        session = ctx.state.get("session")
        feature = next(f for f in features if f["id"] == lease["feature"])
        status = feature.get("status", "failing")
        line = (f"session {lease['session']} {lease['feature']}#{lease['attempt']}: {status}"
                + (f"; {session['report'].get('summary', '')[:160]}" if session and session["report"].get("summary")
                   else ""))
        updates: dict[str, Any] = {"progress": [*ctx.state.get("progress", []), line][-20:]}
        if status == "failing" and lease["attempt"] >= ctx.params["max_attempts"]:
            features = _with(features, lease["feature"], status="blocked",
                             reason=f"still failing after {lease['attempt']} attempts")
            updates["features"] = features
        claims_done = bool(session and session["report"].get("all_done"))
        if claims_done or all(f.get("status") == "passing" for f in features):
            return Goto("VERIFY_ALL", updates)
        return Goto("SELECT_FEATURE", updates)

    @node("VERIFY_ALL")
    def verify_all(self, ctx: Ctx) -> Decision:
        """Every check on a fresh clone of HEAD, and a clean tree: the only way to "done"."""
        features = ctx.state["features"]
        report: ChecksReport = ctx.activity(harness_run_checks, ChecksInput(
            workspace=ctx.state["workspace"], commit=ctx.state["head"], features=features, purpose="verify_all",
            where="clone", check_timeout_seconds=ctx.params["check_timeout_seconds"]))
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
            "evidence": {f["id"]: {k: f["evidence"][k] for k in ("commit", "command", "exit_code", "duration_ms")}
                         for f in features},
        })

    def describe_candidate(self, candidate: Any) -> CandidateView:
        features = candidate.get("features", []) if isinstance(candidate, dict) else []
        return CandidateView(
            title=f"Feature list of {len(features)} features",
            summary=(f"Scaffold {str(candidate.get('scaffold_sha', ''))[:12]} in {candidate.get('workspace')}; every "
                     "check fails on the scaffold. Approving freezes features.json and checks/ (contract "
                     f"{str(candidate.get('contract_hash', ''))[:12]})."),
            facts=[(f["id"], f"{f['description']} ({f['check']})") for f in features])

    def admin_panels(self, workflow: Any) -> list[AdminPanel]:
        from agentops.agents.harness.presentation import harness_panels

        return harness_panels(workflow)

    def show_extras(self, workflow: Any) -> dict[str, Any]:
        """``agent show --json``: the feature board with the engine's evidence."""
        state = workflow.state if isinstance(workflow.state, dict) else {}
        board = []
        for f in state.get("features", []):
            evidence = f.get("evidence") or {}
            board.append({"id": f.get("id"), "status": f.get("status"), "attempts": f.get("attempts", 0),
                          "commit": str(evidence.get("commit", ""))[:12], "exit_code": evidence.get("exit_code"),
                          "duration_ms": evidence.get("duration_ms"), "reason": f.get("reason", "")})
        return {"features": board, "sessions": state.get("sessions", 0), "harness_progress": state.get("progress", [])}
