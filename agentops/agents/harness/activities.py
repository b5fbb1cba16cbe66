"""Activities of the ``harness`` kind that the engine runs, not the model: the isolation probe,
validating the feature list, check runs, preparing a session's workspace and the breakers'
assessment; and what the model sessions (``session.py``) and proposals (``proposals.py``) share
with them: the workspace paths, the retry policy of check runs and the session lease. Check runs
are the engine's: the model never sees a verdict it could set.
"""
from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypedDict

from django.conf import settings

from agentops import sandbox
from agentops.agents.harness import breakers, gitops, tools
from agentops.agents.harness import checks as checks_mod
from agentops.agents.harness.checks import CheckResult, Feature
from agentops.kind import ActivityContext, InvalidInput, RetryPolicy, activity, keep_alive
from agentops.sandbox import files

CHECK_RETRY = RetryPolicy(max_attempts=3, initial_interval_seconds=1.0)
# Every blocking step of these activities heartbeats (keep_alive): a dead worker's session is
# taken over after this setting's seconds, not minutes.
SESSION_LEASE = "AGENTOPS_HARNESS_SESSION_LEASE_SECONDS"
SMOKE_COMMAND = "sh checks/smoke.sh"
INIT_COMMAND = "sh init.sh"


def workspace_for(ctx: ActivityContext, requested: str) -> Path:
    """The workflow's workspace: the launch's ``workspace`` parameter, else one of its own."""
    path = Path(requested) if requested else Path(settings.AGENTOPS_WORKSPACE_DIR) / f"harness-wf-{ctx.workflow_id}"
    return path.resolve()


def service_dir(workflow_id: int) -> Path:
    """Logs and pid files of a workflow's services (outside the workspace, so its tree stays clean)."""
    return Path(settings.AGENTOPS_WORKSPACE_DIR).resolve() / ".harness-services" / f"wf-{workflow_id}"


def scratch_dir(ctx: ActivityContext) -> Path:
    """A directory of this operation's own for checkouts (a retry empties and reuses it)."""
    name = re.sub(r"[^A-Za-z0-9_.-]+", "_", ctx.operation_id)
    return Path(settings.AGENTOPS_WORKSPACE_DIR).resolve() / ".harness-checks" / name


# --- isolation --------------------------------------------------------------------------------

@dataclass(frozen=True)
class ProbeInput:
    required: str  # bwrap or none


class Probe(TypedDict):
    level: str  # bwrap, none, or refused: what commands of this workflow get on this worker
    detail: str
    mode: str  # the worker's AGENTOPS_SANDBOX
    required: str
    enough: bool


@activity("harness_probe", retry=CHECK_RETRY)
def harness_probe(ctx: ActivityContext, input: ProbeInput) -> Probe:
    """Probe the isolation commands would get here: bubblewrap with the network off, none, or
    "refused" (no bubblewrap, and this worker may not run a model's commands without it)."""
    mode = settings.AGENTOPS_SANDBOX
    try:
        level = sandbox.isolation()
        detail = "AGENTOPS_SANDBOX=none on this worker" if mode == "none" else sandbox.bwrap_works()[1]
    except sandbox.SandboxUnavailable as exc:
        level, detail = "refused", str(exc)
    probe: Probe = {"level": level, "detail": detail[:400], "mode": mode, "required": input.required,
                    "enough": level == "bwrap" or (level == "none" and input.required == "none")}
    ctx.note("harness.isolation_probed", **probe)
    return probe


# --- VALIDATE_FEATURE_LIST -------------------------------------------------------------------

@dataclass(frozen=True)
class ValidateInput:
    workspace: str
    commit: str
    check_timeout_seconds: float = 60.0
    require_isolation: str = "none"


class Validation(TypedDict):
    features: list[Feature]
    contract_hash: str
    results: list[CheckResult]
    vacuous: list[str]


@activity("harness_validate", retry=CHECK_RETRY, lease_seconds=SESSION_LEASE)
def harness_validate(ctx: ActivityContext, input: ValidateInput) -> Validation:
    """Schema of features.json at the scaffold commit, then every check run on it: a check that
    already passes on the scaffold proves nothing and is flagged (vacuous)."""
    root = Path(input.workspace)
    raw = gitops.git(root, "show", f"{input.commit}:features.json", check=False)
    if not raw:
        raise InvalidInput(f"The scaffold commit {input.commit[:12]} has no features.json.")
    features = checks_mod.validate_features(raw, check_exists=lambda path: bool(
        gitops.git(root, "cat-file", "-t", f"{input.commit}:{path}", check=False) == "blob"))
    with keep_alive(ctx, "checks on the scaffold"):
        results = checks_mod.run_checks(root, input.commit, features, where="worktree",
                                        timeout_seconds=input.check_timeout_seconds, scratch=scratch_dir(ctx),
                                        require_isolation=input.require_isolation)
    for result in results:
        _note_check(ctx, "scaffold", result)
    vacuous = [r["feature"] for r in results if r["passed"]]
    return {"features": features, "contract_hash": checks_mod.contract_hash(root, input.commit),
            "results": results, "vacuous": vacuous}


def _note_check(ctx: ActivityContext, purpose: str, result: CheckResult) -> None:
    ctx.note("harness.check_ran", purpose=purpose, **{k: v for k, v in result.items() if k != "output_tail"},
             output_tail=result["output_tail"][-500:])


# --- the engine's check runs -------------------------------------------------------------------

@dataclass(frozen=True)
class ChecksInput:
    workspace: str
    commit: str
    features: list[Feature]
    purpose: str  # verify, regression, verify_all
    where: str = "worktree"  # or clone
    check_timeout_seconds: float = 60.0
    require_isolation: str = "none"


class ChecksReport(TypedDict):
    commit: str
    results: list[CheckResult]
    clean_tree: bool
    head: str


@activity("harness_run_checks", retry=CHECK_RETRY, lease_seconds=SESSION_LEASE)
def harness_run_checks(ctx: ActivityContext, input: ChecksInput) -> ChecksReport:
    """Run checks on one commit in a checkout of their own; each result is an event with its evidence."""
    root = Path(input.workspace)
    with keep_alive(ctx, f"{input.purpose} checks"):
        results = checks_mod.run_checks(root, input.commit, list(input.features), where=input.where,
                                        timeout_seconds=input.check_timeout_seconds, scratch=scratch_dir(ctx),
                                        require_isolation=input.require_isolation)
    for result in results:
        _note_check(ctx, input.purpose, result)
    return {"commit": input.commit, "results": results, "clean_tree": not gitops.dirty(root),
            "head": gitops.head(root)}


# --- PREPARE_SESSION ---------------------------------------------------------------------------

@dataclass(frozen=True)
class PrepareInput:
    workspace: str
    expected_head: str
    wip_name: str  # the feature/attempt of the session whose leftovers would be found
    smoke: bool = True  # run init.sh and the smoke check after the reset
    check_timeout_seconds: float = 60.0
    require_isolation: str = "none"


class Smoke(TypedDict):
    ran: bool
    passed: bool
    command: str
    exit_code: int
    output_tail: str
    isolation: str


class Prepared(TypedDict):
    base_sha: str
    wip: Any  # {"ref", "commit", "files", "head_moved"} or None
    smoke: Smoke | None


@activity("harness_prepare", retry=CHECK_RETRY, lease_seconds=SESSION_LEASE)
def harness_prepare(ctx: ActivityContext, input: PrepareInput) -> Prepared:
    """Record the session's base commit; half-work found in the workspace goes to a wip/ ref first;
    services a dead attempt left are stopped; then the engine runs init.sh and the smoke check."""
    root = Path(input.workspace)
    ctx.fence("restore the workspace to the last recorded commit")
    stopped = tools.stop_leftover_services(service_dir(ctx.workflow_id))
    if stopped:
        ctx.note("harness.services_stopped", groups=stopped, why="left by an attempt that died")
    wip = gitops.save_wip_and_reset(root, base_sha=input.expected_head, name=input.wip_name)
    if wip is not None:
        ctx.note("harness.wip_saved", ref=wip.ref, commit=wip.commit, files=wip.files, base_sha=input.expected_head)
    smoke = None
    if input.smoke:
        with keep_alive(ctx, "init.sh and the smoke check"):
            smoke = _smoke(root, input.check_timeout_seconds, input.require_isolation)
        ctx.note("harness.smoke_ran", base_sha=gitops.head(root), **{k: v for k, v in smoke.items()
                                                                      if k != "output_tail"},
                 output_tail=smoke["output_tail"][-500:])
    return {"base_sha": gitops.head(root), "wip": None if wip is None else wip.__dict__, "smoke": smoke}


def _smoke(root: Path, timeout: float, require_isolation: str) -> Smoke:
    """``sh init.sh`` then ``sh checks/smoke.sh`` in the workspace, sandboxed; whatever they write is
    cleaned away after (the session starts from a clean tree). Without the required isolation
    nothing runs and the smoke did not run (``ran`` false)."""
    output, exit_code, isolation, ran = "", 0, "", False
    for command in (INIT_COMMAND, SMOKE_COMMAND):
        if not files.is_file(root, command.split()[1]):
            continue
        try:
            if require_isolation == "bwrap" and sandbox.isolation() != "bwrap":
                output += f"$ {command}: not run: this worker has no bubblewrap, which the workflow requires\n"
                break
            sandbox.isolation()  # SandboxUnavailable: a real model and no bubblewrap, nothing runs
            ran = True
            done = sandbox.run(command.split(), workspace=root, timeout_seconds=timeout, max_output_bytes=8000)
            exit_code, isolation = (done.exit_code if not done.timed_out else 124), done.isolation
            output += f"$ {command} -> exit {exit_code}\n{done.output}\n"
        except sandbox.SandboxUnavailable as exc:
            output += f"$ {command}: not run: {exc}\n"
            break
        except FileNotFoundError as exc:
            exit_code, output = -1, output + f"$ {command}: could not run: {exc}\n"
        if exit_code != 0:
            break
    gitops.git(root, "checkout", "-q", "--", ".", check=False)
    gitops.git(root, "clean", "-fdq")
    return {"ran": ran, "passed": ran and exit_code == 0, "command": f"{INIT_COMMAND} && {SMOKE_COMMAND}",
            "exit_code": exit_code, "output_tail": sandbox.redacted_tail(output, checks_mod.OUTPUT_TAIL_CHARS),
            "isolation": isolation}


# --- ASSESS: budgets and loop breakers ------------------------------------------------------

@dataclass(frozen=True)
class AssessInput:
    feature: Feature
    session: dict[str, Any]
    passed: bool
    evidence: Any
    sessions_since_pass: int
    limits: dict[str, Any]


@activity("harness_assess", retry=CHECK_RETRY)
def harness_assess(ctx: ActivityContext, input: AssessInput) -> breakers.Verdict:
    """The breakers and budgets after a session (``breakers.assess``); each that fired is an event."""
    verdict = breakers.assess(feature=dict(input.feature), session=input.session, passed=input.passed,
                              evidence=input.evidence, sessions_since_pass=input.sessions_since_pass,
                              limits=breakers.Limits(**input.limits))  # type: ignore[typeddict-item]
    for event in verdict["events"]:
        ctx.note(event["kind"], **{k: v for k, v in event.items() if k != "kind"})
    return verdict

