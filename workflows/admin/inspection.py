"""What the workflow page shows below its fields: the path through the nodes, history, work and waits."""
from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from django.conf import settings
from django.core.paginator import Page, Paginator
from django.db.models import Min
from django.urls import reverse

from workflows import registry, selectors
from workflows.admin.common import candidate_view, time_left
from workflows.errors import Refused
from workflows.models import (
    Activity,
    ActivityAttempt,
    BehavioralRelease,
    Checkpoint,
    Commitment,
    Event,
    Intent,
    Timer,
    Wait,
    Workflow,
)
from workflows.services.steps import COMPENSATION_NODE

# The event timeline is paged, newest first: a long-running agent has thousands of events, and the
# page of one with 461 events weighed 1.9 MB when it listed them all.
EVENTS_PER_PAGE = 50
EVENTS_PAGE_PARAM = "events"
EVENT_VALUE_CHARS = 400
# The activities and checkpoints tables list the newest ones, newest first; the activity list has
# every activity, and each checkpoint links to a page of its own with the state.
ACTIVITIES_SHOWN = 20
CHECKPOINTS_SHOWN = 30
# The path chart draws the newest steps: one dot per node visit, and a run of 1,601 visits drew
# 343 KB of SVG.
PATH_STEPS_SHOWN = 60


def duration(start: datetime | None, end: datetime | None) -> str:
    if start is None or end is None:
        return ""
    seconds = (end - start).total_seconds()
    if seconds < 60:
        return f"{seconds:.2f} s"
    minutes, seconds = divmod(int(seconds), 60)
    hours, minutes = divmod(minutes, 60)
    return f"{hours} h {minutes} min" if hours else f"{minutes} min {seconds} s"


def _attempt_row(attempt: ActivityAttempt, now: datetime) -> dict[str, Any]:
    running = attempt.status == ActivityAttempt.Status.RUNNING
    end = attempt.finished_at or (now if running else None)
    return {"attempt": attempt, "duration": duration(attempt.started_at, end), "running": running,
            "flower_url": flower_task_url(attempt.task_id)}


def flower_task_url(task_id: str) -> str:
    base = settings.AGENTOPS_FLOWER_URL.rstrip("/")
    return f"{base}/task/{task_id}" if base and task_id else ""


@dataclass(frozen=True)
class PathPoint:
    x: int
    y: int
    node: str
    visit: int
    at: datetime


@dataclass(frozen=True)
class PathChart:
    """The semantic nodes visited so far, as a step chart: one row per node, one column per visit."""

    width: int
    height: int
    rows: list[tuple[int, str, bool]]
    points: list[PathPoint]
    polyline: str
    status: str
    steps_left_out: int = 0  # the oldest steps, not drawn

    LEFT = 190
    STEP = 40
    ROW = 24
    TOP = 18


def path_chart(workflow: Workflow, checkpoints: list[Checkpoint], *, left_out: int = 0) -> PathChart:
    """Visit 1 is the start node (entered at launch, without a checkpoint); each checkpoint is one more visit.
    With ``left_out``, the ``checkpoints`` are the newest ones and that many older steps are not drawn."""
    try:
        definition = registry.definition(workflow.kind)
        nodes, start = list(definition.nodes), definition.start_node
    except Refused:  # a kind no longer registered: draw what was visited
        nodes, start = [], "(start)"
    if not checkpoints:
        start = workflow.current_node
    launch = [(start, 1, workflow.created_at)] if not left_out else []
    visits = launch + [(c.node, c.node_visit, c.created_at) for c in checkpoints]
    for node, _, _ in visits:
        if node not in nodes:
            nodes.append(node)
    row_of = {node: i for i, node in enumerate(nodes)}
    visited = {node for node, _, _ in visits}
    y = lambda node: PathChart.TOP + row_of[node] * PathChart.ROW  # noqa: E731
    points = [PathPoint(PathChart.LEFT + i * PathChart.STEP, y(node), node, visit, at)
              for i, (node, visit, at) in enumerate(visits)]
    return PathChart(
        width=PathChart.LEFT + max(len(points), 1) * PathChart.STEP + 90,
        height=PathChart.TOP + len(nodes) * PathChart.ROW,
        rows=[(y(node), node, node in visited) for node in nodes],
        points=points, polyline=" ".join(f"{p.x},{p.y}" for p in points), status=workflow.status,
        steps_left_out=left_out,
    )


def inspect_workflow(workflow: Workflow, *, now: datetime, events_page: str = "") -> dict[str, Any]:
    """Everything the workflow page shows below its fields, read in a handful of queries."""
    # The table shows no activity's input, result or working state: leave them in the database.
    rows = workflow.activities.defer("input", "result", "checkpoint")
    activities = list(rows.order_by("-pk").prefetch_related("attempts")[:ACTIVITIES_SHOWN])
    activities_total = len(activities) if len(activities) < ACTIVITIES_SHOWN else workflow.activities.count()
    # The path and the table need the newest checkpoints' node and time, never their state (the bulk of the bytes).
    newest = max(PATH_STEPS_SHOWN, CHECKPOINTS_SHOWN)
    checkpoints = list(reversed(workflow.checkpoints.order_by("-node_visit").defer("state", "delta")[:newest]))
    older = workflow.checkpoints.count() - len(checkpoints) if len(checkpoints) == newest else 0
    made = list(workflow.commitments.select_related("activity").order_by("pk"))
    compensations = {a.operation_id: a for a in rows.filter(
        operation_id__in=[f"{c.activity.operation_id}/compensate" for c in made])}
    commitments = [
        {"commitment": c, "compensation": compensations.get(f"{c.activity.operation_id}/compensate")} for c in made
    ]
    waits = [
        {"wait": w, "candidate": candidate_view(workflow, w.candidate) if w.candidate is not None else None,
         "time_left": time_left(w.expires_at, now) if w.status == Wait.Status.OPEN else ""}
        for w in workflow.waits.select_related("decided_by").order_by("pk")
    ]
    return {
        "path": path_chart(workflow, checkpoints[-PATH_STEPS_SHOWN:],
                           left_out=older + 1 + max(len(checkpoints) - PATH_STEPS_SHOWN, 0) if older else 0),
        "intents": list(workflow.intents.select_related("created_by").order_by("version")),
        "timeline": timeline_page(workflow, events_page),
        "activities": [{"activity": a, "attempts": [_attempt_row(t, now) for t in a.attempts.all()],
                        "is_compensation": a.node == COMPENSATION_NODE} for a in activities],
        "activities_hidden": activities_total - len(activities),
        "activity_list_url": f"{reverse('admin:workflows_activity_changelist')}?workflow__exact={workflow.pk}",
        "waits": waits,
        "timers": list(workflow.timers.order_by("fire_at", "pk")),
        "commitments": commitments,
        "family": _family(workflow),
        "checkpoints": [{"checkpoint": c, "url": reverse("admin:workflows_workflow_checkpoint",
                                                         args=[workflow.pk, c.pk])}
                        for c in reversed(checkpoints[-CHECKPOINTS_SHOWN:])],
        "checkpoints_hidden": older + max(len(checkpoints) - CHECKPOINTS_SHOWN, 0),
        "history_archive": selectors.history_archive(workflow),
        "release": workflow.release,
        "release_tools": json.dumps(workflow.release.tool_versions, sort_keys=True),
        "flower_configured": bool(settings.AGENTOPS_FLOWER_URL),
        "help": {
            "activity": _help(Activity), "attempt": _help(ActivityAttempt), "wait": _help(Wait),
            "timer": _help(Timer), "commitment": _help(Commitment), "intent": _help(Intent),
            "checkpoint": _help(Checkpoint), "event": _help(Event), "release": _help(BehavioralRelease),
        },
    }


def _family(workflow: Workflow) -> dict[str, Any]:
    """The workflow's place in its tree: its parent and its children (``selectors.family``), linked."""
    parent, children = selectors.family(workflow)
    url = lambda pk: reverse("admin:workflows_workflow_change", args=[pk])  # noqa: E731
    return {"parent": {**parent, "url": url(parent["id"])} if parent else None,
            "children": [{**c, "url": url(c["id"])} for c in children]}


@dataclass(frozen=True)
class PageLink:
    label: str
    url: str  # empty for the current page and for a gap ("…")
    current: bool = False


def timeline_page(workflow: Workflow, number: str) -> dict[str, Any]:
    """One page of the event timeline, newest first, with links to the other pages.

    Event numbers run 1, 2, 3, … per workflow without gaps (``uniq_event_seq``), so a page is a
    range of them: no COUNT and no OFFSET, however long the history. A missing or out-of-range
    page number gives the nearest page.
    """
    # An archived history (retention) keeps only the events recorded since: page those.
    oldest = (workflow.events.aggregate(first=Min("seq"))["first"] or 1) if workflow.history_archived else 1
    paginator = Paginator(range(workflow.event_seq, oldest - 1, -1), EVENTS_PER_PAGE)
    page = paginator.get_page(number)
    seqs = page.object_list
    events = list(workflow.events.filter(seq__lte=seqs[0], seq__gte=seqs[-1]).order_by("-seq")) if seqs else []
    return {
        "rows": [{"event": e, "offset": duration(workflow.created_at, e.created_at), "details": _details(e.data)}
                 for e in events],
        "page": page, "count": workflow.event_seq, "per_page": EVENTS_PER_PAGE, "archived_before": oldest - 1,
        "newest": seqs[0] if seqs else 0, "oldest": seqs[-1] if seqs else 0,
        "links": _page_links(workflow, paginator, page),
    }


def _page_links(workflow: Workflow, paginator: Paginator, page: Page) -> list[PageLink]:
    base = reverse("admin:workflows_workflow_change", args=[workflow.pk])
    return page_links(paginator, page, lambda number: f"{base}?{EVENTS_PAGE_PARAM}={number}#timeline",
                      previous="‹ newer", next="older ›")


def page_links(paginator: Paginator, page: Page, url_of: Callable[[int], str], *, previous: str = "‹ previous",
               next: str = "next ›") -> list[PageLink]:
    """Links to a paged list's other pages (``url_of(number)``): the previous one, the numbers with
    gaps, the next one; none for a single page."""
    if paginator.num_pages < 2:
        return []

    def link(label: str, number: int) -> PageLink:
        if number == page.number:
            return PageLink(label, "", current=True)
        return PageLink(label, url_of(number))

    links = [link(previous, page.previous_page_number())] if page.has_previous() else []
    links += [PageLink(str(n), "") if n == Paginator.ELLIPSIS else link(str(n), int(n))
              for n in paginator.get_elided_page_range(page.number, on_each_side=2, on_ends=1)]
    if page.has_next():
        links.append(link(next, page.next_page_number()))
    return links


def _details(data: Any) -> list[tuple[str, str]]:
    """An event's data as (key, value) pairs: strings as they are, anything else as JSON; each
    value cut to its first ``EVENT_VALUE_CHARS`` (a check run's output tail is 2 KB, and a page
    has 50 events)."""
    if not isinstance(data, dict):
        return [("", _cut(json.dumps(data, default=str)))]
    return [(key, _cut(value if isinstance(value, str) else json.dumps(value, sort_keys=True, default=str)))
            for key, value in sorted(data.items())]


def _cut(text: str) -> str:
    if len(text) <= EVENT_VALUE_CHARS:
        return text
    return f"{text[:EVENT_VALUE_CHARS]} [… {len(text) - EVENT_VALUE_CHARS:,} more characters: agent export-history]"


def _help(model: type[Any]) -> dict[str, str]:
    """Field name → help text, shown as column-header tooltips."""
    return {f.name: str(getattr(f, "help_text", "") or "") for f in model._meta.get_fields() if hasattr(f, "help_text")}
