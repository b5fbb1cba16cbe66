"""The release is what runs: workers configured otherwise than the shell that launches.

The workers run one model; this test process (the launching "shell") is configured with
another. A worker announces its release when it starts, the launch records it, and every call
goes to it: were the shell's release recorded while the workers called theirs, the release shown
(and the simulated label) would not be what ran.
"""
from __future__ import annotations

import pytest
from django.conf import settings

from tests.process.harness import launch_release, wait_until_status
from workflows.models import BehavioralRelease, UsageEntry, Workflow

pytestmark = [pytest.mark.process, pytest.mark.django_db(transaction=True)]

WORKERS_MODEL = "claude-on-the-workers"


def test_a_launch_from_a_shell_configured_otherwise_records_and_runs_the_workers_release(
    cluster, git_repo, requester, figures,
):
    assert settings.AGENTOPS_MODEL != WORKERS_MODEL
    cluster.extra_env["AGENTOPS_MODEL"] = WORKERS_MODEL
    cluster.start(workers=("wa",), beats=("beat",))
    announced = cluster.wait_for(
        lambda: BehavioralRelease.objects.filter(announced_at__isnull=False).order_by("-announced_at").first(),
        timeout=20, what="the worker's release announcement")

    ids = [launch_release(git_repo, requester, f"Ship release notes {n}") for n in range(2)]
    wait_until_status(cluster, ids, "waiting", node="WAIT_FOR_APPROVAL", timeout=90)

    workflows = list(Workflow.objects.filter(pk__in=ids).select_related("release"))
    proposed = {w.state["proposal"]["model"]["model"] for w in workflows}
    charged = set(UsageEntry.objects.filter(workflow_id__in=ids).values_list("model", flat=True))
    figures("release announced by the workers", announced=announced.model,
            shell=settings.AGENTOPS_MODEL, recorded=sorted({w.release.model for w in workflows}),
            proposed=sorted(proposed), ledger=sorted(charged))
    assert announced.model == f"scripted/{WORKERS_MODEL}"
    assert {w.release_id for w in workflows} == {announced.pk}
    assert proposed == charged == {f"scripted/{WORKERS_MODEL}"}
