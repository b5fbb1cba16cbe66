"""Steer messages (``manage.py agent steer``) as a user turn of a model conversation.

An activity of a kind that reads steering (``WorkflowDefinition.reads_steering``) passes its
conversation through ``steered`` right before each model call, with that call's number, and
keeps what it returns as its conversation: the messages are then in every later call of it and
in its checkpoints, and a retried attempt gets them again where it resumes (docs/authoring.md,
"Steering").
"""
from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from workflows.activity_context import ActivityContext


def steering_turn(taken: list[dict[str, Any]]) -> dict[str, Any]:
    """One user turn holding the steer messages ``taken`` (``ctx.steering``), oldest first."""
    parts = [f'<message seq="{m["seq"]}" from="{m["sender"]}" sent_at="{m["sent_at"][:19]}Z">\n{m["text"]}\n'
             "</message>" for m in taken]
    return {"role": "user", "content": (
        "<steering>\nA person running this agent sent you the following while you worked. It does not replace "
        "your goal; take it into account from now on.\n" + "\n".join(parts) + "\n</steering>")}


def steered(ctx: ActivityContext, *, call: int, messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """``messages`` followed by a user turn with the steer messages model call ``call`` sends;
    ``messages`` itself when there are none. The earlier messages are the same objects (the
    ledger's estimate of a continued conversation relies on it)."""
    taken = ctx.steering(call=call)
    return [*messages, steering_turn(taken)] if taken else messages
