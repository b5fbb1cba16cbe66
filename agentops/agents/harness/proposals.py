"""A coding session's proposal of a new feature list or checks (``propose_feature_change``): staged
on a ref of its own, validated and its checks run there for a person to approve, then adopted by
fast-forwarding the workspace once approved.
"""
from __future__ import annotations

import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypedDict

from agentops.agents.harness import checks as checks_mod
from agentops.agents.harness import gitops
from agentops.agents.harness.activities import CHECK_RETRY, SESSION_LEASE, scratch_dir
from agentops.agents.harness.checks import CheckResult, Feature
from agentops.kind import ActivityContext, InvalidInput, activity, keep_alive
from agentops.sandbox import files


@dataclass(frozen=True)
class ProposalInput:
    workspace: str
    head: str
    proposal: dict[str, Any]
    session: int
    check_timeout_seconds: float = 60.0
    require_isolation: str = "none"


class Staged(TypedDict):
    valid: bool
    error: str
    commit: str
    ref: str
    contract_hash: str
    features: list[Feature]
    results: list[CheckResult]
    reason: str


@activity("harness_stage_proposal", retry=CHECK_RETRY, lease_seconds=SESSION_LEASE)
def harness_stage_proposal(ctx: ActivityContext, input: ProposalInput) -> Staged:
    """Commit a session's proposed feature list and checks on a ref of their own (``proposal/<session>``,
    on top of the session's head), validate it and run its checks there, for a person to approve.
    The workspace is not touched."""
    root = Path(input.workspace)
    scratch = scratch_dir(ctx)
    checkout = scratch / "proposal"
    shutil.rmtree(scratch, ignore_errors=True)
    scratch.mkdir(parents=True)
    gitops.git(root, "worktree", "prune")
    gitops.git(root, "worktree", "add", "-q", "--detach", str(checkout), input.head)
    refused, commit = "", input.head
    try:
        # The checkout holds the session's commit: a link it committed is refused, never written through.
        files.write_text(checkout, "features.json", input.proposal["features_json"])
        for path, content in input.proposal.get("checks", {}).items():
            files.write_text(checkout, path, content)
    except (OSError, ValueError) as exc:
        refused = f"the proposal could not be written in a checkout of {input.head}: {exc}"
    else:
        commit = gitops.commit_all(checkout, f"Proposed feature list change (session {input.session})",
                                   trailers={"Harness-Operation": ctx.operation_id}) or input.head
    finally:
        gitops.git(root, "worktree", "remove", "--force", str(checkout), check=False)
        shutil.rmtree(scratch, ignore_errors=True)
    ref = f"proposal/{input.session}"
    gitops.git(root, "update-ref", f"refs/heads/{ref}", commit)
    staged: Staged = {"valid": False, "error": "", "commit": commit, "ref": ref, "contract_hash": "",
                      "features": [], "results": [], "reason": str(input.proposal.get("reason", ""))}
    try:
        if refused:
            raise InvalidInput(refused)
        staged["features"] = checks_mod.validate_features(input.proposal["features_json"], check_exists=lambda path: (
            gitops.git(root, "cat-file", "-t", f"{commit}:{path}", check=False) == "blob"))
    except InvalidInput as exc:
        staged["error"] = str(exc)
    else:
        staged["valid"] = True
        staged["contract_hash"] = checks_mod.contract_hash(root, commit)
        with keep_alive(ctx, "checks of the proposal"):
            staged["results"] = checks_mod.run_checks(root, commit, staged["features"], where="worktree",
                                                      timeout_seconds=input.check_timeout_seconds,
                                                      scratch=scratch_dir(ctx),
                                                      require_isolation=input.require_isolation)
    ctx.note("harness.proposal_staged", ref=ref, commit=commit, valid=staged["valid"], error=staged["error"][:300],
             contract_hash=staged["contract_hash"], reason=staged["reason"][:300])
    return staged


@dataclass(frozen=True)
class AdoptInput:
    workspace: str
    commit: str


class Adopted(TypedDict):
    head: str  # the new contract commit


@activity("harness_adopt_proposal", retry=CHECK_RETRY)
def harness_adopt_proposal(ctx: ActivityContext, input: AdoptInput) -> Adopted:
    """Fast-forward the workspace to an approved proposal (idempotent: already there, nothing moves)."""
    root = Path(input.workspace)
    if gitops.head(root) != input.commit:
        ctx.fence("adopt the approved feature list")
        gitops.git(root, "merge", "-q", "--ff-only", input.commit)
    return {"head": gitops.head(root)}

