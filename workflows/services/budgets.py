"""The usage ledger: one row per request to a model provider, reserved before it is sent and
charged, released or marked uncertain after it; defer or pause at the limits."""
from __future__ import annotations

import json
from collections.abc import Iterable
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from decimal import Decimal
from typing import Any

from django.db import connection, transaction
from django.db.models import Exists, OuterRef

from workflows import clock
from workflows.errors import BudgetDeferred, BudgetExhausted, InvalidInput, TransitionRefused
from workflows.leases import Claim, Fence
from workflows.models import ActivityAttempt, UsageEntry, Workflow
from workflows.prices import cost_usd, usage_fields
from workflows.provider import Usage
from workflows.rules import BUDGET_PAUSE_PREFIX, amount_checked
from workflows.selectors import spent_usd
from workflows.services import lifecycle, slots
from workflows.services.common import (
    event_record,
    priority_checked,
    workflow_lock,
    workflow_not_found,
    workflow_save,
)
from workflows.services.steps import Outcome, Result, username_of
from workflows.services.visits import wake_locked
from workflows.sql import RowWrite, rows_insert
from workflows.sql import budgets as sql_budgets
from workflows.sql.server import advisory_xact_lock

HOUR = timedelta(hours=1)
PRIORITY_PASSES_HOURLY = 9


# The first key of the advisory locks of ``_tree_lock`` (the second is the workflow's id).
TREE_LOCK_SPACE = 0x616F7472  # "aotr"


def usage_key(*, operation_id: str, call: int, attempt: int, request: int) -> str:
    """The ledger key of one request: ``<operation_id>#<call>@<attempt>.<request>``."""
    return f"{operation_id}#{call}@{attempt}.{request}"


def budget_reserve_ensure(
    *, workflow_id: int, key: str, operation_id: str, provider: str, model: str, estimate_usd: Decimal,
    attempt: int = 0, fence: Fence | None = None,
) -> bool:
    """Hold the estimated cost of one request to a provider before it is sent, or refuse it at the limits.

    Every request has its own key (``usage_key``: a retry, the SDK's included, or the same call
    made by a later attempt is a new request, checked against the budget like the first).
    Idempotent for the same request: the unique ``key`` is looked up under the workflow's row
    lock, which serializes workers racing for the last dollars, so reservations never exceed the
    total budget. True when this call reserved it, False when it was reserved already. Raises
    BudgetExhausted over the total, BudgetDeferred (with the time the hourly window frees up)
    over the hourly limit unless the workflow's priority is 9 or more. ``fence`` (an attempt's
    ``ctx.fence_of``) is checked under the lock first: the request is reserved only while the
    attempt may still send it, in one transaction. Its statements are SQL (``workflows.sql``):
    every request of every model call makes them.

    A workflow with neither budget limit needs no row lock of its own: on PostgreSQL the limits
    read (the row share-locked: a writer holding it is waited for), the fence (the lease
    extended as ``ctx.fence`` does, under the same condition) and the reservation are one
    statement, which inserts the row only when the workflow had no limit and the fence held. A
    limit being set meanwhile is waited for and seen. Any other outcome (a limit, the fence
    failed) takes the locked way, which decides.
    """
    row = {"workflow": workflow_id, "key": key, "operation_id": operation_id, "attempt": attempt,
           "provider": provider, "model": model, "reserved_usd": estimate_usd, "created_at": clock.now()}
    if fence is not None and fence.claim is not None and connection.vendor == "postgresql":
        reserved = _reserve_without_limits(fence.claim, fence.detail, row)
        if reserved is not None:
            return reserved
    return _reserve_locked(row, fence)


def _reserve_without_limits(claim: Claim, detail: str, row: dict[str, Any]) -> bool | None:
    """The reservation of a workflow without budget limits in one statement (PostgreSQL), fenced
    by ``claim``'s lease: True or False as ``budget_reserve_ensure``; None when the workflow has a
    limit or the fence failed."""
    values, where = lifecycle.lease_extension(claim, now=row["created_at"], detail=detail)
    fenced, unlimited, reserved = sql_budgets.reserve_without_limits(row["workflow"], values, where, row)
    return reserved if fenced and unlimited else None


@transaction.atomic
def _reserve_locked(row: dict[str, Any], fence: Fence | None) -> bool:
    limits = _budget_lock(row["workflow"], row["key"])
    if fence is not None:
        fence.check()
    if limits.reserved:
        return False
    _check_total(limits, row["reserved_usd"])
    if limits.priority < PRIORITY_PASSES_HOURLY:
        _check_hourly(limits, row["reserved_usd"], now=row["created_at"])
        if limits.parent_id is not None:
            _check_ancestors_hourly(limits, row["reserved_usd"], now=row["created_at"])
    rows_insert(UsageEntry, [row])
    return True


@dataclass(frozen=True)
class _Limits:
    """The budget fields of a locked workflow row, and whether the request is reserved already."""

    workflow_id: int
    total_usd: Decimal | None
    hourly_usd: Decimal | None
    priority: int
    reserved: bool
    parent_id: int | None = None
    has_children: bool = False


def _budget_lock(workflow_id: int, key: str) -> _Limits:
    """``workflow_lock`` for a reservation: the budget fields of the row, and whether ``key`` is in the ledger."""
    row = sql_budgets.budget_row_lock(workflow_id, key)
    if row is None:
        raise workflow_not_found(workflow_id)
    total, hourly, priority, reserved, parent_id, has_children = row
    return _Limits(workflow_id=workflow_id, total_usd=_decimal(total), hourly_usd=_decimal(hourly),
                   priority=int(priority), reserved=bool(reserved), parent_id=parent_id,
                   has_children=bool(has_children))


def _decimal(value: Any) -> Decimal | None:
    """A money column as read by a cursor (SQLite gives a number, not a Decimal)."""
    return None if value is None else Decimal(str(value))


def _check_total(limits: _Limits, estimate: Decimal) -> None:
    if limits.total_usd is None:
        return
    committed = spent_usd(limits.workflow_id)
    if committed + estimate > limits.total_usd:
        raise BudgetExhausted(
            f"{BUDGET_PAUSE_PREFIX}: workflow {limits.workflow_id} has used {committed:.4f} of its "
            f"{limits.total_usd:.4f} USD and the next call may cost up to {estimate:.4f}; raise the budget "
            f"(`manage.py agent budget {limits.workflow_id} --total USD`, or POST /api/workflows/{limits.workflow_id}/"
            "budget) to resume.",
            workflow_id=limits.workflow_id,
        )


def _check_hourly(limits: _Limits, estimate: Decimal, *, now: datetime) -> None:
    """The workflow's hourly limit over its tree's last hour: its own calls and its children's
    (a child's spend counts against its parent's limit)."""
    if limits.hourly_usd is None:
        return
    if limits.has_children:
        _tree_lock(limits.workflow_id)
    ids = _tree(limits.workflow_id) if limits.has_children else [limits.workflow_id]
    _check_window(limits.workflow_id, limits.hourly_usd, ids, estimate, now=now, owner=limits.workflow_id)


def _check_ancestors_hourly(limits: _Limits, estimate: Decimal, *, now: datetime) -> None:
    """Each ancestor's hourly limit over the ancestor's whole tree: children, however many, never
    spend more in an hour than their parent's limit allows."""
    ancestor_id = limits.parent_id
    while ancestor_id is not None:
        parent_id, hourly = Workflow.objects.filter(pk=ancestor_id).values_list("parent_id", "budget_hourly_usd")[0]
        if hourly is not None:
            _tree_lock(ancestor_id)
            _check_window(limits.workflow_id, hourly, _tree(ancestor_id), estimate, now=now, owner=ancestor_id)
        ancestor_id = parent_id


def _tree_lock(workflow_id: int) -> None:
    """Serialize the reservations counted against one workflow's tree (its own, its descendants'):
    a lock of its own, taken after the reserving workflow's row lock, nearest ancestor first, so it
    never waits on a writer that locks parent then child (PostgreSQL; SQLite has one writer)."""
    advisory_xact_lock(TREE_LOCK_SPACE, workflow_id)


def _tree(workflow_id: int) -> list[int]:
    """The workflow and its descendants, level by level."""
    ids, level = [workflow_id], [workflow_id]
    while level:
        level = list(Workflow.objects.filter(parent_id__in=level).values_list("pk", flat=True))
        ids += level
    return ids


def _check_window(workflow_id: int, limit: Decimal, ids: list[int], estimate: Decimal, *, now: datetime,
                  owner: int) -> None:
    """``owner``'s hourly ``limit`` over the last hour of the workflows ``ids`` (``workflow_id`` asks)."""
    whose = "its" if owner == workflow_id else f"its ancestor workflow {owner}'s (over that workflow's tree)"
    window = list(UsageEntry.objects.filter(workflow_id__in=ids, created_at__gt=now - HOUR)
                  .order_by("created_at", "pk"))
    spend = total = sum((e.amount_usd for e in window), Decimal(0))
    if spend + estimate <= limit:
        return
    if estimate > limit:
        raise BudgetExhausted(
            f"{BUDGET_PAUSE_PREFIX}: one call of workflow {workflow_id} may cost {estimate:.4f} USD, more "
            f"than {whose} hourly budget of {limit:.4f}; raise it (`manage.py agent budget {owner} "
            f"--hourly USD`, or POST /api/workflows/{owner}/budget).",
            workflow_id=workflow_id,
        )
    for entry in window:
        spend -= entry.amount_usd
        if spend + estimate <= limit:
            retry_at = entry.created_at + HOUR
            break
    spent = (f"Workflow {workflow_id} spent {total:.4f} USD in the last hour (limit {limit:.4f})"
             if owner == workflow_id else
             f"The tree of workflow {owner} spent {total:.4f} USD in the last hour (its hourly limit {limit:.4f}, "
             f"which workflow {workflow_id} counts against)")
    raise BudgetDeferred(
        f"{spent}; the next call waits until {retry_at:%H:%M:%S} UTC.",
        workflow_id=workflow_id, retry_after_seconds=max((retry_at - now).total_seconds(), 1.0),
    )


def budget_charge_once(*, key: str, cost_usd: Decimal, usage: dict[str, int], request_id: str = "",
                       http_status: int | None = 200) -> bool:
    """Replace the reservation of one request with its real cost, from the usage the provider
    reported; also settles an uncertain entry whose usage became known (a late answer to a
    taken-over attempt, or the provider's usage report). True when this call charged it.

    Idempotent: conditional UPDATE on status reserved or uncertain; recording the same
    request again updates nothing, so a request is never counted twice. SQL, as the reservation.
    """
    return bool(budget_charge_write(key=key, cost_usd=cost_usd, usage=usage, request_id=request_id,
                                    http_status=http_status).run())


def budget_charge_write(*, key: str, cost_usd: Decimal, usage: dict[str, int], request_id: str = "",
                        http_status: int | None = 200) -> RowWrite:
    """``budget_charge_once`` as a write not yet made: a model call's charge goes in the statement
    of its ``model.called`` note (``ActivityContext.note_with``)."""
    return lifecycle.row_moving(UsageEntry, "charge", {"key": key}, cost_usd=cost_usd, usage=usage,
                                request_id=request_id, http_status=http_status, at=clock.now())


def budget_release_once(*, key: str, reason: str, http_status: int | None = None, request_id: str = "") -> bool:
    """Give back the reservation of a request that cost nothing: the provider answered it with an
    error (429, 529, 4xx, 5xx are not billed) or it never left the process (connection refused).

    Idempotent: conditional UPDATE on status reserved or uncertain; True when this call released it.
    """
    return bool(lifecycle.row_moving(UsageEntry, "release", {"key": key}, reason=reason, http_status=http_status,
                                     request_id=request_id, at=clock.now()).run())


def budget_uncertain_once(*, key: str, reason: str) -> bool:
    """Mark a request whose outcome is unknown (a timeout, a dropped connection, an answer that
    could not be read) as uncertain: the provider may have billed it, so its estimate keeps
    counting against the budget until ``budget_charge_once`` settles it with the real usage.

    Idempotent: conditional UPDATE on status reserved; True when this call marked it.
    """
    return bool(lifecycle.rows_move(UsageEntry.objects.filter(key=key), "doubt", reason=reason))


def usage_reservations_settle_orphaned() -> int:
    """Mark as uncertain the reservations whose attempt no longer runs: the worker died (or its
    lease was taken over) while the request was in flight, so nobody will charge or release it.
    Run by the lease sweep after it reaps; returns how many entries it marked.

    Idempotent: conditional UPDATE on status reserved and no running attempt
    (operation_id, attempt); an attempt still running keeps its reservations.
    """
    running = ActivityAttempt.objects.filter(
        activity__operation_id=OuterRef("operation_id"), number=OuterRef("attempt"),
        status=ActivityAttempt.Status.RUNNING,
    )
    orphaned = UsageEntry.objects.filter(status=UsageEntry.Status.RESERVED).filter(~Exists(running))
    return lifecycle.rows_move(orphaned, "doubt",
                               reason="no answer seen: the attempt that sent it stopped (worker died or lease lost)")


@transaction.atomic
def workflow_budget_set(
    *, workflow_id: int, user: Any, total_usd: Decimal | None = None, hourly_usd: Decimal | None = None
) -> Workflow:
    """An operator sets the budget (audited in the event history) and a workflow paused for
    budget resumes; if the new limits still leave no room, its next model call pauses it again.

    Not idempotent in its history: every call records a ``budget.changed`` event.
    """
    if total_usd is None and hourly_usd is None:
        raise InvalidInput("Give a total budget, an hourly budget or both (USD; --total and --hourly on the "
                           "command line, total_usd and hourly_usd over HTTP); nothing was changed.")
    total_usd = amount_checked(total_usd, what="The total budget")
    hourly_usd = amount_checked(hourly_usd, what="The hourly budget")
    workflow = workflow_lock(workflow_id)
    if workflow.is_terminal:
        raise TransitionRefused(f"Workflow {workflow_id} is {workflow.status}; its budget no longer matters.")
    now = clock.now()
    if total_usd is not None and workflow.parent_id is not None:
        _check_fits_in_ancestors(workflow, total_usd)
    old = {"total": _str(workflow.budget_total_usd), "hourly": _str(workflow.budget_hourly_usd)}
    if total_usd is not None:
        workflow.budget_total_usd = total_usd
    if hourly_usd is not None:
        workflow.budget_hourly_usd = hourly_usd
    workflow_save(workflow, "budget_total_usd", "budget_hourly_usd", at=now)
    event_record(workflow=workflow, kind="budget.changed", at=now, by=getattr(user, "username", ""), old=old,
                 new={"total": _str(workflow.budget_total_usd), "hourly": _str(workflow.budget_hourly_usd)})
    if workflow.status == Workflow.Status.PAUSED and workflow.pause_cause == Workflow.PauseCause.BUDGET:
        wake_locked(workflow, now=now, cause=f"budget raised by {getattr(user, 'username', '') or 'an operator'}")
    return workflow


def _check_fits_in_ancestors(child: Workflow, total_usd: Decimal) -> None:
    """Refuse a child's new total when what its parent counts for it would grow past what its
    ancestors have left: the tree's spend never passes the root's total. A parent counts a running
    child's whole budget (``selectors.children_reserved_usd``); growing it by X takes X from the
    parent's room, or, for a parent without a total of its own, from its parent's, and so on."""
    spent = spent_usd(child)
    counted = max(child.budget_total_usd, spent) if child.budget_total_usd is not None else spent
    growth = max(total_usd, spent) - counted
    if growth <= 0:
        return
    ancestor = child.parent
    while ancestor is not None:
        if ancestor.budget_total_usd is not None:
            room = ancestor.budget_total_usd - spent_usd(ancestor)
            if growth > room:
                raise InvalidInput(
                    f"Workflow {child.pk} is a child of workflow {child.parent_id}: a total of {total_usd:.4f} USD "
                    f"would count {growth:.4f} more against workflow {ancestor.pk}, which has {max(room, 0):.4f} "
                    f"of its {ancestor.budget_total_usd:.4f} left. Raise workflow {ancestor.pk}'s total first "
                    f"(`manage.py agent budget {ancestor.pk} --total USD`); nothing was changed.",
                    workflow_id=child.pk, field="total_usd")
            return
        ancestor = ancestor.parent


@transaction.atomic
def workflow_priority_set(*, workflow_id: int, priority: int, user: Any = None, by: str = "") -> Result:
    """Change a workflow's priority (0–10): from its next activity attempt on, its model calls wait
    in that band of the shared rate limits, and at 9 or above they may pass the hourly budget
    (never the total). A call already waiting keeps the band it asked in; an activity waiting for
    a concurrency slot takes its new place at once. Who changed it is recorded
    on the ``priority.changed`` event: ``user``'s name, else ``by``.

    Idempotent: the priority it already has returns ALREADY_APPLIED and records nothing. Raises
    InvalidInput for a priority out of range and TransitionRefused for a finished workflow; each
    changes nothing.
    """
    priority = priority_checked(priority)
    workflow = workflow_lock(workflow_id)
    if workflow.is_terminal:
        raise TransitionRefused(f"Workflow {workflow_id} is {workflow.status}; its priority no longer matters.",
                                workflow_id=workflow_id)
    if workflow.priority == priority:
        return Result.of(workflow, Outcome.ALREADY_APPLIED,
                         f"Workflow {workflow_id} already has priority {priority}; nothing changed.")
    now = clock.now()
    old, workflow.priority = workflow.priority, priority
    workflow_save(workflow, "priority", at=now)
    slots.priority_changed(workflow.pk, priority)
    event_record(workflow=workflow, kind="priority.changed", at=now, by=username_of(user) or by.strip()[:150],
                 old=old, new=priority)
    return Result.of(workflow, Outcome.APPLIED, f"Workflow {workflow_id} has priority {priority} (was {old}) from its "
                     "next activity attempt on" + (": it may pass the hourly budget, never the total." if priority >= 9
                                                   else "."))


def _str(value: Decimal | None) -> str | None:
    return None if value is None else str(value)


def pause_for_budget_locked(workflow: Workflow, error: BaseException, *, now: datetime) -> None:
    """Pause the workflow for a person: an attempt found the total budget spent (the lifecycle
    parked its activity and gave the attempt back)."""
    if workflow.status in (Workflow.Status.RUNNING, Workflow.Status.WAITING):
        workflow.pause(at=now, reason=str(error), cause=Workflow.PauseCause.BUDGET)
        event_record(workflow=workflow, kind="workflow.paused", at=now, reason=str(error),
                     cause=Workflow.PauseCause.BUDGET)
        workflow_save(workflow, "status", "reason", at=now)



# --- settling uncertain requests from the provider's usage ---------------------------------------

USAGE_FIELDS = ("input_tokens", "output_tokens", "cache_read_input_tokens", "cache_creation_input_tokens")
MAX_REPORT_LINES = 100_000


@dataclass(frozen=True)
class UsageReportLine:
    """One request of a usage report: its ledger key and either its usage (billed) or not billed."""

    line: int
    key: str
    usage: Usage | None
    request_id: str = ""
    reason: str = ""


@dataclass
class SettleSummary:
    """What settling a report did, per outcome, with the keys."""

    charged: list[str] = field(default_factory=list)
    released: list[str] = field(default_factory=list)
    already_settled: list[str] = field(default_factory=list)
    in_flight: list[str] = field(default_factory=list)
    charged_usd: Decimal = Decimal(0)
    reserved_usd: Decimal = Decimal(0)

    def to_json(self) -> dict[str, Any]:
        return {"charged": self.charged, "released": self.released, "already_settled": self.already_settled,
                "in_flight": self.in_flight, "charged_usd": str(self.charged_usd),
                "reserved_usd": str(self.reserved_usd)}

    @property
    def message(self) -> str:
        return (f"{len(self.charged)} uncertain requests charged ({self.charged_usd} USD where "
                f"{self.reserved_usd} USD was held), {len(self.released)} released as not billed; "
                f"{len(self.already_settled)} already settled, {len(self.in_flight)} still in flight (left as they "
                "are: their attempt will settle them).")


def usage_report_parse(lines: Iterable[str]) -> list[UsageReportLine]:
    """Parse a usage report: JSON Lines, one object per request that a gateway or the provider's
    logs matched to its ``x-agentops-usage-key``: ``{"key": …, "usage": {input_tokens,
    output_tokens, cache_read_input_tokens, cache_creation_input_tokens, cache_creation:
    {ephemeral_1h_input_tokens}}, "request_id": …}`` for a billed request (the Messages API's own
    ``usage`` object; other fields in it are ignored), ``{"key": …, "billed": false, "reason": …}``
    for one the provider did not bill. Blank lines are skipped.

    Raises InvalidInput naming every bad line (up to ten) and a key given twice, before anything
    is settled.
    """
    parsed: list[UsageReportLine] = []
    problems: list[str] = []
    seen: dict[str, int] = {}
    for number, raw in enumerate(lines, start=1):
        if number > MAX_REPORT_LINES:
            raise InvalidInput(f"The usage report has more than {MAX_REPORT_LINES:,} lines; split it.")
        if not raw.strip():
            continue
        try:
            entry = _report_line(number, raw)
        except InvalidInput as exc:
            problems.append(f"line {number}: {exc}")
            continue
        if entry.key in seen:
            problems.append(f"line {number}: key {entry.key!r} was already given on line {seen[entry.key]}")
        seen.setdefault(entry.key, number)
        parsed.append(entry)
    if problems:
        more = f"; and {len(problems) - 10} more" if len(problems) > 10 else ""
        raise InvalidInput("The usage report was not applied; nothing changed. " + "; ".join(problems[:10]) + more)
    return parsed


def _report_line(number: int, raw: str) -> UsageReportLine:
    try:
        data = json.loads(raw)
    except json.JSONDecodeError as exc:
        raise InvalidInput(f"not JSON ({exc.msg})") from None
    if not isinstance(data, dict) or not isinstance(data.get("key"), str) or not data["key"]:
        raise InvalidInput('not an object with a "key" string')
    key, usage, billed = data["key"], data.get("usage"), data.get("billed", True)
    if billed is False:
        if usage is not None:
            raise InvalidInput('gives both "usage" and "billed": false')
        return UsageReportLine(line=number, key=key, usage=None, reason=str(data.get("reason") or "")[:200])
    if billed is not True or not isinstance(usage, dict):
        raise InvalidInput('needs "usage" (the Messages API usage object) or "billed": false')
    counts: dict[str, int] = {}
    for name in USAGE_FIELDS:
        value = usage.get(name, 0)
        if value is None:
            value = 0
        if not isinstance(value, int) or isinstance(value, bool) or value < 0:
            raise InvalidInput(f"usage.{name} must be a whole number of tokens, 0 or more; got {value!r}")
        counts[name] = value
    by_ttl = usage.get("cache_creation") or {}
    written_1h = by_ttl.get("ephemeral_1h_input_tokens", 0) if isinstance(by_ttl, dict) else None
    if not isinstance(written_1h, int) or isinstance(written_1h, bool) or not 0 <= written_1h <= counts[
            "cache_creation_input_tokens"]:
        raise InvalidInput("usage.cache_creation.ephemeral_1h_input_tokens must be a whole number of tokens, "
                           "at most cache_creation_input_tokens")
    request_id = data.get("request_id") or ""
    if not isinstance(request_id, str):
        raise InvalidInput("request_id must be a string")
    return UsageReportLine(line=number, key=key, usage=Usage(**counts, cache_creation_1h_input_tokens=written_1h),
                           request_id=request_id[:120])


def usage_settle_from_report(*, report: list[UsageReportLine], user: Any = None) -> SettleSummary:
    """Settle the ledger's uncertain requests from a usage report (``usage_report_parse``): a
    billed one is charged its real cost (at its row's model's price), one not billed is released.
    Rows already charged or released are left as they are, and so are reserved ones (their
    attempt is still running and will settle them). Each workflow whose ledger changed gets a
    ``usage.settled`` event. All in one transaction.

    Idempotent: conditional UPDATEs on status uncertain (``budget_charge_once``,
    ``budget_release_once``); settling the same report again changes nothing. Raises
    InvalidInput, changing nothing, when a key is not in the ledger.
    """
    keys = [line.key for line in report]
    rows = {e.key: e for e in UsageEntry.objects.filter(key__in=keys)}
    unknown = [f"line {line.line}: {line.key!r}" for line in report if line.key not in rows]
    if unknown:
        raise InvalidInput("The usage report names requests that are not in the ledger, so nothing was settled: "
                           + ", ".join(unknown[:10]) + "; check the report is this installation's.")
    summary = SettleSummary()
    by_workflow: dict[int, list[str]] = {}
    with transaction.atomic():
        for line in report:
            entry = rows[line.key]
            if entry.status == UsageEntry.Status.RESERVED:
                summary.in_flight.append(line.key)
                continue
            if line.usage is None:
                done = entry.status == UsageEntry.Status.UNCERTAIN and budget_release_once(
                    key=line.key, reason=f"not billed, by the usage report{': ' + line.reason if line.reason else ''}")
                (summary.released if done else summary.already_settled).append(line.key)
            else:
                cost = cost_usd(entry.model, line.usage)
                done = entry.status == UsageEntry.Status.UNCERTAIN and budget_charge_once(
                    key=line.key, cost_usd=cost, usage=usage_fields(line.usage), request_id=line.request_id,
                    http_status=None)
                if done:
                    summary.charged.append(line.key)
                    summary.charged_usd += cost
                    summary.reserved_usd += entry.reserved_usd
                else:
                    summary.already_settled.append(line.key)
            if done:
                by_workflow.setdefault(entry.workflow_id, []).append(line.key)
        now = clock.now()
        for workflow_id, settled in sorted(by_workflow.items()):
            workflow = workflow_lock(workflow_id)
            event_record(workflow=workflow, kind="usage.settled", at=now, by=getattr(user, "username", ""),
                         keys=settled[:50], requests=len(settled))
    return summary
