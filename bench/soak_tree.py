"""The soak's trees: a parent whose two children each make one effect, and what is checked of them.

A tree's root (kind ``soak-tree``) asks the model for a plan (PLAN), starts two children (kind
``soak-tree-leaf``, each with a share of the root's budget) and waits for both (FAN), then asks the
model once more (CLOSE) and completes with its children's deployments. Each child sleeps a moment
(a durable timer), asks the model for a note and deploys once on the soak's deploy target, under
its operation's idempotency key (the release kind's ``deploy``, with its reconcile and its
compensation), then completes: its deployment is handed to the root, which releases it only when
it completes. Every model call is on the scripted provider through ``metered_complete``, so the
spend is real ledger rows counted against the budgets. Importing the module registers both kinds
(``AGENTOPS_AGENT_MODULES`` on the soak's workers).

Plans, drawn from the seed:

- ``complete``: left alone → ``completed``;
- ``cancel`` / ``supersede``: the root is cancelled, or given a new goal, a random moment after
  its launch;
- ``cancel_after_child`` / ``supersede_after_child``: the same, right after the soak sees one of
  the root's current children completed (its deployment kept for the root, perhaps not yet
  collected).

The checks: no effect live that belongs to a cancelled tree or to a superseded intent of a tree;
no operation identity with two effects; a completed tree owns live exactly its current
children's two deployments (released to it, none active), each child at most one; every
tree's spend (charged cost and uncertain estimates of all its workflows) within the root's
total budget.
"""
from __future__ import annotations

from collections import Counter
from decimal import Decimal
from typing import Any

ROOT_KIND, LEAF_KIND = "soak-tree", "soak-tree-leaf"
TREE_PLANS = ("complete", "cancel_after_child", "supersede_after_child", "cancel", "supersede")
TREE_WEIGHTS = (3, 2, 2, 1, 1)
# The root's total budget and each child's share (USD): a scripted call costs about a tenth of a
# cent and reserves about three times that; the room left covers the root's own calls and a
# second pair of children after a new goal or a revalidation.
ROOT_BUDGET_USD = Decimal("0.10")
CHILD_BUDGET_USD = Decimal("0.02")
# A child sleeps this long before its work (a timer beat fires), so that changes of mind and
# release changes find children before and after their effects.
LEAF_PAUSE_SECONDS = (0, 3)
# A "cancel" or "supersede" plan changes its mind this many seconds after the launch.
CHANGE_AFTER_SECONDS = (0.5, 10.0)


def launch_params(rng: Any) -> dict[str, Any]:
    return {"pause_seconds": [rng.randint(*LEAF_PAUSE_SECONDS) for _ in range(2)],
            "child_budget_usd": str(CHILD_BUDGET_USD)}


def wants_change(plan: Any, now: float, children: list[Any]) -> bool:
    """Whether the soak changes its mind about this tree now: a moment after its launch, or as soon
    as one of the root's current children completed."""
    if plan.action == "complete" or plan.changed:
        return False
    if plan.action.endswith("_after_child"):
        return any(c.status == "completed" for c in children)
    return now >= plan.launch_at + plan.change_after


def allowed(plan: Any) -> set[str]:
    if plan.action.startswith("cancel") and plan.changed == "cancelled":
        return {"cancelled"}
    return {"completed"}


def members(root_ids: list[int]) -> dict[int, int]:
    """Every workflow of the trees of ``root_ids``: workflow id → its root's id."""
    from workflows.models import Workflow

    root_of = {pk: pk for pk in root_ids}
    frontier = list(root_ids)
    while frontier:
        kids = list(Workflow.objects.filter(parent_id__in=frontier).values_list("pk", "parent_id"))
        for pk, parent in kids:
            root_of[pk] = root_of[parent]
        frontier = [pk for pk, _ in kids]
    return root_of


def spend_of(workflow_ids: list[int]) -> dict[int, Decimal]:
    """What counts against a budget, per workflow: charged cost and uncertain estimates."""
    from workflows.models import UsageEntry

    spent: dict[int, Decimal] = {}
    for pk, status, cost, reserved in UsageEntry.objects.filter(
            workflow_id__in=workflow_ids, status__in=("charged", "uncertain", "reserved")).values_list(
            "workflow_id", "status", "cost_usd", "reserved_usd"):
        spent[pk] = spent.get(pk, Decimal(0)) + (cost if status == "charged" else reserved)
    return spent


def check(plans: list[Any], effects: dict[str, dict[str, int]], workflow_of: Any, v: list[str]) -> dict[str, Any]:
    """The trees' checks against the deploy target's effects; returns the figures (violations appended to ``v``)."""
    from workflows.models import Commitment, Event, Workflow

    trees = [p for p in plans if p.kind == "tree" and p.workflow_id is not None]
    root_of = members([p.workflow_id for p in trees])
    rows = Workflow.objects.filter(pk__in=list(root_of)).select_related("parent_wait").in_bulk()
    live: dict[int, list[str]] = {}
    twice = 0
    for key, counts in effects.items():
        owner = workflow_of(key)
        if owner not in root_of:
            continue
        if counts["created"] > 1 or counts["deleted"] > 1:
            twice += 1
            v.append(f"tree {root_of[owner]}: operation identity {key} made {counts['created']} times, "
                     f"undone {counts['deleted']} times")
        if counts["created"] > counts["deleted"]:
            live.setdefault(root_of[owner], []).append(key)
    tally: Counter[str] = Counter(launched=len(trees))
    stranded = 0
    owning = 0
    ratios: list[float] = []
    spent = spend_of(list(root_of))
    for plan in trees:
        root = rows[plan.workflow_id]
        tally[root.status] += 1
        tally["superseded"] += plan.changed == "superseded"
        tree = [pk for pk, r in root_of.items() if r == root.pk]
        tally["children"] += len(tree) - 1
        keys = sorted(live.get(root.pk, []))
        label = f"tree {root.pk} ({plan.action}, {plan.changed or 'no change of mind'}, {root.status})"
        if root.status == "completed":
            expected = sorted(d["idempotency_key"] for d in (root.result or {}).get("deployments", []))
            current = [pk for pk in tree if pk != root.pk and rows[pk].status == "completed"
                       and rows[pk].parent_wait is not None
                       and rows[pk].parent_wait.intent_version == root.intent_version]
            owners = sorted(workflow_of(k) for k in keys)
            if len(expected) == 2 and keys == expected and owners == sorted((root.result or {}).get("children", [])) \
                    and sorted(current) == owners:
                owning += 1
            else:
                stranded += len(set(keys) - set(expected))
                v.append(f"{label}: owns live {keys}, not exactly its current children's {expected} "
                         f"(children of this intent completed: {sorted(current)})")
        elif keys:
            stranded += len(keys)
            v.append(f"{label}: effects left live {keys}")
        active = list(Commitment.objects.filter(workflow_id__in=tree, status="active").values_list("pk", flat=True))
        if active:
            v.append(f"{label}: commitments still active after convergence: {active}")
        total = root.budget_total_usd
        used = sum((spent.get(pk, Decimal(0)) for pk in tree), Decimal(0))
        if total:
            ratios.append(float(used / total))
            if used > total:
                v.append(f"{label}: the tree spent {used} USD, over the root's total {total}")
        else:
            v.append(f"{label}: launched without a total budget")
    kinds = ("release.kept_course", "release.changed", "commitment.adopted", "child.cancelled")
    events = Counter(Event.objects.filter(workflow_id__in=list(root_of), kind__in=kinds).values_list("kind", flat=True))
    return {**dict(tally), "changed_after_child": sum(p.changed_after_child for p in trees),
            "effects_live_of_cancelled_or_superseded": stranded, "effects_made_twice": twice,
            "completed_owning_exactly_their_childrens_effects": f"{owning}/{tally['completed']}",
            "max_spend_ratio": round(max(ratios), 3) if ratios else None, **dict(sorted(events.items()))}
