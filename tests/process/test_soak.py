"""The soak (``bench/soak.py``, ``make soak``) in CI: two minutes of randomized faults, a fixed seed, no violations.

It runs as its own process, as ``make soak`` does: its own database on the test server (created
and dropped), its own Redis server on a free port (restarted by the nemesis), its own deploy
target, three workers and a beat, each reaching PostgreSQL and Redis through forwarders of its
own (the nemesis partitions them); only three harness agents (``approve``, ``resume`` and
``propose``) beside the release and autonomous ones and the trees (a root and its children, cancelled,
superseded or left to complete, under the release changes of the nemesis). The seed is fixed, so a failure here replays
locally with ``make soak SOAK_ARGS="--seconds 120 --seed 20261201 …"`` (the command is in the
failure message).
"""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from django.conf import settings

from tests.process.harness import REPO_ROOT
from workflows.testing.cluster import subprocess_database_url

pytestmark = [pytest.mark.process]

SEED = 20261201
# Every kind but clock_skew, which needs libfaketime (the soak says so when it skips it).
FAULT_KINDS = ("worker_kill", "worker_pause", "beat_restart", "second_beat", "broker_restart", "broker_flush",
               "pg_terminate", "target_drop", "kill_after_accept", "partition", "release_change")
# Five trees: each of soak_tree.TREE_PLANS once.
ARGS = ["--seconds", "120", "--seed", str(SEED), "--release", "12", "--autonomous", "3", "--harness", "3",
        "--trees", "5", "--fault-gap", "2", "4",
        "--converge-timeout", "240"]

# Within the test's own timeout: the soak's run, then its tear-down after an interrupt.
SOAK_SECONDS, TEARDOWN_SECONDS = 420, 45


@pytest.mark.timeout(480)
def test_a_short_soak_under_every_fault_kind_has_no_violations(tmp_path: Path, figures: Any) -> None:
    """Every workflow converges as its plan allows, each operation identity has at most one effect,
    every model call is charged and every history is contiguous, under every kind of fault; the
    harness agent that proposes a feature change completes under the contract approved for it."""
    if settings.DATABASES["default"]["ENGINE"] != "django.db.backends.postgresql":
        pytest.skip("the soak needs PostgreSQL: run with DATABASE_URL=postgres://…")
    server = subprocess_database_url().rsplit("/", 1)[0]
    out = tmp_path / "soak.json"
    command = [sys.executable, "-m", "bench.soak", *ARGS, "--postgres-url", server, "--run-dir", str(tmp_path),
               "--out", str(out)]
    replay = f"make soak SOAK_ARGS=\"{' '.join(ARGS)}\""
    # Its own session: a soak past its time is interrupted as a whole, so that its tear-down stops
    # the workers, beat, Redis and deploy target it started instead of leaving them running.
    soak = subprocess.Popen(command, cwd=REPO_ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            start_new_session=True)
    try:
        stdout, stderr = soak.communicate(timeout=SOAK_SECONDS)
    except subprocess.TimeoutExpired:
        os.killpg(soak.pid, signal.SIGINT)
        try:
            stdout, stderr = soak.communicate(timeout=TEARDOWN_SECONDS)
        except subprocess.TimeoutExpired:
            os.killpg(soak.pid, signal.SIGKILL)
            stdout, stderr = soak.communicate()
        pytest.fail(f"the soak ran past {SOAK_SECONDS} s (replay: {replay}); logs under {tmp_path}\n"
                    f"{stdout[-12000:]}\n{stderr[-4000:]}")
    assert soak.returncode == 0 and out.exists(), (
        f"the soak failed (replay: {replay}); logs under {tmp_path}\n{stdout[-12000:]}\n{stderr[-4000:]}")
    result = json.loads(out.read_text())
    assert result["violations"] == [] and result["duplicates"] == 0 and result["lost"] == 0, result
    assert all(result["faults"].get(kind, 0) >= 1 for kind in FAULT_KINDS), result["faults"]
    # The propose agent's proposal was approved and checked (the soak checks it only of a completed agent:
    # faults may fail a harness agent whose activity runs out of attempts, an outcome the soak allows).
    propose = {k: v for k, v in result["outcomes"].items() if k.startswith("harness:propose:")}
    assert set(propose) <= {"harness:propose:completed", "harness:propose:failed_by_faults"}, propose
    if "harness:propose:completed" in propose:
        assert result["harness"].get("proposals_approved") == 1, result["harness"]
    # The trees (bench/soak_tree.py): cancelled, superseded and completed ones, beside the others; the
    # soak's violations already hold their checks (no effect left live of a changed tree, none made
    # twice, each completed root owning exactly its children's effects, spend within the root's budget).
    trees = result["trees"]
    assert trees["launched"] == 5 and trees["children"] >= trees["launched"], trees
    assert trees["effects_live_of_cancelled_or_superseded"] == 0 and trees["effects_made_twice"] == 0, trees
    figures("soak (CI)", seed=SEED, workflows=result["workflows"]["total"], faults=result["faults"],
            partitions=result["partitions"], effects=result["effects"], duplicates=result["duplicates"],
            lost=result["lost"], converge_s=result["converge_s"], wall_s=result["wall_s"],
            leases_expired=result["recovery"]["activity.lease_expired"], trees=trees)
