"""Regression that scales: after an accepted pass a bounded, rotating share of the other passing checks runs,
all of them every Nth pass; every passing check is re-run within ceil(passing / share) passes."""
from __future__ import annotations

import math
from typing import Any

import pytest

from agentops.agents.harness.board import regression_share
from agentops.agents.harness.definition import Harness
from agentops.kind import InvalidInput


def features(n: int) -> list[Any]:
    return [{"id": f"F{i:03d}", "check": f"python checks/f{i}.py", "status": "passing"} for i in range(1, n + 1)]


def test_a_share_rotates_through_every_passing_check():
    others, rotation, seen_at = features(25), 0, {}
    for number in range(1, 4):
        chosen, rotation = regression_share(others, passes=number - 1, rotation=rotation, max_checks=10,
                                            full_every=0)
        assert len(chosen) == 10
        for f in chosen:
            seen_at.setdefault(f["id"], number)
    assert len(seen_at) == 25 and max(seen_at.values()) == math.ceil(25 / 10)
    assert rotation == 30 % 25


def test_every_nth_pass_runs_them_all_and_small_boards_always_do():
    others = features(40)
    assert len(regression_share(others, passes=9, rotation=7, max_checks=10, full_every=10)[0]) == 40
    assert len(regression_share(others, passes=8, rotation=7, max_checks=10, full_every=10)[0]) == 10
    assert regression_share(others[:10], passes=0, rotation=3, max_checks=10, full_every=0) == (others[:10], 3)
    assert regression_share(others, passes=0, rotation=0, max_checks=0, full_every=0) == (others, 0)


def test_check_runs_per_pass_at_200_features_are_bounded_by_the_policy():
    """200 features made to pass one by one: the regression runs average the share plus a full run every tenth pass."""
    board, rotation, runs = features(200), 0, []
    for passes in range(200):
        others = board[:passes]
        if not others:
            continue
        chosen, rotation = regression_share(others, passes=passes, rotation=rotation, max_checks=10, full_every=10)
        runs.append(len(chosen))
    # The worst pass is a full one (199 others); on average a pass reruns under 30, against 99.5 when all rerun.
    assert max(runs) == 199 and sum(runs) / len(runs) < 30


@pytest.mark.parametrize(("name", "value"), [("regression_max_checks", "501"), ("regression_full_every", "-1")])
def test_the_policy_parameters_are_checked_at_launch(name, value, tmp_path):
    with pytest.raises(InvalidInput, match=f"Parameter {name}="):
        Harness().validate_params({"workspace": str(tmp_path / "ws"), name: value})
