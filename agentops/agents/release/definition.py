"""The ``release`` agent: an approval-gated change, deployed once, verified and reconciled."""
from __future__ import annotations

import hashlib
import json
import os
import shlex
from typing import Any, TypedDict

from pydantic import Field

from agentops.agents.release.activities import (
    DeployInput,
    Deployment,
    DeploymentCheckInput,
    Evidence,
    Proposal,
    ProposalInput,
    RepoInput,
    RunTestsInput,
    RunTestsReport,
    deploy,
    inspect_repository,
    propose_change,
    reconcile_deployment,
    run_tests,
    verify_deployment,
)
from agentops.kind import (
    ROLE_MAX_LENGTH,
    CandidateView,
    Complete,
    Decision,
    Fail,
    Goto,
    InvalidInput,
    LaunchParams,
    NodeContext,
    WorkflowDefinition,
    candidate_as_json,
    node,
    register_definition,
)

DEFAULT_ROLE = "release-approvers"
DEFAULT_EXPIRY_HOURS = 24.0


def candidate_hash(candidate: dict[str, Any]) -> str:
    """SHA-256 over the canonical JSON of the candidate (proposal, repository HEAD, release)."""
    return hashlib.sha256(json.dumps(candidate, sort_keys=True, separators=(",", ":")).encode()).hexdigest()


class ReleaseParams(LaunchParams):
    repo: str = Field(description="path of the git repository to change and deploy")
    test_command: str = Field(description="the command that runs its tests, e.g. 'make test'")
    approver_role: str = Field(DEFAULT_ROLE, description="the Django group whose members approve the change")
    approval_expiry_hours: float = Field(DEFAULT_EXPIRY_HOURS, gt=0, le=24 * 365,
                                         description="hours an approval stays open")


class State(TypedDict, total=False):
    """What the handlers keep between nodes."""

    evidence: Evidence
    proposal: Proposal
    candidate_intent: int
    candidate_release: str
    approved_hash: str | None
    approved_by: str
    tests: RunTestsReport
    candidate: dict[str, Any]
    candidate_hash: str
    deployment: Deployment
    reconciliation: dict[str, Any]


Ctx = NodeContext[State]


@register_definition
class Release(WorkflowDefinition):
    kind = "release"
    version = 1
    start_node = "GATHER_EVIDENCE"
    revalidate_node = "REVALIDATE"
    launch_params = ReleaseParams
    reads_steering = True  # its one model-calling step: propose_change (BUILD_CANDIDATE)

    def validate_params(self, params: dict[str, Any]) -> dict[str, Any]:
        """Launch-time checks (this runs once in the launch service, never during replay)."""
        typed = super().validate_params(params)
        repo = typed["repo"]
        if not repo:
            raise InvalidInput("Parameter repo is required: --param repo=/path/to/git/repository.")
        repo = os.path.abspath(repo)
        if not os.path.isdir(os.path.join(repo, ".git")):
            raise InvalidInput(f"Parameter repo={repo!r} is not a git repository (no .git directory).")
        command = typed["test_command"]
        if not command:
            raise InvalidInput("Parameter test_command is required, e.g. --param test_command='make test'.")
        try:
            if not shlex.split(command):
                raise ValueError("empty")
        except ValueError as exc:
            raise InvalidInput(f"Parameter test_command={command!r} cannot be parsed as a command: {exc}.") from None
        hours = typed["approval_expiry_hours"]
        role = typed["approver_role"] or DEFAULT_ROLE
        role_limit = ROLE_MAX_LENGTH
        if len(role) > role_limit:
            raise InvalidInput(f"Parameter approver_role is {len(role)} characters long; the limit is {role_limit} "
                               f"(a Django group name): name an existing group, e.g. "
                               f"--param approver_role={DEFAULT_ROLE}.")
        return {"repo": repo, "test_command": command, "approver_role": role, "approval_expiry_hours": hours}

    @node("GATHER_EVIDENCE")
    def gather_evidence(self, ctx: Ctx) -> Decision:
        evidence = ctx.activity(inspect_repository, RepoInput(repo=ctx.params["repo"]))
        return Goto("BUILD_CANDIDATE", {"evidence": evidence})

    @node("BUILD_CANDIDATE")
    def build_candidate(self, ctx: Ctx) -> Decision:
        proposal = ctx.activity(propose_change, ProposalInput(goal=ctx.goal, evidence=ctx.state["evidence"]))
        return Goto("VERIFY_CANDIDATE", {
            "proposal": proposal, "candidate_intent": ctx.intent_version,
            "candidate_release": ctx.release_fingerprint, "approved_hash": None,
        })

    @node("VERIFY_CANDIDATE")
    def verify_candidate(self, ctx: Ctx) -> Decision:
        tests = ctx.activity(run_tests, RunTestsInput(
            repo=ctx.params["repo"], head=ctx.state["evidence"]["head"],
            files=ctx.state["proposal"]["files"], test_command=ctx.params["test_command"],
        ))
        if not tests["passed"]:
            return Fail(f"The candidate's tests failed (exit {tests['exit_code']}): {tests['output_tail'][-300:]}")
        return Goto("REQUEST_APPROVAL", {"tests": tests})

    @node("REQUEST_APPROVAL")
    def request_approval(self, ctx: Ctx) -> Decision:
        candidate = {
            "title": ctx.state["proposal"]["title"], "summary": ctx.state["proposal"]["summary"],
            "files": ctx.state["proposal"]["files"], "head": ctx.state["evidence"]["head"],
            "release": ctx.release_fingerprint, "intent_version": ctx.intent_version,
            "tests": {"passed": ctx.state["tests"]["passed"], "exit_code": ctx.state["tests"]["exit_code"]},
        }
        return Goto("WAIT_FOR_APPROVAL", {"candidate": candidate, "candidate_hash": candidate_hash(candidate)})

    @node("WAIT_FOR_APPROVAL")
    def wait_for_approval(self, ctx: Ctx) -> Decision:
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

    @node("REVALIDATE")
    def revalidate(self, ctx: Ctx) -> Decision:
        """After any wait or goal change: rebuild unless the approved candidate still holds."""
        current = ctx.activity(inspect_repository, RepoInput(repo=ctx.params["repo"]))
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

    @node("COMMIT_OPERATION")
    def commit_operation(self, ctx: Ctx) -> Decision:
        deployment = ctx.activity(deploy, DeployInput(
            candidate_hash=ctx.state["approved_hash"] or "", head=ctx.state["evidence"]["head"],
            title=ctx.state["proposal"]["title"], files=ctx.state["proposal"]["files"],
        ))
        return Goto("VERIFY_POSTCONDITION", {"deployment": deployment})

    @node("VERIFY_POSTCONDITION")
    def verify_postcondition(self, ctx: Ctx) -> Decision:
        check = ctx.activity(verify_deployment, DeploymentCheckInput(
            deployment=ctx.state["deployment"], candidate_hash=ctx.state["approved_hash"] or ""))
        if not check["ok"]:
            return Fail(f"The deployment did not verify: {check['reason']}")
        return Goto("RECONCILE")

    @node("RECONCILE")
    def reconcile(self, ctx: Ctx) -> Decision:
        report = ctx.activity(reconcile_deployment, DeploymentCheckInput(deployment=ctx.state["deployment"]))
        if not report["consistent"]:
            return Fail(f"Reconciliation found a mismatch: {report['reason']}")
        return Goto("COMPLETE", {"reconciliation": report})

    @node("COMPLETE")
    def complete(self, ctx: Ctx) -> Decision:
        return Complete({
            "deployment_id": ctx.state["deployment"]["deployment_id"],
            "candidate_hash": ctx.state["approved_hash"], "approved_by": ctx.state.get("approved_by"),
        })

    def describe_candidate(self, candidate: Any) -> CandidateView:
        """The proposal's title, summary and files in full; the repository HEAD and the tests as facts."""
        if not isinstance(candidate, dict):
            return candidate_as_json(candidate)
        files = candidate.get("files")
        file_list = sorted((str(p), str(c)) for p, c in files.items()) if isinstance(files, dict) else []
        facts = []
        if candidate.get("head"):
            facts.append(("Repository HEAD", str(candidate["head"])))
        tests = candidate.get("tests")
        if isinstance(tests, dict):
            verdict = "passed" if tests.get("passed") else "FAILED"
            code = tests.get("exit_code")
            facts.append(("Tests on the candidate", verdict + (f" (exit code {code})" if code is not None else "")))
        shown = {"title", "summary", "head", "tests", *(("files",) if file_list else ())}
        rest = {k: v for k, v in candidate.items() if k not in shown}
        return CandidateView(
            title=str(candidate.get("title", "")), summary=str(candidate.get("summary", "")), files=file_list,
            facts=facts, other=json.dumps(rest, indent=2, sort_keys=True, default=str) if rest else "",
        )
