"""What a model call costs the database, counted: the statements the engine runs per call.

CPU per call (bench/README.md, "7. Agents in flight") is measured under load and moves with
the machine; the statements behind it do not. A new question asked on every call (a feature's
check, an ORM query in the call's path) shows here as a higher count.
"""
from __future__ import annotations

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext

from tests.conftest import drive
from workflows import services
from workflows.models import Event

pytestmark = pytest.mark.django_db

# The offline autonomous run below, measured on 2026-12-03 (eighteenth session): 185 statements for 11 model
# calls (16.8 a call) on PostgreSQL, launch excluded; its plan, tasks, tools, verdict and every node entry
# included (the test's transaction makes each block of its own a savepoint: two statements more). A note, a
# checkpoint and a reservation without budget limits are one statement each there; a call's charge rides on
# its model.called note, the steering question after a tool turn's checkpoint on that checkpoint, and an
# advance's goal on its workflow's row lock (218 before, 19.8). Elsewhere (SQLite) each is a transaction of
# two or three, and the events and the workflow's sequence number take a statement each: 325 (29.5).
STATEMENTS_PER_CALL_MAX = {"postgresql": 17}.get(connection.vendor, 30)


@pytest.fixture(autouse=True)
def workspaces(settings, tmp_path):
    settings.AGENTOPS_WORKSPACE_DIR = tmp_path / "workspaces"


def test_an_autonomous_run_stays_within_its_statements_per_model_call():
    workflow_id = services.workflow_launch(kind="autonomous", goal="Prepare onboarding notes").pk
    with CaptureQueriesContext(connection) as queries:
        workflow = drive(workflow_id)

    assert workflow.status == "completed", workflow.reason
    calls = Event.objects.filter(workflow_id=workflow_id, kind="model.called").count()
    statements = len(queries.captured_queries)
    assert calls == 11
    assert statements / calls <= STATEMENTS_PER_CALL_MAX, (
        f"{statements} statements for {calls} model calls ({statements / calls:.1f} a call): a question asked on "
        "every call is new; make it SQL written once per shape, or fold it into a statement the call already runs")
