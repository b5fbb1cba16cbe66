"""Telling approvers that a decision waits: the ``notify_approvers`` activity (email, webhook).

Sending is at most once per wait and purpose. Neither SMTP nor an incoming webhook takes an
idempotency key, so a resent message is a second message in someone's inbox. Before each
channel the activity records, in a fenced checkpoint, that it is about to send; an attempt
that finds that record (its predecessor stopped between the record and the outcome) does not
send again, and fails with "may have been sent" instead. Only an error that proves nothing
left (connection refused, DNS, a refused login: no message was handed over) is retried.

Secrets stay out of durable state: the input is a wait id and a purpose, the result names
recipients by username, and error texts are scrubbed of the webhook URL and SMTP password.
"""
from __future__ import annotations

import json
import logging
import smtplib
import urllib.error
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from django.conf import settings
from django.contrib.auth import get_user_model
from django.core.mail import EmailMessage, get_connection
from django.db.models import Q
from django.urls import reverse

from workflows import clock
from workflows.activity_context import ActivityContext
from workflows.authority import wait_authority_refusal
from workflows.errors import Permanent, Retryable
from workflows.models import Wait
from workflows.registry import RetryPolicy, activity

logger = logging.getLogger("agentops.notifications")

NOTIFY_ACTIVITY = "notify_approvers"
OPENED = "opened"
REMINDER = "reminder"
# Phases of a channel in the attempt's checkpoint.
SENDING, SENT, NOT_SENT = "sending", "sent", "not_sent"
MAX_GOAL_CHARS_IN_MESSAGE = 500


class NotSent(Retryable):
    """A channel failed before anything was handed over; the next attempt may send it."""


@dataclass(frozen=True)
class NotifyInput:
    """Which wait to tell its approvers about, and why (``opened`` or ``reminder``)."""

    wait_id: int
    purpose: str = OPENED


@dataclass
class NotifyResult:
    """What was sent: ``email``/``webhook`` are ``sent``, ``off`` (not configured) or ``nobody``
    (no approver has an address); ``skipped`` says why nothing was sent at all."""

    wait_id: int
    purpose: str
    email: str = "off"
    webhook: str = "off"
    recipients: list[str] = field(default_factory=list)
    skipped: str = ""


def admin_card_url(wait_id: int) -> str:
    """The wait's card in the approval queue, as approvers reach the site."""
    base = settings.AGENTOPS_ADMIN_BASE_URL.rstrip("/")
    return f"{base}{reverse('admin:workflows_wait_approvals')}#wait-{wait_id}"


def approvers_of(wait: Wait) -> list[Any]:
    """The active users who may decide ``wait``, as the approval service decides who may:
    members of its role group and superusers, less the launcher and the goal's author unless
    AGENTOPS_ALLOW_SELF_APPROVAL (``wait_authority_refusal``)."""
    users = get_user_model().objects.filter(is_active=True).filter(
        Q(groups__name=wait.required_role) | Q(is_superuser=True)
    ).distinct().order_by("pk")
    return [u for u in users if not wait_authority_refusal(wait=wait, user=u)]


def message_text(wait: Wait, purpose: str) -> tuple[str, str]:
    """(subject, body) of the notification; plain text, the same for every channel."""
    workflow = wait.workflow
    goal = workflow.intents.filter(version=wait.intent_version).values_list("goal", flat=True).first() or ""
    if len(goal) > MAX_GOAL_CHARS_IN_MESSAGE:
        goal = goal[:MAX_GOAL_CHARS_IN_MESSAGE] + "…"
    expires = f"{wait.expires_at:%Y-%m-%d %H:%M} UTC" if wait.expires_at else "never"
    if purpose == REMINDER:
        subject = f"Approval expiring: workflow {workflow.pk} ({workflow.kind}), wait {wait.pk}"
        lead = f"An approval is still waiting and expires at {expires}."
    else:
        subject = f"Approval waiting: workflow {workflow.pk} ({workflow.kind}), wait {wait.pk}"
        lead = f"A decision waits for a member of {wait.required_role!r}; it expires at {expires}."
    body = (f"{lead}\n\nWorkflow {workflow.pk} ({workflow.kind}), node {wait.node}, intent v{wait.intent_version}.\n"
            f"Goal: {goal}\n\nDecide here: {admin_card_url(wait.pk)}\n")
    return subject, body


def _scrubbed(text: str) -> str:
    """``text`` without the secrets an error message could echo."""
    for secret in (settings.AGENTOPS_NOTIFY_WEBHOOK_URL, settings.EMAIL_HOST_PASSWORD):
        if secret:
            text = text.replace(secret, "[secret]")
    return text


def email_send(recipients: list[Any], subject: str, body: str) -> None:
    """One message per approver over one connection. Raises NotSent when the connection or the
    login failed (nothing was handed over); any later error may follow a delivered message."""
    connection = get_connection(fail_silently=False)
    try:
        connection.open()
    except (OSError, smtplib.SMTPException) as exc:
        raise NotSent(_scrubbed(f"{type(exc).__name__}: {exc}")) from None
    try:
        connection.send_messages([EmailMessage(subject, body, to=[u.email], connection=connection)
                                  for u in recipients])
    finally:
        connection.close()


def webhook_send(text: str) -> None:
    """POST ``{"text": ...}`` (Slack's incoming-webhook shape) to AGENTOPS_NOTIFY_WEBHOOK_URL.
    Raises NotSent when the request could not be made (connection, DNS); an HTTP error status
    or a lost answer may follow a posted message."""
    request = urllib.request.Request(
        settings.AGENTOPS_NOTIFY_WEBHOOK_URL, data=json.dumps({"text": text}).encode(),
        headers={"Content-Type": "application/json"}, method="POST",
    )
    try:
        with urllib.request.urlopen(request, timeout=settings.AGENTOPS_HTTP_TIMEOUT_SECONDS) as answer:
            answer.read(1024)
    except urllib.error.HTTPError as exc:
        raise RuntimeError(f"the webhook answered HTTP {exc.code}") from None
    except urllib.error.URLError as exc:
        # urllib wraps only errors of connecting and sending the request in URLError.
        raise NotSent(_scrubbed(f"the webhook could not be reached: {exc.reason}")) from None


def slack_escaped(text: str) -> str:
    """Slack reads <…> as links and mentions; a goal must not ping a channel."""
    return text.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")


NOTIFY_RETRY = RetryPolicy(max_attempts=5, initial_interval_seconds=10.0, backoff=3.0, max_interval_seconds=900.0)


@activity(NOTIFY_ACTIVITY, retry=NOTIFY_RETRY)
def notify_approvers(ctx: ActivityContext, input: NotifyInput) -> NotifyResult:
    """Tell the approvers of an open approval wait, at most once per channel (module docstring).

    Sends nothing for a wait that is no longer open (decided, expired, invalidated).
    """
    result = NotifyResult(wait_id=input.wait_id, purpose=input.purpose)
    wait = Wait.objects.select_related("workflow").filter(pk=input.wait_id).first()
    if wait is None or wait.kind != Wait.Kind.APPROVAL or wait.status != Wait.Status.OPEN:
        result.skipped = f"wait {input.wait_id} is {wait.status if wait else 'gone'}"
        return result
    if wait.expires_at is not None and wait.expires_at <= clock.now():
        result.skipped = f"wait {input.wait_id} expired at {wait.expires_at:%Y-%m-%d %H:%M:%S}"
        return result
    subject, body = message_text(wait, input.purpose)
    recipients = [u for u in approvers_of(wait) if u.email]
    result.recipients = [u.username for u in recipients]
    channels: list[tuple[str, Callable[[], None]]] = []
    if recipients:
        channels.append(("email", lambda: email_send(recipients, subject, body)))
    else:
        result.email = "nobody"
    if settings.AGENTOPS_NOTIFY_WEBHOOK_URL:
        channels.append(("webhook", lambda: webhook_send(slack_escaped(f"*{subject}*\n{body}"))))
    _channels_send_at_most_once(ctx, channels, result)
    return result


def _channels_send_at_most_once(ctx: ActivityContext, channels: list[tuple[str, Callable[[], None]]],
                                result: NotifyResult) -> None:
    state = dict(ctx.resume or {})
    uncertain = []
    for name, send in channels:
        if state.get(name) == SENT:
            setattr(result, name, SENT)
            continue
        if state.get(name) == SENDING:
            # An earlier attempt recorded that it was about to send and stopped before
            # recording the outcome: the message may be in inboxes already.
            uncertain.append(f"{name}: an earlier attempt stopped while sending")
            continue
        state[name] = SENDING
        ctx.checkpoint(state, detail=f"sending {name}", force=True)  # fenced: LeaseLost stops here
        ctx.faultpoint("notify.before_send", channel=name)
        try:
            send()
        except NotSent:
            state[name] = NOT_SENT
            ctx.checkpoint(state, detail=f"{name} not sent", force=True)
            raise
        except Exception as exc:  # noqa: BLE001 - after the hand-over any error may follow a delivery
            logger.warning("notify.outcome_unknown", extra={"operation_id": ctx.operation_id, "channel": name})
            state[name] = SENDING  # left as "sending": a retry must not send again
            uncertain.append(_scrubbed(f"{name}: {type(exc).__name__}: {exc}"))
            continue
        state[name] = SENT
        ctx.checkpoint(state, detail=f"{name} sent", force=True)
        setattr(result, name, SENT)
    if uncertain:
        raise Permanent(
            f"Notification {ctx.operation_id} may have been delivered and is not sent again (at most once): "
            + "; ".join(uncertain) + ". The approval queue still lists the wait.",
            operation_id=ctx.operation_id,
        )
