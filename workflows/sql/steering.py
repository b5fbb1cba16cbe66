"""The question every model call of a steerable kind asks: is there a steer message it may take?
As SQL, since the ORM's filter costs several times the statement (bench/README.md, 7)."""
from __future__ import annotations

import functools
from typing import Any

from django.db import connection

from workflows.models import Activity, SteerMessage
from workflows.models.steering import ENDED_WITHOUT_RESULT
from workflows.sql import concrete_field, quoted_column, quoted_table


def takeable_exists(workflow_id: int, activity_id: int, call: int) -> bool:
    """Whether the workflow has a steer message held by no activity, held by ``activity_id`` at
    ``call`` or later, or held by an activity that ended without a result."""
    with connection.cursor() as cursor:
        cursor.execute(_takeable_sql(), [workflow_id, activity_id, call,
                                         *(status.value for status in ENDED_WITHOUT_RESULT)])
        return cursor.fetchone() is not None


@functools.cache
def _takeable_sql() -> str:
    def column(model: Any, name: str) -> str:
        return quoted_column(concrete_field(model, name))

    steer, activity = quoted_table(SteerMessage), quoted_table(Activity)
    held_by = f"{steer}.{column(SteerMessage, 'activity')}"
    ended = ", ".join(["%s"] * len(ENDED_WITHOUT_RESULT))
    return (f"SELECT 1 FROM {steer} WHERE {steer}.{column(SteerMessage, 'workflow')} = %s AND ({held_by} IS NULL "
            f"OR ({held_by} = %s AND {steer}.{column(SteerMessage, 'call')} >= %s) OR EXISTS (SELECT 1 FROM "
            f"{activity} WHERE {activity}.{column(Activity, 'id')} = {held_by} AND "
            f"{activity}.{column(Activity, 'status')} IN ({ended}))) LIMIT 1")
