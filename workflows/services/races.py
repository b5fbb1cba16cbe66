"""First-of waits (``ctx.wait_first``): decide once, under the workflow's row lock, which of a
signal, a child's end and a timer came first, record it on the wait, and close the losers."""
from __future__ import annotations

from datetime import datetime
from typing import Any

from workflows.models import Signal, Timer, Wait, Workflow
from workflows.services import lifecycle
from workflows.services.cancellation import children_cancel_live
from workflows.services.common import event_record, workflow_lock
from workflows.services.steps import child_commitments_adopt, child_wait_close
from workflows.services.visits import wake_locked


def first_wait_settle(workflow: Workflow, wait: Wait, *, now: datetime, signal: Signal | None = None,
                      timer_fired: bool = False) -> str:
    """Decide the race of the open first-of wait ``wait`` if one of its sources has come, and
    return the winner (``signal``, ``child`` or ``timer``), or "" while none has. The caller
    holds the workflow's row lock: a signal's delivery passes ``signal`` (the oldest queued of
    its name), a timer's firing ``timer_fired``; the opening of the wait and the collection of
    children's ends pass neither.

    When several have come by then, a child that has ended wins (the first of them in the order
    the handler gave), then the signal, then the timer: the children are locked after the
    workflow (parent first, child second, as everywhere) before their status is read, so a child
    cannot end between that read and its cancel, and a child's end that committed first is never
    undone for a signal that came after it. The winner is recorded on the wait (its payload,
    ``engine.first_outcome_of`` reads it) and the losers are closed: the wait's timer is ignored,
    the race's other children are cancelled (their effects undone, as for any cancelled child), and
    a signal that did not win is not consumed (it stays queued for the next wait of its name).

    Idempotent: only an open wait is settled, and settling satisfies it; a second call returns "".
    """
    if wait.status != Wait.Status.OPEN:
        return ""
    winner = _ended_child_wait(workflow, wait, now=now)
    payload: dict[str, Any]
    if winner is not None:
        payload = {"won": "child", "operation_id": winner.operation_id, "kind": winner.event_name,
                   "child": winner.payload}
    else:
        if signal is None and wait.event_name:
            signal = Signal.objects.filter(workflow=workflow, name=wait.event_name,
                                           consumed_by__isnull=True).order_by("pk").first()
        if signal is not None:
            payload = {"won": "signal", "signal": signal.name, "payload": signal.payload}
        elif timer_fired:
            payload = {"won": "timer"}
        else:
            return ""
    won = str(payload["won"])
    wait.satisfy(at=now, payload=payload)
    wait.save(update_fields=["status", "decided_at", "payload"])
    if won == "signal" and signal is not None:
        signal.consumed_by = wait
        signal.save(update_fields=["consumed_by"])
    _losers_close(workflow, wait, won=won, winner=winner, now=now)
    event_record(workflow=workflow, kind="wait.first_won", at=now, wait_id=wait.pk, won=won,
                 **({"operation_id": winner.operation_id} if winner is not None else {}),
                 **({"signal": signal.name, "dedupe_key": signal.dedupe_key} if won == "signal" and signal else {}))
    if workflow.status == Workflow.Status.WAITING or (workflow.status == Workflow.Status.PAUSED
                                                      and workflow.pause_cause == Workflow.PauseCause.OPERATOR):
        # An operator's pause holds the wake (recorded); the resume reads the settled wait.
        wake_locked(workflow, now=now, cause=f"first-of wait {wait.pk} won by the {won}")
    return won


def _ended_child_wait(workflow: Workflow, wait: Wait, *, now: datetime) -> Wait | None:
    """The child wait of the race whose child has ended, the first in the order given, or None.
    Every child of the race is locked (after the workflow) and an end not yet collected is
    recorded on its wait here, as ``children_collect_if_finished`` would."""
    if not wait.first_of:
        return None
    waits = {w.operation_id: w for w in Wait.objects.filter(workflow=workflow, kind=Wait.Kind.CHILD,
                                                            operation_id__in=wait.first_of)}
    children = dict(Workflow.objects.filter(parent_wait__in=list(waits.values())).values_list("parent_wait", "pk"))
    winner, closed = None, False
    for operation_id in wait.first_of:
        child_wait = waits.get(operation_id)
        if child_wait is None:
            continue
        pk = children.get(child_wait.pk)
        if child_wait.status == Wait.Status.OPEN and pk is not None:
            child = workflow_lock(pk)
            if child.is_terminal:
                child_wait_close(workflow, child_wait, child, now=now)
                closed = True
        if winner is None and child_wait.status == Wait.Status.SATISFIED:
            winner = child_wait
    if closed:
        # What a completed child made is the parent's from now on, as on any collection of its end.
        child_commitments_adopt(workflow, now=now)
    return winner


def _losers_close(workflow: Workflow, wait: Wait, *, won: str, winner: Wait | None, now: datetime) -> None:
    lifecycle.rows_move(wait.timers.filter(status=Timer.Status.PENDING), "ignore",
                        note=f"first-of wait {wait.pk} was won by the {won}")
    losers = [op for op in wait.first_of if winner is None or op != winner.operation_id]
    if losers:
        children_cancel_live(workflow, why=f"lost first-of wait {wait.pk} to the {won}",
                             by=f"first-of wait {wait.pk}", now=now, operation_ids=losers)


def first_waits_settle(workflow: Workflow, *, now: datetime) -> int:
    """Settle every open first-of wait of the workflow's current node visit whose child has
    ended (``children_collect_if_finished`` calls it after closing child waits). Returns how many."""
    settled = 0
    for wait in workflow.waits.filter(kind=Wait.Kind.FIRST, status=Wait.Status.OPEN,
                                      node_visit=workflow.node_visit).order_by("pk"):
        settled += bool(first_wait_settle(workflow, wait, now=now))
    return settled
