"""``python -m bench.against``: what it reads from each harness's output, and the ratios it judges."""
from __future__ import annotations

import pytest

from bench.against import RUN_LINE, TARGETS, summary

# Lines the in-flight run printed: the baseline commit's harness (d948bed), then this tree's.
EARLIER = ("[bench   62.6s]   peak 500 in flight, 72.03 calls/s (0.72x ideal), due->sent p99 6.39 s, 686.2 MB, "
           "21 connections; CPU ms per call workers 17.2, postgres 5.5, fake_api 1.2")
THIS = ("[bench   47.4s]   peak 500 in flight, 89.26 calls/s (0.89x ideal), due->sent p99 2.304 s, 755.5 MB, "
        "18 connections, 0 failed attempts; CPU ms per call workers 8.1, postgres 2.6, fake_api 0.9, "
        "worker io1 3.5, worker io2 4.4, worker short 0.3")


@pytest.mark.parametrize(("line", "expected"), [(EARLIER, ("0.72", "17.2", "5.5")), (THIS, ("0.89", "8.1", "2.6"))])
def test_both_harnesses_lines_give_the_ratio_and_the_cpu_per_call(line: str, expected: tuple[str, ...]) -> None:
    found = RUN_LINE.search(line)
    assert found is not None and found.groups() == expected


def test_the_ratios_are_of_the_medians_and_judged_against_the_issues_targets() -> None:
    runs = {"earlier": [{"ratio": 0.7, "worker": 16.0, "postgres": 5.0},
                        {"ratio": 0.7, "worker": 18.0, "postgres": 5.4}],
            "this": [{"ratio": 0.9, "worker": 8.0, "postgres": 3.4}, {"ratio": 0.9, "worker": 9.0, "postgres": 3.6}]}
    report = summary(runs, commit="d948bed", agents=500)
    assert report["worker"] == {"earlier_ms": 17.0, "this_ms": 8.5, "ratio": 0.5, "target": TARGETS["worker"],
                                "met": True}
    assert report["postgres"]["ratio"] == pytest.approx(3.5 / 5.2)
    assert report["postgres"]["met"] is False  # 0.673 against 2 / 3.1 = 0.645
