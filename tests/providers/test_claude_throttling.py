"""Throttling is not failure: rate limits and overloads wait in stored retry windows and give their attempt back."""
from __future__ import annotations

from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import drive
from tests.fakes import anthropic_api as fake
from tests.fakes.anthropic_api import FakeAnthropicAPI
from tests.fakes.claude_agent import ClaudeForAutonomous, seed_workspace
from workflows import clock, services
from workflows.models import Activity, ActivityAttempt, Event, Workflow

pytestmark = pytest.mark.django_db


@pytest.fixture(autouse=True)
def workspaces(settings: Any, tmp_path: Path) -> Path:
    settings.AGENTOPS_WORKSPACE_DIR = tmp_path / "workspaces"
    return Path(settings.AGENTOPS_WORKSPACE_DIR)


def run_until_done(workflow_id: int, time_machine: Any, *, rounds: int = 60) -> list[float]:
    """Drive the workflow, moving the clock to each stored retry window; returns the waits moved over."""
    waits = []
    for _ in range(rounds):
        workflow = drive(workflow_id)
        if workflow.is_terminal:
            break
        due = Activity.objects.filter(workflow_id=workflow_id, status="scheduled").order_by("next_attempt_at").first()
        assert due is not None, f"workflow {workflow_id} is {workflow.status} with nothing scheduled: {workflow.reason}"
        wait = (due.next_attempt_at - clock.now()).total_seconds()
        waits.append(wait)
        time_machine.shift(timedelta(seconds=max(wait, 0) + 0.001))
    return waits


def test_thirty_seconds_of_overload_leave_the_workflow_running_and_it_completes(
    claude: FakeAnthropicAPI, workspaces: Path, settings: Any, time_machine: Any,
) -> None:
    """529s for 30 s (the SDK's own retry included) throttle planning far past its 4 attempts;
    each throttled attempt is given back, waits a jittered, growing, capped backoff, and the
    workflow completes once the API recovers."""
    settings.AGENTOPS_ANTHROPIC_MAX_RETRIES = 1
    settings.AGENTOPS_THROTTLE_BACKOFF_SECONDS = 1.0
    settings.AGENTOPS_THROTTLE_BACKOFF_MAX_SECONDS = 8.0
    time_machine.move_to(clock.now(), tick=False)
    claude.responder = ClaudeForAutonomous()
    workflow = services.workflow_launch(kind="autonomous", goal="Prepare onboarding notes from the docs")
    seed_workspace(workspaces / f"wf-{workflow.pk}")
    started = clock.now()
    claude.overload_for(30)

    waits = run_until_done(workflow.pk, time_machine)

    workflow = Workflow.objects.get(pk=workflow.pk)
    assert workflow.status == "completed", workflow.reason
    planning = Activity.objects.get(workflow=workflow, name="plan_tasks")
    throttled = ActivityAttempt.objects.filter(activity=planning, throttled=True).count()
    assert throttled == ActivityAttempt.objects.filter(activity=planning, error__startswith="Throttled:").count()
    given_back = ActivityAttempt.objects.filter(activity=planning, throttled=True, refunded=True)
    assert given_back.count() == throttled
    recorded = sorted(given_back.values_list("retry_after_seconds", flat=True))
    print(f"\n{throttled} throttled planning attempts over {sum(waits[:throttled]):.1f} s of waits: "
          + ", ".join(f"{w:.1f}" for w in waits[:throttled]))
    assert throttled >= 5, "more throttled attempts than the activity's 4 attempts allow"
    assert planning.max_attempts == 4 + throttled, "every throttled attempt was given back"
    assert all(0 < w <= 8.0 for w in waits[:throttled]), "the backoff is capped"
    assert recorded == pytest.approx(sorted(waits[:throttled]), abs=0.01), "each attempt records the window it opened"
    assert waits[0] <= 1.0 and max(waits[:throttled]) > 4.0, "the backoff grows from its start"
    first_answer = next(r for r in claude.requests if r.status == 200)
    assert first_answer.at >= started.timestamp() + 30
    assert [r.status for r in claude.requests[:2 * throttled]] == [529] * (2 * throttled)
    assert Event.objects.filter(workflow=workflow, kind="activity.throttled").count() == throttled
    failed_calls = Event.objects.filter(workflow=workflow, kind="model.called", data__status_code=529)
    assert failed_calls.count() == throttled, "each attempt's failed call is recorded (the SDK retried inside it)"


def test_a_429s_retry_after_is_the_window_and_gives_the_attempt_back(
    claude: FakeAnthropicAPI, workspaces: Path, time_machine: Any,
) -> None:
    time_machine.move_to(clock.now(), tick=False)
    claude.script(*[fake.rate_limited(retry_after=45)] * 6)
    claude.responder = ClaudeForAutonomous()
    workflow = services.workflow_launch(kind="autonomous", goal="Prepare onboarding notes from the docs")
    seed_workspace(workspaces / f"wf-{workflow.pk}")

    waits = run_until_done(workflow.pk, time_machine)

    assert Workflow.objects.get(pk=workflow.pk).status == "completed"
    assert waits[:6] == [45.0] * 6, "the server's retry-after is honoured exactly"
    planning = Activity.objects.get(workflow=workflow, name="plan_tasks")
    assert (planning.attempt, planning.max_attempts) == (7, 10)
    assert list(planning.attempts.values_list("throttled", "refunded", "retry_after_seconds")) == [
        (True, True, 45.0)] * 6 + [(False, False, None)]


def test_a_server_error_still_uses_up_attempts(claude: FakeAnthropicAPI, workspaces: Path,
                                               time_machine: Any) -> None:
    """Only throttling is given back: a 500 is a failed try like any other."""
    time_machine.move_to(clock.now(), tick=False)
    claude.script(*[fake.api_error(500, "api_error", "Internal server error")] * 4)
    workflow = services.workflow_launch(kind="autonomous", goal="Prepare onboarding notes from the docs")

    run_until_done(workflow.pk, time_machine)

    planning = Activity.objects.get(workflow=workflow, name="plan_tasks")
    assert (planning.status, planning.attempt, planning.max_attempts) == ("failed", 4, 4)
    assert not planning.attempts.filter(throttled=True).exists()
    assert not planning.attempts.filter(refunded=True).exists()
    assert list(planning.attempts.values_list("retry_after_seconds", flat=True))[-1] is None, "no retry followed"
    assert Workflow.objects.get(pk=workflow.pk).status == "failed"


FALLBACK = "claude-haiku-4-5"


@pytest.mark.parametrize("policy", ["revalidate", "pin"])
def test_sustained_overload_moves_the_calls_to_the_fallback_model(
    claude: FakeAnthropicAPI, workspaces: Path, settings: Any, time_machine: Any, policy: str,
) -> None:
    """The primary model is overloaded for ten minutes (a pinned workflow's for 12 s: past the
    threshold). After AGENTOPS_FALLBACK_AFTER_THROTTLES throttled attempts the workflow's calls move to its fallback
    model, recorded as a release change, and it completes without waiting the overload out. A
    pinned workflow keeps its model (the pin covers it) and waits."""
    from tests.providers.conftest import MODEL

    settings.AGENTOPS_FALLBACK_AFTER_THROTTLES = 3
    settings.AGENTOPS_THROTTLE_BACKOFF_SECONDS = 1.0
    settings.AGENTOPS_THROTTLE_BACKOFF_MAX_SECONDS = 8.0
    time_machine.move_to(clock.now(), tick=False)
    claude.responder = ClaudeForAutonomous()
    workflow = services.workflow_launch(kind="autonomous", goal="Prepare onboarding notes from the docs",
                                        options=services.LaunchOptions(fallback_model=FALLBACK, release_policy=policy))
    seed_workspace(workspaces / f"wf-{workflow.pk}")
    started = clock.now()
    overload = 12 if policy == "pin" else 600
    claude.overload_for(overload, model=MODEL)

    run_until_done(workflow.pk, time_machine)

    workflow = Workflow.objects.get(pk=workflow.pk)
    assert workflow.status == "completed", workflow.reason
    answered = [r for r in claude.requests if r.status == 200]
    changes = [e.data for e in Event.objects.filter(workflow=workflow, kind="release.changed")]
    if policy == "pin":
        assert {r.body["model"] for r in answered} == {MODEL}
        assert answered[0].at >= started.timestamp() + overload, "the pinned workflow waited the overload out"
        assert changes == []
        throttled = ActivityAttempt.objects.filter(activity__workflow=workflow, throttled=True)
        assert throttled.count() >= settings.AGENTOPS_FALLBACK_AFTER_THROTTLES
        return
    assert [r.status for r in claude.requests[:3]] == [529, 529, 529]
    assert {r.body["model"] for r in claude.requests[3:]} == {FALLBACK}, "every call after the move"
    assert answered[0].at < started.timestamp() + 60, "no waiting out the overload"
    assert [(c["where"], c["model"]) for c in changes] == [("fallback", FALLBACK)]
    assert workflow.release.model == FALLBACK
    assert set(workflow.usage.filter(status="charged").values_list("model", flat=True)) == {FALLBACK}


def test_a_fallback_model_that_is_not_a_model_name_is_refused_at_launch(claude: FakeAnthropicAPI) -> None:
    from workflows.errors import InvalidInput

    with pytest.raises(InvalidInput, match="fallback model must be a model name"):
        services.workflow_launch(kind="autonomous", goal="Notes",
                                 options=services.LaunchOptions(fallback_model="haiku; rm -rf /"))
    assert not Workflow.objects.exists()
