"""The model sessions of the ``harness`` kind: the initializer (session 0, which writes the feature
list and its checks) and the coding sessions, one leased feature each, with the engine-built
briefing and the session's budgets (``Limits``). Both are tool-use loops (``metered_complete``,
the tools of ``tools.py``); every tool call is fenced and recorded as an event.
"""
from __future__ import annotations

import hashlib
import json
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import timedelta
from decimal import Decimal
from pathlib import Path
from typing import Any, TypedDict

from agentops.agents.harness import breakers, gitops, tools
from agentops.agents.harness.activities import SESSION_LEASE, service_dir, workspace_for
from agentops.agents.harness.checks import Feature
from agentops.kind import (
    ActivityContext,
    Permanent,
    RetryPolicy,
    activity,
    annotate,
    cost_usd,
    keep_alive,
    metered_complete,
    now,
    provider_for,
    tool_span,
)
from agentops.steering import steered

MAX_TURNS = 40
SESSION_RETRY = RetryPolicy(max_attempts=3, initial_interval_seconds=1.0, backoff=2.0)
GIT_LOG_LINES = 20


# --- the initializer -------------------------------------------------------------------------

@dataclass(frozen=True)
class InitInput:
    goal: str
    workspace: str = ""
    require_isolation: str = "none"


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


def _same_node_of_this_workflow(operation_id: str) -> Callable[[str], bool]:
    """Whether an operation is a visit of the same node of the same workflow as ``operation_id``
    (``wf-22/INITIALIZE.4/i1/1``: any ``wf-22/INITIALIZE.<visit>/…``)."""
    workflow, node_visit = operation_id.split("/")[:2]
    prefix = f"{workflow}/{node_visit.rpartition('.')[0]}."
    return lambda operation: operation.startswith(prefix)


@activity("harness_initialize", retry=SESSION_RETRY, lease_seconds=SESSION_LEASE)
def harness_initialize(ctx: ActivityContext, input: InitInput) -> InitResult:
    """Session 0. A retry, or a later visit (a release change sends the workflow back here), starts
    over from the repository as it was before the first: the commits of the workflow's initializers
    (their ``Harness-Operation`` trailer) and everything after them are saved under
    ``wip/initializer/<attempt>`` and undone, so the new session builds the scaffold again."""
    root = workspace_for(ctx, input.workspace)
    gitops.ensure_repo(root)
    base = gitops.head_before(root, _same_node_of_this_workflow(ctx.operation_id))
    if gitops.head(root):
        gitops.save_wip_and_reset(root, base_sha=base, name=f"initializer/{ctx.attempt}")
    session = tools.Session(root=root, operation_id=ctx.operation_id, protect=False,
                            require_isolation=input.require_isolation, service_dir=service_dir(ctx.workflow_id))
    brief = f"<goal>{input.goal}</goal>\n<feature>INIT</feature>\n<attempt>1</attempt>\n<workspace>{root}</workspace>"
    try:
        turns = _loop(ctx, session, system=INITIALIZE_SYSTEM, brief=brief, toolset=tools.INITIALIZER_TOOLS,
                      fault_context={"feature": "INIT"})
    finally:
        session.close()
    engine_committed = bool(gitops.commit_all(root, "harness: commit what the initializer left",
                                              trailers={"Harness-Operation": ctx.operation_id}))
    sha = gitops.head(root)
    if not sha or sha == base:
        raise Permanent(f"The initializer made no commit in {root}; it must write features.json and checks/.")
    return {"workspace": str(root), "scaffold_sha": sha, "turns": turns, "engine_committed": engine_committed}


# --- CODING_SESSION ------------------------------------------------------------------------------

@dataclass(frozen=True)
class Limits:
    """A session's budgets: the tool call's (time), the session's (turns, tokens, wall time), and
    the loop breaker inside a session (identical tool calls)."""

    max_turns: int = MAX_TURNS
    max_tokens: int = 400_000
    max_seconds: float = 1800.0
    command_timeout_seconds: int = 120
    idle_seconds: int = 30
    repeat_limit: int = 3
    require_isolation: str = "none"


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
    limits: Limits = field(default_factory=Limits)
    memory: list[dict[str, Any]] = field(default_factory=list)  # the last progress rows
    repair: str = ""  # the red smoke's output when this is a "repair main" session
    budget_note: str = ""  # what is left of the feature's and the workflow's budgets
    patterns: list[str] = field(default_factory=list)  # learnings of earlier sessions (bounded)
    reviews: list[dict[str, Any]] = field(default_factory=list)  # reviewer children's findings, newest last


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
    outcome: str  # request_pass, end_session, timeout, budget_turns, budget_tokens, repeated_call, no_answer
    crashed_attempts: int  # attempts of this session that died before this one
    tokens: int
    cost_usd: str
    seconds: float
    diff_sha: str  # SHA-256 of the session's diff from base_sha ("" when it changed nothing)
    files: list[str]
    proposal: Any
    services_stopped: list[str]
    tree: str  # the tree the session left (the same tree twice: the same diff)


SESSION_SYSTEM = (
    "<task>harness_session</task>\nYou are one coding session of a long project. Work only on the feature you were "
    "given. Read the progress rows and the git log, implement the feature, test it as a user would, git_commit, "
    "then call request_pass with the feature's id: the engine runs the feature's check on your commit in a clean "
    "checkout and decides. features.json and checks/ are read-only: propose_feature_change asks a person for a "
    "change. Finish before the deadline. If you cannot finish, call end_session with what you learned.")


def briefing(input: SessionInput, wip: Any, *, deadline: str, git_log: str) -> str:
    """The engine-built briefing, each part bounded: the leased feature, its check, the board, the
    deadline and budgets, the git log, the last progress rows, WIP and a red smoke's output."""
    f = input.feature
    parts = [f"<goal>{input.goal[:2000]}</goal>", f"<feature>{f['id']}</feature>",
             f"<attempt>{input.attempt}</attempt>", f"<session>{input.session}</session>",
             f"<base_sha>{input.base_sha}</base_sha>", f"<description>{f['description']}</description>",
             "<steps>" + "; ".join(f.get("steps", [])) + "</steps>", f"<check>{f['check']}</check>",
             "<board>" + ", ".join(f"{row['id']}:{row['status']}" for row in input.board) + "</board>",
             f"<deadline>{deadline} (in {input.limits.max_seconds:g} s; at most {input.limits.max_turns} turns and "
             f"{input.limits.max_tokens} tokens)</deadline>"]
    if input.budget_note:
        parts.append(f"<budget>{input.budget_note[:300]}</budget>")
    if input.repair:
        parts.append("<repair>The smoke check (init.sh, checks/smoke.sh) fails on main at the start of this "
                     "session: repair main before any feature work, then request_pass REPAIR.\n"
                     f"{input.repair[-1500:]}</repair>")
    if input.last_output:
        parts.append(f"<last_check_output>{input.last_output[-1500:]}</last_check_output>")
    if wip:
        parts.append(f"<wip>Half-work of an interrupted session was saved to {wip['ref']} ({wip['commit'][:12]}; "
                     f"files: {', '.join(wip['files'][:10])}); the workspace was reset to {input.base_sha[:12]}."
                     "</wip>")
    if input.patterns:
        parts.append("<patterns>\n" + "\n".join(f"- {p}" for p in input.patterns[-breakers.PATTERNS:])
                     + "\n</patterns>")
    for review in input.reviews[-3:]:
        findings = "\n".join(f"- {str(f)[:300]}" for f in review.get("findings", [])[:10]) or "- no findings"
        parts.append(f"<review feature=\"{review.get('feature', '')}\" verdict=\"{review.get('verdict', '')}\">"
                     f"A reviewer read that feature's diff against its steps:\n{findings}\n</review>")
    if git_log:
        parts.append(f"<git_log>{git_log[:2000]}</git_log>")
    rows = [breakers.render_row(r) for r in input.memory[-5:]] or input.progress[-5:]
    if rows:
        parts.append("<progress>\n" + "\n".join(rows) + "\n</progress>")
    return "\n".join(parts)[:10_000]


@activity("harness_session", retry=SESSION_RETRY, lease_seconds=SESSION_LEASE)
def harness_session(ctx: ActivityContext, input: SessionInput) -> SessionResult:
    """One coding session on one leased feature (or on repairing main).

    Starts from ``base_sha``: a retry after a killed attempt first saves the killed attempt's
    half-work to ``wip/<feature>/<attempt>`` and says so in its briefing. Ends on request_pass,
    end_session, a session budget (turns, tokens, the deadline: recorded as ``timeout``, the
    work kept) or repeated identical tool calls; services still running are stopped; harness-owned
    files a session changed are then reverted in a commit of the engine's and recorded.
    """
    root = Path(input.workspace)
    feature = input.feature["id"]
    ctx.fence("restore the workspace to the session's base commit")
    services = service_dir(ctx.workflow_id)
    tools.stop_leftover_services(services)
    found = gitops.save_wip_and_reset(root, base_sha=input.base_sha, name=f"{feature}/{input.attempt}")
    wip = input.wip
    if found is not None:
        wip = found.__dict__
        ctx.note("harness.wip_saved", ref=found.ref, commit=found.commit, files=found.files,
                 base_sha=input.base_sha, feature=feature, feature_attempt=input.attempt)
    limits = input.limits
    session = tools.Session(root=root, operation_id=ctx.operation_id, feature=feature,
                            require_isolation=limits.require_isolation,
                            command_timeout_seconds=limits.command_timeout_seconds,
                            idle_seconds=limits.idle_seconds, service_dir=services)
    started = time.monotonic()
    deadline = (now() + timedelta(seconds=limits.max_seconds)).isoformat(timespec="seconds")
    git_log = gitops.git(root, "log", "--oneline", "-n", str(GIT_LOG_LINES), check=False)
    run = _Run(ctx, session, limits, started)
    try:
        turns = _loop(ctx, session, system=SESSION_SYSTEM, brief=briefing(input, wip, deadline=deadline,
                                                                            git_log=git_log),
                      toolset=tools.TOOLS, fault_context={"feature": feature, "feature_attempt": input.attempt},
                      run=run)
    finally:
        stopped = session.close()
    if stopped:
        ctx.note("harness.services_stopped", names=stopped, why="the session ended")
    changed = gitops.tampered(root, protected_sha=input.protected_sha)
    if changed:
        ctx.fence("revert changes to the approved feature list and checks")
        sha = gitops.revert_tamper(root, protected_sha=input.protected_sha, operation_id=ctx.operation_id)
        ctx.note("harness.tamper_reverted", feature=feature, paths=changed[:20], commit=sha)
    head = gitops.head(root)
    diff = gitops.git(root, "diff", input.base_sha, head, "--", ".", ":(exclude)features.json", ":(exclude)checks")
    files = gitops.git(root, "diff", "--name-only", input.base_sha, head).splitlines()
    outcome = run.outcome or session.ended or "no_answer"
    ctx.note("harness.session_ended", feature=feature, feature_attempt=input.attempt, outcome=outcome, turns=turns,
             tokens=run.tokens, cost_usd=str(run.cost), seconds=round(time.monotonic() - started, 2),
             crashed_attempts=ctx.attempt - 1, files=files[:20])
    return {"head": head, "base_sha": input.base_sha, "ended": session.ended or "turns",
            "pass_requested": session.ended == "request_pass", "report": session.report,
            "commits": session.commits, "refused": session.refused, "tamper": changed, "wip": wip, "turns": turns,
            "outcome": outcome, "crashed_attempts": ctx.attempt - 1, "tokens": run.tokens,
            "cost_usd": str(run.cost), "seconds": round(time.monotonic() - started, 2),
            "diff_sha": hashlib.sha256(diff.encode()).hexdigest() if diff else "", "files": files[:50],
            "proposal": session.proposal, "services_stopped": stopped,
            "tree": gitops.git(root, "rev-parse", "HEAD^{tree}", check=False)}


class _Run:
    """A coding session's budgets as it goes: turns, tokens, cost, the deadline, identical calls."""

    def __init__(self, ctx: ActivityContext, session: tools.Session, limits: Limits, started: float) -> None:
        self.ctx, self.session, self.limits, self.started = ctx, session, limits, started
        self.tokens, self.cost, self.outcome, self.warned = 0, Decimal(0), "", False
        self.calls: dict[str, int] = {}
        self.model = provider_for(ctx).model

    def left_seconds(self) -> float:
        return self.limits.max_seconds - (time.monotonic() - self.started)

    def exhausted(self, turn: int) -> bool:
        """Whether a session budget ran out before the next model call (recorded once)."""
        what = ("timeout" if self.left_seconds() <= 0 else "budget_turns" if turn >= self.limits.max_turns
                else "budget_tokens" if self.tokens >= self.limits.max_tokens else "")
        if what:
            self.outcome = what
            self.ctx.note("harness.budget_exhausted", level="session", what=what.removeprefix("budget_"),
                          feature=self.session.feature, turns=turn, tokens=self.tokens,
                          seconds=round(time.monotonic() - self.started, 1), consequence="session ended")
        return bool(what)

    def charged(self, usage: Any) -> None:
        self.tokens += usage.input_tokens + usage.output_tokens
        self.cost += cost_usd(self.model, usage)

    def repeated(self, name: str, args: dict[str, Any]) -> bool:
        """Whether this exact call was made ``repeat_limit`` times in this session (recorded once)."""
        key = json.dumps([name, args], sort_keys=True, default=str)
        self.calls[key] = self.calls.get(key, 0) + 1
        if self.calls[key] < self.limits.repeat_limit:
            return False
        self.outcome = "repeated_call"
        self.ctx.note("harness.loop_breaker", breaker="repeated_tool_call", feature=self.session.feature, tool=name,
                      count=self.calls[key], input=key[:300], consequence="session ended")
        return True

    def warning(self) -> str:
        """A note near the deadline (a quarter of the session's time left), once."""
        left = self.left_seconds()
        if self.warned or left > self.limits.max_seconds / 4:
            return ""
        self.warned = True
        return (f"[engine] {max(0, round(left))} s left before this session's deadline: commit what works and "
                "request_pass or end_session now; after the deadline the session is stopped (your commits stay).")


def _loop(ctx: ActivityContext, session: tools.Session, *, system: str, brief: str,
          toolset: list[dict[str, Any]], fault_context: dict[str, Any] | None = None,
          run: _Run | None = None) -> int:
    """The tool-use loop shared by the initializer and coding sessions; returns the turns taken."""
    messages: list[dict[str, Any]] = [{"role": "user", "content": brief}]
    allowed = {t["name"] for t in toolset}
    for turn in range(MAX_TURNS if run is None else run.limits.max_turns + 1):
        if run is not None and run.exhausted(turn):
            return turn
        # A retried session starts over from its base commit: it takes its steer messages again.
        messages = steered(ctx, call=turn, messages=messages)
        # Sessions follow each other after minutes of check runs: the tools and system prompt
        # (the same for every session) stay cached for an hour instead of five minutes.
        response = metered_complete(ctx, call=turn, system=system, messages=messages, max_tokens=4000,
                                    tools=toolset, prefix_cache_ttl="1h")
        if run is not None:
            run.charged(response.usage)
        if not response.tool_calls:
            if response.stop_reason in ("max_tokens", "pause_turn"):
                messages += [response.assistant_turn(), {"role": "user", "content": "Go on, one tool call at a time."}]
                continue
            session.ended = session.ended or "end_session"
            session.report = session.report or {"summary": response.text[:2000], "all_done": False}
            return turn + 1
        messages.append(response.assistant_turn())
        results: list[dict[str, Any]] = []
        for n, call in enumerate(response.tool_calls):
            name, args = call["name"], call.get("input") or {}
            asked = args  # what the model asked for: the repeat breaker compares these
            if n:  # the first tool's fence is the call's model.called note, metered_complete's last write
                ctx.fence(f"tool {name}")
            if name not in allowed:
                ok, output = False, f"tool {name!r} is not available in this session"
            else:
                if run is not None and name == "run_command":
                    # The deadline caps every command too.
                    args = {**args, "timeout_seconds": max(1, min(int(args.get("timeout_seconds") or 30),
                                                                 int(run.left_seconds())))}
                with tool_span(name) as span, keep_alive(ctx, f"tool {name}"):
                    ok, output = tools.call(session, name, args)
                    annotate(span, {"agentops.tool.ok": ok})
            ctx.note("tool.called", tool=name, input=json.dumps(_short(args), default=str)[:300], ok=ok,
                     output=output[:300], **({"isolation": session.isolation} if name == "run_command" else {}))
            if output.startswith("refused:"):
                ctx.note("harness.tool_refused", tool=name, feature=session.feature, reason=output[:500])
            ctx.faultpoint("harness.after_tool", tool=name, turn=turn, **(fault_context or {}))
            results.append({"type": "tool_result", "tool_use_id": call["id"], "content": output, "is_error": not ok})
            if session.ended or (run is not None and run.repeated(name, asked)):
                break
        if session.ended or (run is not None and run.outcome):
            return turn + 1
        warning = run.warning() if run is not None else ""
        messages.append({"role": "user", "content": results + ([{"type": "text", "text": warning}] if warning
                                                               else [])})
        ctx.heartbeat(f"{session.feature or 'initializer'} turn {turn + 1}")
    return MAX_TURNS


def _short(args: dict[str, Any]) -> dict[str, Any]:
    return {k: (v[:200] + "…" if isinstance(v, str) and len(v) > 200 else v) for k, v in args.items()}
