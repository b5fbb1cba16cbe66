"""Changing a workflow's priority after launch (a launch option, changeable): over
HTTP and from the command line, audited, idempotent, refused where it enters when out of range."""
from __future__ import annotations

import json
from collections.abc import Iterator
from io import StringIO

import pytest
from django.core.management import CommandError, call_command

from tests.api.conftest import Http
from tests.conftest import one_event_kind
from workflows import services
from workflows.models import Event, Workflow
from workflows.testing import registered

pytestmark = pytest.mark.django_db(transaction=True)

Prioritised = one_event_kind("prioritised")


@pytest.fixture(autouse=True)
def prioritised() -> Iterator[None]:
    with registered(Prioritised):
        yield


def test_the_priority_changes_over_http_audited_and_once(http: Http, requester_token: str,
                                                         operator_token: str) -> None:
    launched = http.post("/workflows", {"kind": "prioritised", "goal": "g", "priority": 3}, token=requester_token)
    assert launched.status == 201, launched.body
    base = f"/workflows/{launched.body['id']}"
    denied = http.post(f"{base}/priority", {"priority": 9}, token=requester_token)
    assert denied.status == 403 and "may not change the priority of workflows" in denied.body["error"]
    for bad in ({"priority": 11}, {"priority": -1}, {"priority": "9"}, {"priority": True}, {"priority": 9.5}, {},
                {"priority": 9, "by": "me"}):
        refused = http.post(f"{base}/priority", bad, token=operator_token)
        assert refused.status == 400 and set(refused.body) == {"error"}, (bad, refused.body)
    assert Workflow.objects.get(pk=launched.body["id"]).priority == 3

    changed = http.post(f"{base}/priority", {"priority": 9.0}, token=operator_token)  # JSON Schema's integer
    assert (changed.status, changed.body["outcome"]) == (200, "applied"), changed.body
    assert "may pass the hourly budget" in changed.body["message"]
    again = http.post(f"{base}/priority", {"priority": 9}, token=operator_token)
    assert (again.status, again.body["outcome"]) == (200, "already_applied")
    assert Workflow.objects.get(pk=launched.body["id"]).priority == 9
    events = Event.objects.filter(workflow_id=launched.body["id"], kind="priority.changed")
    assert [(e.data["by"], e.data["old"], e.data["new"]) for e in events] == [("olga", 3, 9)]
    assert http.get(base, token=requester_token).body["spend"]["priority"] == 9

    assert http.post(f"{base}/cancel", {}, token=operator_token).status == 200
    assert http.post(f"{base}/priority", {"priority": 2}, token=operator_token).status == 409
    assert http.post("/workflows/999999/priority", {"priority": 2}, token=operator_token).status == 404


def test_agent_priority_records_the_shell_and_refuses_out_of_range() -> None:
    workflow = services.workflow_launch(kind="prioritised", goal="g")
    out = StringIO()
    call_command("agent", "priority", str(workflow.pk), "10", "--json", stdout=out)
    assert json.loads(out.getvalue())["outcome"] == "applied"
    assert Event.objects.get(workflow=workflow, kind="priority.changed").data["by"].startswith("shell:")
    with pytest.raises(CommandError, match="from 0 to 10"):
        call_command("agent", "priority", str(workflow.pk), "12")
    assert Workflow.objects.get(pk=workflow.pk).priority == 10
