"""The reminder's definition: REMIND, then WAIT_FOR_PAYMENT; paid completes it, silence reminds again."""
from __future__ import annotations

from typing import Any, TypedDict

from pydantic import Field

from agentops.kind import (
    Complete,
    Decision,
    Fail,
    Goto,
    InvalidInput,
    LaunchParams,
    NodeContext,
    WorkflowDefinition,
    node,
    register_definition,
)
from examples.reminder.activities import ReminderInput, send_reminder


class ReminderParams(LaunchParams):
    invoice: str = Field(min_length=1, max_length=40, description="the invoice to collect, e.g. INV-7")
    email: str = Field(max_length=200, description="the one address the reminders go to")
    max_reminders: int = Field(3, ge=1, le=10, description="reminders sent before the workflow fails")
    days_between: float = Field(7.0, gt=0, le=60, description="days to wait for payment after each reminder")


class State(TypedDict, total=False):
    sent: list[str]  # message ids of the reminders sent so far


@register_definition
class Reminder(WorkflowDefinition):
    kind = "reminder"
    version = 1
    start_node = "REMIND"
    revalidate_node = "REMIND"
    launch_params = ReminderParams

    def validate_params(self, params: dict[str, Any]) -> dict[str, Any]:
        """The declared types and ranges first; then what a type cannot say. Everything a later
        node stores or sends is checked here, so bad input fails at launch."""
        typed = super().validate_params(params)
        if "@" not in typed["email"] or "\n" in typed["email"]:
            raise InvalidInput("Parameter email must be one address: --param email=ap@example.com.")
        return typed

    @node("REMIND")
    def remind(self, ctx: NodeContext[State]) -> Decision:
        sent = ctx.state.get("sent", [])
        message = ctx.activity(send_reminder, ReminderInput(
            invoice=ctx.params["invoice"], email=ctx.params["email"], number=len(sent) + 1))
        return Goto("WAIT_FOR_PAYMENT", {"sent": [*sent, message.message_id]})

    @node("WAIT_FOR_PAYMENT")
    def wait_for_payment(self, ctx: NodeContext[State]) -> Decision:
        payment = ctx.wait_for_event("paid", timeout_seconds=ctx.params["days_between"] * 86400)
        sent = ctx.state["sent"]
        if not payment.expired:
            return Complete({"paid": payment.payload, "reminders": len(sent)})
        if len(sent) >= ctx.params["max_reminders"]:
            return Fail(f"Invoice {ctx.params['invoice']} is still unpaid after {len(sent)} reminders.")
        return Goto("REMIND")
