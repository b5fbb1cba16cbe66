"""Cursor paging for every list of the API: keyset pages over an indexed, unique, ordered column
(a workflow's id, an event's seq), so a page costs the same at the millionth row as at the first and
rows added meanwhile are neither skipped nor repeated. The cursor is opaque to clients (today the
last key of the page, as text); a page holds at most MAX_PAGE items."""
from __future__ import annotations

from collections.abc import Callable
from typing import Any

from django.db.models import QuerySet
from ninja import Query

from workflows.errors import InvalidInput
from workflows.selectors import MAX_ID

MAX_PAGE = 200
LIMIT = Query(50, ge=1, le=MAX_PAGE, description=f"items per page, 1–{MAX_PAGE}")
CURSOR = Query("", max_length=20, pattern=r"^[0-9]{0,19}$",
               description="`next_cursor` of the page before; empty: the first page")


def cursor_key(cursor: str) -> int | None:
    """The key a cursor holds, or None for the first page; InvalidInput for one no page gave."""
    if not cursor:
        return None
    if not cursor.isdigit() or int(cursor) > MAX_ID:
        raise InvalidInput(f"cursor {cursor[:30]!r} is not one this API gave; pass a page's next_cursor, or none for "
                           "the first page.")
    return int(cursor)


def keyset_page(rows: QuerySet[Any], *, key: str, cursor: str, limit: int, descending: bool,
                shape: Callable[[Any], Any], keep_position: bool = False) -> dict[str, Any]:
    """``{"items": [...], "next_cursor": ...}``: up to ``limit`` rows after ``cursor`` in ``key`` order.

    ``next_cursor`` is null on the last page, unless ``keep_position`` (a log that grows, polled): then it
    is where the next poll starts, the given cursor when nothing came."""
    after = cursor_key(cursor)
    if after is not None:
        rows = rows.filter(**{f"{key}__lt" if descending else f"{key}__gt": after})
    page = list(rows.order_by(f"-{key}" if descending else key)[: limit + 1])
    more, page = len(page) > limit, page[:limit]
    last = str(getattr(page[-1], key)) if page else (cursor or None)
    return {"items": [shape(row) for row in page], "next_cursor": last if more or keep_position else None}
