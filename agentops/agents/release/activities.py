"""Activities of the ``release`` agent: git inspection, the model's proposal, tests, deployment."""
from __future__ import annotations

import os
import shlex
import shutil
from dataclasses import dataclass
from pathlib import Path, PurePosixPath
from typing import Any, NotRequired, TypedDict

from django.conf import settings

from agentops import git as engine_git
from agentops import sandbox
from agentops.deploytarget import client
from agentops.kind import (
    MODEL_CALL_LEASE,
    ActivityContext,
    CompensationInput,
    InvalidInput,
    Permanent,
    RetryPolicy,
    activity,
    provider_for,
)
from agentops.providers.answers import AnswerTool, ask_structured, json_object_in
from agentops.sandbox import files

MAX_FILES = 20
MAX_FILE_BYTES = 100_000
HEARTBEAT_EVERY_SECONDS = 5.0


def _git(repo: str, *args: str) -> str:
    """Git on the operator's repository or a scratch clone of it, as the engine runs git
    (``agentops.git``: no program its configuration names runs; its configuration is not rewritten)."""
    return engine_git.run(repo, *args, owned=False, identity=(), timeout=60).strip()


@dataclass(frozen=True)
class RepoInput:
    repo: str


class Evidence(TypedDict):
    repo: str
    head: str
    branch: str
    files: int
    dirty: bool


@dataclass(frozen=True)
class ProposalInput:
    goal: str
    evidence: Evidence


class Proposal(TypedDict, total=False):
    title: str
    summary: str
    files: dict[str, str]
    model: dict[str, Any]


@dataclass(frozen=True)
class RunTestsInput:
    repo: str
    head: str
    files: dict[str, str]
    test_command: str


class RunTestsReport(TypedDict):
    passed: bool
    exit_code: int
    output_tail: str
    isolation: NotRequired[str]  # the sandbox the tests ran in: "bwrap" or "none" (absent before it existed)


@dataclass(frozen=True)
class DeployInput:
    candidate_hash: str
    head: str
    title: str
    files: dict[str, str]


class Deployment(TypedDict):
    deployment_id: str
    idempotency_key: str
    status: str
    # The workflow that made it (the target records it in the body): a fork reuses its original's
    # deployment and checks it as the original's. Absent in results recorded before forks: the
    # workflow that recorded it.
    workflow_id: NotRequired[int]


@dataclass(frozen=True)
class DeploymentCheckInput:
    deployment: Deployment
    candidate_hash: str = ""


@activity("inspect_repository", retry=RetryPolicy(max_attempts=3))
def inspect_repository(ctx: ActivityContext, input: RepoInput) -> Evidence:
    repo = input.repo
    if not os.path.isdir(repo):
        raise Permanent(f"Repository {repo} does not exist on this worker.")
    return {
        "repo": repo,
        "head": _git(repo, "rev-parse", "HEAD"),
        "branch": _git(repo, "rev-parse", "--abbrev-ref", "HEAD"),
        "files": len(_git(repo, "ls-files").splitlines()),
        "dirty": bool(_git(repo, "status", "--porcelain")),
    }


PROPOSAL_TOOL = AnswerTool("submit_proposal", "Submit the change: a title, a summary and the full new content of "
                           "each file it writes.", {
    "type": "object", "required": ["title", "summary", "files"], "additionalProperties": False, "properties": {
        "title": {"type": "string", "minLength": 1, "maxLength": 200},
        "summary": {"type": "string", "maxLength": 2000},
        "files": {"type": "object", "minProperties": 1, "maxProperties": MAX_FILES,
                  "additionalProperties": {"type": "string"}}},
})

PROPOSE_SYSTEM = (
    "<task>propose_change</task>\nYou prepare a small, reviewable change to a git repository that serves the goal. "
    "Answer by calling submit_proposal; files maps each relative path to its full new content."
)


@activity("propose_change", retry=RetryPolicy(max_attempts=4, initial_interval_seconds=2.0),
          lease_seconds=MODEL_CALL_LEASE, io_bound=True)
def propose_change(ctx: ActivityContext, input: ProposalInput) -> Proposal:
    evidence = input.evidence
    provider = provider_for(ctx)
    prompt = (f"<goal>{input.goal}</goal>\n"
              f"Repository at {evidence['head']} on {evidence['branch']} with {evidence['files']} files.")
    proposal, responses = ask_structured(ctx, system=PROPOSE_SYSTEM, prompt=prompt, tool=PROPOSAL_TOOL,
                                         validate=validate_proposal, max_tokens=2000, what="proposal", steer=True)
    proposal["model"] = {"provider": provider.name, "model": provider.model,
                         "input_tokens": sum(r.usage.input_tokens for r in responses),
                         "output_tokens": sum(r.usage.output_tokens for r in responses)}
    return proposal


def validate_proposal(answer: dict[str, Any] | str) -> Proposal:
    """Model output is data: check it (parsing a text answer first, fenced or bare), or refuse it with the reason."""
    data = answer if isinstance(answer, dict) else json_object_in(answer, what="proposal")
    if not isinstance(data, dict) or set(data) != {"title", "summary", "files"}:
        keys = sorted(data) if isinstance(data, dict) else type(data).__name__
        raise InvalidInput(f"The model's proposal must have exactly title, summary and files; got {keys}.")
    title, summary, files = data["title"], data["summary"], data["files"]
    if not isinstance(title, str) or not 0 < len(title) <= 200 or not isinstance(summary, str) or len(summary) > 2000:
        raise InvalidInput("The model's proposal needs a title of 1–200 characters and a summary under 2,000.")
    if not isinstance(files, dict) or not 0 < len(files) <= MAX_FILES:
        raise InvalidInput(f"The model's proposal must change between 1 and {MAX_FILES} files.")
    for path, content in files.items():
        pure = PurePosixPath(path)
        if pure.is_absolute() or ".." in pure.parts or not pure.parts or pure.parts[0] == ".git":
            raise InvalidInput(f"The model proposed writing {path!r}, outside the repository; refused.")
        if not isinstance(content, str) or len(content.encode()) > MAX_FILE_BYTES or "\x00" in content:
            raise InvalidInput(f"The model's content for {path!r} is not text under {MAX_FILE_BYTES} bytes.")
    return {"title": title, "summary": summary, "files": files}


@activity("run_tests", retry=RetryPolicy(max_attempts=3), lease_seconds=30)
def run_tests(ctx: ActivityContext, input: RunTestsInput) -> RunTestsReport:
    """Run the test command on a scratch clone with the proposal applied; heartbeats while it runs."""
    # One workspace per attempt: a superseded attempt that resumes (a paused worker) cleans up
    # only its own, never the clone the attempt that took over is testing in.
    workdir = Path(settings.AGENTOPS_WORKSPACE_DIR) / f"{ctx.operation_id.replace('/', '_')}.attempt{ctx.attempt}"
    shutil.rmtree(workdir, ignore_errors=True)
    workdir.parent.mkdir(parents=True, exist_ok=True)
    try:
        _git(input.repo, "clone", "--quiet", "--local", input.repo, str(workdir))
        _git(str(workdir), "checkout", "--quiet", input.head)
        for path, content in input.files.items():
            # The clone holds the repository's committed files: a link among them is refused, not followed.
            files.write_text(workdir, path, content)
        return _run_command(ctx, shlex.split(input.test_command), cwd=workdir)
    finally:
        shutil.rmtree(workdir, ignore_errors=True)


def _run_command(ctx: ActivityContext, argv: list[str], *, cwd: Path) -> RunTestsReport:
    """Run the test command in the sandbox (agentops/sandbox/), heartbeating every few seconds.

    It sees the clone, the system and the worker's Python, and none of agentops' environment
    (DJANGO_SETTINGS_MODULE, DATABASE_URL, the API key): the repository's tests run as on their own.
    """
    timeout = settings.AGENTOPS_TEST_TIMEOUT_SECONDS
    try:
        done = sandbox.run(argv, workspace=cwd, timeout_seconds=timeout, wait_every_seconds=HEARTBEAT_EVERY_SECONDS,
                           on_wait=lambda: ctx.heartbeat("tests running"))
    except FileNotFoundError:
        raise Permanent(f"Test command {argv[0]!r} was not found on this worker.") from None
    if done.timed_out:
        raise Permanent(f"Tests ran longer than {timeout} s (sandbox: {done.isolation}); they were stopped.")
    return {"passed": done.exit_code == 0, "exit_code": done.exit_code,
            "output_tail": sandbox.redacted_tail(done.output, 2000), "isolation": done.isolation}


def _deploy_target() -> tuple[str, float]:
    return settings.AGENTOPS_DEPLOY_TARGET_URL, settings.AGENTOPS_HTTP_TIMEOUT_SECONDS


def _deployment_result(deployment: dict[str, Any], key: str, workflow_id: int) -> Deployment:
    return {"deployment_id": deployment["deployment_id"], "idempotency_key": key, "status": deployment["status"],
            "workflow_id": workflow_id}


def _owner(ctx: ActivityContext, deployment: Deployment) -> int:
    """The workflow whose deployment this is: the one that recorded it (a fork's original), else this one."""
    return deployment.get("workflow_id", ctx.workflow_id)


def find_deployment_by_key(ctx: ActivityContext, input: DeployInput) -> Deployment | None:
    """Reconcile a lost attempt: did the deploy target already accept this operation?"""
    url, timeout = _deploy_target()
    found = client.get_deployment(base_url=url, idempotency_key=ctx.idempotency_key, timeout=timeout)
    return _deployment_result(found, ctx.idempotency_key, ctx.workflow_id) if found else None


@activity("undeploy", retry=RetryPolicy(max_attempts=10, initial_interval_seconds=2.0))
def undeploy(ctx: ActivityContext, input: CompensationInput) -> dict[str, Any]:
    """Compensate a deployment; idempotent on the deploy target (404 means nothing to undo)."""
    url, timeout = _deploy_target()
    ctx.fence("DELETE the deployment")
    ctx.faultpoint("activity.before_external_call")
    deleted = client.delete_deployment(base_url=url, idempotency_key=input.sent_key, timeout=timeout)
    ctx.faultpoint("activity.after_external_call")
    return {"deleted": deleted, "idempotency_key": input.sent_key}


@activity(
    "deploy", retry=RetryPolicy(max_attempts=5, initial_interval_seconds=1.0),
    reconcile=find_deployment_by_key, commitment="deployment", compensation=undeploy,
)
def deploy(ctx: ActivityContext, input: DeployInput) -> Deployment:
    url, timeout = _deploy_target()
    body = {"workflow_id": ctx.workflow_id, "candidate_hash": input.candidate_hash, "head": input.head,
            "title": input.title, "files": input.files}
    ctx.fence("POST the deployment")
    ctx.faultpoint("activity.before_external_call")
    deployment = client.create_deployment(base_url=url, idempotency_key=ctx.idempotency_key, body=body,
                                          timeout=timeout)
    ctx.faultpoint("activity.after_external_call")
    return _deployment_result(deployment, ctx.idempotency_key, ctx.workflow_id)


def _postcondition(recorded: Deployment, body: dict[str, Any]) -> tuple[bool, str]:
    """Whether the recorded deployment stands on the target, judged as docs/deploy-protocol.md says."""
    url, timeout = _deploy_target()
    found = client.get_deployment(base_url=url, idempotency_key=recorded["idempotency_key"], timeout=timeout)
    return client.check_postcondition(found, deployment_id=recorded["deployment_id"], body=body)


@activity("verify_deployment", retry=RetryPolicy(max_attempts=5))
def verify_deployment(ctx: ActivityContext, input: DeploymentCheckInput) -> dict[str, Any]:
    """Check the postcondition: the deployment is there, deployed, carrying the approved candidate."""
    ok, reason = _postcondition(input.deployment,
                                {"workflow_id": _owner(ctx, input.deployment), "candidate_hash": input.candidate_hash})
    return {"ok": ok, "reason": reason}


@activity("reconcile_deployment", retry=RetryPolicy(max_attempts=5))
def reconcile_deployment(ctx: ActivityContext, input: DeploymentCheckInput) -> dict[str, Any]:
    """Compare what we recorded with what the deploy target holds."""
    consistent, reason = _postcondition(input.deployment, {"workflow_id": _owner(ctx, input.deployment)})
    if not consistent:
        return {"consistent": False, "reason": reason}
    return {"consistent": True, "reason": "", "deployment_id": input.deployment["deployment_id"]}
