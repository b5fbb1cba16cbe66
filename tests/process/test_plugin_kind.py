"""A kind of one's own, from docs/authoring.md: one package plus one settings line, run by real workers."""
from __future__ import annotations

from pathlib import Path

import pytest
from django.conf import settings

from examples.reminder.activities import send_reminder
from examples.reminder.definition import Reminder
from tests.process.harness import Cluster, wait_until_status
from workflows import clock, services
from workflows.models import Event, Installation, Timer, Workflow
from workflows.testing import registered

pytestmark = [pytest.mark.process, pytest.mark.django_db(transaction=True)]

MODULES = ",".join([*settings.AGENTOPS_AGENT_MODULES, "examples.reminder"])


def test_the_reminder_example_runs_on_real_workers_with_one_settings_line(cluster: Cluster, figures):
    cluster.extra_env["AGENTOPS_AGENT_MODULES"] = MODULES
    cluster.start(workers=("wa",), beats=("beat",))
    with registered(Reminder, send_reminder):
        ids = [services.workflow_launch(kind="reminder", goal=f"Collect INV-{n}", params={
            "invoice": f"INV-{n}", "email": "ap@example.com", "max_reminders": 2, "days_between": 1}).pk
            for n in range(3)]
        wait_until_status(cluster, ids, "waiting", node="WAIT_FOR_PAYMENT", timeout=60)
        # One invoice stays unpaid past its window (its timer is made due), the others are paid.
        Timer.objects.filter(workflow_id=ids[0]).update(fire_at=clock.now())
        for pk in ids[1:]:
            services.workflow_signal(workflow_id=pk, name="paid", payload={"amount": "10"}, dedupe_key=f"pay-{pk}")
        wait_until_status(cluster, ids[1:], "completed", timeout=60)
        cluster.wait_for(lambda: len(Workflow.objects.get(pk=ids[0]).state.get("sent", [])) == 2
                         and Workflow.objects.get(pk=ids[0]).status == "waiting",
                         timeout=60, what="a second reminder for the unpaid invoice")
        services.workflow_signal(workflow_id=ids[0], name="paid", payload={"amount": "10"}, dedupe_key="late")
        wait_until_status(cluster, ids, "completed", timeout=60)

    sent = sorted(p.name for p in (Path(cluster.tmp_path) / "workspaces" / "outbox").iterdir())
    results = [Workflow.objects.get(pk=pk).result for pk in ids]
    figures("plug-in kind on real workers", workflows=len(ids), reminders_sent=len(sent),
            results=[r["reminders"] for r in results],
            handler_failures=Event.objects.filter(kind="workflow.handler_failed").count())
    assert [r["reminders"] for r in results] == [2, 1, 1]
    # One file per idempotency key: the installation id, then the operation id.
    installation = Installation.objects.get().installation_id
    assert len(sent) == 4 and all(name.startswith(f"{installation}_wf-") for name in sent)
