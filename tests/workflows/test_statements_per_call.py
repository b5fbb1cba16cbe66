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
from workflows.models import Activity, Checkpoint, Event, Workflow

pytestmark = pytest.mark.django_db

# The offline autonomous run below, measured on 2026-12-04: 169 statements for 11 model
# calls (15.4 a call) on PostgreSQL, launch excluded; its plan, tasks, tools, verdict and every node entry
# included (the test's transaction makes each block of its own a savepoint: two statements more). A note, a
# checkpoint and a reservation without budget limits are one statement each there; a call's charge rides on
# its model.called note, the steering question after a tool turn's checkpoint on that checkpoint, and what an
# advance asks of its workflow (goal, last checkpoint, open child waits) on its row lock; a result and its
# attempt's close are one statement (185 as two, 16.8). Elsewhere (SQLite) each is a transaction of two or
# three, and the events and the workflow's sequence number take a statement each: 314 (28.5). On PostgreSQL,
# moreover, a result's advance takes no savepoint of its own (159, 14.5), a node entry's fields
# are written by the statement that writes the events of its step to the same row (153, 13.9), and the
# result's statement reads its node visit's activities for the advance: 148 (13.5).
STATEMENTS_PER_CALL_MAX = {"postgresql": 13.5}.get(connection.vendor, 29)


@pytest.fixture(autouse=True)
def workspaces(settings, tmp_path):
    settings.AGENTOPS_WORKSPACE_DIR = tmp_path / "workspaces"


def driven() -> tuple[Workflow, list[str]]:
    """An offline autonomous run launched and driven to its end; its statements, launch excluded."""
    workflow_id = services.workflow_launch(kind="autonomous", goal="Prepare onboarding notes").pk
    with CaptureQueriesContext(connection) as queries:
        workflow = drive(workflow_id)
    assert workflow.status == "completed", workflow.reason
    return workflow, [q["sql"] for q in queries.captured_queries]


def test_an_autonomous_run_stays_within_its_statements_per_model_call():
    workflow, statements = driven()
    calls = Event.objects.filter(workflow_id=workflow.pk, kind="model.called").count()
    assert calls == 11
    assert len(statements) / calls <= STATEMENTS_PER_CALL_MAX, (
        f"{len(statements)} statements for {calls} model calls ({len(statements) / calls:.1f} a call): a question "
        "asked on every call is new; make it SQL written once per shape, or fold it into a statement the call "
        "already runs")


def test_an_advance_asks_its_goal_last_checkpoint_and_child_waits_with_its_row_lock():
    """Every node entry chains its checkpoint to the last one and looks for children to cancel; a
    workflow with no child asks neither question apart (nor its goal), whatever its length."""
    workflow, statements = driven()
    apart = [sql for sql in statements
             if sql.startswith("SELECT") and not sql.startswith('SELECT "workflows_workflow".')]
    for table in ("workflows_wait", "workflows_checkpoint", "workflows_intent"):
        assert not [sql for sql in apart if f'FROM "{table}"' in sql], table
    assert Checkpoint.objects.filter(workflow_id=workflow.pk).exclude(delta=None).count() >= 5, "chained as deltas"


def test_a_node_entry_is_written_with_the_events_of_its_step():
    """Every step enters a node and records events on the same row: the node, its visit, the state
    and the checkpoint go with the events' statement; only the completion's change of status
    updates the row on its own (and takes what a node entry put off with it)."""
    workflow, statements = driven()
    alone = [sql for sql in statements if sql.startswith('UPDATE "workflows_workflow"')]
    if connection.vendor == "postgresql":
        [completion] = alone
        assert '"status" = ' in completion and '"current_node" = ' in completion
    last = Checkpoint.objects.filter(workflow_id=workflow.pk).latest("pk")
    assert (workflow.checkpoint_id, workflow.current_node, workflow.node_visit) == (last.pk, last.node,
                                                                                   last.node_visit)


@pytest.mark.skipif(connection.vendor != "postgresql", reason="one statement on PostgreSQL; two elsewhere")
def test_the_advance_after_a_result_reads_its_visit_with_the_results_statement():
    """The advance replays the node visit from its activities, one of which the result just wrote:
    on PostgreSQL the result's statement reads them (that row as written), no statement of its own."""
    workflow, statements = driven()
    results = [n for n, sql in enumerate(statements) if sql.startswith('WITH moved AS (UPDATE "workflows_activity"')]
    assert len(results) == Activity.objects.filter(workflow_id=workflow.pk).count()
    visit_read = 'SELECT "operation_id", "name", "status", "result", "error" FROM "workflows_activity"'
    assert not [n for n in results if statements[n + 1].startswith(visit_read)]
