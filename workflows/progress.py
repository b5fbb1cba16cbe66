"""The progress object an activity reports (percent, achievements, remaining, confidence, hours
left): its shape, checked where it enters. Model output is data: a malformed one is refused."""
from __future__ import annotations

from typing import Any

from workflows.errors import InvalidInput

MAX_ITEMS = 20


def progress_validate(result: Any) -> dict[str, Any]:
    """Check the ``progress`` object of an activity result; model output is data, refused when malformed."""
    progress = result.get("progress") if isinstance(result, dict) else None
    if not isinstance(progress, dict):
        raise InvalidInput("The result has no progress object; expected percent, achievements, remaining, confidence.")
    percent, confidence = progress.get("percent"), progress.get("confidence")
    if isinstance(percent, bool) or not isinstance(percent, int) or not 0 <= percent <= 100:
        raise InvalidInput(f"Progress percent must be a whole number from 0 to 100; got {percent!r}.")
    if isinstance(confidence, bool) or not isinstance(confidence, (int, float)) or not 0 <= confidence <= 1:
        raise InvalidInput(f"Progress confidence must be a number from 0 to 1; got {confidence!r}.")
    for field in ("achievements", "remaining"):
        items = progress.get(field, [])
        if not isinstance(items, list) or len(items) > MAX_ITEMS or not all(
            isinstance(i, str) and len(i) <= 500 for i in items
        ):
            raise InvalidInput(f"Progress {field} must be a list of at most {MAX_ITEMS} short texts.")
    hours = progress.get("estimated_hours_left")
    bad_hours = isinstance(hours, bool) or not isinstance(hours, (int, float)) or not 0 <= hours < 10_000
    if hours is not None and bad_hours:
        raise InvalidInput(f"Progress estimated_hours_left must be a number of hours; got {hours!r}.")
    return progress
