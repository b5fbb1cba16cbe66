"""Pauses and resumes: `agent pause` holds a workflow where it is; `agent resume` lets it go on,
whatever paused it (an operator, failed advances, a definition's question), and retries failed
compensations."""
from __future__ import annotations

from datetime import datetime
from typing import Any

from django.db import transaction

from workflows import clock, doorbells
from workflows.errors import TransitionRefused
from workflows.models import Activity, Wait, Workflow
from workflows.services.cancellation import compensations_retry
from workflows.services.common import event_record, events_batched, text_checked, workflow_lock, workflow_save
from workflows.services.steps import Outcome, Result, username_of
from workflows.services.visits import wake_locked
from workflows.services.workflows import advance_locked

MAX_REASON_CHARS = 2000


@transaction.atomic
def workflow_pause(*, workflow_id: int, reason: str = "", user: Any = None, by: str = "") -> Result:
    """Pause a running or waiting workflow for an operator (``PauseCause.OPERATOR``).

    Nothing new starts while it is paused: no activity attempt is claimed (``activity_claim_if_runnable``
    refuses a paused workflow's), no advance runs (``advance_locked`` needs running), and a decision,
    signal or timer that would wake it is recorded on its wait but leaves it paused (``wake_locked``).
    Attempts already running are not stopped: they finish and their results are recorded, to be
    used when it resumes (``workflow_resume``), so no effect is cut off halfway or repeated.
    Who paused is recorded on the ``workflow.paused`` event: ``user``'s name, else ``by``.

    Idempotent: a workflow already paused by an operator returns ALREADY_APPLIED and changes nothing
    (status and cause checked under the row lock). Raises TransitionRefused, changing nothing, for a
    workflow paused for another cause (budget, stagnation, …: that cause says what resumes it),
    cancelling or finished.
    """
    reason = text_checked(reason, what="The reason", max_length=MAX_REASON_CHARS) if reason.strip() else ""
    workflow = workflow_lock(workflow_id)
    if workflow.status == Workflow.Status.PAUSED:
        if workflow.pause_cause == Workflow.PauseCause.OPERATOR:
            return Result.of(workflow, Outcome.ALREADY_APPLIED,
                             f"Workflow {workflow_id} was already paused by an operator ({workflow.reason}); nothing "
                             f"changed. `manage.py agent resume {workflow_id}` lets it go on.")
        cause = Workflow.PauseCause(workflow.pause_cause).label if workflow.pause_cause else "paused"
        raise TransitionRefused(f"Workflow {workflow_id} is already paused ({cause}: {workflow.reason[:300]}); "
                                "nothing new starts while it is, so there is nothing more to pause. Resolve that "
                                "pause first; once it runs again, pause it if you still want to.",
                                workflow_id=workflow_id)
    if workflow.status not in (Workflow.Status.RUNNING, Workflow.Status.WAITING):
        raise TransitionRefused(f"Workflow {workflow_id} is {workflow.status}; only a running or waiting workflow "
                                "can be paused.", workflow_id=workflow_id)
    now = clock.now()
    who = username_of(user) or by.strip()[:150] or "unknown"
    was = workflow.status
    running = list(workflow.activities.filter(status=Activity.Status.RUNNING).values_list("operation_id", flat=True))
    workflow.pause(at=now, reason=reason or f"paused by {who}", cause=Workflow.PauseCause.OPERATOR)
    event_record(workflow=workflow, kind="workflow.paused", at=now, reason=workflow.reason,
                 cause=Workflow.PauseCause.OPERATOR, by=who, was=was, node=workflow.current_node,
                 running=running[:20])
    workflow_save(workflow, "status", "reason", at=now)
    finishing = (f" {len(running)} running activit{'ies finish' if len(running) > 1 else 'y finishes'} and "
                 f"{'their results are' if len(running) > 1 else 'its result is'} recorded;" if running else "")
    return Result.of(workflow, Outcome.APPLIED,
                     f"Workflow {workflow_id} is paused at {workflow.current_node}: nothing new starts.{finishing} "
                     f"`manage.py agent resume {workflow_id}` goes on from there.")


def operator_resume_locked(workflow: Workflow, *, now: datetime, by: str) -> Result:
    """Resume a workflow an operator paused (the caller holds its row lock): it goes on exactly where
    it stopped. Results recorded meanwhile are replayed by the advance, never re-run; a workflow
    that was waiting and whose wait is still open waits again (a wait decided while it was paused is
    taken up by the advance)."""
    event_record(workflow=workflow, kind="workflow.resumed", at=now, by=by, cause=Workflow.PauseCause.OPERATOR)
    workflow.reason = ""  # the pause's reason goes with the pause
    workflow_save(workflow, "reason", at=now)
    wake_locked(workflow, now=now, cause=f"resumed by {by}", resume=True)
    if workflow.status != Workflow.Status.RUNNING:  # its release policy ended it
        return Result.of(workflow, Outcome.APPLIED, f"Workflow {workflow.pk} resumed; it is {workflow.status}.")
    open_waits = list(workflow.waits.filter(status=Wait.Status.OPEN, node_visit=workflow.node_visit,
                                            intent_version=workflow.intent_version).order_by("pk"))
    if open_waits:
        workflow.park(at=now)
        workflow_save(workflow, "status", at=now)
        names = ", ".join(f"{w.kind} wait {w.pk}" for w in open_waits)
        return Result.of(workflow, Outcome.APPLIED,
                         f"Workflow {workflow.pk} resumed; it waits on {names} again, as before the pause.")
    return Result.of(workflow, Outcome.APPLIED,
                     f"Workflow {workflow.pk} resumed at {workflow.current_node}; it goes on from there.")


@transaction.atomic
def workflow_resume(*, workflow_id: int, user: Any = None, by: str = "") -> Result:
    """Resume a paused workflow, retry failed compensations (of a workflow in any state), or
    re-ring a running one whose doorbell may be lost.

    A workflow an operator paused goes on exactly where it stopped (``operator_resume_locked``).
    A workflow paused, or backing off, after failed advances is advanced at once, in this
    call, with a fresh count of failures: HANDLER_FAILED when it fails again (recorded).
    Idempotent: resuming a running workflow only rings its doorbell again; only failed
    compensations get new attempts (conditional UPDATE on status=failed).
    Raises TransitionRefused for waiting and terminal workflows, naming what they wait for.
    """
    workflow = workflow_lock(workflow_id)
    now = clock.now()
    by = username_of(user) or by.strip()[:150] or "an operator"
    if workflow.status == Workflow.Status.PAUSED and workflow.pause_cause == Workflow.PauseCause.BUDGET:
        raise TransitionRefused(f"Workflow {workflow_id} is paused because its budget ran out; resuming would pause "
                                f"it again at its next model call. Raise the budget (`manage.py agent budget "
                                f"{workflow_id} --total USD --user NAME`, or POST "
                                f"/api/workflows/{workflow_id}/budget), which resumes it.")
    # A compensation out of attempts leaves an effect nothing undoes, whatever the workflow's state.
    retried = compensations_retry(workflow, now=now)
    if workflow.status == Workflow.Status.PAUSED and workflow.pause_cause == Workflow.PauseCause.OPERATOR:
        return operator_resume_locked(workflow, now=now, by=by)
    if workflow.status == Workflow.Status.PAUSED:
        failed = workflow.pause_cause == Workflow.PauseCause.HANDLER_FAILED
        if workflow.pause_cause == Workflow.PauseCause.DEFINITION:
            workflow.reason = ""  # the question was for the person who just answered it
            workflow_save(workflow, "reason", at=now)
        wake_locked(workflow, now=now, cause=f"resumed by {by}")
        return _advance_now(workflow, now=now, by=by) if failed else _resumed(workflow)
    if workflow.status == Workflow.Status.RUNNING and workflow.handler_failures:
        return _advance_now(workflow, now=now, by=by)
    if retried:
        return Result.of(workflow, Outcome.APPLIED, f"Workflow {workflow_id}: {retried} failed compensation"
                                                    f"{'s get' if retried > 1 else ' gets'} new attempts.")
    if workflow.status in (Workflow.Status.RUNNING, Workflow.Status.CANCELLING):
        doorbells.workflow_advance(workflow_id=workflow.pk)
        return Result.of(workflow, Outcome.ALREADY_APPLIED,
                         f"Workflow {workflow_id} was already {workflow.status}; its doorbell was rung again.")
    if workflow.status == Workflow.Status.WAITING:
        waits = ", ".join(f"{w.kind} wait {w.pk}" for w in workflow.waits.filter(status=Wait.Status.OPEN))
        raise TransitionRefused(
            f"Workflow {workflow_id} is waiting on {waits or 'a wait'}; decide or signal it instead."
        )
    raise TransitionRefused(f"Workflow {workflow_id} is {workflow.status}; it cannot be resumed.")



def _resumed(workflow: Workflow) -> Result:
    return Result.of(workflow, Outcome.APPLIED, f"Workflow {workflow.pk} resumed; it is {workflow.status}.")



def _advance_now(workflow: Workflow, *, now: datetime, by: str) -> Result:
    """Advance a workflow after its handler failures, presumably fixed, with a fresh count
    (the failures' reason goes with them; a new failure writes its own)."""
    if workflow.status != Workflow.Status.RUNNING:
        return _resumed(workflow)  # waking it ended it (its release policy) or sent it elsewhere
    event_record(workflow=workflow, kind="workflow.advance_retried", at=now, by=by,
                 failures=workflow.handler_failures)
    workflow.handler_failures, workflow.advance_retry_at, workflow.reason = 0, None, ""
    workflow_save(workflow, "handler_failures", "advance_retry_at", "reason", at=now)
    with events_batched(workflow):
        outcome = advance_locked(workflow)
    if outcome == Outcome.HANDLER_FAILED:
        return Result.of(workflow, outcome, f"Workflow {workflow.pk} was resumed, but advancing failed again: "
                                            f"{workflow.reason}")
    return _resumed(workflow)
