"""Retention: the checkpoints and events of workflows that finished long ago move to archive files.

A workflow that completed, failed or was cancelled more than AGENTOPS_RETENTION_DAYS ago (its
row's ``updated_at``, written when it finished) has its history written to
``AGENTOPS_ARCHIVE_DIR/<YYYY-MM of launch>/workflow-<id>.jsonl``, in `agent export-history`'s
JSON Lines format, and then its checkpoints and events are deleted, and the state blobs no
remaining row references. The workflow row stays, with ``history_archived_at`` and
``history_archive_path`` saying where the history went, and one new event, ``history.archived``.
Activities, attempts, waits, commitments and the usage ledger stay, and so do the blobs the row's
state and the activities' results reference (``agent show`` and the admin resolve them).

Order, so that a process killed at any point leaves a consistent state:

1. claim (its own transaction): ``select_for_update(skip_locked=True)`` on the due rows, then a
   conditional update of ``history_archive_claimed_at`` from the value read (a second beat
   claims nothing; a claim older than AGENTOPS_RETENTION_CLAIM_SECONDS is taken over);
2. write the archive to a temporary file in the same directory, fsync it, rename it over the
   final name, fsync the directory: the archive is whole or absent, never half;
3. under the workflow's row lock, only while the claim is still this run's: delete the
   checkpoints and events the archive holds (not an event recorded after it was written), then
   the workflow's blobs that nothing left references, mark the row, record ``history.archived``;
   one transaction.

Why deleting blobs cannot lose one a concurrent writer needs: a ``StateBlob`` row belongs to one
workflow (``uniq_state_blob`` is (workflow, digest), and every read looks blobs up by the workflow
that holds the reference), so only rows of this workflow can reference it. Every writer of this
workflow's blobs or of a row referencing them (a checkpoint or the row's state on entering a node,
an activity's result) holds its row lock, and looks up which blobs are stored after taking it.
Retention collects what the remaining rows reference and deletes the rest under the same lock, in
one transaction: a writer before it is seen, a writer after it finds the blobs gone and stores
them again. A fork copies the blobs of the state it starts from into rows of its own, under the
original's row lock, and is refused once the original is archived: made before the deletion, it
keeps its copies; after, it is not made. An export reads its own snapshot (``histories``), so it
sees the blobs of the checkpoints it reads, deleted meanwhile or not.

Killed after 2, the rows are all still there and unmarked; the next run after the claim expires
writes the archive again (the same name, replaced whole) and deletes.
"""
from __future__ import annotations

import itertools
import logging
import os
from datetime import datetime, timedelta
from pathlib import Path

from django.conf import settings
from django.db import transaction
from django.db.models import Q

from workflows import clock, faults, histories, statestore
from workflows.models import Activity, Checkpoint, Event, StateBlob, Workflow
from workflows.services.common import event_record, workflow_lock
from workflows.services.failures import row_isolated

logger = logging.getLogger("agentops.retention")


def histories_archive_due() -> int:
    """Archive the histories of at most AGENTOPS_RETENTION_BATCH_SIZE workflows that finished
    more than AGENTOPS_RETENTION_DAYS ago, oldest first (index ``wf_finished_unarchived_idx``);
    returns how many this run archived. AGENTOPS_RETENTION_DAYS = 0: none, ever.

    Safe at any moment, any number of times, from two beats at once: a workflow is archived only
    by the run whose claim (conditional update of ``history_archive_claimed_at``) is still on
    its row under the row lock; an archived workflow is never claimed again. Never touches a
    workflow that is not completed, failed or cancelled (checked at the claim and under the lock).
    """
    days = settings.AGENTOPS_RETENTION_DAYS
    if not days:
        return 0
    now = clock.now()
    claimed = _claim_due(now=now, finished_before=now - timedelta(days=days))
    return sum(
        row_isolated("archive_histories", pk, lambda pk: history_archive_if_claimed(workflow_id=pk, claimed_at=now),
                     workflow_id=lambda pk: pk)
        for pk in claimed
    )


@transaction.atomic
def _claim_due(*, now: datetime, finished_before: datetime) -> list[int]:
    """Claim due workflows: row locks skip the ones another run is claiming, and the conditional
    update holds where row locks do not (SQLite) or a claim was read stale."""
    stale = now - timedelta(seconds=settings.AGENTOPS_RETENTION_CLAIM_SECONDS)
    due = (Workflow.objects.select_for_update(skip_locked=True)
           .filter(status__in=Workflow.TERMINAL, history_archived_at__isnull=True, updated_at__lt=finished_before)
           .filter(Q(history_archive_claimed_at__isnull=True) | Q(history_archive_claimed_at__lt=stale))
           .order_by("updated_at", "pk"))
    claimed = []
    for pk, seen in due.values_list("pk", "history_archive_claimed_at")[: settings.AGENTOPS_RETENTION_BATCH_SIZE]:
        row = Workflow.objects.filter(pk=pk, history_archived_at__isnull=True, status__in=Workflow.TERMINAL)
        row = row.filter(history_archive_claimed_at__isnull=True) if seen is None else row.filter(
            history_archive_claimed_at=seen)
        if row.update(history_archive_claimed_at=now):
            claimed.append(pk)
    return claimed


def history_archive_if_claimed(*, workflow_id: int, claimed_at: datetime) -> bool:
    """Write the archive of a workflow this run claimed at ``claimed_at``, then delete the
    checkpoints and events it holds and mark the row; False (nothing deleted) when the claim is
    no longer this run's or the workflow was archived meanwhile. The archive is fsynced and in
    place before any row is deleted; the deletion and the marking are one transaction."""
    workflow = Workflow.objects.select_related("release").get(pk=workflow_id)
    if not _claim_held(workflow, claimed_at):
        return False
    path = archive_path(workflow)
    try:
        written = _archive_write(workflow, path)
    except histories.HistoryArchived:
        return False  # archived meanwhile by a run that took the claim over
    faults.faultpoint("retention.archive_written", workflow_id=workflow_id)
    with transaction.atomic():
        workflow = workflow_lock(workflow_id)
        if not _claim_held(workflow, claimed_at):
            return False  # another run took the claim over (this one was too slow) and archives it
        checkpoints = Checkpoint.objects.filter(workflow_id=workflow_id, node_visit__lte=written.last_visit)
        events = Event.objects.filter(workflow_id=workflow_id, seq__lte=written.last_event_seq)
        # One DELETE each: the ORM's delete() would load every checkpoint (its state too) to
        # null Workflow.checkpoint, which is nulled here instead.
        Workflow.objects.filter(pk=workflow_id).update(checkpoint=None)
        deleted_checkpoints = checkpoints._raw_delete(checkpoints.db)
        deleted_events = events._raw_delete(events.db)
        deleted_blobs = blobs_unreferenced_delete(workflow)
        now = clock.now()
        workflow.checkpoint = None
        workflow.history_archived_at = now
        workflow.history_archive_path = str(path)
        workflow.save(update_fields=["checkpoint", "history_archived_at", "history_archive_path"])
        event_record(workflow=workflow, kind="history.archived", at=now, path=str(path), visits=written.visits,
                     checkpoints=deleted_checkpoints, events=deleted_events, blobs=deleted_blobs,
                     through_seq=written.last_event_seq)
    logger.info("history.archived", extra={"workflow_id": workflow_id, "path": str(path),
                                           "checkpoints": deleted_checkpoints, "events": deleted_events,
                                           "blobs": deleted_blobs})
    return True


def blobs_unreferenced_delete(workflow: Workflow, *, per_statement: int = 500) -> int:
    """Delete the workflow's state blobs that no remaining row references (its row's state, its
    checkpoints left, its activities' results, and the items and chunks those reference); returns
    how many. The caller holds the workflow's row lock (the module's docstring: why that is safe)."""
    remaining = itertools.chain(
        [workflow.state],
        (value for pair in Checkpoint.objects.filter(workflow_id=workflow.pk).values_list("state", "delta")
         .iterator(chunk_size=per_statement) for value in pair),
        Activity.objects.filter(workflow_id=workflow.pk, result__isnull=False).values_list("result", flat=True)
        .iterator(chunk_size=per_statement))
    keep = statestore.blobs_referenced(workflow.pk, remaining)
    stored = StateBlob.objects.filter(workflow_id=workflow.pk).values_list("digest", flat=True)
    unreferenced = [d for d in stored.iterator(chunk_size=per_statement) if d not in keep]
    deleted = 0
    for i in range(0, len(unreferenced), per_statement):
        blobs = StateBlob.objects.filter(workflow_id=workflow.pk, digest__in=unreferenced[i:i + per_statement])
        deleted += blobs._raw_delete(blobs.db)
    return deleted


def _claim_held(workflow: Workflow, claimed_at: datetime) -> bool:
    return (workflow.status in Workflow.TERMINAL and workflow.history_archived_at is None
            and workflow.history_archive_claimed_at == claimed_at)


def archive_path(workflow: Workflow) -> Path:
    """Where the workflow's archive goes: the same name on every try (a retry replaces it)."""
    root = Path(settings.AGENTOPS_ARCHIVE_DIR)
    return root / f"{workflow.created_at:%Y-%m}" / f"workflow-{workflow.pk}.jsonl"


def _archive_write(workflow: Workflow, path: Path) -> histories.Written:
    """Write the history to ``path`` atomically and durably: a temporary file beside it (mode
    0600: states hold what the agent saw), fsynced, renamed over ``path``, the directory fsynced."""
    new_dirs = [d for d in (path.parent, path.parent.parent) if not d.exists()]
    path.parent.mkdir(parents=True, exist_ok=True)
    with histories.replaced(path) as out:
        written = histories.write(workflow, out)
    for directory in [path.parent, *(d.parent for d in new_dirs)]:
        _fsync_directory(directory)
    return written


def _fsync_directory(directory: Path) -> None:
    fd = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
