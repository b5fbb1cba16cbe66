"""The outside kind on real workers and beat, with the plugin's ``workers`` fixture."""
import os

import pytest
from notes_kind import BOARD  # importing it registers the kind in this process too (the workers import it by name)

from agentops.kind.presentation import Activity, Workflow
from agentops.kind.testing import launch

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture
def workers_broker_url():
    return os.environ["CELERY_BROKER_URL"]  # a Redis DB the runner gave these tests alone


def test_a_reminder_sleeps_and_pins_its_note_on_real_workers(workers):
    workers.extra_env["AGENTOPS_AGENT_MODULES"] = "notes_kind"
    workers.start(workers=("wa",), beats=("beat",))
    workflow = launch("outside_reminder", params={"text": "Call Ada", "delay_seconds": 2})

    workers.wait_for(lambda: Workflow.objects.get(pk=workflow.pk).status == "completed", timeout=90,
                     what="the reminder pinned by the workers")
    pin = Activity.objects.get(workflow=workflow, name="pin_note")
    assert Workflow.objects.get(pk=workflow.pk).result == {"pin": pin.sent_key}
    assert BOARD.pins == []  # pinned in the worker's process, after beat fired the timer: none in this one
