"""Where a workflow's money went: the usage ledger summed per node, per activity and per model
(docs/live.md, "Cost per step"). Reads only; one grouped query, whatever the length of the run."""
from __future__ import annotations

from decimal import Decimal
from typing import Any

from django.db.models import Case, Count, DecimalField, F, Sum, Value, When

from workflows.models import Activity, UsageEntry, Workflow

MICRO_USD = Decimal("0.000001")
TOKENS = ("input_tokens", "output_tokens", "cache_read_tokens", "cache_write_tokens")


def cost_breakdown(workflow: Workflow) -> dict[str, Any]:
    """Spend (what the budget counts: charged costs, and the estimates of requests in flight or of
    unknown outcome), calls and tokens, per node, activity and model, the costliest first."""
    amount = Case(When(status=UsageEntry.Status.CHARGED, then=F("cost_usd")),
                  When(status=UsageEntry.Status.RELEASED, then=Value(Decimal(0))),
                  default=F("reserved_usd"), output_field=DecimalField(max_digits=14, decimal_places=6))
    grouped = (UsageEntry.objects.filter(workflow=workflow).values("operation_id", "model")
               .annotate(usd=Sum(amount), calls=Count("pk"), **{t: Sum(t) for t in TOKENS}).order_by())
    steps = dict((op, (node, name)) for op, node, name in Activity.objects.filter(workflow=workflow).values_list(
        "operation_id", "node", "name"))
    by: dict[str, dict[str, dict[str, Any]]] = {"node": {}, "activity": {}, "model": {}}
    total = Decimal(0)
    for row in grouped:
        node, name = steps.get(row["operation_id"], ("—", "—"))
        total += row["usd"] or 0
        for axis, key in (("node", node), ("activity", name), ("model", row["model"])):
            into = by[axis].setdefault(key, {axis: key, "usd": Decimal(0), "calls": 0, **{t: 0 for t in TOKENS}})
            into["usd"] += row["usd"] or 0
            into["calls"] += row["calls"]
            for t in TOKENS:
                into[t] += row[t] or 0
    return {"workflow_id": workflow.pk, "spent_usd": str(total.quantize(MICRO_USD)),
            **{f"by_{axis}": [{**r, "usd": str(r["usd"].quantize(MICRO_USD))}
                              for r in sorted(rows.values(), key=lambda r: (-r["usd"], str(r[axis])))]
               for axis, rows in by.items()}}
