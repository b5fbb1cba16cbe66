"""How a harness workflow looks in the admin: the feature board with the engine's evidence, features
passing over time, each session's timeline and commits, the isolation that ran and the limits.

Everything comes from durable rows (the workflow's state, its activities and its event history),
except the sessions' diffs, which are read from the workspace's git repository while the page
renders: bounded in time and size, and said to be unavailable when this web server cannot read the
workspace (it may live on a worker's disk). Model output and command output are shown as text.
"""
from __future__ import annotations

import json
import os
import subprocess
import threading
from collections import Counter, defaultdict
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from datetime import datetime
from decimal import Decimal, InvalidOperation
from pathlib import Path
from typing import Any
from urllib.parse import urlencode

from django.core.paginator import Paginator
from django.db.models import Count, Sum
from django.db.models.fields.json import KT
from django.urls import reverse

from agentops import git as engine_git
from agentops.kind import AdminPanel, resolve, state_of
from agentops.kind.presentation import (
    Activity,
    Reading,
    TimeChart,
    UsageEntry,
    Workflow,
    duration,
    page_links,
    time_chart,
    usd,
    when,
)

SESSION_ACTIVITIES = ("harness_initialize", "harness_session")
# Events of a session's operation that are not steps of it: its scheduling, a doorbell rung again
# while it ran, and the engine's check runs (shown on the board and the chart).
NOT_SESSION_STEPS = ("activity.scheduled", "activity.doorbell_ignored", "harness.check_ran")
# The purposes of the check runs whose result is the feature's status (harness.check_ran events).
DECIDING = ("scaffold", "verify", "regression", "verify_all")
# Diffs on the page: those of the newest sessions only (each git call is a process the page
# waits for), at most this many commits a session, each cut at this many bytes (the --stat comes
# first, so it survives a cut patch); git gets this long before it is killed.
DIFF_SESSIONS = 3
# Sessions shown with their timelines on the workflow page, newest first, a page at a time:
# ?sessions=<page>.
SESSIONS_SHOWN = 10
SESSIONS_PAGE_PARAM = "sessions"
# Of a session's timeline, the first and the last steps (a model may make hundreds of tool calls in
# one session), each tool call's output cut to its end.
SESSION_STEPS_SHOWN = 40
STEP_OUTPUT_CHARS = 600
# Of each feature's evidence, the end of its output shown on the board (agent show --json has the
# whole stored tail).
BOARD_TAIL_CHARS = 600
# The board is paged (a 500-feature list drew 270 KB of rows), in the list's order, and can be
# narrowed to one status: ?features=<page>&feature_status=<status>.
BOARD_PAGE_SIZE = 50
BOARD_PAGE_PARAM = "features"
BOARD_STATUS_PARAM = "feature_status"
DIFF_MAX_COMMITS = 5
DIFF_MAX_BYTES = 12_000
GIT_TIMEOUT_SECONDS = 5.0
STATUS_HELP = {
    "passing": "its check exited 0 on the engine's last run",
    "failing": "its check has not passed yet, or failed again in a regression or the final verify",
    "blocked": "still failing after the last attempt allowed; the engine no longer picks it",
}


@dataclass(frozen=True)
class CheckRun:
    """A ``harness.check_ran`` event: when, and its evidence (feature, purpose, passed, isolation, …)."""

    at: datetime
    data: dict[str, Any]


@dataclass(frozen=True)
class FeatureRow:
    id: str
    description: str
    status: str
    attempts: int
    reason: str
    evidence: dict[str, Any]  # the last check run that decided the status (CheckResult), or {}
    took: str  # the evidence's duration


@dataclass(frozen=True)
class Step:
    """One entry of a session's timeline: a model call, a tool call, a refusal, an attempt's start or end."""

    at: datetime
    offset: str  # since the session's first event
    took: str  # since the step before it in this session: how long this call ran
    kind: str
    label: str
    detail: str
    ok: bool = True
    cost: str = ""
    output: str = ""


@dataclass(frozen=True)
class Commit:
    sha: str
    text: str  # git show --stat --patch, cut at DIFF_MAX_BYTES
    cut: bool


@dataclass
class SessionView:
    number: int
    feature: str
    attempt: int
    status: str
    operation_id: str
    started: datetime | None = None
    took: str = ""
    cost_usd: Decimal = Decimal(0)  # of its model calls, as each model.called event priced it
    model_calls: int = 0
    tool_calls: int = 0
    commands: int = 0
    ended: str = ""
    summary: str = ""
    verdict: str = ""  # the engine's check of the feature on the session's commit: passed, failed or ""
    steps: list[Step] = field(default_factory=list)
    commits: list[Commit] = field(default_factory=list)
    diff_note: str = ""  # why the commits are not shown, or that some were left out


def harness_panels(workflow: Workflow, query: Mapping[str, str]) -> list[AdminPanel]:
    state = state_of(workflow) if isinstance(workflow.state, dict) else {}
    checks = check_runs(workflow)
    features = [f for f in state.get("features") or [] if isinstance(f, dict)]
    sessions = session_views(workflow, state, checks, query.get(SESSIONS_PAGE_PARAM, ""))
    counts = Counter(_status(f) for f in features)
    return [AdminPanel(template="agents/harness/board.html", context={
        "board": board_page(workflow, features, query), "counts": {s: counts.get(s, 0) for s in STATUS_HELP},
        "board_page_size": BOARD_PAGE_SIZE, "sessions_page_size": SESSIONS_SHOWN, "status_help": STATUS_HELP,
        "chart": passing_chart(workflow, checks, features=[str(f.get("id", "")) for f in features]),
        "sessions": sessions,
        "isolation": isolation_used(workflow, checks), "limits": limits(workflow, state),
    })]


def check_runs(workflow: Workflow) -> list[CheckRun]:
    """Every ``harness.check_ran`` event, with only the keys the page reads: not its output tail
    (2 KB a run, thousands of runs in a long project)."""
    keys = ("feature", "purpose", "passed", "commit", "isolation")
    # As text (->>): half the time of decoding each value as JSON.
    rows = (workflow.events.filter(kind="harness.check_ran").order_by("seq")
            .annotate(**{f"check_{k}": KT(f"data__{k}") for k in keys})
            .values_list("created_at", *(f"check_{k}" for k in keys)))
    return [CheckRun(at, {"feature": feature, "purpose": purpose, "passed": passed == "true", "commit": commit,
                          "isolation": isolation}) for at, feature, purpose, passed, commit, isolation in rows]


def _status(feature: dict[str, Any]) -> str:
    return str(feature.get("status") or "failing")


def board_page(workflow: Workflow, features: list[dict[str, Any]], query: Mapping[str, str]) -> dict[str, Any]:
    """One page of the feature board (``BOARD_PAGE_SIZE`` rows, in the list's order), narrowed to
    the status ``query`` asks for, with links to the other pages and to each status."""
    status = query.get(BOARD_STATUS_PARAM, "")
    status = status if status in STATUS_HELP else ""
    chosen = [f for f in features if not status or _status(f) == status]
    paginator = Paginator(chosen, BOARD_PAGE_SIZE)
    page = paginator.get_page(query.get(BOARD_PAGE_PARAM, ""))
    base = reverse("admin:workflows_workflow_change", args=[workflow.pk])

    def url(number: int, of: str = status) -> str:
        params = {BOARD_PAGE_PARAM: number, **({BOARD_STATUS_PARAM: of} if of else {})}
        return f"{base}?{urlencode(params)}#features"

    return {
        "rows": feature_rows(page.object_list), "status": status, "total": len(features), "shown": len(chosen),
        "first": page.start_index(), "last": page.end_index(),
        "links": page_links(paginator, page, url),
        "filters": [(s or "all", url(1, s), s == status) for s in ("", *STATUS_HELP)],
    }


def feature_rows(features: Iterable[dict[str, Any]]) -> list[FeatureRow]:
    rows = []
    for f in features:
        evidence = _object(f.get("evidence"))
        tail = str(evidence.get("output_tail") or "")
        if len(tail) > BOARD_TAIL_CHARS:
            evidence = {**evidence, "output_tail": f"[… {len(tail) - BOARD_TAIL_CHARS:,} characters before: agent show "
                                                   f"--json has them …]\n{tail[-BOARD_TAIL_CHARS:]}"}
        ms = evidence.get("duration_ms")
        rows.append(FeatureRow(id=str(f.get("id", "")), description=str(f.get("description", "")),
                               status=_status(f), attempts=int(f.get("attempts") or 0),
                               reason=str(f.get("reason", "")), evidence=evidence,
                               took=f"{ms / 1000:.2f} s" if isinstance(ms, int | float) else "—"))
    return rows


def passing_chart(workflow: Workflow, checks: list[CheckRun], *, features: list[str]) -> TimeChart | None:
    """Features of the board passing after each check run that changed the count: the runs that decide a
    feature's status (``DECIDING``: the scaffold's all red, a verify or the final verify sets it, a
    red regression flips it back); other runs, and checks of ids not on the board, leave it alone."""
    total = len(features)
    checks = [c for c in checks if c.data.get("purpose") in DECIDING and c.data.get("feature") in features]
    passing: dict[str, bool] = {}
    readings: list[Reading] = []
    for n, check in enumerate(checks, start=1):
        data = check.data
        before = sum(passing.values())
        passing[str(data.get("feature"))] = bool(data.get("passed"))
        now = sum(passing.values())
        if now != before or n in (1, len(checks)):
            readings.append(Reading(check.at, float(now),
                                    f"{when(check.at)}: {now} of {total} passing after check run {n} "
                                    f"({data.get('purpose')} of {data.get('feature')}: "
                                    f"{'passed' if data.get('passed') else 'failed'})"))
    if not readings or total == 0:
        return None
    first, last = readings[0], readings[-1]
    return time_chart(
        readings, slug=f"passing-{workflow.pk}", title=f"Features passing in workflow {workflow.pk}",
        description=(f"Features passing the engine's checks: {first.value:.0f} of {total} at {when(first.at)}, "
                     f"{last.value:.0f} of {total} at {when(last.at)}, over {len(checks)} check runs."),
        y_max=float(total), step=True,
    )


def session_views(workflow: Workflow, state: dict[str, Any], checks: list[CheckRun], number: str) -> dict[str, Any]:
    """A page of SESSIONS_SHOWN sessions, newest first (the initializer is session 0, then one per
    coding session), with links to the other pages: a page of a 500-feature run costs what one of
    a 10-feature run does."""
    paginator = Paginator(Activity.objects.filter(workflow=workflow, name__in=SESSION_ACTIVITIES).order_by("-pk"),
                          SESSIONS_SHOWN)
    page = paginator.get_page(number)
    base = reverse("admin:workflows_workflow_change", args=[workflow.pk])
    return {"views": _views(workflow, state, checks, list(page.object_list), newer=page.start_index() - 1),
            "count": paginator.count, "first": page.start_index(), "last": page.end_index(),
            "links": page_links(paginator, page, lambda n: f"{base}?{SESSIONS_PAGE_PARAM}={n}#sessions",
                                previous="‹ newer", next="older ›")}


def _views(workflow: Workflow, state: dict[str, Any], checks: list[CheckRun], activities: list[Activity], *,
           newer: int) -> list[SessionView]:
    """The sessions ``activities`` (newest first) as the page shows them; ``newer`` sessions come
    before them (only the newest DIFF_SESSIONS of all have their commits read)."""
    events: dict[str, list[Any]] = defaultdict(list)
    operations = {a.operation_id for a in activities}
    for event in (workflow.events.exclude(kind__in=NOT_SESSION_STEPS)
                  .filter(data__operation_id__in=operations).order_by("seq").values("kind", "created_at", "data")):
        events[event["data"]["operation_id"]].append(event)
    verdicts = {(c.data.get("feature"), c.data.get("commit")): bool(c.data.get("passed"))
                for c in checks if c.data.get("purpose") == "verify"}
    workspace = str(state.get("workspace") or "")
    views = []
    for age, activity in enumerate(activities, start=newer):
        view = _session(activity, events[activity.operation_id])
        result = _object(resolve(activity.workflow_id, activity.result))
        if activity.name == "harness_session":
            passed = verdicts.get((view.feature, result.get("head")))
            view.verdict = "" if passed is None else "passed" if passed else "failed"
        if result and age < DIFF_SESSIONS:
            view.commits, view.diff_note = session_commits(workspace, activity.name, result)
        elif head := str(result.get("head") or result.get("scaffold_sha") or ""):
            view.diff_note = (f"Only the newest {DIFF_SESSIONS} sessions' commits are read here: "
                              f"git -C {workspace} show {head[:12]}.")
        views.append(view)
    return views


def _session(activity: Activity, events: list[Any]) -> SessionView:
    data, result = _object(activity.input), _object(resolve(activity.workflow_id, activity.result))
    feature, report = _object(data.get("feature")), _object(result.get("report"))
    view = SessionView(
        number=int(data.get("session") or 0), feature=str(feature.get("id") or "initializer"),
        attempt=int(data.get("attempt") or 1), status=activity.status, operation_id=activity.operation_id,
        ended=str(result.get("ended", "")), summary=str(report.get("summary") or report.get("note") or ""))
    start = previous = events[0]["created_at"] if events else None
    for event in events:
        step = _step(event, start=start, previous=previous)
        previous = event["created_at"]
        view.steps.append(step)
        if event["kind"] == "model.called":
            view.model_calls += 1
            view.cost_usd += _decimal(event["data"].get("cost_usd"))
        elif event["kind"] == "tool.called":
            view.tool_calls += 1
            view.commands += event["data"].get("tool") == "run_command"
    view.started = start
    view.took = duration(start, previous)
    if len(view.steps) > SESSION_STEPS_SHOWN:
        half, left_out = SESSION_STEPS_SHOWN // 2, len(view.steps) - SESSION_STEPS_SHOWN
        gap = Step(at=view.steps[half].at, offset="", took="", kind="left-out", label=f"… {left_out} steps",
                   detail="not shown here: agent export-history has every event of the session")
        view.steps = [*view.steps[:half], gap, *view.steps[-half:]]
    return view


def _step(event: dict[str, Any], *, start: datetime | None, previous: datetime | None) -> Step:
    kind, data, at = event["kind"], event["data"], event["created_at"]
    common = {"at": at, "offset": duration(start, at), "took": duration(previous, at), "kind": kind}
    if kind == "model.called":
        return Step(**common, label="model call",
                    detail=(f"{data.get('input_tokens', 0)} tokens in, {data.get('output_tokens', 0)} out, "
                            f"{data.get('latency_ms', 0)} ms, stop: {data.get('stop_reason', '')}"),
                    cost=usd(data.get("cost_usd")))
    if kind == "tool.called":
        tool, args = str(data.get("tool", "")), _json_object(data.get("input"))
        if tool == "run_command":
            label = f"$ {args.get('command', '')}" if args else "run_command"
            detail = f"isolation {data.get('isolation', '?')}"
        else:
            label = tool
            detail = ", ".join(f"{k}={v}" for k, v in args.items() if k != "content") if args else str(
                data.get("input", ""))
        output = str(data.get("output", ""))
        if len(output) > STEP_OUTPUT_CHARS:
            output = f"[… {len(output) - STEP_OUTPUT_CHARS:,} characters before …]\n{output[-STEP_OUTPUT_CHARS:]}"
        return Step(**common, label=label, detail=detail, ok=bool(data.get("ok")), output=output)
    if kind == "harness.tool_refused":
        return Step(**common, label=f"{data.get('tool')} refused", detail=str(data.get("reason", "")), ok=False)
    if kind == "harness.tamper_reverted":
        return Step(**common, label="harness files reverted", ok=False,
                    detail=f"{', '.join(data.get('paths') or [])} restored in {str(data.get('commit', ''))[:12]}")
    if kind == "harness.wip_saved":
        return Step(**common, label="half-work saved",
                    detail=f"{data.get('ref')}: {', '.join(data.get('files') or [])}")
    if kind.startswith("activity."):
        what = kind.removeprefix("activity.").replace("_", " ")
        detail = "; ".join(part for part in (f"on {data['worker']}" if data.get("worker") else "",
                                             str(data.get("error") or "")) if part)
        return Step(**common, label=f"attempt {data.get('attempt', '?')} {what}", detail=detail,
                    ok=kind != "activity.failed")
    rest = {k: v for k, v in data.items() if k not in ("operation_id", "attempt")}
    return Step(**common, label=kind, detail=json.dumps(rest, sort_keys=True, default=str)[:300])


def _object(value: Any) -> dict[str, Any]:
    """A stored JSON object, or {} for anything else: the page shows what is there, never fails on it."""
    return value if isinstance(value, dict) else {}


def _json_object(text: Any) -> dict[str, Any]:
    try:
        return _object(json.loads(text) if isinstance(text, str) else text)
    except ValueError:  # cut at 300 characters when it was recorded
        return {}


def _decimal(value: Any) -> Decimal:
    try:
        return Decimal(str(value)) if value not in (None, "") else Decimal(0)
    except InvalidOperation:
        return Decimal(0)


def session_commits(workspace: str, name: str, result: dict[str, Any]) -> tuple[list[Commit], str]:
    """The commits a session made (the initializer: its scaffold), as ``git show --stat --patch``, and a note."""
    head = str(result.get("head") or result.get("scaffold_sha") or "")
    base = str(result.get("base_sha") or "") if name == "harness_session" else ""
    if not head or head == base:
        return [], "No commit: the session ended without changing the repository."
    if not workspace or not Path(workspace, ".git").is_dir() or not os.access(workspace, os.R_OK):
        return [], (f"The workspace {workspace or '(none recorded)'} is not readable on this web server (it may "
                    f"live on a worker's disk): run git -C {workspace or 'WORKSPACE'} show {head[:12]} there.")
    shas = [head]
    if base:
        listed = _git(workspace, "rev-list", "--reverse", f"{base}..{head}", limit=4_000)
        if listed is None:
            return [], f"git could not read {base[:12]}..{head[:12]} in {workspace}."
        shas = listed[0].split()
    commits = []
    for sha in shas[:DIFF_MAX_COMMITS]:
        shown = _git(workspace, "show", "--no-ext-diff", "--no-textconv", "--no-color", "--no-show-signature",
                     "--stat", "--patch", "--format=commit %H%nAuthor: %an%nDate:   %aI%n%n    %s%n%n%b", sha,
                     limit=DIFF_MAX_BYTES)
        if shown is not None:
            commits.append(Commit(sha=sha, text=shown[0], cut=shown[1]))
    more = len(shas) - DIFF_MAX_COMMITS
    return commits, f"{more} more commit{'s' if more > 1 else ''} of this session not shown." if more > 0 else ""


def _git(workspace: str, *args: str, limit: int) -> tuple[str, bool] | None:
    """Run a read-only git command; (its output cut at ``limit`` bytes, whether it was cut), or None.

    Nothing the workspace's own configuration asks for runs here: the engine's git environment
    and overrides (``agentops.git``), and no external diff, text conversion or signature check. It
    only reads: the repository's configuration is not rewritten from a web process.
    """
    env = engine_git.environment()
    command = engine_git.argv(workspace, *args, identity=())
    try:
        proc = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, env=env)
    except OSError:
        return None
    timer = threading.Timer(GIT_TIMEOUT_SECONDS, proc.kill)
    timer.start()
    try:
        assert proc.stdout is not None
        out = proc.stdout.read(limit + 1)
    finally:
        timer.cancel()
        proc.kill()
        code = proc.wait()
    if code not in (0, -9) or (code == -9 and len(out) <= limit):
        return None  # failed, or killed by the timer before it had said enough
    return out[:limit].decode("utf-8", "replace"), len(out) > limit


def isolation_used(workflow: Workflow, checks: list[CheckRun]) -> dict[str, list[tuple[str, int]]]:
    """How checks and sessions' commands were isolated (``bwrap`` or ``none``), as recorded per run:
    (isolation, runs) pairs."""
    commands: Counter[str] = Counter()
    for isolation, n in (workflow.events.filter(kind="tool.called", data__tool="run_command")
                         .values_list("data__isolation").annotate(n=Count("pk")).order_by()):
        commands[str(isolation or "?")] += n
    return {"checks": sorted(Counter(str(c.data.get("isolation") or "?") for c in checks).items()),
            "commands": sorted(commands.items())}


def limits(workflow: Workflow, state: dict[str, Any]) -> dict[str, Any]:
    """The run's own limits (launch parameters) and budgets, and what the sessions used of them."""
    params = workflow.params if isinstance(workflow.params, dict) else {}
    return {
        "sessions": int(state.get("sessions") or 0), "max_sessions": params.get("max_sessions"),
        "max_attempts": params.get("max_attempts"), "check_timeout_seconds": params.get("check_timeout_seconds"),
        "budget_total_usd": workflow.budget_total_usd, "budget_hourly_usd": workflow.budget_hourly_usd,
        # Sessions are what calls the model in a harness run: its charged spend, every session's.
        "sessions_cost_usd": UsageEntry.objects.filter(workflow=workflow, cost_usd__isnull=False).aggregate(
            total=Sum("cost_usd"))["total"] or Decimal(0),
    }
