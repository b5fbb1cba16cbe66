"""The reminder's one activity: send a payment reminder, at most once per operation."""
from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

from django.conf import settings

from agentops.kind import ActivityContext, RetryPolicy, activity


@dataclass(frozen=True)
class ReminderInput:
    invoice: str
    email: str
    number: int  # 1 for the first reminder, 2 for the second, ...


@dataclass(frozen=True)
class ReminderSent:
    message_id: str
    path: str


def outbox() -> Path:
    """Where reminders are "sent": one file per message, standing in for a mail API."""
    return Path(settings.AGENTOPS_WORKSPACE_DIR) / "outbox"


@activity(retry=RetryPolicy(max_attempts=5, initial_interval_seconds=2.0))
def send_reminder(ctx: ActivityContext, input: ReminderInput) -> ReminderSent:
    """Write the reminder to the outbox under the idempotency key (the installation id, then the
    operation id), so an attempt retried after a crash finds the message sent and sends nothing
    again (a real mail API would take it as its idempotency key)."""
    path = outbox() / f"{ctx.idempotency_key.replace('/', '_')}.txt"
    if not path.exists():
        ctx.fence("send the reminder")  # still wanted? (not cancelled, goal not changed, not taken over)
        path.parent.mkdir(parents=True, exist_ok=True)
        draft = path.with_suffix(".draft")
        draft.write_text(f"To: {input.email}\nSubject: Invoice {input.invoice} (reminder {input.number})\n\n"
                         f"Invoice {input.invoice} is still open. Please pay it at your earliest convenience.\n")
        os.replace(draft, path)  # the message appears whole or not at all
    return ReminderSent(message_id=ctx.idempotency_key, path=str(path))
