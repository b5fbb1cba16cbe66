"""Steer messages: a person tells a running agent something; its next model call takes it.

A steer message is a row (``SteerMessage``), ordered per workflow. Sending one records it and a
``steer.received`` event naming who sent it; nothing is rung: the agent reads it at its next model
call. An activity of a kind that reads steering asks before each model call
(``ActivityContext.steering(call=n)``, through ``steering_take_if_current``) and sends what it gets
as a user turn. The rule that makes that exactly once (docs/authoring.md, "Steering"):

- a model call takes the messages no activity holds, in order, and records its activity and call
  number on them (``steer.delivered``), fenced by the attempt's lease;
- a later attempt of the same activity takes again the ones held at its call number or later (its
  conversation resumes before them: the checkpoint it resumes from was saved before they were
  added), so a retry neither loses nor repeats them: the conversation that goes on has each once;
- no other activity takes a held message while its activity is live, or once it succeeded
  (delivered); when its activity ended without a result (failed after its retries, voided by a
  new goal, a cancel or a replan) its conversation is gone, and the workflow's next model call
  takes it.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from django.db import transaction
from django.db.models import Max, Q

from workflows import clock, registry
from workflows.errors import InvalidInput, TransitionRefused
from workflows.leases import Claim
from workflows.models import Activity, SteerMessage, Workflow
from workflows.models.steering import ENDED_WITHOUT_RESULT, MAX_STEER_CHARS
from workflows.services import lifecycle
from workflows.services.common import event_record, text_checked, workflow_lock
from workflows.services.steps import Outcome, username_of
from workflows.sql import steering as sql_steering

TEXT_IN_EVENT = 300


@dataclass(frozen=True)
class SteerResult:
    """What ``workflow_steer`` did: ``outcome`` for code, ``message`` for a person."""

    outcome: Outcome
    message: str
    workflow_id: int
    status: str
    seq: int

    def to_json(self) -> dict[str, Any]:
        """The answer of ``agent steer --json`` and of POST /api/workflows/ID/steer."""
        return {"id": self.workflow_id, "outcome": self.outcome.value, "status": self.status, "seq": self.seq,
                "message": self.message}


def dedupe_key_checked(key: str) -> str:
    limit = SteerMessage._meta.get_field("dedupe_key").max_length or 0
    if len(key) > limit:
        raise InvalidInput(f"The dedupe key is {len(key)} characters long; the limit is {limit}. "
                           "Send a shorter key, e.g. a hash of this one.")
    if any(c < " " or c == "\x7f" for c in key):
        raise InvalidInput("The dedupe key holds a control character (NUL, a line break…); send printable text.")
    return key


@transaction.atomic
def workflow_steer(*, workflow_id: int, message: str, user: Any = None, by: str = "",
                   dedupe_key: str = "") -> SteerResult:
    """Record a steer message for the workflow's next model call (see the module's docstring).

    Who sent it is ``user``'s name, else ``by`` (the shell's login); it is recorded on the row and
    on the ``steer.received`` event. Idempotent per ``dedupe_key``: unique constraint
    ``uniq_steer_dedupe``, looked up under the workflow's row lock; the same key again returns
    ALREADY_APPLIED naming the first message and changes nothing. Without a key every call sends a
    new message. Raises InvalidInput for an empty or overlong message or key, TransitionRefused
    for a finished or cancelling workflow and for a kind whose model calls do not read steering;
    both change nothing.
    """
    text = text_checked(message, what="The steer message", max_length=MAX_STEER_CHARS)
    dedupe_key = dedupe_key_checked(dedupe_key)
    workflow = workflow_lock(workflow_id)
    if dedupe_key:
        earlier = SteerMessage.objects.filter(workflow=workflow, dedupe_key=dedupe_key).first()
        if earlier is not None:
            return SteerResult(Outcome.ALREADY_APPLIED,
                               f"Steer message #{earlier.seq} with dedupe key {dedupe_key!r} was sent to workflow "
                               f"{workflow_id} before; nothing changed.", workflow.pk, workflow.status, earlier.seq)
    if workflow.is_terminal or workflow.status == Workflow.Status.CANCELLING:
        raise TransitionRefused(
            f"Workflow {workflow_id} is {workflow.status}; it makes no more model calls, so no agent would read "
            f"the message. Fork it (`manage.py agent fork {workflow_id} --from-visit N`) or launch a new one.",
            workflow_id=workflow_id)
    if not registry.definition(workflow.kind).reads_steering:
        raise TransitionRefused(
            f"Workflow {workflow_id} is a {workflow.kind} workflow, whose model calls do not read steer messages; "
            "change its goal with `agent supersede`, or send it a signal its definition waits for.",
            workflow_id=workflow_id)
    now = clock.now()
    seq = (SteerMessage.objects.filter(workflow=workflow).aggregate(m=Max("seq"))["m"] or 0) + 1
    sender = username_of(user) or by.strip()[:150] or "unknown"
    SteerMessage.objects.create(workflow=workflow, seq=seq, text=text, sent_by=user, sender=sender,
                                dedupe_key=dedupe_key, sent_at=now)
    event_record(workflow=workflow, kind="steer.received", at=now, seq=seq, by=sender, dedupe_key=dedupe_key,
                 chars=len(text), text=text[:TEXT_IN_EVENT])
    return SteerResult(Outcome.APPLIED,
                       f"Steer message #{seq} recorded for workflow {workflow_id}; its next model call receives it "
                       "as a user turn (`agent show` says when it was delivered).", workflow.pk, workflow.status, seq)


def _takeable(claim: Claim, call: int) -> Q:
    return (Q(activity__isnull=True) | Q(activity_id=claim.activity_id, call__gte=call)
            | Q(activity__status__in=ENDED_WITHOUT_RESULT))


def steering_take_if_current(*, claim: Claim, call: int) -> list[dict[str, Any]] | None:
    """The steer messages model call ``call`` of the claimed attempt sends, oldest first, each
    recorded as held by its activity at that call (``steer.delivered``); None, changing nothing,
    when the attempt no longer holds its lease.

    Idempotent per (activity, call): a repeat, or a later attempt resuming at this call or before,
    takes the same messages again (see the module's docstring); row locks on the messages
    (``select_for_update``), then a re-check, keep two activities from taking one. A call that
    finds nothing to take reads one indexed query and writes nothing.
    """
    if not sql_steering.takeable_exists(claim.workflow_id, claim.activity_id, call):
        return []
    pending = SteerMessage.objects.filter(workflow_id=claim.workflow_id).filter(_takeable(claim, call))
    now = clock.now()
    with transaction.atomic():
        rows = list(pending.select_for_update(of=("self",)).order_by("seq"))
        # Locked: another activity's take committed meanwhile changes who holds a row; read it again.
        held = {a: s for a, s in Activity.objects.filter(
            pk__in={r.activity_id for r in rows if r.activity_id is not None}).values_list("pk", "status")}
        rows = [r for r in rows if r.activity_id is None or held.get(r.activity_id) in ENDED_WITHOUT_RESULT
                or (r.activity_id == claim.activity_id and (r.call or 0) >= call)]
        if not rows:
            return []
        events = []
        for row in rows:
            again = row.activity_id == claim.activity_id
            row.activity_id, row.call, row.taken_at = claim.activity_id, call, now
            events.append(("steer.delivered", now, {"seq": row.seq, "operation_id": claim.operation_id,
                                                   "attempt": claim.attempt, "call": call, "by": row.sender,
                                                   **({"again": True} if again else {})}))
        if not lifecycle.notes_if_current(claim, events):
            transaction.set_rollback(True)
            return None
        SteerMessage.objects.bulk_update(rows, ["activity", "call", "taken_at"])
    return [{"seq": r.seq, "text": r.text, "sender": r.sender, "sent_at": r.sent_at.isoformat()} for r in rows]
