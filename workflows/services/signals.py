"""Signals: deliver a named message to a workflow, queued until a wait of its name (an event wait
or a first-of wait) takes it, once per dedupe key."""
from __future__ import annotations

from typing import Any

from django.db import transaction

from workflows import clock
from workflows.errors import InvalidInput, TransitionRefused
from workflows.models import Signal, Wait
from workflows.services.common import event_record, text_checked, workflow_lock
from workflows.services.races import first_wait_settle
from workflows.services.steps import Outcome, Result, signal_consume
from workflows.services.visits import wake_locked
from workflows.statestore import json_checked

SIGNAL_AUTO_KEY_PREFIX = "auto-"



# The keys of signed webhook deliveries: "webhook:<source>:<delivery id>". No caller of
# workflow_signal (the HTTP API, `agent signal`) may send a key here, so none can make a genuine
# delivery look like a repeat.
SIGNAL_WEBHOOK_KEY_PREFIX = "webhook:"



@transaction.atomic
def workflow_signal(*, workflow_id: int, name: str, payload: Any = None, dedupe_key: str = "") -> Result:
    """Deliver a named event to the workflow's open event wait for that name, or queue it.

    Signals are queued per name in order of arrival, and each event wait for a name receives
    the oldest one queued (when it opens, or when the next signal arrives). Outcome APPLIED: the
    signal satisfied an open wait now (the message names it); QUEUED: no wait for the name is
    open, the signal waits for the next one (``agent show`` lists it under ``signals_queued``).
    A signal is never answered as delivered when no wait received it.

    Idempotent per ``dedupe_key``: unique constraint ``uniq_signal_dedupe``; a repeated key
    returns ALREADY_APPLIED and changes nothing. Without a key, every delivery is a new signal,
    stored under a key of its own that starts with SIGNAL_AUTO_KEY_PREFIX. Raises InvalidInput,
    and stores nothing, for a key longer than the column or one in a reserved namespace
    (SIGNAL_AUTO_KEY_PREFIX, or SIGNAL_WEBHOOK_KEY_PREFIX: see workflow_signal_from_webhook).
    """
    if dedupe_key.startswith(SIGNAL_AUTO_KEY_PREFIX):
        raise InvalidInput(f"The dedupe key {dedupe_key[:40]!r} starts with {SIGNAL_AUTO_KEY_PREFIX!r}, which is "
                           "reserved for the keys of signals sent without one; choose a key without that prefix.")
    if dedupe_key.startswith(SIGNAL_WEBHOOK_KEY_PREFIX):
        raise InvalidInput(f"The dedupe key {dedupe_key[:40]!r} starts with {SIGNAL_WEBHOOK_KEY_PREFIX!r}, which is "
                           "reserved for signed webhook deliveries; choose a key without that prefix.")
    return _signal_deliver(workflow_id=workflow_id, name=name, payload=payload, dedupe_key=dedupe_key)



@transaction.atomic
def workflow_signal_from_webhook(*, workflow_id: int, name: str, payload: Any, source: str,
                                 delivery_id: str) -> Result:
    """Deliver the signal of a signed webhook delivery (its signature already verified).

    Idempotent per delivery: the key ``webhook:<source>:<delivery_id>`` (unique constraint
    ``uniq_signal_dedupe``), in the namespace workflow_signal refuses, so only a delivery the
    source signed can take it; the same delivery again returns ALREADY_APPLIED. Raises
    InvalidInput, and stores nothing, for an empty source or delivery id.
    """
    if not source or not delivery_id:
        raise InvalidInput("A webhook delivery needs its source and its delivery id; nothing was delivered.")
    return _signal_deliver(workflow_id=workflow_id, name=name, payload=payload,
                          dedupe_key=f"{SIGNAL_WEBHOOK_KEY_PREFIX}{source}:{delivery_id}")



def _signal_deliver(*, workflow_id: int, name: str, payload: Any, dedupe_key: str) -> Result:
    """The delivery both entry points share, inside their transaction: the key's namespace is theirs to check."""
    name = text_checked(name, what="The signal name", max_length=100)
    payload = json_checked(payload, what="The signal payload")
    max_key = Signal._meta.get_field("dedupe_key").max_length
    if max_key is not None and len(dedupe_key) > max_key:
        raise InvalidInput(f"The dedupe key is {len(dedupe_key)} characters long; the limit is {max_key}. "
                           "Send a shorter key, e.g. a hash of this one.")
    if any(c < " " or c == "\x7f" for c in dedupe_key):
        raise InvalidInput("The dedupe key holds a control character (NUL, a line break…); send printable text.")
    workflow = workflow_lock(workflow_id)
    keys = Signal.objects.filter(workflow=workflow)
    if dedupe_key:
        # Before the status: a repeat (a webhook redelivered after the workflow finished) is answered
        # as the repeat it is, not refused.
        earlier = keys.filter(dedupe_key=dedupe_key).first()
        if earlier is not None:
            where = "still queued" if earlier.consumed_by_id is None else f"delivered to wait {earlier.consumed_by_id}"
            return Result.of(workflow, Outcome.ALREADY_APPLIED,
                             f"A signal with dedupe key {dedupe_key!r} was received before ({where}); nothing changed.")
    if workflow.is_terminal:
        raise TransitionRefused(f"Workflow {workflow_id} is {workflow.status}; it takes no more signals.")
    now = clock.now()
    key = dedupe_key
    if not key:
        # A keyless signal is never a repeat. The seq of the event that records it makes its key
        # unique among generated ones; the suffix steps around a key a sender chose in this
        # namespace before it was reserved (such rows stay as they are).
        seq, n = workflow.event_seq + 1, 0
        key = f"{SIGNAL_AUTO_KEY_PREFIX}{seq}"
        while keys.filter(dedupe_key=key).exists():
            n += 1
            key = f"{SIGNAL_AUTO_KEY_PREFIX}{seq}.{n}"
    signal = Signal.objects.create(workflow=workflow, name=name, payload=payload, dedupe_key=key, received_at=now)
    wait = workflow.waits.filter(kind__in=(Wait.Kind.EVENT, Wait.Kind.FIRST), status=Wait.Status.OPEN,
                                 event_name=name).order_by("pk").first()
    queued = keys.filter(name=name, consumed_by__isnull=True)
    event_record(workflow=workflow, kind="signal.received", at=now, name=name, dedupe_key=key,
                 queued=wait is None)
    if wait is None:
        ahead = queued.count() - 1
        return Result.of(workflow, Outcome.QUEUED,
                         f"No wait for signal {name!r} is open on workflow {workflow_id}; the signal is queued"
                         + (f" behind {ahead} earlier one{'s' if ahead > 1 else ''}" if ahead else "")
                         + f" and the next wait for {name!r} receives it (oldest first).")
    # The oldest queued signal of the name: normally this one, since an open wait leaves none queued.
    oldest = queued.order_by("pk").first() or signal
    if wait.kind == Wait.Kind.FIRST:
        won = first_wait_settle(workflow, wait, now=now, signal=oldest)
        if won != "signal":
            return Result.of(workflow, Outcome.QUEUED,
                             f"Signal {name!r} came after the end of a child that wait {wait.pk} (first of) was "
                             f"waiting for, which won; the signal is queued and the next wait for {name!r} "
                             "receives it (oldest first).")
        return Result.of(workflow, Outcome.APPLIED, f"Signal {name!r} delivered to wait {wait.pk}.")
    signal_consume(workflow, wait, oldest, now=now)
    wake_locked(workflow, now=now, cause=f"signal {name}")
    return Result.of(workflow, Outcome.APPLIED, f"Signal {name!r} delivered to wait {wait.pk}.")
