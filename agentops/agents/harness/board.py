"""The feature list as pure functions: a feature's changes, check results applied to it (with
their evidence), what a check run needs of each feature, the regression share after a pass, the
board a session's briefing shows and a blocked feature's fresh allotment.
"""
from __future__ import annotations

from typing import Any, cast

from agentops.agents.harness.checks import CheckResult, Feature


def with_changes(features: list[Feature], fid: str, **changes: Any) -> list[Feature]:
    return [cast(Feature, {**f, **changes}) if f["id"] == fid else f for f in features]


def apply_results(features: list[Feature], results: list[CheckResult]) -> list[Feature]:
    """Each result decides its feature's status (a blocked feature stays blocked), with its evidence."""
    by_id = {r["feature"]: r for r in results}
    out: list[Feature] = []
    for f in features:
        r = by_id.get(f["id"])
        if r is None:
            out.append(f)
            continue
        status = "passing" if r["passed"] else ("blocked" if f.get("status") == "blocked" else "failing")
        out.append(cast(Feature, {**f, "status": status, "evidence": r}))
    return out


def to_run(features: list[Feature]) -> list[Feature]:
    """What a check run needs of each feature (its id and check): a run's input stays small at 500."""
    return [cast(Feature, {"id": f["id"], "check": f["check"]}) for f in features]


def regression_share(others: list[Feature], *, passes: int, rotation: int, max_checks: int,
                     full_every: int) -> tuple[list[Feature], int]:
    """Which passing checks a regression run takes after an accepted pass, and the next rotation.

    All of them when ``max_checks`` is 0, when there are no more than that, or on every
    ``full_every``-th pass; else the next ``max_checks`` in feature-list order from ``rotation``
    (wrapping round), so every passing check runs at least once every ceil(passing / max_checks)
    passes, and VERIFY_ALL runs every check before the run can complete.
    """
    if not max_checks or len(others) <= max_checks or (full_every and (passes + 1) % full_every == 0):
        return others, rotation
    start = rotation % len(others)
    chosen = (others[start:] + others[:start])[:max_checks]
    return chosen, (start + max_checks) % len(others)


def board_rows(features: list[Feature]) -> list[dict[str, str]]:
    return [{"id": f["id"], "status": f.get("status", "failing")} for f in features]


def unblocked(feature: Feature, extra_attempts: int) -> Feature:
    """A fresh allotment for a blocked feature: more attempts, a zero spend, loop breakers reset."""
    return cast(Feature, {**feature, "status": "failing", "reason": "", "spent_usd": "0", "error_streak": 0,
                          "diff_streak": 0, "attempt_limit": feature.get("attempts", 0) + extra_attempts})

