"""The ``release`` agent: an approval-gated change, deployed once, verified and reconciled."""
from __future__ import annotations

import hashlib
import json
import os
import shlex
from typing import Any

from workflows.engine import Complete, Decision, Fail, Goto, NodeContext, WorkflowDefinition
from workflows.errors import InvalidInput
from workflows.registry import register_definition

DEFAULT_ROLE = "release-approvers"
DEFAULT_EXPIRY_HOURS = 24.0


def candidate_hash(candidate: dict[str, Any]) -> str:
    """SHA-256 over the canonical JSON of the candidate (proposal, repository HEAD, release)."""
    return hashlib.sha256(json.dumps(candidate, sort_keys=True, separators=(",", ":")).encode()).hexdigest()


@register_definition
class Release(WorkflowDefinition):
    kind = "release"
    version = 1
    nodes = (
        "GATHER_EVIDENCE", "BUILD_CANDIDATE", "VERIFY_CANDIDATE", "REQUEST_APPROVAL", "WAIT_FOR_APPROVAL",
        "REVALIDATE", "COMMIT_OPERATION", "VERIFY_POSTCONDITION", "RECONCILE", "COMPLETE",
    )
    start_node = "GATHER_EVIDENCE"
    revalidate_node = "REVALIDATE"

    def validate_params(self, params: dict[str, Any]) -> dict[str, Any]:
        """Launch-time checks (this runs once in the launch service, never during replay)."""
        allowed = {"repo", "test_command", "approver_role", "approval_expiry_hours"}
        unknown = sorted(set(params) - allowed)
        if unknown:
            raise InvalidInput(f"Unknown parameter(s) {', '.join(unknown)} for kind 'release'; "
                               f"allowed: {', '.join(sorted(allowed))}.")
        repo = str(params.get("repo", "")).strip()
        if not repo:
            raise InvalidInput("Parameter repo is required: --param repo=/path/to/git/repository.")
        repo = os.path.abspath(repo)
        if not os.path.isdir(os.path.join(repo, ".git")):
            raise InvalidInput(f"Parameter repo={repo!r} is not a git repository (no .git directory).")
        command = str(params.get("test_command", "")).strip()
        if not command:
            raise InvalidInput("Parameter test_command is required, e.g. --param test_command='make test'.")
        try:
            if not shlex.split(command):
                raise ValueError("empty")
        except ValueError as exc:
            raise InvalidInput(f"Parameter test_command={command!r} cannot be parsed as a command: {exc}.") from None
        try:
            hours = float(params.get("approval_expiry_hours", DEFAULT_EXPIRY_HOURS))
        except (TypeError, ValueError):
            raise InvalidInput("Parameter approval_expiry_hours must be a number of hours.") from None
        if not 0 < hours <= 24 * 365:
            raise InvalidInput(f"Parameter approval_expiry_hours={hours} must be between 0 and 8760.")
        role = str(params.get("approver_role", DEFAULT_ROLE)).strip() or DEFAULT_ROLE
        return {"repo": repo, "test_command": command, "approver_role": role, "approval_expiry_hours": hours}

    def gather_evidence(self, ctx: NodeContext) -> Decision:
        evidence = ctx.activity("inspect_repository", repo=ctx.params["repo"])
        return Goto("BUILD_CANDIDATE", {"evidence": evidence})

    def build_candidate(self, ctx: NodeContext) -> Decision:
        proposal = ctx.activity("propose_change", goal=ctx.goal, evidence=ctx.state["evidence"])
        return Goto("VERIFY_CANDIDATE", {
            "proposal": proposal, "candidate_intent": ctx.intent_version,
            "candidate_release": ctx.release_fingerprint, "approved_hash": None,
        })

    def verify_candidate(self, ctx: NodeContext) -> Decision:
        tests = ctx.activity(
            "run_tests", repo=ctx.params["repo"], head=ctx.state["evidence"]["head"],
            files=ctx.state["proposal"]["files"], test_command=ctx.params["test_command"],
        )
        if not tests["passed"]:
            return Fail(f"The candidate's tests failed (exit {tests['exit_code']}): {tests['output_tail'][-300:]}")
        return Goto("REQUEST_APPROVAL", {"tests": tests})

    def request_approval(self, ctx: NodeContext) -> Decision:
        candidate = {
            "title": ctx.state["proposal"]["title"], "summary": ctx.state["proposal"]["summary"],
            "files": ctx.state["proposal"]["files"], "head": ctx.state["evidence"]["head"],
            "release": ctx.release_fingerprint, "intent_version": ctx.intent_version,
            "tests": {"passed": ctx.state["tests"]["passed"], "exit_code": ctx.state["tests"]["exit_code"]},
        }
        return Goto("WAIT_FOR_APPROVAL", {"candidate": candidate, "candidate_hash": candidate_hash(candidate)})

    def wait_for_approval(self, ctx: NodeContext) -> Decision:
        outcome = ctx.approval(
            candidate=ctx.state["candidate"], candidate_hash=ctx.state["candidate_hash"],
            role=ctx.params["approver_role"], expires_in_seconds=ctx.params["approval_expiry_hours"] * 3600,
            state_versions={"intent_version": ctx.intent_version, "head": ctx.state["evidence"]["head"]},
        )
        if outcome.approved:
            return Goto("REVALIDATE", {"approved_hash": ctx.state["candidate_hash"], "approved_by": outcome.decided_by})
        if outcome.expired:
            return Fail("The approval wait expired before anyone decided.")
        return Fail(f"Rejected by {outcome.decided_by}: {outcome.comment or 'no comment'}")

    def revalidate(self, ctx: NodeContext) -> Decision:
        """After any wait or goal change: rebuild unless the approved candidate still holds."""
        current = ctx.activity("inspect_repository", repo=ctx.params["repo"])
        state = ctx.state
        if "evidence" not in state or current["head"] != state["evidence"]["head"]:
            return Goto("BUILD_CANDIDATE", {"evidence": current})
        still_valid = (
            state.get("approved_hash") is not None
            and state.get("approved_hash") == state.get("candidate_hash")
            and state.get("candidate_intent") == ctx.intent_version
            and state.get("candidate_release") == ctx.release_fingerprint
        )
        return Goto("COMMIT_OPERATION") if still_valid else Goto("BUILD_CANDIDATE", {"evidence": current})

    def commit_operation(self, ctx: NodeContext) -> Decision:
        deployment = ctx.activity(
            "deploy", candidate_hash=ctx.state["approved_hash"], head=ctx.state["evidence"]["head"],
            title=ctx.state["proposal"]["title"], files=ctx.state["proposal"]["files"],
        )
        return Goto("VERIFY_POSTCONDITION", {"deployment": deployment})

    def verify_postcondition(self, ctx: NodeContext) -> Decision:
        check = ctx.activity("verify_deployment", deployment=ctx.state["deployment"],
                             candidate_hash=ctx.state["approved_hash"])
        if not check["ok"]:
            return Fail(f"The deployment did not verify: {check['reason']}")
        return Goto("RECONCILE")

    def reconcile(self, ctx: NodeContext) -> Decision:
        report = ctx.activity("reconcile_deployment", deployment=ctx.state["deployment"])
        if not report["consistent"]:
            return Fail(f"Reconciliation found a mismatch: {report['reason']}")
        return Goto("COMPLETE", {"reconciliation": report})

    def complete(self, ctx: NodeContext) -> Decision:
        return Complete({
            "deployment_id": ctx.state["deployment"]["deployment_id"],
            "candidate_hash": ctx.state["approved_hash"], "approved_by": ctx.state.get("approved_by"),
        })
