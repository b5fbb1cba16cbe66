"""Rules the database services and the in-memory test kit both follow: how a compensation is
named, what an amount of USD may be, what budget a child gets. Nothing here touches a model or a
database, so the kit (``workflows.testing.memory``) imports it without Django set up."""
from __future__ import annotations

from collections.abc import Callable
from decimal import ROUND_DOWN, Decimal

from workflows import engine
from workflows.errors import BudgetExhausted, InvalidInput

# The precision of every budget column (``Workflow.budget_total_usd``, ``budget_hourly_usd``).
BUDGET_DIGITS = 12
BUDGET_PLACES = 4
BUDGET_STEP = Decimal(1).scaleb(-BUDGET_PLACES)
MAX_BUDGET_USD = Decimal(10) ** (BUDGET_DIGITS - BUDGET_PLACES)  # every budget is under it
# The reason texts of a pause start with these, for people; code reads ``Workflow.pause_cause``.
BUDGET_PAUSE_PREFIX = "Budget exhausted"


def compensation_operation_id(operation_id: str) -> str:
    """The operation id of the activity that undoes the effect of activity ``operation_id``."""
    return f"{operation_id}/compensate"


def amount_checked(value: Decimal | None, *, what: str) -> Decimal | None:
    """A budget amount as given, or InvalidInput: positive, finite and within the columns'
    precision (12 digits, 4 after the point). Never rounded: 0.000001 would be stored as 0.0000
    and pause the workflow at once, so it is refused like any other bad amount."""
    if value is None:
        return None
    if not isinstance(value, Decimal) or not value.is_finite() or not Decimal(0) < value < MAX_BUDGET_USD:
        raise InvalidInput(f"{what} must be a positive amount of USD under {MAX_BUDGET_USD:,}; got {value}; "
                           "nothing was changed.")
    if value != value.quantize(BUDGET_STEP):
        rounded_up = value.quantize(BUDGET_STEP, "ROUND_UP")
        raise InvalidInput(f"{what} has more than {BUDGET_PLACES} decimal places ({value}); it would be rounded, so "
                           f"it is refused: give at most {BUDGET_PLACES}, e.g. {rounded_up}.")
    return value


def child_budget_share(command: engine.StartChild, *, total_usd: Decimal | None, workflow_id: int,
                       left_usd: Callable[[Decimal], Decimal]) -> Decimal | None:
    """The budget ``command`` gives its child, out of a parent's ``total_usd`` of which
    ``left_usd(total_usd)`` remains: as asked, or all that remains; None with no total and none
    asked. BudgetExhausted when it does not fit; InvalidInput for an asked budget that is no
    amount of USD."""
    asked = None
    if command.budget_usd is not None:
        try:
            asked = Decimal(command.budget_usd)
        except ArithmeticError:
            raise InvalidInput(f"ctx.child(budget={command.budget_usd!r}) is not an amount of USD.") from None
        asked = amount_checked(asked, what=f"The budget of child {command.operation_id}")
    if total_usd is None:
        return asked
    left = left_usd(total_usd)
    budget = left.quantize(BUDGET_STEP, rounding=ROUND_DOWN) if asked is None else asked
    if budget <= 0 or budget > left:
        raise BudgetExhausted(
            f"{BUDGET_PAUSE_PREFIX}: workflow {workflow_id} has {max(left, Decimal(0)):.4f} of its "
            f"{total_usd:.4f} USD left (its spend and its children's budgets), and its child "
            f"{command.operation_id} ({command.child_kind}) needs {budget:.4f}; raise the budget (`manage.py agent "
            f"budget {workflow_id} --total USD`, or POST /api/workflows/{workflow_id}/budget) to start it.",
            workflow_id=workflow_id,
        )
    return budget
