"""How the admin writes a moment and an amount of money: one way on every page.

Moments use the project's ``DATETIME_FORMAT`` (agentops/formats/en/formats.py), the format of
the admin's own fields and lists too: ``2026-12-01 09:14:02 UTC``. Money is US dollars with
``USD_PLACES`` decimals (``$0.0123``): model calls cost fractions of a cent, and budgets are set
to four decimals. Templates use the ``when`` and ``usd`` filters of ``agentops_admin``.
"""
from __future__ import annotations

from datetime import datetime
from decimal import ROUND_HALF_UP, Decimal, InvalidOperation

from django.utils import formats, timezone

USD_PLACES = 4
_QUANTUM = Decimal(1).scaleb(-USD_PLACES)


def when(at: datetime | None) -> str:
    """``2026-12-01 09:14:02 UTC`` in the site's time zone; "" for no moment (templates add a default)."""
    if at is None:
        return ""
    return formats.date_format(timezone.localtime(at), "DATETIME_FORMAT")


def usd(amount: Decimal | float | int | str | None) -> str:
    """``$1,234.5678``: four decimals always; an amount that would round to zero but is not is ``<$0.0001``.

    "" for no amount (no budget), so templates say what that means.
    """
    if amount is None or amount == "":
        return ""
    try:
        value = Decimal(str(amount))
    except InvalidOperation:
        return str(amount)  # not a number: shown as it is rather than hidden
    sign = "-" if value < 0 else ""
    rounded = abs(value).quantize(_QUANTUM, rounding=ROUND_HALF_UP)
    if rounded == 0 and value != 0:
        return f"{sign}<${_QUANTUM}"
    return f"{sign}${rounded:,.{USD_PLACES}f}"
