"""Approvers are told when a decision waits: once per wait, by email and webhook, never blocking it."""
from __future__ import annotations

import json
import socket
import threading
from collections.abc import Iterator
from datetime import timedelta
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest
from aiosmtpd.controller import Controller
from django.contrib.auth.models import Group, User
from django.core import mail

from tests.conftest import drive, open_approval
from workflows import clock, engine, replay, services
from workflows.features.notifications.activity import NOTIFY_ACTIVITY
from workflows.features.notifications.services import NOTIFY_NODE
from workflows.features.notifications.services import approval_reminders_schedule_due as approval_reminders_schedule
from workflows.models import Activity, Event, Wait, Workflow
from workflows.services import RunOutcome
from workflows.testing import registered

KIND = "test-notify-gate"
ROLE = "notify-approvers"
BASE = "https://agentops.example.org"
SECRET_HOOK_PATH = "/hooks/T000/B000/secret-token-42"


class NotifyGate(engine.WorkflowDefinition):
    kind = KIND
    start_node = "ASK"
    revalidate_node = "ASK"

    @engine.node("ASK")
    def ask(self, ctx: engine.NodeContext) -> engine.Decision:
        outcome = ctx.approval(candidate={"change": "x"}, candidate_hash="h1", role=ROLE,
                               expires_in_seconds=3 * 3600, state_versions={})
        return engine.Complete() if outcome.approved else engine.Fail("rejected")


@pytest.fixture(autouse=True)
def gate_registered(settings: Any) -> Iterator[None]:
    settings.AGENTOPS_ADMIN_BASE_URL = BASE
    settings.AGENTOPS_ALLOW_SELF_APPROVAL = False
    settings.AGENTOPS_NOTIFY_WEBHOOK_URL = ""
    settings.AGENTOPS_APPROVAL_REMINDER_HOURS = 1.0
    with registered(NotifyGate):
        yield


@pytest.fixture
def people(db: None) -> dict[str, User]:
    """Two approvers, a superuser, and four who must not be told."""
    group = Group.objects.get_or_create(name=ROLE)[0]
    made = {}
    for name, in_group, extra in [("alice", True, {}), ("bob", True, {}), ("rita", True, {}),
                                  ("carol", True, {"is_active": False}), ("oscar", False, {}),
                                  ("nomail", True, {"email": ""})]:
        user = User.objects.create_user(name, email=extra.pop("email", f"{name}@example.org"), **extra)
        if in_group:
            user.groups.add(group)
        made[name] = user
    made["root"] = User.objects.create_superuser("root", email="root@example.org", password="x")
    return made


def launch(people: dict[str, User]) -> Workflow:
    """A gate launched by rita (an approver herself, so she may not decide it), driven to its wait."""
    workflow = services.workflow_launch(kind=KIND, goal="Ship <!channel> & more", user=people["rita"])
    return drive(workflow.pk)


def notification(workflow: Workflow, purpose: str = "opened") -> Activity:
    return Activity.objects.get(workflow=workflow, name=NOTIFY_ACTIVITY, input__purpose=purpose)


def card(wait: Wait) -> str:
    return f"{BASE}/admin/workflows/wait/approvals/#wait-{wait.pk}"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def test_opened_approval_emails_each_approver_once_with_the_link(people):
    """Each approver gets one email naming the card; the launcher, the inactive, the outsider do not."""
    workflow = launch(people)
    wait = open_approval(workflow.pk)
    assert workflow.status == Workflow.Status.WAITING
    assert sorted(m.to[0] for m in mail.outbox) == ["alice@example.org", "bob@example.org", "root@example.org"]
    assert all(len(m.to) == 1 and card(wait) in m.body for m in mail.outbox)
    assert mail.outbox[0].subject == f"Approval waiting: workflow {workflow.pk} ({KIND}), wait {wait.pk}"
    sent = notification(workflow)
    assert (sent.node, sent.node_visit, sent.status) == (NOTIFY_NODE, 0, Activity.Status.SUCCEEDED)
    assert sent.operation_id == f"{wait.operation_id}/notify"
    assert sent.result["recipients"] == ["alice", "bob", "root"]


def test_duplicate_doorbell_sends_nothing_more(people):
    """A second doorbell for a notification that ran finds nothing to claim."""
    workflow = launch(people)
    assert services.activity_run_if_runnable(activity_id=notification(workflow).pk) == RunOutcome.SKIPPED
    assert len(mail.outbox) == 3


def test_retry_that_finds_the_sending_record_does_not_send_again(people):
    """An attempt that sent and died before recording its result leaves "sending" in its
    checkpoint; the retry fails with "may have been delivered" instead of sending again."""
    workflow = launch(people)
    sent = notification(workflow)
    Activity.objects.filter(pk=sent.pk).update(status=Activity.Status.SCHEDULED, checkpoint={"email": "sending"},
                                               next_attempt_at=clock.now(), result=None)
    assert services.activity_run_if_runnable(activity_id=sent.pk) == RunOutcome.FAILED
    assert len(mail.outbox) == 3
    sent.refresh_from_db()
    assert "may have been delivered and is not sent again" in sent.error
    workflow.refresh_from_db()
    assert workflow.status == Workflow.Status.WAITING
    services.wait_approve(wait_id=open_approval(workflow.pk).pk, user=people["alice"], candidate_hash="h1")
    assert drive(workflow.pk).status == Workflow.Status.COMPLETED


def test_crash_between_the_record_and_the_send_sends_at_most_once(people, settings, tmp_path: Path, time_machine):
    """The attempt records "sending", then dies before sending: the retry does not send (at most
    once; SMTP takes no idempotency key), and the workflow goes on waiting."""
    time_machine.move_to(clock.now(), tick=False)
    settings.AGENTOPS_FAULT_LOG = str(tmp_path / "faults.log")
    settings.AGENTOPS_TESTING_FAULTS = json.dumps([{"point": "notify.before_send", "action": "raise"}])
    workflow = launch(people)
    sent = notification(workflow)
    assert sent.status == Activity.Status.SCHEDULED and sent.checkpoint == {"email": "sending"}
    assert "fault injected" in sent.error
    time_machine.shift(timedelta(minutes=1))
    assert services.activity_run_if_runnable(activity_id=sent.pk) == RunOutcome.FAILED
    assert mail.outbox == []
    assert (tmp_path / "faults.log").read_text().count("notify.before_send") == 1
    workflow.refresh_from_db()
    assert workflow.status == Workflow.Status.WAITING
    assert Event.objects.filter(workflow=workflow, kind="activity.failed").count() == 1


def test_refused_smtp_connection_is_retried_and_never_fails_the_workflow(people, settings, time_machine):
    """Connection refused proves nothing was sent: each attempt retries, the last fails the
    notification only; the workflow waits, and the approval still completes it."""
    time_machine.move_to(clock.now(), tick=False)
    settings.EMAIL_BACKEND = "django.core.mail.backends.smtp.EmailBackend"
    settings.EMAIL_HOST, settings.EMAIL_PORT, settings.EMAIL_TIMEOUT = "127.0.0.1", free_port(), 2
    workflow = launch(people)
    sent = notification(workflow)
    outcomes = []
    for _ in range(10):
        sent.refresh_from_db()
        if sent.status != Activity.Status.SCHEDULED:
            break
        time_machine.move_to(sent.next_attempt_at + timedelta(seconds=1), tick=False)
        outcomes.append(services.activity_run_if_runnable(activity_id=sent.pk))
    # Five attempts: the first ran in drive(), the fifth is the last.
    assert outcomes == [RunOutcome.RETRY_SCHEDULED] * 3 + [RunOutcome.FAILED]
    assert sent.status == Activity.Status.FAILED and "ConnectionRefusedError" in sent.error
    assert sent.checkpoint == {"email": "not_sent"}
    workflow.refresh_from_db()
    assert workflow.status == Workflow.Status.WAITING
    services.wait_approve(wait_id=open_approval(workflow.pk).pk, user=people["bob"], candidate_hash="h1")
    assert drive(workflow.pk).status == Workflow.Status.COMPLETED


def test_reminder_is_sent_once_shortly_before_expiry(people, time_machine):
    """Within AGENTOPS_APPROVAL_REMINDER_HOURS of expiry each approver is reminded, once."""
    time_machine.move_to(clock.now(), tick=False)
    workflow = launch(people)
    assert approval_reminders_schedule() == 0  # three hours left
    time_machine.shift(timedelta(hours=2, minutes=1))
    assert approval_reminders_schedule() == 1
    assert approval_reminders_schedule() == 0  # a second beat, or the next tick
    drive(workflow.pk)
    reminders = [m for m in mail.outbox if m.subject.startswith("Approval expiring")]
    assert sorted(m.to[0] for m in reminders) == ["alice@example.org", "bob@example.org", "root@example.org"]
    time_machine.shift(timedelta(minutes=30))
    assert approval_reminders_schedule() == 0
    assert len(mail.outbox) == 6
    assert notification(workflow, "reminder").operation_id == f"{open_approval(workflow.pk).operation_id}/remind"


def test_decided_wait_gets_no_reminder_and_a_late_notification_sends_nothing(people, time_machine):
    """Once decided, a wait is not reminded, and a notification still queued sends nothing."""
    time_machine.move_to(clock.now(), tick=False)
    workflow = services.workflow_launch(kind=KIND, goal="Ship", user=people["rita"])
    services.workflow_advance_if_runnable(workflow_id=workflow.pk)
    wait = open_approval(workflow.pk)
    services.wait_approve(wait_id=wait.pk, user=people["alice"], candidate_hash="h1")
    time_machine.shift(timedelta(hours=2, minutes=30))
    assert approval_reminders_schedule() == 0
    drive(workflow.pk)
    assert mail.outbox == []


def test_notifications_leave_the_replay_check_clean(people):
    """No handler asks for a notification, and the replay check does not see one."""
    workflow = launch(people)
    services.wait_approve(wait_id=open_approval(workflow.pk).pk, user=people["alice"], candidate_hash="h1")
    workflow = drive(workflow.pk)
    assert replay.check(replay.history_of(workflow)) is None


class Sink:
    """An SMTP server that keeps what it receives (aiosmtpd's handler protocol)."""

    def __init__(self) -> None:
        self.received: list[tuple[list[str], str]] = []

    async def handle_DATA(self, server: Any, session: Any, envelope: Any) -> str:
        self.received.append((list(envelope.rcpt_tos), envelope.content.decode("utf-8", "replace")))
        return "250 Message accepted for delivery"


@pytest.fixture
def smtp_sink(settings: Any) -> Iterator[Sink]:
    sink = Sink()
    controller = Controller(sink, hostname="127.0.0.1", port=free_port())
    controller.start()
    settings.EMAIL_BACKEND = "django.core.mail.backends.smtp.EmailBackend"
    settings.EMAIL_HOST, settings.EMAIL_PORT, settings.EMAIL_TIMEOUT = "127.0.0.1", controller.port, 5
    yield sink
    controller.stop()


def test_real_smtp_server_receives_one_message_per_approver(people, smtp_sink):
    """Over real SMTP on 127.0.0.1: one message to each approver, with the link to the card."""
    workflow = launch(people)
    wait = open_approval(workflow.pk)
    assert sorted(r for rcpts, _ in smtp_sink.received for r in rcpts) == [
        "alice@example.org", "bob@example.org", "root@example.org"]
    assert all(card(wait) in content and "Approval waiting" in content for _, content in smtp_sink.received)


def test_smtp_server_back_after_a_refusal_delivers_on_the_retry(people, settings, time_machine):
    """An attempt refused at connect sent nothing, so the next attempt sends."""
    time_machine.move_to(clock.now(), tick=False)
    port = free_port()
    settings.EMAIL_BACKEND = "django.core.mail.backends.smtp.EmailBackend"
    settings.EMAIL_HOST, settings.EMAIL_PORT, settings.EMAIL_TIMEOUT = "127.0.0.1", port, 5
    workflow = launch(people)
    sent = notification(workflow)
    assert sent.status == Activity.Status.SCHEDULED
    sink = Sink()
    controller = Controller(sink, hostname="127.0.0.1", port=port)
    controller.start()
    try:
        time_machine.move_to(sent.next_attempt_at + timedelta(seconds=1), tick=False)
        assert services.activity_run_if_runnable(activity_id=sent.pk) == RunOutcome.RECORDED
    finally:
        controller.stop()
    assert len(sink.received) == 3


class Hook(BaseHTTPRequestHandler):
    posts: list[tuple[str, dict[str, Any]]] = []

    def do_POST(self) -> None:  # noqa: N802 - http.server's name
        body = self.rfile.read(int(self.headers["Content-Length"]))
        type(self).posts.append((self.path, json.loads(body)))
        self.send_response(200)
        self.end_headers()
        self.wfile.write(b"ok")

    def log_message(self, *args: Any) -> None:
        pass


@pytest.fixture
def hook_server() -> Iterator[tuple[str, list[tuple[str, dict[str, Any]]]]]:
    Hook.posts = []
    server = ThreadingHTTPServer(("127.0.0.1", 0), Hook)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}", Hook.posts
    server.shutdown()
    server.server_close()


def secrets_recorded(workflow: Workflow, secret: str) -> list[str]:
    """Where ``secret`` appears in the workflow's events and activities."""
    found = [e.kind for e in Event.objects.filter(workflow=workflow) if secret in json.dumps(e.data)]
    found += [a.operation_id for a in Activity.objects.filter(workflow=workflow)
              if secret in json.dumps([a.input, a.result, a.error, a.checkpoint])]
    return found


def test_webhook_receives_one_post_with_the_link_and_the_url_stays_secret(people, settings, hook_server):
    """The incoming webhook gets {"text": ...} once, with the card's link and Slack-escaped text."""
    url, posts = hook_server
    settings.AGENTOPS_NOTIFY_WEBHOOK_URL = url + SECRET_HOOK_PATH
    workflow = launch(people)
    wait = open_approval(workflow.pk)
    assert [path for path, _ in posts] == [SECRET_HOOK_PATH]
    text = posts[0][1]["text"]
    assert card(wait) in text and "&lt;!channel&gt; &amp; more" in text and "<!channel>" not in text
    assert notification(workflow).result["webhook"] == "sent"
    assert services.activity_run_if_runnable(activity_id=notification(workflow).pk) == RunOutcome.SKIPPED
    assert len(posts) == 1
    assert secrets_recorded(workflow, "secret-token-42") == []


def test_unreachable_webhook_is_retried_and_its_url_never_recorded(people, settings):
    """A refused webhook connection schedules a retry; the email already sent is not resent, and
    the secret URL appears in no event, input, result or error."""
    settings.AGENTOPS_NOTIFY_WEBHOOK_URL = f"http://127.0.0.1:{free_port()}{SECRET_HOOK_PATH}"
    workflow = launch(people)
    sent = notification(workflow)
    assert sent.status == Activity.Status.SCHEDULED
    assert sent.checkpoint == {"email": "sent", "webhook": "not_sent"}
    assert len(mail.outbox) == 3
    assert secrets_recorded(workflow, "secret-token-42") == []
