"""The reminder's definition: REMIND, then WAIT_FOR_PAYMENT; paid completes it, silence reminds again."""
from __future__ import annotations

from typing import Any, TypedDict

from examples.reminder.activities import ReminderInput, send_reminder
from workflows.engine import Complete, Decision, Fail, Goto, NodeContext, WorkflowDefinition, node
from workflows.errors import InvalidInput
from workflows.registry import register_definition


class State(TypedDict, total=False):
    sent: list[str]  # message ids of the reminders sent so far


@register_definition
class Reminder(WorkflowDefinition):
    kind = "reminder"
    version = 1
    start_node = "REMIND"
    revalidate_node = "REMIND"

    def validate_params(self, params: dict[str, Any]) -> dict[str, Any]:
        """Everything a later node stores or sends is checked here, so bad input fails at launch."""
        unknown = sorted(set(params) - {"invoice", "email", "max_reminders", "days_between"})
        if unknown:
            raise InvalidInput(f"Unknown parameter(s) {', '.join(unknown)} for kind 'reminder'.")
        invoice, email = str(params.get("invoice", "")).strip(), str(params.get("email", "")).strip()
        if not 0 < len(invoice) <= 40:
            raise InvalidInput("Parameter invoice is required, at most 40 characters: --param invoice=INV-7.")
        if "@" not in email or len(email) > 200 or "\n" in email:
            raise InvalidInput("Parameter email must be one address: --param email=ap@example.com.")
        try:
            reminders = int(params.get("max_reminders", 3))
            days = float(params.get("days_between", 7))
        except (TypeError, ValueError):
            raise InvalidInput("Parameters max_reminders and days_between must be numbers.") from None
        if not 1 <= reminders <= 10 or not 0 < days <= 60:
            raise InvalidInput("max_reminders must be 1–10 and days_between above 0 and at most 60.")
        return {"invoice": invoice, "email": email, "max_reminders": reminders, "days_between": days}

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
