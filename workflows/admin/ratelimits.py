"""The rate-limits page: the shared limiter's scopes, slots and waiting calls, and the activities'
concurrency keys, as the page shows them."""
from __future__ import annotations

from collections.abc import Callable
from typing import Any


def rate_limits_panel() -> dict[str, Any]:
    """The rate-limits page's rows: per scope and dimension its limits and use; waiting calls by
    tenant (the launcher's name for ``user:<id>``) and priority, highest first; slots and caps;
    and the activities' concurrency keys (the database's, shown whatever the limiter's state)."""
    from workflows import ratelimits
    from workflows.ratelimits.limiter import DIMENSIONS
    from workflows.services import slots

    activity_keys = slots.overview()
    now = ratelimits.overview()
    tenants = {tenant for row in (activity_keys or {"keys": []})["keys"] for tenant, _ in row["waiting"]}
    if now is not None and now["up"]:
        tenants |= {tenant for state in now["scopes"] for tenant, _ in state["waiting"]}
    who = tenant_names(tenants)

    def waiting(rows: dict[tuple[str, int], int]) -> list[dict[str, Any]]:
        return [{"tenant": who(tenant), "priority": priority, "n": n}
                for (tenant, priority), n in sorted(rows.items(), key=lambda i: (-i[0][1], i[0][0]))]

    panel: dict[str, Any] = {"activity_keys": None if activity_keys is None else [
        {"key": row["key"], "running": row["running"], "cap": row["cap"], "waiting": waiting(row["waiting"])}
        for row in activity_keys["keys"]]}
    if now is None or not now["up"]:
        return {**panel, "limiter": "off" if now is None else "down"}
    scopes = [{
        "scope": state["scope"], "blocked_seconds": state["blocked_seconds"],
        "pace_percent": round(100 * state["pace"]), "rate_limited": state["rate_limited"],
        "last_429": state["last_429"],
        "dimensions": [{"name": d, "configured": state["configured"][d], "learned": state["learned"].get(d, 0),
                        "effective": state["effective"][d], "available": state["available"][d],
                        "burst": state["burst"][d], "provider_bucket": state["provider_bucket"].get(d),
                        "used": state["burst"][d] - state["available"][d]} for d in DIMENSIONS],
        "waiting": waiting(state["waiting"]),
    } for state in now["scopes"]]
    keys = sorted(set(now["slots"]) | set(now["caps"]))
    return {**panel, "limiter": "up", "scopes": scopes,
            "slots": [{"key": k, "held": now["slots"].get(k, 0), "cap": now["caps"].get(k)} for k in keys]}



def tenant_names(tenants: set[str]) -> Callable[[str], str]:
    """How a page shows a tenant: ``alice (user:3)`` for a launcher who exists, else as it is."""
    from django.contrib.auth import get_user_model

    user_ids = {int(t.removeprefix("user:")) for t in tenants if t.startswith("user:") and t[5:].isdigit()}
    names = dict(get_user_model().objects.filter(pk__in=user_ids).values_list("pk", "username"))

    def who(tenant: str) -> str:
        suffix = tenant.removeprefix("user:")
        return f"{names[int(suffix)]} ({tenant})" if suffix.isdigit() and int(suffix) in names else tenant

    return who
