"""What the writes of a model call cost in index entries (workflows/models/__init__.py): a lease
extension is a HOT update, which writes none, and no index of the tables a call writes repeats
what another one already leads with."""
from __future__ import annotations

import pytest
from django.db import connection, transaction

from tests.workflows.test_chaining import chain_registered  # noqa: F401  (a fixture)
from tests.workflows.test_checkpoints import claimed
from workflows import services
from workflows.models import (
    Activity,
    ActivityAttempt,
    Checkpoint,
    Event,
    ProgressSample,
    StateBlob,
    UsageEntry,
    Workflow,
)

pytestmark = [
    pytest.mark.django_db(transaction=True),
    pytest.mark.skipif(connection.vendor != "postgresql", reason="HOT updates and pg_index are PostgreSQL's"),
]

# The tables every model call or step writes.
WRITTEN_PER_CALL = [Workflow, Activity, ActivityAttempt, Event, Checkpoint, UsageEntry, ProgressSample, StateBlob]


def _updates(table: str) -> tuple[int, int]:
    """This transaction's updates of ``table`` so far: all of them, and those made in place (HOT)."""
    with connection.cursor() as cursor:
        cursor.execute("SELECT n_tup_upd, n_tup_hot_upd FROM pg_stat_xact_user_tables WHERE relname = %s", [table])
        row = cursor.fetchone()
    return (row[0], row[1]) if row else (0, 0)


@pytest.mark.usefixtures("rung", "chain_registered")
def test_a_heartbeat_and_a_checkpoint_update_the_activity_in_place():
    _, activity, claim = claimed()
    table = Activity._meta.db_table

    with transaction.atomic():
        updated, in_place = _updates(table)
        assert services.activity_heartbeat_if_current(claim=claim, detail="waiting for model call 0") is True
        assert services.activity_checkpoint_if_current(claim=claim, state={"turn": 1}, detail="turn 1") is True
        after = _updates(table)

    assert (after[0] - updated, after[1] - in_place) == (2, 2), (
        "a lease extension wrote index entries: an index of workflows_activity now covers a column it writes "
        "(lease_expires_at, heartbeat_at, heartbeat_detail, checkpoint, checkpointed_at)")
    activity.refresh_from_db()
    assert activity.checkpoint == {"turn": 1} and activity.heartbeat_detail == "turn 1"


def test_no_index_repeats_the_leading_columns_of_another():
    """An index without a condition whose columns begin another index's (or a unique constraint's)
    is paid for on every write and answers nothing the other does not."""
    tables = [model._meta.db_table for model in WRITTEN_PER_CALL]
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT t.relname, i.relname, x.indkey::int2[], x.indpred IS NULL, x.indisunique, x.indexprs IS NULL "
            "FROM pg_index x JOIN pg_class i ON i.oid = x.indexrelid JOIN pg_class t ON t.oid = x.indrelid "
            "WHERE t.relname = ANY(%s)", [tables])
        indexes = cursor.fetchall()
    assert {row[0] for row in indexes} == set(tables)

    repeated = []
    for table, name, columns, whole, unique, plain in indexes:
        if unique or not whole or not plain:
            continue
        for other_table, other, other_columns, other_whole, _, _ in indexes:
            if (other_table == table and other != name and other_whole
                    and list(other_columns[:len(columns)]) == list(columns)):
                repeated.append(f"{name} repeats {other}")
    assert repeated == []
