"""Activities of the ``harness`` kind: the initializer, coding sessions, and the engine's check runs.

Sessions are tool-use loops (``metered_complete``, the tools of ``tools.py``); every tool call
is fenced and recorded as an event. Check runs are the engine's: the model never sees a
verdict it could set.
"""
from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypedDict

from django.conf import settings

from agentops.agents.harness import checks as checks_mod
from agentops.agents.harness import gitops, tools
from agentops.agents.harness.checks import CheckResult, Feature
from agentops.budgets import metered_complete
from workflows.activity_context import ActivityContext
from workflows.errors import InvalidInput, Permanent
from workflows.registry import RetryPolicy, activity

MAX_TURNS = 40
SESSION_RETRY = RetryPolicy(max_attempts=3, initial_interval_seconds=1.0, backoff=2.0)
CHECK_RETRY = RetryPolicy(max_attempts=3, initial_interval_seconds=1.0)
SESSION_LEASE_SECONDS = 600


def workspace_for(ctx: ActivityContext, requested: str) -> Path:
    """The workflow's workspace: the launch's ``workspace`` parameter, else one of its own."""
    path = Path(requested) if requested else Path(settings.AGENTOPS_WORKSPACE_DIR) / f"harness-wf-{ctx.workflow_id}"
    return path.resolve()


def _scratch(ctx: ActivityContext) -> Path:
    """A directory of this operation's own for checkouts (a retry empties and reuses it)."""
    name = re.sub(r"[^A-Za-z0-9_.-]+", "_", ctx.operation_id)
    return Path(settings.AGENTOPS_WORKSPACE_DIR).resolve() / ".harness-checks" / name


# --- the initializer -------------------------------------------------------------------------

@dataclass(frozen=True)
class InitInput:
    goal: str
    workspace: str = ""


class InitResult(TypedDict):
    workspace: str
    scaffold_sha: str
    turns: int
    engine_committed: bool


INITIALIZE_SYSTEM = (
    "<task>harness_initialize</task>\nYou set up a project for a team of coding sessions that will each implement "
    "one feature. Write features.json (a list of features: id F01…, description, steps, priority, check, "
    "passes=false), one end-to-end check per feature under checks/ that runs the program as a user would and "
    "fails until the feature works, checks/smoke.sh, init.sh, progress.md and a stub of the program; then "
    "git_commit and end_session.")


@activity("harness_initialize", retry=SESSION_RETRY, lease_seconds=SESSION_LEASE_SECONDS)
def harness_initialize(ctx: ActivityContext, input: InitInput) -> InitResult:
    """Session 0. A retry starts over from the repository as it was before the session."""
    root = workspace_for(ctx, input.workspace)
    gitops.ensure_repo(root)
    base = gitops.head(root)
    if base:
        gitops.save_wip_and_reset(root, base_sha=base, name=f"initializer/{ctx.attempt}")
    session = tools.Session(root=root, operation_id=ctx.operation_id, protect=False)
    brief = f"<goal>{input.goal}</goal>\n<feature>INIT</feature>\n<attempt>1</attempt>\n<workspace>{root}</workspace>"
    turns = _loop(ctx, session, system=INITIALIZE_SYSTEM, brief=brief, toolset=tools.INITIALIZER_TOOLS)
    engine_committed = bool(gitops.commit_all(root, "harness: commit what the initializer left",
                                              trailers={"Harness-Operation": ctx.operation_id}))
    sha = gitops.head(root)
    if not sha or sha == base:
        raise Permanent(f"The initializer made no commit in {root}; it must write features.json and checks/.")
    return {"workspace": str(root), "scaffold_sha": sha, "turns": turns, "engine_committed": engine_committed}


# --- VALIDATE_FEATURE_LIST -------------------------------------------------------------------

@dataclass(frozen=True)
class ValidateInput:
    workspace: str
    commit: str
    check_timeout_seconds: float = 60.0


class Validation(TypedDict):
    features: list[Feature]
    contract_hash: str
    results: list[CheckResult]
    vacuous: list[str]


@activity("harness_validate", retry=CHECK_RETRY, lease_seconds=SESSION_LEASE_SECONDS)
def harness_validate(ctx: ActivityContext, input: ValidateInput) -> Validation:
    """Schema of features.json at the scaffold commit, then every check run on it: a check that
    already passes on the scaffold proves nothing and is flagged (vacuous)."""
    root = Path(input.workspace)
    raw = gitops.git(root, "show", f"{input.commit}:features.json", check=False)
    if not raw:
        raise InvalidInput(f"The scaffold commit {input.commit[:12]} has no features.json.")
    features = checks_mod.validate_features(raw, check_exists=lambda path: bool(
        gitops.git(root, "cat-file", "-t", f"{input.commit}:{path}", check=False) == "blob"))
    results = checks_mod.run_checks(root, input.commit, features, where="worktree",
                                    timeout_seconds=input.check_timeout_seconds, scratch=_scratch(ctx),
                                    on_result=lambda r: _note_check(ctx, "scaffold", r))
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


class ChecksReport(TypedDict):
    commit: str
    results: list[CheckResult]
    clean_tree: bool
    head: str


@activity("harness_run_checks", retry=CHECK_RETRY, lease_seconds=SESSION_LEASE_SECONDS)
def harness_run_checks(ctx: ActivityContext, input: ChecksInput) -> ChecksReport:
    """Run checks on one commit in a checkout of their own; each result is an event with its evidence."""
    root = Path(input.workspace)
    results = checks_mod.run_checks(root, input.commit, list(input.features), where=input.where,
                                    timeout_seconds=input.check_timeout_seconds, scratch=_scratch(ctx),
                                    on_result=lambda r: _note_check(ctx, input.purpose, r))
    return {"commit": input.commit, "results": results, "clean_tree": not gitops.dirty(root),
            "head": gitops.head(root)}


# --- PREPARE_SESSION and CODING_SESSION --------------------------------------------------------

@dataclass(frozen=True)
class PrepareInput:
    workspace: str
    expected_head: str
    wip_name: str  # the feature/attempt of the session whose leftovers would be found


class Prepared(TypedDict):
    base_sha: str
    wip: Any  # {"ref", "commit", "files", "head_moved"} or None


@activity("harness_prepare", retry=CHECK_RETRY)
def harness_prepare(ctx: ActivityContext, input: PrepareInput) -> Prepared:
    """Record the session's base commit; half-work found in the workspace goes to a wip/ ref first."""
    root = Path(input.workspace)
    ctx.fence("restore the workspace to the last recorded commit")
    wip = gitops.save_wip_and_reset(root, base_sha=input.expected_head, name=input.wip_name)
    if wip is not None:
        ctx.note("harness.wip_saved", ref=wip.ref, commit=wip.commit, files=wip.files, base_sha=input.expected_head)
    return {"base_sha": gitops.head(root), "wip": None if wip is None else wip.__dict__}


@dataclass(frozen=True)
class SessionInput:
    goal: str
    workspace: str
    feature: Feature
    attempt: int  # this feature's attempt number (1, 2, …)
    session: int  # the workflow's session number
    base_sha: str
    protected_sha: str  # the approved commit of features.json and checks/
    board: list[dict[str, str]] = field(default_factory=list)
    last_output: str = ""
    wip: Any = None
    progress: list[str] = field(default_factory=list)


class SessionResult(TypedDict):
    head: str
    base_sha: str
    ended: str  # request_pass, end_session, turns
    pass_requested: bool
    report: dict[str, Any]
    commits: list[str]
    refused: list[dict[str, str]]
    tamper: list[str]
    wip: Any
    turns: int


SESSION_SYSTEM = (
    "<task>harness_session</task>\nYou are one coding session of a long project. Work only on the feature you were "
    "given. Read progress.md and the git log, implement the feature, test it as a user would, git_commit, then "
    "call request_pass with the feature's id: the engine runs the feature's check on your commit in a clean "
    "checkout and decides. features.json and checks/ are read-only. If you cannot finish, call end_session "
    "with what you learned.")


def briefing(input: SessionInput, wip: Any) -> str:
    """The engine-built briefing: the leased feature, its check, the board, recent progress, WIP."""
    f = input.feature
    parts = [f"<goal>{input.goal}</goal>", f"<feature>{f['id']}</feature>", f"<attempt>{input.attempt}</attempt>",
             f"<session>{input.session}</session>", f"<base_sha>{input.base_sha}</base_sha>",
             f"<description>{f['description']}</description>",
             "<steps>" + "; ".join(f.get("steps", [])) + "</steps>", f"<check>{f['check']}</check>",
             "<board>" + ", ".join(f"{row['id']}:{row['status']}" for row in input.board) + "</board>"]
    if input.last_output:
        parts.append(f"<last_check_output>{input.last_output[-1500:]}</last_check_output>")
    if wip:
        parts.append(f"<wip>Half-work of an interrupted session was saved to {wip['ref']} ({wip['commit'][:12]}; "
                     f"files: {', '.join(wip['files'][:10])}); the workspace was reset to {input.base_sha[:12]}."
                     "</wip>")
    if input.progress:
        parts.append("<progress>" + " | ".join(input.progress[-5:]) + "</progress>")
    return "\n".join(parts)[:8000]


@activity("harness_session", retry=SESSION_RETRY, lease_seconds=SESSION_LEASE_SECONDS)
def harness_session(ctx: ActivityContext, input: SessionInput) -> SessionResult:
    """One coding session on one leased feature.

    Starts from ``base_sha``: a retry after a killed attempt first saves the killed attempt's
    half-work to ``wip/<feature>/<attempt>`` and says so in its briefing. Ends on request_pass,
    end_session or the turn limit; harness-owned files a session changed are then reverted in a
    commit of the engine's and recorded.
    """
    root = Path(input.workspace)
    feature = input.feature["id"]
    ctx.fence("restore the workspace to the session's base commit")
    found = gitops.save_wip_and_reset(root, base_sha=input.base_sha, name=f"{feature}/{input.attempt}")
    wip = input.wip
    if found is not None:
        wip = found.__dict__
        ctx.note("harness.wip_saved", ref=found.ref, commit=found.commit, files=found.files,
                 base_sha=input.base_sha, feature=feature, feature_attempt=input.attempt)
    session = tools.Session(root=root, operation_id=ctx.operation_id, feature=feature)
    turns = _loop(ctx, session, system=SESSION_SYSTEM, brief=briefing(input, wip), toolset=tools.TOOLS,
                  fault_context={"feature": feature, "feature_attempt": input.attempt})
    changed = gitops.tampered(root, protected_sha=input.protected_sha)
    if changed:
        ctx.fence("revert changes to the approved feature list and checks")
        sha = gitops.revert_tamper(root, protected_sha=input.protected_sha, operation_id=ctx.operation_id)
        ctx.note("harness.tamper_reverted", feature=feature, paths=changed[:20], commit=sha)
    return {"head": gitops.head(root), "base_sha": input.base_sha, "ended": session.ended or "turns",
            "pass_requested": session.ended == "request_pass", "report": session.report,
            "commits": session.commits, "refused": session.refused, "tamper": changed, "wip": wip, "turns": turns}


def _loop(ctx: ActivityContext, session: tools.Session, *, system: str, brief: str,
          toolset: list[dict[str, Any]], fault_context: dict[str, Any] | None = None) -> int:
    """The tool-use loop shared by the initializer and coding sessions; returns the turns taken."""
    messages: list[dict[str, Any]] = [{"role": "user", "content": brief}]
    allowed = {t["name"] for t in toolset}
    for turn in range(MAX_TURNS):
        response = metered_complete(ctx, call=turn, system=system, messages=messages, max_tokens=4000,
                                    tools=toolset)
        if not response.tool_calls:
            if response.stop_reason in ("max_tokens", "pause_turn"):
                messages += [response.assistant_turn(), {"role": "user", "content": "Go on, one tool call at a time."}]
                continue
            session.ended = session.ended or "end_session"
            session.report = session.report or {"summary": response.text[:2000], "all_done": False}
            return turn + 1
        messages.append(response.assistant_turn())
        results = []
        for call in response.tool_calls:
            name, args = call["name"], call.get("input") or {}
            ctx.fence(f"tool {name}")
            if name in allowed:
                ok, output = tools.call(session, name, args)
            else:
                ok, output = False, f"tool {name!r} is not available in this session"
            ctx.note("tool.called", tool=name, input=json.dumps(_short(args), default=str)[:300], ok=ok,
                     output=output[:300], **({"isolation": session.isolation} if name == "run_command" else {}))
            if output.startswith("refused:"):
                ctx.note("harness.tool_refused", tool=name, feature=session.feature, reason=output[:500])
            ctx.faultpoint("harness.after_tool", tool=name, turn=turn, **(fault_context or {}))
            results.append({"type": "tool_result", "tool_use_id": call["id"], "content": output, "is_error": not ok})
            if session.ended:
                break
        if session.ended:
            return turn + 1
        messages.append({"role": "user", "content": results})
        ctx.heartbeat(f"{session.feature or 'initializer'} turn {turn + 1}")
    return MAX_TURNS


def _short(args: dict[str, Any]) -> dict[str, Any]:
    return {k: (v[:200] + "…" if isinstance(v, str) and len(v) > 200 else v) for k, v in args.items()}
