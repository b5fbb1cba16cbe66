"""Failure boundaries: an advance that raises is recorded, retried with backoff and finally
paused for a person; a sweep row that raises is recorded and skipped. Neither undoes work
recorded before it, nor stops other workflows."""
from __future__ import annotations

import hashlib
import logging
import traceback
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime, timedelta
from pathlib import PurePath
from typing import Any

from django.conf import settings
from django.db import InterfaceError, OperationalError, transaction

from workflows import clock
from workflows.models import Event, Workflow
from workflows.services.common import (
    event_record,
    events_pending,
    events_pending_truncate,
    workflow_lock,
    workflow_save,
)
from workflows.services.steps import ChainSlot

logger = logging.getLogger("agentops.failures")

# A failed advance is tried again after 30 s, 60 s, 120 s … at most this far apart.
HANDLER_RETRY_FIRST_SECONDS = 30
HANDLER_RETRY_MAX_SECONDS = 30 * 60
MAX_MESSAGE_CHARS = 500
MAX_FRAMES = 5
# The connection itself failed (dropped, timed out, deadlocked): nothing is wrong with the
# workflow's code or data, so the error propagates and the caller's transaction is retried
# as a whole, as before the boundary existed.
INFRASTRUCTURE_ERRORS: tuple[type[BaseException], ...] = (OperationalError, InterfaceError)


@dataclass(frozen=True)
class AdvanceMark:
    """What the in-memory workflow looked like before an advance: a savepoint rollback puts
    the rows back, this puts back what the rows do not hold (batched events, the chain claim)."""

    event_seq: int
    events_pending: int
    status: str
    reason: str
    chain_claimed: bool

    @classmethod
    def take(cls, workflow: Workflow, chain: ChainSlot | None) -> AdvanceMark:
        return cls(event_seq=workflow.event_seq, events_pending=events_pending(workflow), status=workflow.status,
                   reason=workflow.reason, chain_claimed=chain is not None and chain.claim is not None)

    def restore(self, workflow: Workflow, chain: ChainSlot | None) -> None:
        """Match the in-memory workflow to its row after the savepoint rolled back."""
        workflow.refresh_from_db()
        # Events recorded in an ``events_batched`` block are written at its end, so the row's
        # event_seq lags behind them: take the counter from before the advance instead.
        workflow.event_seq = self.event_seq
        events_pending_truncate(workflow, self.events_pending)
        if chain is not None and not self.chain_claimed:
            chain.claim = None  # its activity row and attempt were rolled back with the savepoint


def handler_failure_record(workflow: Workflow, error: Exception, *, node: str, now: datetime) -> None:
    """Record an advance that raised, on a workflow restored to its state before the advance:
    a ``workflow.handler_failed`` event, and either a retry time (backoff) or, at
    AGENTOPS_HANDLER_MAX_FAILURES failures in a row, a pause for a person.

    A cancelling workflow cannot pause: it keeps retrying at the longest interval.
    """
    cap = settings.AGENTOPS_HANDLER_MAX_FAILURES
    workflow.handler_failures += 1
    failures = workflow.handler_failures
    error_text = f"{type(error).__name__}: {str(error)[:MAX_MESSAGE_CHARS]}"
    pause = workflow.status == Workflow.Status.RUNNING and failures >= cap
    retry_at = None if pause else now + timedelta(seconds=handler_retry_delay(failures))
    event_record(
        workflow=workflow, kind="workflow.handler_failed", at=now, node=node, error_type=type(error).__name__,
        message=str(error)[:MAX_MESSAGE_CHARS], traceback_sha256=traceback_digest(error),
        frames=last_frames(error), failures=failures, retry_at=retry_at.isoformat() if retry_at else None,
    )
    logger.warning("workflow.handler_failed", exc_info=error,
                   extra={"workflow_id": workflow.pk, "node": node, "failures": failures})
    workflow.advance_retry_at = retry_at
    if pause:
        times = "once" if failures == 1 else f"{failures} times in a row"
        reason = (f"Paused: advancing at node {node} failed {times}: {error_text}. "
                  "Recorded results are kept. Fix the cause (the workflow.handler_failed events hold the last "
                  f"frames), then `manage.py agent resume {workflow.pk}`; or `manage.py agent cancel "
                  f"{workflow.pk}`.")
        workflow.pause(at=now, reason=reason, cause=Workflow.PauseCause.HANDLER_FAILED)
        event_record(workflow=workflow, kind="workflow.paused", at=now, reason=reason,
                     cause=Workflow.PauseCause.HANDLER_FAILED)
        workflow_save(workflow, "status", "reason", "handler_failures", "advance_retry_at", at=now)
        return
    if retry_at is not None and workflow.status == Workflow.Status.RUNNING:
        # A cancelling workflow keeps its cancellation reason; agent show lists the failures.
        workflow.reason = (f"Advancing failed at node {node} ({failures} of {cap} tries): {error_text}. Recorded "
                           f"results are kept; it is tried again at {retry_at:%Y-%m-%d %H:%M:%S} UTC and pauses for "
                           f"a person after {cap} failures in a row. After a fix, `manage.py agent resume "
                           f"{workflow.pk}` tries at once.")
    workflow_save(workflow, "reason", "handler_failures", "advance_retry_at", at=now)


def handler_failures_clear(workflow: Workflow, mark: AdvanceMark, *, now: datetime) -> None:
    """After a successful advance: forget earlier failures, and the reason they wrote."""
    if not workflow.handler_failures and workflow.advance_retry_at is None:
        return
    if not workflow.is_terminal:  # a workflow that ended (a cancel finished) did not recover: its end says so
        event_record(workflow=workflow, kind="workflow.handler_recovered", at=now, node=workflow.current_node,
                     failures=workflow.handler_failures)
    workflow.handler_failures, workflow.advance_retry_at = 0, None
    fields = ["handler_failures", "advance_retry_at"]
    if mark.status == Workflow.Status.RUNNING and workflow.reason == mark.reason:
        workflow.reason = ""  # the failure's own text: the advance did not write a reason of its own
        fields.append("reason")
    workflow_save(workflow, *fields, at=now)


def handler_retry_delay(failures: int) -> float:
    """Seconds before the next try after ``failures`` failed advances in a row."""
    return float(min(HANDLER_RETRY_FIRST_SECONDS * 2 ** max(failures - 1, 0), HANDLER_RETRY_MAX_SECONDS))


def traceback_digest(error: BaseException) -> str:
    """SHA-256 of the formatted stack and the error type, without the message: the same bug
    digests alike in every workflow it hits, whatever values its message names."""
    formatted = "".join(traceback.format_tb(error.__traceback__)) + type(error).__qualname__
    return hashlib.sha256(formatted.encode("utf-8", "backslashreplace")).hexdigest()


def last_frames(error: BaseException) -> list[str]:
    """The innermost frames, as ``path:line in function: code`` (the last three path parts)."""
    frames = traceback.extract_tb(error.__traceback__)[-MAX_FRAMES:]
    return [f"{'/'.join(PurePath(f.filename).parts[-3:])}:{f.lineno} in {f.name}: {(f.line or '').strip()[:200]}"
            for f in frames]


def row_isolated(sweep: str, row_id: int, fn: Callable[[int], Any], *, workflow_id: Callable[[int], int | None]) -> int:
    """Run one sweep row in its own savepoint; a row that raises is logged, recorded on its
    workflow (``sweep.row_failed``, in a transaction of its own; once while it fails the same
    way) and counted as 0, so the batch goes on. ``workflow_id`` names the row's workflow, or
    None when it has none."""
    try:
        with transaction.atomic():
            return int(fn(row_id))
    except Exception as exc:
        logger.exception("sweep.row_failed", extra={"sweep": sweep, "row_id": row_id})
        _row_failure_record(sweep, row_id, exc, workflow_id=workflow_id)
        return 0


def _row_failure_record(sweep: str, row_id: int, error: Exception, *,
                        workflow_id: Callable[[int], int | None]) -> None:
    try:
        with transaction.atomic():
            pk = workflow_id(row_id)
            if pk is None:
                return
            workflow = workflow_lock(pk)
            digest = traceback_digest(error)
            last = Event.objects.filter(workflow=workflow, kind="sweep.row_failed", data__sweep=sweep,
                                        data__row_id=row_id).order_by("-seq").values_list("data", flat=True).first()
            if last is not None and last.get("traceback_sha256") == digest:
                return  # the same failure on every tick: the history keeps the first, the log every one
            event_record(workflow=workflow, kind="sweep.row_failed", at=clock.now(), sweep=sweep, row_id=row_id,
                         error_type=type(error).__name__, message=str(error)[:MAX_MESSAGE_CHARS],
                         traceback_sha256=digest)
    except Exception:
        # The row's workflow may be the broken part: the log line above is the record then.
        logger.exception("sweep.row_failure_unrecorded", extra={"sweep": sweep, "row_id": row_id})
