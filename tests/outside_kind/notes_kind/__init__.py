"""A kind of an outside package: a reminder sleeps, then pins its note to a board once; a digest
has a reminder pinned by a child workflow and completes with the child's note."""
from __future__ import annotations

from typing import Any

from agentops.kind import (
    ActivityContext,
    Complete,
    Decision,
    Goto,
    LaunchParams,
    NodeContext,
    WorkflowDefinition,
    activity,
    node,
    register_definition,
)


class Board:
    """The outside system: every pin it was asked for, by idempotency key, in order."""

    def __init__(self) -> None:
        self.pins: list[tuple[str, str]] = []

    def pin(self, key: str, text: str) -> None:
        self.pins.append((key, text))

    def pinned(self, key: str) -> bool:
        return any(pinned == key for pinned, _ in self.pins)


BOARD = Board()


def pinned_already(ctx: ActivityContext, input: dict[str, Any]) -> dict[str, Any] | None:
    """After a lost attempt: the board already has the pin when that attempt got as far as pinning."""
    return {"pin": ctx.idempotency_key} if BOARD.pinned(ctx.idempotency_key) else None


@activity(lease_seconds=30, reconcile=pinned_already)
def pin_note(ctx: ActivityContext, input: dict[str, Any]) -> dict[str, Any]:
    ctx.faultpoint("activity.before_external_call")
    BOARD.pin(ctx.idempotency_key, input["text"])
    ctx.faultpoint("activity.after_external_call")
    return {"pin": ctx.idempotency_key}


class ReminderParams(LaunchParams):
    text: str
    delay_seconds: int = 0


class DigestParams(LaunchParams):
    text: str


@register_definition
class Reminder(WorkflowDefinition):
    kind = "outside_reminder"
    start_node = "SLEEP"
    revalidate_node = "SLEEP"
    launch_params = ReminderParams

    @node("SLEEP")
    def sleep(self, ctx: NodeContext[Any]) -> Decision:
        ctx.sleep(ctx.params["delay_seconds"])
        return Goto("PIN")

    @node("PIN")
    def pin(self, ctx: NodeContext[Any]) -> Decision:
        return Complete(ctx.activity(pin_note, {"text": ctx.params["text"]}))


@register_definition
class Digest(WorkflowDefinition):
    kind = "outside_digest"
    start_node = "GATHER"
    revalidate_node = "GATHER"
    launch_params = DigestParams

    @node("GATHER")
    def gather(self, ctx: NodeContext[Any]) -> Decision:
        reminder = ctx.child("outside_reminder", "Pin the digest's note",
                             {"text": ctx.params["text"], "delay_seconds": 0})
        (outcome,) = ctx.wait_children(reminder)
        return Complete({"child": outcome.workflow_id, "status": outcome.status, "note": outcome.result})
