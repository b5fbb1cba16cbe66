"""Parked workflows across a Django migration that changes a kind's model and the shape of its
stored state (docs/authoring.md, "Migrations of stored state").

Version 1 of the kind ``test-migrating`` keeps a ticket ``{"number", "email"}`` in its state and
sends ``{"number", "email"}`` to its notify activity; version 2 calls the field ``contact_email``
(and adds ``priority``, with a default). Two workflows park on version 1: one waiting for
approval, one approved with its notify activity scheduled. ``tests/migrating_kind``'s migration
0002 renames the column of the kind's table and rewrites the parked workflows' state, current
checkpoint and scheduled input; applied with Django's MigrationExecutor on the PostgreSQL test
database, between the two deploys. Both workflows then finish on version 2.
"""
from __future__ import annotations

import hashlib
import json
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import pytest
from django.contrib.auth.models import Group, User
from django.db import connection
from django.db.migrations.executor import MigrationExecutor
from django.test.utils import modify_settings

from tests.conftest import drive, open_approval
from tests.workflows.test_replay_check import replay_check
from workflows import engine, services
from workflows.codec import from_json
from workflows.models import Activity, Workflow
from workflows.registry import ActivityType, RetryPolicy
from workflows.testing import registered

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.usefixtures("rung")]

KIND = "test-migrating"
APP = "migrating_kind"
ROLE = "ticket-approvers"
NOTIFIED: list[tuple[str, str]] = []  # the notify activity's effects: (operation id, address)


@dataclass(frozen=True)
class OpenInput:
    number: str
    email: str


@dataclass(frozen=True)
class TicketV1:
    number: str
    email: str


@dataclass(frozen=True)
class TicketV2:
    number: str
    contact_email: str  # was ``email``: renamed, so stored values need the data migration
    priority: int = 3  # added with a default: stored values without it load as they are


@dataclass(frozen=True)
class NotifyV1:
    number: str
    email: str


@dataclass(frozen=True)
class NotifyV2:
    number: str
    contact_email: str


def open_v1(ctx: Any, input: OpenInput) -> TicketV1:
    return TicketV1(number=input.number, email=input.email)


def open_v2(ctx: Any, input: OpenInput) -> TicketV2:
    return TicketV2(number=input.number, contact_email=input.email)


def notify_v1(ctx: Any, input: NotifyV1) -> dict[str, Any]:
    raise AssertionError("version 1's notify never runs in this test: its workflows are parked before it")


def notify_v2(ctx: Any, input: NotifyV2) -> dict[str, Any]:
    from tests.migrating_kind.models import Contact  # the table as migration 0002 left it

    contact, created = Contact.objects.get_or_create(
        operation_id=ctx.operation_id, defaults={"number": input.number, "contact_email": input.contact_email})
    if created:
        NOTIFIED.append((ctx.operation_id, input.contact_email))
    return {"contact_id": contact.pk, "to": contact.contact_email}


def _activity(fn: Any, name: str) -> ActivityType[Any, Any]:
    return ActivityType(fn, name=name, retry=RetryPolicy(max_attempts=3), lease_seconds=None, reconcile=None,
                        commitment="", compensation="", records_progress=False)


OPEN_V1, OPEN_V2 = _activity(open_v1, "test_migrating_open"), _activity(open_v2, "test_migrating_open")
NOTIFY_V1, NOTIFY_V2 = _activity(notify_v1, "test_migrating_notify"), _activity(notify_v2, "test_migrating_notify")


def candidate_hash(candidate: dict[str, Any]) -> str:
    return hashlib.sha256(json.dumps(candidate, sort_keys=True).encode()).hexdigest()


class V1(engine.WorkflowDefinition):
    """OPEN a ticket, WAIT_FOR_APPROVAL of whom to tell, NOTIFY them, done."""

    kind = KIND
    version = 1
    start_node = "OPEN"
    revalidate_node = "OPEN"

    def validate_params(self, params: dict[str, Any]) -> dict[str, Any]:
        return {"number": str(params["number"]), "email": str(params["email"])}

    @engine.node("OPEN")
    def open(self, ctx: engine.NodeContext[Any]) -> engine.Decision:
        ticket = ctx.activity(OPEN_V1, OpenInput(number=ctx.params["number"], email=ctx.params["email"]))
        return engine.Goto("WAIT_FOR_APPROVAL", {"ticket": ticket})

    @engine.node("WAIT_FOR_APPROVAL")
    def wait_for_approval(self, ctx: engine.NodeContext[Any]) -> engine.Decision:
        ticket = from_json(TicketV1, ctx.state["ticket"], what="The ticket")
        candidate = {"number": ticket.number, "to": ticket.email}
        outcome = ctx.approval(candidate=candidate, candidate_hash=candidate_hash(candidate), role=ROLE,
                               expires_in_seconds=3600, state_versions={})
        return engine.Goto("NOTIFY") if outcome.approved else engine.Fail("rejected")

    @engine.node("NOTIFY")
    def notify(self, ctx: engine.NodeContext[Any]) -> engine.Decision:
        ticket = from_json(TicketV1, ctx.state["ticket"], what="The ticket")
        receipt = ctx.activity(NOTIFY_V1, NotifyV1(number=ticket.number, email=ticket.email))
        return engine.Complete({"to": ticket.email, "receipt": receipt})


class V2(V1):
    """The same path; the ticket's address is ``contact_email`` now, and it has a priority."""

    version = 2

    @engine.node("OPEN")
    def open(self, ctx: engine.NodeContext[Any]) -> engine.Decision:
        ticket = ctx.activity(OPEN_V2, OpenInput(number=ctx.params["number"], email=ctx.params["email"]))
        return engine.Goto("WAIT_FOR_APPROVAL", {"ticket": ticket})

    @engine.node("WAIT_FOR_APPROVAL")
    def wait_for_approval(self, ctx: engine.NodeContext[Any]) -> engine.Decision:
        ticket = from_json(TicketV2, ctx.state["ticket"], what="The ticket")
        # The candidate people approve keeps its shape: its hash is what the open wait is bound to.
        candidate = {"number": ticket.number, "to": ticket.contact_email}
        outcome = ctx.approval(candidate=candidate, candidate_hash=candidate_hash(candidate), role=ROLE,
                               expires_in_seconds=3600, state_versions={})
        return engine.Goto("NOTIFY") if outcome.approved else engine.Fail("rejected")

    @engine.node("NOTIFY")
    def notify(self, ctx: engine.NodeContext[Any]) -> engine.Decision:
        ticket = from_json(TicketV2, ctx.state["ticket"], what="The ticket")
        receipt = ctx.activity(NOTIFY_V2, NotifyV2(number=ticket.number, contact_email=ticket.contact_email))
        return engine.Complete({"to": ticket.contact_email, "priority": ticket.priority, "receipt": receipt})


def migrate(target: str | None) -> None:
    """Migrate the kind's app to ``target`` (None: unapply all) with Django's MigrationExecutor."""
    executor = MigrationExecutor(connection)
    executor.loader.build_graph()
    executor.migrate([(APP, target)])


def columns() -> set[str]:
    with connection.cursor() as cursor:
        return {c.name for c in connection.introspection.get_table_description(cursor, f"{APP}_contact")}


@pytest.fixture
def kind_app() -> Iterator[None]:
    """The test app installed, at its first migration; unapplied (its table dropped) afterwards."""
    with modify_settings(INSTALLED_APPS={"append": "tests.migrating_kind"}):
        migrate("0001_initial")
        try:
            yield
        finally:
            migrate(None)


@pytest.fixture
def approver() -> User:
    user = User.objects.create_user("tia", password="tia-password")
    user.groups.add(Group.objects.get_or_create(name=ROLE)[0])
    return user


def park_on_version_1(approver: User) -> tuple[int, int]:
    """One workflow waiting for approval, one approved with its notify activity scheduled."""
    with registered(V1, OPEN_V1, NOTIFY_V1):
        waiting = services.workflow_launch(kind=KIND, goal="Tell the customer", params={
            "number": "T-1", "email": "ann@example.com"}).pk
        scheduled = services.workflow_launch(kind=KIND, goal="Tell the supplier", params={
            "number": "T-2", "email": "sam@example.com"}).pk
        for pk in (waiting, scheduled):
            assert drive(pk).current_node == "WAIT_FOR_APPROVAL"
        wait = open_approval(scheduled)
        services.wait_approve(wait_id=wait.pk, user=approver, candidate_hash=wait.candidate_hash)
        services.workflow_advance_if_runnable(workflow_id=scheduled)  # schedules notify; no worker runs it
    return waiting, scheduled


def test_parked_workflows_resume_to_completion_after_a_migration_reshapes_their_state(
    kind_app: None, approver: User,
) -> None:
    """A workflow waiting for approval and one with its activity scheduled, parked on version 1,
    finish on version 2 once migration 0002 has renamed the model's column and rewritten their
    stored ticket; before the migration, replay-check names both as unable to go on."""
    NOTIFIED.clear()
    waiting, scheduled = park_on_version_1(approver)
    notify = Activity.objects.get(workflow_id=scheduled, name="test_migrating_notify")
    assert (notify.status, notify.input) == ("scheduled", {"number": "T-2", "email": "sam@example.com"})
    assert Workflow.objects.get(pk=waiting).state["ticket"] == {"number": "T-1", "email": "ann@example.com"}
    assert "email" in columns()

    with registered(V2, OPEN_V2, NOTIFY_V2):
        # Version 2 deployed before the data migration: neither parked workflow could go on.
        code, out = replay_check("--kind", KIND)
        assert code == 1 and out.count("does not fit TicketV2: contact_email: missing") == 2, out

        migrate("0002_contact_email")
        assert "contact_email" in columns() and "email" not in columns()
        assert Workflow.objects.get(pk=waiting).state["ticket"] == {"number": "T-1", "contact_email": "ann@example.com"}
        assert Activity.objects.get(pk=notify.pk).input == {"number": "T-2", "contact_email": "sam@example.com"}
        code, out = replay_check("--kind", KIND)
        assert code == 0 and "2 of 2 histories replay" in out, out

        wait = open_approval(waiting)  # opened on version 1; its candidate and hash are unchanged
        services.wait_approve(wait_id=wait.pk, user=approver, candidate_hash=wait.candidate_hash)
        finished = {pk: drive(pk) for pk in (waiting, scheduled)}

    for pk, to in ((waiting, "ann@example.com"), (scheduled, "sam@example.com")):
        wf = finished[pk]
        assert wf.status == "completed", (wf.status, wf.reason)
        assert wf.result["to"] == to and wf.result["priority"] == 3, wf.result
    from tests.migrating_kind.models import Contact

    assert sorted(Contact.objects.values_list("number", "contact_email")) == [
        ("T-1", "ann@example.com"), ("T-2", "sam@example.com")]
    assert sorted(to for _, to in NOTIFIED) == ["ann@example.com", "sam@example.com"]  # each notified once


def test_replay_check_names_a_scheduled_activity_whose_stored_input_no_longer_fits(
    kind_app: None, approver: User,
) -> None:
    """New activity code whose input type renamed a field, under an unchanged definition: the
    handlers still replay, but the input stored for the scheduled notify would be refused when its
    attempt starts, so replay-check names that workflow (and only that one) before the deploy."""
    waiting, scheduled = park_on_version_1(approver)
    with registered(V1, OPEN_V1, NOTIFY_V2):
        code, out = replay_check("--kind", KIND)
    assert code == 1 and "1 of 2 histories replay" in out, out
    assert f"workflow {scheduled} ({KIND}) at node NOTIFY" in out, out
    assert ("the input stored for activity 'test_migrating_notify' (scheduled) no longer fits its input type" in out
            and "contact_email" in out), out
    assert f"workflow {waiting} " not in out, out
