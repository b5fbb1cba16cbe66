"""Launch and supersede with an idempotency key: a client that sends the same
request again after a lost answer gets the first result, never a second workflow or a second
intent version; the key with another request is refused and changes nothing."""
from __future__ import annotations

import json
from collections.abc import Iterator
from io import StringIO
from typing import Any

import pytest
from django.core.management import call_command
from django.core.management.base import CommandError

from tests.conftest import one_event_kind, run_at_once
from workflows import services
from workflows.errors import IdempotencyKeyReused, InvalidInput
from workflows.models import ClientRequest, Intent, Workflow
from workflows.services import Outcome
from workflows.testing import registered

KIND = "test-client-keys"


WaitForGo = one_event_kind(KIND)


@pytest.fixture(autouse=True)
def kind() -> Iterator[None]:
    with registered(WaitForGo):
        yield


def launch(key: str, goal: str = "Answer the customer", **options: Any) -> tuple[Workflow, bool]:
    return services.workflow_launch_once(idempotency_key=key, kind=KIND, goal=goal,
                                         options=services.LaunchOptions(**options))


def agent(*args: str) -> Any:
    out = StringIO()
    call_command("agent", *args, "--json", stdout=out)
    return json.loads(out.getvalue())


@pytest.mark.django_db
def test_the_same_launch_twice_with_one_key_makes_one_workflow():
    """The retry after a lost answer returns the first workflow (created False) and writes nothing."""
    first, created = launch("req-1", max_hours=5, budget_total_usd=None)
    again, created_again = launch("req-1", max_hours=5.0)

    assert (created, created_again) == (True, False)
    assert again.pk == first.pk
    assert Workflow.objects.count() == 1
    assert ClientRequest.objects.get().workflow_id == first.pk


@pytest.mark.django_db
def test_the_key_with_another_launch_is_refused_and_changes_nothing():
    """Another goal, kind option or amount under a used key: IdempotencyKeyReused naming the
    workflow the key made; no workflow, no key row added."""
    first, _ = launch("req-2")
    for other in ({"goal": "Another goal"}, {"priority": 9}, {"max_hours": 2}):
        with pytest.raises(IdempotencyKeyReused, match=f"Idempotency key 'req-2' was used for another launch "
                                                       f"request \\(workflow {first.pk}\\), with other values"):
            launch("req-2", **other)
    assert Workflow.objects.count() == 1 and ClientRequest.objects.count() == 1


@pytest.mark.django_db
def test_a_refused_launch_leaves_its_key_free():
    """A launch refused for bad input writes nothing, its key included: the corrected launch may use it."""
    with pytest.raises(InvalidInput, match="The priority must be a whole number from 0 to 10"):
        launch("req-3", priority=11)
    assert not ClientRequest.objects.exists()
    workflow, created = launch("req-3")
    assert created and Workflow.objects.get().pk == workflow.pk


@pytest.mark.django_db
@pytest.mark.parametrize("key", ["x" * 201, "caf\u00e9", "tab\there", " padded"])
def test_a_bad_key_is_refused(key):
    with pytest.raises(InvalidInput, match="The idempotency key .* must be 1–200 printable ASCII characters"):
        launch(key)
    assert not Workflow.objects.exists()


@pytest.mark.django_db(transaction=True)
@pytest.mark.usefixtures("rung")
def test_two_concurrent_launches_with_one_key_make_one_workflow():
    """Two connections launch with one key at the same moment: the unique constraint makes the
    second wait for the first and return its workflow."""
    results = run_at_once(lambda: launch("race-1"), count=2)

    assert not [r for r in results if isinstance(r, Exception)], results
    assert sorted(created for _, created in results) == [False, True]
    assert results[0][0].pk == results[1][0].pk
    assert Workflow.objects.count() == 1 and ClientRequest.objects.count() == 1


@pytest.mark.django_db
@pytest.mark.usefixtures("rung")
def test_the_same_supersede_twice_makes_one_intent_version():
    """The repeated supersede answers already_applied naming v2; there is no v3."""
    workflow, _ = launch("")
    first = services.workflow_supersede(workflow_id=workflow.pk, goal="Answer in French", idempotency_key="sup-1")
    again = services.workflow_supersede(workflow_id=workflow.pk, goal="Answer in French", idempotency_key="sup-1")

    assert (first.outcome, first.intent_version) == (Outcome.APPLIED, 2)
    assert (again.outcome, again.intent_version) == (Outcome.ALREADY_APPLIED, 2)
    assert again.message == (f"This supersede (key 'sup-1') already made intent v2 of workflow {workflow.pk}; "
                             "nothing changed.")
    assert list(Intent.objects.filter(workflow=workflow).values_list("version", flat=True)) == [1, 2]
    with pytest.raises(IdempotencyKeyReused, match="'sup-1' was used for another supersede request"):
        services.workflow_supersede(workflow_id=workflow.pk, goal="Answer in German", idempotency_key="sup-1")
    other, _ = launch("")
    with pytest.raises(IdempotencyKeyReused, match="'sup-1' was used for another supersede request"):
        services.workflow_supersede(workflow_id=other.pk, goal="Answer in French", idempotency_key="sup-1")
    assert Intent.objects.filter(workflow=other).count() == 1


@pytest.mark.django_db(transaction=True)
@pytest.mark.usefixtures("rung")
def test_two_concurrent_supersedes_with_one_key_make_one_intent_version():
    workflow, _ = launch("")
    results = run_at_once(lambda: services.workflow_supersede(
        workflow_id=workflow.pk, goal="Answer in French", idempotency_key="sup-race"))

    assert sorted(r.outcome for r in results) == [Outcome.ALREADY_APPLIED, Outcome.APPLIED], results
    assert Intent.objects.filter(workflow=workflow).count() == 2


@pytest.mark.django_db
@pytest.mark.usefixtures("rung")
def test_the_command_line_takes_the_key_for_launch_and_supersede():
    """`agent launch --idempotency-key K` twice prints one workflow; with another goal it exits 3
    with the service's text; `agent supersede --idempotency-key K` twice makes v2 only."""
    first = agent("launch", KIND, "--goal", "Answer", "--idempotency-key", "cli-1")
    again = agent("launch", KIND, "--goal", "Answer", "--idempotency-key", "cli-1")
    assert first == again and Workflow.objects.count() == 1
    text = StringIO()
    call_command("agent", "launch", KIND, "--goal", "Answer", "--idempotency-key", "cli-1", stdout=text)
    assert f"Workflow {first['id']} ({KIND}) was launched before with this idempotency key" in text.getvalue()

    with pytest.raises(CommandError) as refused:
        agent("launch", KIND, "--goal", "Another", "--idempotency-key", "cli-1")
    assert refused.value.returncode == 3
    assert str(refused.value) == (f"Idempotency key 'cli-1' was used for another launch request (workflow "
                                  f"{first['id']}), with other values; nothing was changed. Send that request again "
                                  "to get its result, or use a new key for a new launch.")

    wid = str(first["id"])
    superseded = [agent("supersede", wid, "--goal", "Answer in French", "--idempotency-key", "cli-s")
                  for _ in range(2)]
    assert [(s["outcome"], s["intent_version"]) for s in superseded] == [("applied", 2), ("already_applied", 2)]
