"""Reads for the engine, the admin and the commands; no writes."""
from __future__ import annotations

import json
from collections.abc import Callable, Iterable
from datetime import date, datetime, timedelta
from decimal import Decimal
from typing import Any

from django.db.models import Count, Exists, F, OuterRef, Q, QuerySet, Sum

from workflows import clock, engine, registry, statestore
from workflows.errors import InvalidInput
from workflows.models import (
    Activity,
    ApiToken,
    Event,
    Installation,
    Intent,
    Schedule,
    ScheduleOccurrence,
    SteerMessage,
    UsageEntry,
    Wait,
    Workflow,
    WorkflowLabel,
)
from workflows.models.steering import ENDED_WITHOUT_RESULT
from workflows.sql import rows_select


def definition_of(workflow: Workflow) -> engine.WorkflowDefinition | None:
    """The definition of a workflow's kind, or None when no package on this host registers it
    (the pages and commands that show a workflow still work without its kind's hooks)."""
    try:
        return registry.definition(workflow.kind)
    except InvalidInput:
        return None


def current_goal(workflow: Workflow) -> str:
    """The goal of the workflow's current intent version: as read with its row lock
    (``workflow_lock(advance=True)``) when that was this version, else read now."""
    read = workflow.goal_read
    if read is not None and read[0] == workflow.intent_version:
        return str(read[1])
    rows = rows_select(Intent, ("goal",), {"workflow": workflow.pk, "version": workflow.intent_version})
    if not rows:
        raise Intent.DoesNotExist(f"Workflow {workflow.pk} has no intent version {workflow.intent_version}.")
    return str(rows[0][0])


def snapshot(workflow: Workflow, load_goal: Callable[[], str]) -> engine.WorkflowSnapshot:
    return engine.WorkflowSnapshot(
        workflow_id=workflow.pk, kind=workflow.kind, node=workflow.current_node, node_visit=workflow.node_visit,
        intent_version=workflow.intent_version, load_goal=load_goal, params=dict(workflow.params),
        state=statestore.state_of(workflow), release_fingerprint=workflow.release.fingerprint,
        definition_version=workflow.definition_version,
    )


# What an advance reads of each activity of the node visit (``recorded_activities``).
RECORDED_COLUMNS = ("operation_id", "name", "status", "result", "error")


def recorded_activities(workflow: Workflow, rows: list[tuple[Any, ...]] | None = None
                        ) -> dict[str, engine.RecordedActivity]:
    """Activities recorded for the workflow's current node visit, by operation id; from ``rows``
    (``RECORDED_COLUMNS`` of each, read in this transaction under the row lock) when given.

    SQL (``workflows.sql``): every advance replays the node visit with it. The columns
    read are text; the result's JSON comes back as text from both databases (Django reads
    PostgreSQL's jsonb as text too) and is decoded here."""
    if rows is None:
        rows = rows_select(Activity, RECORDED_COLUMNS, {"workflow": workflow.pk, "node_visit": workflow.node_visit})
    return {
        operation_id: engine.RecordedActivity(
            name=name, status=status, error=error,
            # Long values of a result are stored once (workflows.statestore): resolved here.
            result=None if result is None else statestore.resolve(workflow.pk, json.loads(result)))
        for operation_id, name, status, result, error in rows
    }


def recorded_waits(workflow: Workflow) -> dict[str, engine.RecordedWait]:
    """Waits recorded for the workflow's current node visit, by operation id."""
    return {
        w.operation_id: engine.RecordedWait(
            kind=w.kind, status=w.status, decision=w.decision,
            decided_by=w.decided_by.username if w.decided_by else "", comment=w.comment, payload=w.payload,
            name=w.event_name,
        )
        for w in Wait.objects.filter(workflow=workflow, node_visit=workflow.node_visit).select_related("decided_by")
    }


def children_live(workflow: Workflow, *, before_intent: int | None = None) -> list[int]:
    """The ids of the workflow's children that have not ended (started under an intent before
    ``before_intent``, or any)."""
    children = Workflow.objects.filter(parent=workflow).exclude(status__in=Workflow.TERMINAL)
    if before_intent is not None:
        children = children.filter(parent_wait__intent_version__lt=before_intent)
    return list(children.order_by("pk").values_list("pk", flat=True))


def steering_of(workflow: Workflow) -> list[dict[str, Any]]:
    """The workflow's steer messages, oldest first, each with where it stands: ``pending`` (no
    model call holds it), ``in_flight`` (a model call of a live activity took it) or ``delivered``
    (that activity succeeded); the operation and call that took it unless pending."""
    rows = list(SteerMessage.objects.filter(workflow=workflow).order_by("seq"))
    held = {pk: (status, op) for pk, status, op in Activity.objects.filter(
        pk__in={r.activity_id for r in rows if r.activity_id is not None}).values_list("pk", "status", "operation_id")}
    out = []
    for r in rows:
        status, operation_id = held.get(r.activity_id, ("", "")) if r.activity_id is not None else ("", "")
        state = "pending" if not status or status in ENDED_WITHOUT_RESULT else (
            "delivered" if status == Activity.Status.SUCCEEDED else "in_flight")
        taken = state != "pending"
        out.append({"seq": r.seq, "text": r.text, "sender": r.sender, "sent_at": r.sent_at.isoformat(),
                    "dedupe_key": r.dedupe_key, "status": state, "operation_id": operation_id if taken else None,
                    "call": r.call if taken else None, "taken_at": _iso(r.taken_at) if taken else None})
    return out


def fork_relation(workflow: Workflow) -> dict[str, Any]:
    """Where the workflow was forked from (``forked_from``: id, ``forked_from_visit``: the visits it
    reused) and the forks made of it (``forks``: id, visit, status; the newest 20)."""
    forks = [{"id": pk, "from_visit": visit, "status": status} for pk, visit, status in
             workflow.forks.order_by("-pk").values_list("pk", "forked_from_visit", "status")[:20]]
    return {"forked_from": workflow.forked_from_id, "forked_from_visit": workflow.forked_from_visit, "forks": forks}


def fork_summary(fork: Workflow) -> dict[str, Any]:
    """The answer of ``agent fork --json`` and of POST /api/workflows/ID/fork: the new workflow."""
    return {"id": fork.pk, "kind": fork.kind, "status": fork.status, "current_node": fork.current_node,
            "node_visit": fork.node_visit, "forked_from": fork.forked_from_id,
            "forked_from_visit": fork.forked_from_visit}


# The largest id PostgreSQL's bigint holds: an id beyond it is refused where it enters, never queried.
MAX_ID = 2**63 - 1
MAX_LIST_ROWS = 1000  # the most workflows `agent list` prints at once
MAX_EVENTS = 10_000  # the most recent events `agent show` and GET /api/workflows/ID include


def workflow_list(*, status: str = "", kind: str = "", launcher: str = "",
                  labels: Iterable[tuple[str, str]] = ()) -> QuerySet[Workflow]:
    """Newest first; each filter given narrows it (``launcher``: the username of who launched;
    ``labels``: every one of these (key, value) labels, index ``workflow_label_kv_idx``). The labels
    come prefetched (``workflow_summary`` shows them)."""
    qs = labels_filtered(Workflow.objects.order_by("-pk").prefetch_related("labels"), labels)
    if status:
        qs = qs.filter(status=status)
    if kind:
        qs = qs.filter(kind=kind)
    if launcher:
        qs = qs.filter(launched_by__username=launcher)
    return qs


def workflows_in_flight(*, kind: str = "", since: date | None = None) -> QuerySet[Workflow]:
    """Workflows whose handlers will run again (running, waiting or paused), oldest first."""
    in_flight = (Workflow.Status.RUNNING, Workflow.Status.WAITING, Workflow.Status.PAUSED)
    qs = Workflow.objects.filter(status__in=in_flight).select_related("release").order_by("pk")
    if kind:
        qs = qs.filter(kind=kind)
    if since is not None:
        qs = qs.filter(created_at__date__gte=since)
    return qs


def workflow_summary(workflow: Workflow) -> dict[str, Any]:
    """The stable JSON shape of one workflow without nested lists (``agent list --json``)."""
    return {
        "id": workflow.pk,
        "kind": workflow.kind,
        "status": workflow.status,
        "current_node": workflow.current_node,
        "intent_version": workflow.intent_version,
        "goal": current_goal(workflow),
        "release": {"provider": workflow.release.provider, "model": workflow.release.model,
                    "prompt_version": workflow.release.prompt_version},
        "fallback_model": workflow.fallback_model,
        "labels": labels_of(workflow),
        "reason": workflow.reason,
        "pause_cause": workflow.pause_cause,
        "handler_failures": workflow.handler_failures,
        "advance_retry_at": _iso(workflow.advance_retry_at),
        "deadline": _iso(workflow.deadline),
        "created_at": workflow.created_at.isoformat(),
        "updated_at": workflow.updated_at.isoformat(),
    }


def labels_filtered(qs: QuerySet[Workflow], labels: Iterable[tuple[str, str]]) -> QuerySet[Workflow]:
    """The workflows of ``qs`` that carry every one of the (key, value) labels (index ``workflow_label_kv_idx``)."""
    for key, value in labels:
        qs = qs.filter(Exists(WorkflowLabel.objects.filter(workflow=OuterRef("pk"), key=key, value=value)))
    return qs


def labels_of(workflow: Workflow) -> dict[str, str]:
    """Its launch labels, key to value, by key (prefetched by ``workflow_list``)."""
    return {label.key: label.value for label in sorted(workflow.labels.all(), key=lambda label: label.key)}


# The keys of ``agent show --json`` that every kind has; a kind's ``show_extras`` adds others.
DETAIL_KEYS = frozenset({
    "id", "kind", "status", "current_node", "intent_version", "goal", "release", "fallback_model", "labels", "reason",
    "pause_cause", "handler_failures", "advance_retry_at", "deadline", "created_at", "updated_at", "params",
    "result", "waits", "activities", "activities_left_out", "commitments", "spend", "progress", "events",
    "signals_queued", "installation_id", "history_archive", "retrying", "parent", "children", "steering",
    "forked_from", "forked_from_visit", "forks",
})


def roles(*, name: str = "") -> list[dict[str, Any]]:
    """Approver roles (groups): each with its members' usernames and how many open approvals name it."""
    from django.contrib.auth.models import Group

    groups = Group.objects.order_by("name").prefetch_related("user_set")
    if name:
        groups = groups.filter(name=name)
    waiting = dict(Wait.objects.filter(kind=Wait.Kind.APPROVAL, status=Wait.Status.OPEN).values_list(
        "required_role").annotate(n=Count("pk")).values_list("required_role", "n"))
    return [{"role": g.name, "members": sorted(u.username for u in g.user_set.all()),
             "open_approvals": waiting.get(g.name, 0)} for g in groups]


def activities_retrying(workflow: Workflow) -> list[dict[str, Any]]:
    """The workflow's activities waiting out a retry window after a failed attempt: what failed,
    which attempt is next and when (a workflow whose work keeps failing is ``running`` until its
    attempts run out; this says what it is doing meanwhile)."""
    return [
        {"operation_id": a.operation_id, "name": a.name, "attempts": a.attempt, "max_attempts": a.max_attempts,
         "next_attempt_at": _iso(a.next_attempt_at), "error": a.error[:500]}
        for a in workflow.activities.filter(status=Activity.Status.SCHEDULED, attempt__gte=1).exclude(
            error="").order_by("next_attempt_at", "pk")[:20]
    ]


def workflows_retrying(ids: list[int]) -> set[int]:
    """Which of the workflows ``ids`` have an activity waiting out a retry window."""
    return set(Activity.objects.filter(workflow_id__in=ids, status=Activity.Status.SCHEDULED, attempt__gte=1)
               .exclude(error="").values_list("workflow_id", flat=True))


def installation_id() -> str | None:
    """This database's installation id (``workflows.installation``); None before the
    first activity of a database whose row was removed (a test's flush) made it again."""
    return Installation.objects.values_list("installation_id", flat=True).first()


# ``agent show --json`` and the API's workflow read list every activity that has not finished and
# the newest finished ones, oldest first (a 200-feature harness run has over 2,000 activities);
# the activity list of the admin and export-history have all of them. Errors keep their end.
ACTIVITIES_SHOWN = 50
ERROR_CHARS_SHOWN = 2_000


def shown_activities(workflow: Workflow) -> tuple[list[Activity], int]:
    """The activities a workflow's detail lists (``ACTIVITIES_SHOWN``), and how many it leaves out."""
    rows = workflow.activities.defer("input", "result", "checkpoint")
    live = (Activity.Status.SCHEDULED, Activity.Status.RUNNING)
    unfinished = list(rows.filter(status__in=live))
    newest = list(rows.exclude(status__in=live).order_by("-pk")[:ACTIVITIES_SHOWN])
    left_out = workflow.activities.count() - len(unfinished) - len(newest) if len(newest) == ACTIVITIES_SHOWN else 0
    return sorted([*unfinished, *newest], key=lambda a: a.pk), left_out


def workflow_detail(workflow: Workflow, *, events: int = 50) -> dict[str, Any]:
    """The stable JSON shape of ``agent show --json``: DETAIL_KEYS, then the kind's extras."""
    detail = workflow_summary(workflow)
    detail["params"] = workflow.params
    detail["result"] = workflow.result
    detail["waits"] = [
        {
            "id": w.pk, "kind": w.kind, "status": w.status, "node": w.node, "candidate_hash": w.candidate_hash,
            "required_role": w.required_role, "intent_version": w.intent_version,
            "expires_at": _iso(w.expires_at),
            "decision": w.decision, "decided_by": w.decided_by.username if w.decided_by else None,
            # What an approver decides on: the candidate the hash is of, while the wait is open (else null).
            **({"candidate": w.candidate, "state_versions": w.state_versions}
               if w.kind == Wait.Kind.APPROVAL and w.status == Wait.Status.OPEN
               else {"candidate": None, "state_versions": None}),
        }
        for w in workflow.waits.select_related("decided_by").order_by("pk")
    ]
    detail["retrying"] = activities_retrying(workflow)
    activities, detail["activities_left_out"] = shown_activities(workflow)
    detail["activities"] = [
        {
            "operation_id": a.operation_id, "idempotency_key": a.sent_key, "name": a.name, "node": a.node,
            "status": a.status,
            "attempts": a.attempt, "error": a.error[-ERROR_CHARS_SHOWN:],
            "heartbeat": a.heartbeat_detail if a.status == "running" else "",
            "checkpointed_at": _iso(a.checkpointed_at) if a.checkpoint is not None else None,
        }
        for a in activities
    ]
    detail["commitments"] = [
        {"id": c.pk, "kind": c.kind, "status": c.status, "operation_id": c.activity.operation_id,
         "handed_over_by": c.handed_over_by_id}
        for c in workflow.commitments.select_related("activity").order_by("pk")
    ]
    # Delivered signals are in the history (wait.satisfied); the queued ones wait for a wait.
    detail["signals_queued"] = [
        {"name": s.name, "dedupe_key": s.dedupe_key, "received_at": s.received_at.isoformat()}
        for s in workflow.signals.filter(consumed_by__isnull=True).order_by("pk")
    ]
    detail["installation_id"] = installation_id()
    detail["steering"] = steering_of(workflow)
    detail.update(fork_relation(workflow))
    recent = Event.objects.filter(workflow=workflow).order_by("-seq")[:events]
    detail["spend"] = spend_summary(workflow)
    detail["progress"] = [
        {"percent": p.percent, "confidence": p.confidence, "achievements": p.achievements, "remaining": p.remaining,
         "at": p.created_at.isoformat()}
        for p in workflow.progress.order_by("-created_at")[:5]
    ]
    detail["events"] = [
        {"seq": e.seq, "kind": e.kind, "at": e.created_at.isoformat(), "data": e.data} for e in reversed(recent)
    ]
    detail["history_archive"] = history_archive(workflow)
    detail["parent"], detail["children"] = family(workflow)
    definition = definition_of(workflow)
    extras = definition.show_extras(workflow) if definition else {}
    return {**detail, **{key: value for key, value in extras.items() if key not in DETAIL_KEYS}}


CHILDREN_SHOWN = 100


def family(workflow: Workflow) -> tuple[dict[str, Any] | None, list[dict[str, Any]]]:
    """The workflow's parent (id, kind, the child's operation id there) or None, and its children
    (ctx.child), oldest first, at most CHILDREN_SHOWN: id, kind, status, operation id, budget."""
    parent = None
    if workflow.parent_id is not None:
        kind = Workflow.objects.filter(pk=workflow.parent_id).values_list("kind", flat=True).first()
        op = Wait.objects.filter(pk=workflow.parent_wait_id).values_list("operation_id", flat=True).first()
        parent = {"id": workflow.parent_id, "kind": kind or "", "operation_id": op or ""}
    children = [
        {"id": c.pk, "kind": c.kind, "status": c.status, "operation_id": c.parent_wait.operation_id if c.parent_wait
         else "", "budget_total_usd": _str(c.budget_total_usd), "reason": c.reason[:300]}
        for c in Workflow.objects.filter(parent=workflow).select_related("parent_wait").order_by("pk")[:CHILDREN_SHOWN]
    ]
    return parent, children


def history_archive(workflow: Workflow) -> dict[str, Any] | None:
    """Where retention moved the workflow's checkpoints and events (docs/operators.md,
    "Retention"), or None while its whole history is in the database."""
    if workflow.history_archived_at is None:
        return None
    return {"archived_at": workflow.history_archived_at.isoformat(), "path": workflow.history_archive_path,
            "export": f"manage.py agent export-history {workflow.pk}"}


MICRO_USD = Decimal("0.000001")


def spent_usd(workflow: Workflow | int) -> Decimal:
    """Charged costs plus the estimates of requests in flight (reserved) or of unknown outcome
    (uncertain); released entries count nothing. ``workflow``: the workflow or its id. A parent
    counts its children too (``children_reserved_usd``)."""
    sums = UsageEntry.objects.filter(workflow=workflow).aggregate(
        charged=Sum("cost_usd", filter=Q(status=UsageEntry.Status.CHARGED)),
        held=Sum("reserved_usd", filter=Q(status__in=(UsageEntry.Status.RESERVED, UsageEntry.Status.UNCERTAIN))))
    return (sums["charged"] or Decimal(0)) + (sums["held"] or Decimal(0)) + children_reserved_usd(workflow)


def children_reserved_usd(workflow: Workflow | int) -> Decimal:
    """What a workflow's children count against its budget: a child that has not ended its whole
    budget (reserved from the parent's when it started; its spend, its own children's included,
    when it has no budget), one that ended what it spent."""
    total = Decimal(0)
    for pk, status, budget in Workflow.objects.filter(parent=workflow).values_list(
            "pk", "status", "budget_total_usd"):
        spent = spent_usd(pk)
        live = status not in Workflow.TERMINAL and budget is not None
        total += max(budget, spent) if live else spent
    return total


def spend_summary(workflow: Workflow) -> dict[str, Any]:
    """Spend, remaining budget, runway at the last hour's rate, and suggestions for a person."""
    now = clock.now()
    entries = UsageEntry.objects.filter(workflow=workflow)
    spent = spent_usd(workflow)
    last_hour = sum((e.amount_usd for e in entries.filter(created_at__gt=now - timedelta(hours=1))), Decimal(0))
    totals = entries.aggregate(calls=Count("pk"), tokens=Sum(F("input_tokens") + F("output_tokens")),
                               uncached=Sum("input_tokens"), read=Sum("cache_read_tokens"),
                               written=Sum("cache_write_tokens"))
    calls = totals["calls"] or 0
    # The API reports a request's input in three parts: uncached, read from the cache, written to it.
    prompt_tokens = sum(totals[k] or 0 for k in ("uncached", "read", "written"))
    tokens_per_call = (totals["tokens"] or 0) // calls if calls else 0
    remaining = workflow.budget_total_usd - spent if workflow.budget_total_usd is not None else None
    runway = round(float(remaining / last_hour), 1) if remaining is not None and last_hour > 0 else None
    suggestions = []
    if runway is not None and runway < 24:
        suggestions.append(f"runway is {runway} h at the last hour's rate: reduce how often the agent calls the model")
    if tokens_per_call > 2000:
        suggestions.append(f"{tokens_per_call} tokens per call: trim the context sent with each call")
    return {
        "spent_usd": str(spent.quantize(MICRO_USD)), "last_hour_usd": str(Decimal(last_hour).quantize(MICRO_USD)),
        "budget_total_usd": _str(workflow.budget_total_usd), "budget_hourly_usd": _str(workflow.budget_hourly_usd),
        "remaining_usd": _str(remaining.quantize(MICRO_USD) if remaining is not None else None),
        "runway_hours": runway, "calls": calls, "tokens_per_call": tokens_per_call,
        "priority": workflow.priority, "suggestions": suggestions,
        "cache_read_share": round((totals["read"] or 0) / prompt_tokens, 3) if prompt_tokens else None,
        # Part of spent_usd: requests whose outcome is unknown, counted at their estimate.
        "uncertain_usd": str(Decimal(entries.filter(status=UsageEntry.Status.UNCERTAIN).aggregate(
            s=Sum("reserved_usd"))["s"] or 0).quantize(MICRO_USD)),
    }


def api_tokens(*, username: str = "") -> QuerySet[ApiToken]:
    """API tokens, newest first, revoked ones included (``agent token list``)."""
    qs = ApiToken.objects.select_related("user").order_by("-pk")
    return qs.filter(user__username=username) if username else qs


def api_token_summary(token: ApiToken) -> dict[str, Any]:
    """The JSON shape of one token (``agent token list --json``): never its secret nor its digest."""
    return {
        "id": token.pk, "user": token.user.username, "name": token.name, "prefix": token.prefix,
        "created_at": token.created_at.isoformat(), "last_used_at": _iso(token.last_used_at),
        "revoked_at": _iso(token.revoked_at),
    }


def _str(value: Decimal | None) -> str | None:
    return None if value is None else str(value)


def _iso(value: datetime | None) -> str | None:
    return value.isoformat() if value is not None else None


def usage_uncertain(*, workflow_id: int | None = None) -> list[dict[str, Any]]:
    """The ledger's uncertain requests (no answer seen), oldest first: what ``agent usage settle`` settles."""
    entries = UsageEntry.objects.filter(status=UsageEntry.Status.UNCERTAIN).order_by("created_at", "pk")
    if workflow_id is not None:
        entries = entries.filter(workflow_id=workflow_id)
    return [{"workflow_id": e.workflow_id, "key": e.key, "provider": e.provider, "model": e.model,
             "reserved_usd": str(e.reserved_usd), "created_at": e.created_at.isoformat(), "outcome": e.outcome}
            for e in entries]


def schedules() -> Any:
    return Schedule.objects.order_by("name")


def occurrence_summary(occurrence: ScheduleOccurrence) -> dict[str, Any]:
    return {"at": occurrence.at.isoformat(), "outcome": occurrence.outcome, "workflow_id": occurrence.workflow_id,
            "reason": occurrence.reason,
            "triggered_by": occurrence.triggered_by.username if occurrence.triggered_by else None}


def schedule_summary(schedule: Schedule) -> dict[str, Any]:
    """A schedule as `agent schedule list --json` (and the admin) show it."""
    last = schedule.occurrences.select_related("triggered_by").order_by("-at").first()
    return {
        "name": schedule.name, "kind": schedule.kind, "goal": schedule.goal, "params": schedule.params,
        "labels": schedule.labels,
        "cron": schedule.cron, "every_seconds": schedule.every_seconds, "when": schedule.when,
        "overlap": schedule.overlap, "catch_up_seconds": schedule.catch_up_seconds,
        "jitter_seconds": schedule.jitter_seconds, "paused": schedule.paused,
        "created_by": schedule.created_by.username if schedule.created_by else None,
        "next_due_at": schedule.next_due_at.isoformat(),
        "buffered_at": _iso(schedule.buffered_at),
        "launched": schedule.occurrences.filter(outcome=ScheduleOccurrence.Outcome.LAUNCHED).count(),
        "last_occurrence": occurrence_summary(last) if last else None,
    }
