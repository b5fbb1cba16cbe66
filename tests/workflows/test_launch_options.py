"""The launch options, declared once (``services.LaunchOptions``): `agent launch`, POST /api/workflows
and the admin's launch form hand the service the same value, so the same options store the same
workflow whichever door they came in by; a bad one is refused at each door and launches nothing."""
from __future__ import annotations

import json
from decimal import Decimal
from io import StringIO
from typing import Any

import pytest
from django.contrib.auth.models import User
from django.core.management import CommandError, call_command
from django.test import Client
from django.urls import reverse

from tests.admin.conftest import logged_in, make_staff
from tests.api.conftest import token_for
from workflows import registry, services
from workflows.errors import InvalidInput
from workflows.models import Workflow
from workflows.services import LaunchOptions

pytestmark = pytest.mark.django_db

STORED = ("priority", "budget_total_usd", "budget_hourly_usd", "release_policy", "stagnation_policy",
          "fallback_model")


@pytest.fixture
def launcher(db: None) -> User:
    user = User.objects.create_user("lena", password="lena-password")
    return make_staff(user, "workflows.view_workflow", "workflows.add_workflow")


def stored(workflow_id: int) -> dict[str, Any]:
    workflow = Workflow.objects.get(pk=workflow_id)
    hours = (workflow.deadline - workflow.created_at).total_seconds() / 3600 if workflow.deadline else None
    labels = dict(workflow.labels.values_list("key", "value"))
    return {name: getattr(workflow, name) for name in STORED} | {"max_hours": round(hours, 6) if hours else None,
                                                                 "labels": labels, "by": workflow.launched_by_id}


def by_command(user: User) -> int:
    out = StringIO()
    call_command("agent", "launch", "autonomous", "--goal", "Write the notes", "--user", user.username,
                 "--priority", "8", "--budget-total", "2.50", "--budget-hourly", "0.5", "--max-hours", "6",
                 "--release-policy", "pin", "--stagnation-policy", "pause", "--fallback-model", "claude-haiku-4-5",
                 "--label", "team=docs", "--json", stdout=out)
    return int(json.loads(out.getvalue())["id"])


def by_api(user: User) -> int:
    client = Client(HTTP_AUTHORIZATION=f"Bearer {token_for(user.username)}")
    answer = client.post("/api/workflows", content_type="application/json", data={
        "kind": "autonomous", "goal": "Write the notes", "priority": 8, "budget_total_usd": "2.50",
        "budget_hourly_usd": 0.5, "max_hours": 6, "release_policy": "pin", "stagnation_policy": "pause",
        "fallback_model": "claude-haiku-4-5", "labels": {"team": "docs"}})
    assert answer.status_code == 201, answer.content
    return int(answer.json()["id"])


def by_admin(user: User) -> int:
    answer = logged_in(user).post(reverse("admin:workflows_workflow_launch"), {
        "kind": "autonomous", "goal": "Write the notes", "priority": "8", "budget_total_usd": "2.50",
        "budget_hourly_usd": "0.5", "max_hours": "6", "release_policy": "pin", "stagnation_policy": "pause",
        "fallback_model": "claude-haiku-4-5", "labels": "team=docs"})
    assert answer.status_code == 302, answer.content.decode()[-2000:]
    return int(answer["Location"].split("/workflow/")[1].split("/")[0])


def test_the_same_options_by_each_door_store_the_same_workflow(launcher: User) -> None:
    expected = {"priority": 8, "budget_total_usd": Decimal("2.5"), "budget_hourly_usd": Decimal("0.5"),
                "release_policy": "pin", "stagnation_policy": "pause", "fallback_model": "claude-haiku-4-5",
                "max_hours": 6.0, "labels": {"team": "docs"}, "by": launcher.pk}
    assert [stored(launch(launcher)) for launch in (by_command, by_api, by_admin)] == [expected] * 3


def test_the_admin_form_offers_every_option_with_the_help_the_flags_give(launcher: User) -> None:
    page = logged_in(launcher).get(reverse("admin:workflows_workflow_launch"), {"kind": "autonomous"})
    text = page.content.decode()
    for name, help_text in services.launch_options.HELP.items():
        if name != "labels":
            assert f'name="{name}"' in text, name
            assert help_text[1:40] in text.replace("&#x27;", "'"), name
    assert "How it runs" in text


def test_left_empty_on_the_form_the_options_are_the_kinds(launcher: User) -> None:
    answer = logged_in(launcher).post(reverse("admin:workflows_workflow_launch"), {
        "kind": "autonomous", "goal": "Write the notes", "priority": "", "max_hours": "", "release_policy": "",
        "stagnation_policy": "", "fallback_model": "", "budget_total_usd": "", "budget_hourly_usd": ""})
    assert answer.status_code == 302
    workflow = Workflow.objects.get()
    definition = registry.definition("autonomous")
    assert (workflow.priority, workflow.budget_total_usd, workflow.release_policy, workflow.stagnation_policy) == (
        5, None, definition.default_release_policy, "record")


@pytest.mark.parametrize(("door", "bad", "message"), [
    ("admin", {"priority": "11"}, "less than or equal to 10"),
    ("admin", {"fallback_model": "no spaces allowed"}, "fallback model must be a model name"),
    ("command", ["--priority", "11"], "priority must be a whole number from 0 to 10"),
    ("command", ["--max-hours", "0"], "time limit must be between 0"),
    ("api", {"priority": 11}, "less than or equal to 10"),
    ("api", {"budget_total_usd": "0.00001"}, "decimal"),
])
def test_a_bad_option_is_refused_at_its_door_and_launches_nothing(launcher: User, door: str, bad: Any,
                                                                  message: str) -> None:
    if door == "admin":
        answer = logged_in(launcher).post(reverse("admin:workflows_workflow_launch"),
                                          {"kind": "autonomous", "goal": "Write the notes", **bad})
        assert answer.status_code == 200 and message in answer.content.decode().replace("&#x27;", "'")
    elif door == "command":
        with pytest.raises(CommandError, match=message):
            call_command("agent", "launch", "autonomous", "--goal", "Write the notes", *bad, stdout=StringIO())
    else:
        client = Client(HTTP_AUTHORIZATION=f"Bearer {token_for(launcher.username)}")
        answer = client.post("/api/workflows", content_type="application/json",
                             data={"kind": "autonomous", "goal": "Write the notes", **bad})
        assert answer.status_code == 400 and message in answer.content.decode()
    assert not Workflow.objects.exists()


def test_options_of_a_request_leave_out_what_is_not_an_option() -> None:
    options = LaunchOptions.of({"kind": "autonomous", "goal": "g", "priority": 7, "labels": {"a": "b"}, "x": 1})
    assert options == LaunchOptions(priority=7, labels={"a": "b"})


def test_checked_fills_in_the_kinds_defaults_and_names_the_request_by_value() -> None:
    definition = registry.definition("autonomous")
    checked = LaunchOptions(budget_total_usd=Decimal("5.00")).checked(definition)
    assert (checked.release_policy, checked.max_hours) == (definition.default_release_policy,
                                                           definition.default_max_hours)
    assert checked.request() == LaunchOptions(budget_total_usd=Decimal("5")).checked(definition).request()
    with pytest.raises(InvalidInput, match="Stagnation policy 'sometimes' is not one of"):
        LaunchOptions(stagnation_policy="sometimes").checked(definition)
