"""A migration that changes the type of a column a prepared statement returns (a longer
``max_length``, say) while workers run: PostgreSQL refuses that statement on every connection
that prepared it ("cached plan must not change result type"). The statement is prepared again:
at once outside a transaction, after the failed transaction's rollback inside one."""
from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import psycopg
import pytest
from django.db import NotSupportedError, connection, transaction

from workflows import services
from workflows.models import Workflow
from workflows.services.common import workflow_lock

pytestmark = [pytest.mark.django_db(transaction=True),
              pytest.mark.skipif(connection.vendor != "postgresql", reason="prepared statements are PostgreSQL's")]


@pytest.fixture
def migrate_kind(settings: Any) -> Iterator[Any]:
    """Change the type of ``workflows_workflow.kind`` from another connection, as a migration
    run by a deploy would; put it back afterwards."""
    db = settings.DATABASES["default"]
    params = {"host": db["HOST"], "port": db["PORT"], "user": db["USER"], "dbname": db["NAME"], "autocommit": True}

    def alter(length: int) -> None:
        with psycopg.connect(**params) as other:
            other.execute(f"ALTER TABLE workflows_workflow ALTER COLUMN kind TYPE varchar({length})")

    yield alter
    alter(Workflow._meta.get_field("kind").max_length)
    connection.ensure_connection()
    connection.connection.execute("DEALLOCATE ALL")


def kinds(pk: int) -> list[str]:
    return list(Workflow.objects.filter(pk=pk).values_list("kind", flat=True))


def locked_kind(pk: int) -> str:
    with transaction.atomic():
        return workflow_lock(pk).kind


def test_a_statement_made_stale_by_a_migration_is_prepared_again(migrate_kind: Any) -> None:
    pk = services.workflow_launch(kind="autonomous", goal="Prepare onboarding notes").pk
    for _ in range(3):  # prepared from the second run on
        assert (kinds(pk), locked_kind(pk)) == (["autonomous"], "autonomous")
    migrate_kind(80)
    # Outside a transaction: run again at once, nothing seen.
    assert [kinds(pk) for _ in range(3)] == [["autonomous"]] * 3
    for _ in range(3):
        locked_kind(pk)
    migrate_kind(100)
    # Inside one: that transaction fails (its task is retried); the next is prepared again.
    with pytest.raises(NotSupportedError, match="cached plan must not change result type"):
        locked_kind(pk)
    assert [locked_kind(pk) for _ in range(3)] == ["autonomous"] * 3
