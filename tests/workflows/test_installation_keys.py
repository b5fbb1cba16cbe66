"""Idempotency keys unique across installations.

An operation id (``wf-1/SEND.1/i1/0``) is the same string in every database. A fresh database
(a second environment, a test run) that posts to the same external system under it would get
the first installation's recorded reply back. What goes out is ``ctx.idempotency_key``: the
installation id (made once per database, shown by ``agent show``) and the operation id. An
activity scheduled before installations had ids keeps sending the key it may already have sent.
"""
from __future__ import annotations

import json
import os
import re
import subprocess
from collections.abc import Iterator
from io import StringIO
from typing import Any

import pytest
from django.core.management import call_command
from django.db import connection
from django.db.migrations.executor import MigrationExecutor

from tests.conftest import drive, run_at_once
from workflows import engine, services
from workflows.activity_context import ActivityContext
from workflows.installation import MAX_SENT_KEY_LENGTH, idempotency_key_for, installation_forget
from workflows.models import Activity, Installation, Workflow
from workflows.registry import activity
from workflows.testing import registered

KIND = "test-installation-keys"
# The external system: it records the reply of each key and answers a repeated key with that
# reply, as an idempotent API (a payments or mail service) does.
REPLIES: dict[str, dict[str, Any]] = {}
SENT: list[str] = []


@activity("test_installation_send")
def send(ctx: ActivityContext, input: dict[str, Any]) -> dict[str, Any]:
    SENT.append(ctx.idempotency_key)
    return REPLIES.setdefault(ctx.idempotency_key, {"reply_to": input["text"], "n": len(REPLIES) + 1})


class SendOnce(engine.WorkflowDefinition):
    """SEND one message to the external system, then complete with its reply."""

    kind = KIND
    start_node = "SEND"
    revalidate_node = "SEND"

    @engine.node("SEND")
    def send(self, ctx: engine.NodeContext[Any]) -> engine.Decision:
        return engine.Complete(ctx.activity(send, {"text": ctx.goal}))


@pytest.fixture(autouse=True)
def kind() -> Iterator[None]:
    REPLIES.clear()
    SENT.clear()
    with registered(SendOnce, send):
        yield
    installation_forget()


def fresh_database() -> None:
    """What a second environment starts from: no workflows (ids count from 1 again) and an
    installation row of its own (the old one removed; the next process that needs one makes it)."""
    with connection.cursor() as cursor:
        cursor.execute("SET CONSTRAINTS ALL IMMEDIATE")  # TRUNCATE refuses pending deferred checks
        cursor.execute(f"TRUNCATE {Workflow._meta.db_table} RESTART IDENTITY CASCADE")
    Installation.objects.all().delete()
    installation_forget()


@pytest.mark.django_db
@pytest.mark.usefixtures("rung")
def test_two_installations_send_different_keys_and_each_gets_its_own_reply():
    """The same operation id in two databases goes out under two keys: each installation's
    message is its own, never the other's recorded reply."""
    fresh_database()  # ids count from 1 in the first database too, whatever ran before in this one
    first = drive(services.workflow_launch(kind=KIND, goal="Reply to ticket 7 (staging)").pk)
    first_op = Activity.objects.get(workflow=first).operation_id
    first_installation = services.installation_id()

    fresh_database()
    second = drive(services.workflow_launch(kind=KIND, goal="Reply to ticket 7 (production)").pk)

    assert Activity.objects.get(workflow=second).operation_id == first_op  # the same string in both databases
    assert services.installation_id() != first_installation
    assert [key.rsplit("~", 1)[0] for key in SENT] == [f"{first_installation}/{first_op}",
                                                       f"{services.installation_id()}/{first_op}"]
    assert first.result == {"reply_to": "Reply to ticket 7 (staging)", "n": 1}
    assert second.result == {"reply_to": "Reply to ticket 7 (production)", "n": 2}


@pytest.mark.django_db
@pytest.mark.usefixtures("rung")
def test_the_key_is_fixed_at_scheduling_and_shown_by_agent_show():
    """The key is recorded on the activity: every attempt sends it, and `agent show` (text and
    --json) shows it with the installation id."""
    workflow = services.workflow_launch(kind=KIND, goal="Reply")
    scheduled = Activity.objects.get(workflow=workflow)
    installation = Installation.objects.get()
    assert scheduled.idempotency_key.rsplit("~", 1)[0] == f"{installation.installation_id}/{scheduled.operation_id}"
    drive(workflow.pk)

    out = StringIO()
    call_command("agent", "show", str(workflow.pk), "--json", stdout=out)
    detail = json.loads(out.getvalue())
    assert detail["installation_id"] == installation.installation_id
    assert [a["idempotency_key"] for a in detail["activities"]] == [scheduled.idempotency_key]
    text = StringIO()
    call_command("agent", "show", str(workflow.pk), stdout=text)
    assert f"Installation: {installation.installation_id}" in text.getvalue()
    assert SENT == [scheduled.idempotency_key]


@pytest.mark.django_db
def test_a_long_operation_id_still_gives_a_key_within_the_protocols_limit():
    """Keys stay within the length targets must accept, and stay unique (a digest of the id)."""
    long_a, long_b = "wf-1/" + "N" * 190 + "/a", "wf-1/" + "N" * 190 + "/b"
    keys = {idempotency_key_for(long_a), idempotency_key_for(long_b)}
    assert len(keys) == 2 and all(len(k) <= MAX_SENT_KEY_LENGTH for k in keys)
    key = idempotency_key_for("wf-1/SEND.1/i1/0")
    assert re.fullmatch(rf"{services.installation_id()}/wf-1/SEND\.1/i1/0~[0-9a-f]{{12}}", key), key
    assert idempotency_key_for("wf-1/SEND.1/i1/0") != key  # each scheduling makes its own


@pytest.mark.django_db(transaction=True)
def test_two_processes_creating_the_installation_at_once_agree_on_one():
    """Created lazily under the singleton key: of two concurrent creators one row wins."""
    Installation.objects.all().delete()
    rows = run_at_once(services.installation_ensure)
    assert all(isinstance(r, Installation) for r in rows), rows
    assert rows[0].installation_id == rows[1].installation_id == Installation.objects.get().installation_id


def migrate(target: str) -> None:
    executor = MigrationExecutor(connection)
    executor.loader.build_graph()
    executor.migrate([("workflows", target)])


@pytest.mark.django_db(transaction=True)
@pytest.mark.usefixtures("rung")
def test_an_activity_scheduled_before_the_migration_keeps_the_key_it_sent():
    """An activity row as it was before installation ids (migration 0010, no key column), whose
    attempt may already have posted: after migration 0011 it still sends its operation id.
    The migration makes the installation's row; activities scheduled after it send the new key."""
    in_flight = services.workflow_launch(kind=KIND, goal="Sent before the upgrade").pk
    migrate("0010_pause_cause_definition")
    try:
        with connection.cursor() as cursor:
            cursor.execute("SELECT operation_id FROM workflows_activity WHERE workflow_id = %s", [in_flight])
            [(old_op,)] = cursor.fetchall()
            columns = {c.name for c in connection.introspection.get_table_description(cursor, "workflows_activity")}
        assert "idempotency_key" not in columns  # the row is as it was before
        migrate("0011_installation_client_requests")
    finally:
        call_command("migrate", "workflows", verbosity=0)
    installation_forget()

    made = Installation.objects.get()  # by the migration
    assert Activity.objects.get(workflow_id=in_flight).idempotency_key == ""
    drive(in_flight)
    after = drive(services.workflow_launch(kind=KIND, goal="Sent after the upgrade").pk)
    new_op = Activity.objects.get(workflow=after).operation_id
    assert SENT[0] == old_op and SENT[1].rsplit("~", 1)[0] == f"{made.installation_id}/{new_op}"


@pytest.mark.django_db(transaction=True)
@pytest.mark.usefixtures("rung")
def test_after_a_restore_from_before_the_effect_a_new_workflow_sends_a_new_key(tmp_path):
    """A real pg_dump before the effect, pg_restore after it: the next workflow takes the same id and
    operation id in the same installation, and still sends a key nothing was sent under (its
    reply is its own, not the lost workflow's)."""
    if connection.vendor != "postgresql":
        pytest.skip("pg_dump and pg_restore need PostgreSQL")
    db = connection.settings_dict
    where = ["-h", db["HOST"] or "127.0.0.1", "-p", str(db["PORT"] or 5432), "-U", db["USER"] or "postgres"]
    env = {**os.environ, "PGPASSWORD": db["PASSWORD"] or ""}
    installation = services.installation_id()
    backup = tmp_path / "before.dump"
    subprocess.run(["pg_dump", *where, "-Fc", "-f", str(backup), db["NAME"]], check=True, env=env, timeout=120)

    lost = drive(services.workflow_launch(kind=KIND, goal="Reply to ticket 7").pk)
    lost_op = Activity.objects.get(workflow=lost).operation_id

    connection.close()
    subprocess.run(["pg_restore", *where, "--clean", "--if-exists", "--single-transaction", "-d", db["NAME"],
                    str(backup)], check=True, env=env, timeout=300)
    installation_forget()
    assert not Workflow.objects.filter(pk=lost.pk).exists()  # the database went back to before it

    again = drive(services.workflow_launch(kind=KIND, goal="Reply to ticket 8").pk)

    assert (again.pk, Activity.objects.get(workflow=again).operation_id) == (lost.pk, lost_op)
    assert services.installation_id() == installation
    assert len(SENT) == 2 and SENT[0] != SENT[1]
    assert again.result == {"reply_to": "Reply to ticket 8", "n": 2}
