"""Behavioral release changes while a workflow waits (pin, revalidate, fail), and named signals."""
from __future__ import annotations

from collections.abc import Iterator
from datetime import timedelta
from typing import Any

import pytest
from django.test import override_settings

from tests.conftest import drive, open_approval, release_params
from workflows import clock, engine, services
from workflows.activity_context import ActivityContext
from workflows.errors import InvalidInput, NotFound, TransitionRefused
from workflows.models import (
    Activity,
    ActivityAttempt,
    BehavioralRelease,
    Event,
    Signal,
    Timer,
    UsageEntry,
    Wait,
    Workflow,
)
from workflows.registry import activity
from workflows.services import Outcome
from workflows.services.common import release_announce
from workflows.testing import registered

pytestmark = [pytest.mark.django_db, pytest.mark.usefixtures("rung")]

EVENT_KIND = "test-event"
PREPARE = "test_event_prepare"


@activity(PREPARE)
def prepare(ctx: ActivityContext, input: dict[str, Any]) -> dict[str, Any]:
    return {"ready": True}


# Runs one activity, waits for a "go" signal, then completes with its payload.
class WaitForGo(engine.WorkflowDefinition):
    kind = EVENT_KIND
    start_node = "PREPARE"
    revalidate_node = "WAIT_FOR_GO"

    @engine.node("PREPARE")
    def prepare(self, ctx: engine.NodeContext) -> engine.Decision:
        return engine.Goto("WAIT_FOR_GO", {"prepared": ctx.activity(prepare, {})})

    @engine.node("WAIT_FOR_GO")
    def wait_for_go(self, ctx: engine.NodeContext) -> engine.Decision:
        outcome = ctx.wait_for_event("go")
        return engine.Goto("DONE", {"payload": outcome.payload})

    @engine.node("DONE")
    def done(self, ctx: engine.NodeContext) -> engine.Decision:
        return engine.Complete({"payload": ctx.state["payload"]})


@pytest.fixture(autouse=True)
def wait_for_go_registered() -> Iterator[None]:
    with registered(WaitForGo, prepare):
        yield


def waiting_for_approval(repo: Any, requester: Any, policy: str) -> tuple[Workflow, Wait]:
    workflow = drive(services.workflow_launch(kind="release", goal="Ship the release notes",
                                              params=release_params(repo), user=requester,
                                              options=services.LaunchOptions(release_policy=policy)).pk)
    assert workflow.status == "waiting"
    return workflow, open_approval(workflow.pk)


def events(workflow: Workflow, kind: str) -> list[dict[str, Any]]:
    return list(Event.objects.filter(workflow=workflow, kind=kind).order_by("seq").values_list("data", flat=True))


def waiting_for_go() -> Workflow:
    workflow = drive(services.workflow_launch(kind=EVENT_KIND, goal="Wait for the go").pk)
    assert workflow.status == "waiting"
    return workflow


def unchanged(workflow: Workflow) -> tuple[Any, ...]:
    workflow.refresh_from_db()
    return (workflow.status, workflow.updated_at, workflow.event_seq, Signal.objects.filter(workflow=workflow).count())


# --- Behavioral release changes ---------------------------------------------------------------


def test_release_change_under_pin_keeps_the_old_release(git_repo, deploy_target, requester, approver, settings):
    """Policy pin: the workflow notes the new release and finishes on the one it started with."""
    workflow, wait = waiting_for_approval(git_repo, requester, "pin")
    old = workflow.release
    settings.AGENTOPS_PROMPT_VERSION = "release-prompt-2"

    services.wait_approve(wait_id=wait.pk, user=approver, candidate_hash=wait.candidate_hash)

    workflow.refresh_from_db()
    new = BehavioralRelease.objects.get(prompt_version="release-prompt-2")
    assert workflow.release_id == old.pk
    assert events(workflow, "release.changed") == [{"policy": "pin", "old": old.fingerprint, "new": new.fingerprint}]
    workflow = drive(workflow.pk)
    assert workflow.status == "completed", workflow.reason
    assert workflow.release_id == old.pk
    assert workflow.result["candidate_hash"] == wait.candidate_hash
    assert deploy_target.store.stats()["deployments"] == 1


def test_model_calls_run_the_workflows_release_not_the_workers_settings(git_repo, deploy_target, requester, approver,
                                                                       settings):
    """Every workflow's calls go to its recorded release's model, not to the provider and model of the
    worker's settings (with those, a pin would pin only a label and the release recorded at launch
    would not be what ran); under revalidate the new release is adopted at the next wait, and the
    candidate rebuilt on it."""
    settings.AGENTOPS_MODEL = "claude-pinned"
    release_announce(at=clock.now())  # the workers run claude-pinned when the two are launched
    pinned = services.workflow_launch(kind="release", goal="Ship the release notes", params=release_params(git_repo),
                                      user=requester, options=services.LaunchOptions(release_policy="pin"))
    current = services.workflow_launch(kind="release", goal="Ship the release notes",
                                       params=release_params(git_repo), user=requester)
    settings.AGENTOPS_MODEL = "claude-newer"
    release_announce(at=clock.now())  # the workers were redeployed on claude-newer

    pinned, current = drive(pinned.pk), drive(current.pk)

    assert (pinned.status, current.status) == ("waiting", "waiting")
    assert pinned.state["proposal"]["model"]["model"] == "scripted/claude-pinned"
    assert current.state["proposal"]["model"]["model"] == "scripted/claude-pinned"
    assert set(UsageEntry.objects.filter(workflow=pinned).values_list("model", flat=True)) == {
        "scripted/claude-pinned"}

    wait = current.waits.get(status="open")
    services.wait_approve(wait_id=wait.pk, user=approver, candidate_hash=wait.candidate_hash)
    current = drive(current.pk)
    assert current.release.model == "scripted/claude-newer"
    assert current.state["proposal"]["model"]["model"] == "scripted/claude-newer"
    assert [e["policy"] for e in events(current, "release.changed")] == ["revalidate"]


def test_a_launch_records_the_release_the_workers_announced(git_repo, requester, settings):
    """A worker announces its release when it starts; a launch from a process configured otherwise
    (a shell without ANTHROPIC_API_KEY, here another model) records the workers' release."""
    settings.AGENTOPS_MODEL = "claude-on-the-workers"
    announced = release_announce(at=clock.now())
    settings.AGENTOPS_MODEL = "claude-in-this-shell"

    workflow = services.workflow_launch(kind="release", goal="Ship the release notes",
                                        params=release_params(git_repo), user=requester)

    assert workflow.release_id == announced.pk
    assert workflow.release.model == "scripted/claude-on-the-workers"


def test_a_worker_that_cannot_run_the_release_adopts_its_own_under_revalidate(git_repo, deploy_target, requester):
    """The worker's prompts differ from the recorded release's (new code deployed): under
    revalidate the call runs on the worker's release and the workflow records that it moved."""
    workflow = services.workflow_launch(kind="release", goal="Ship the release notes",
                                        params=release_params(git_repo), user=requester)
    old = workflow.release
    with override_settings(AGENTOPS_PROMPT_VERSION="release-prompt-7"):
        workflow = drive(workflow.pk)
        new = BehavioralRelease.objects.get(prompt_version="release-prompt-7")

    assert workflow.status == "waiting", workflow.reason
    assert workflow.release_id == new.pk
    [changed] = events(workflow, "release.changed")
    assert (changed["policy"], changed["old"], changed["new"], changed["where"]) == (
        "revalidate", old.fingerprint, new.fingerprint, "worker")
    assert ActivityAttempt.objects.filter(activity__workflow=workflow, status="succeeded").exists()


def test_a_pinned_workflow_refuses_to_run_prompts_it_was_not_pinned_to(git_repo, deploy_target, requester, settings):
    """The pinned prompt version is not the one this worker's code carries: the model call is
    refused (never sent, nothing reserved) and the workflow fails saying why."""
    workflow = services.workflow_launch(kind="release", goal="Ship the release notes", params=release_params(git_repo),
                                        user=requester, options=services.LaunchOptions(release_policy="pin"))
    pinned_prompts = workflow.release.prompt_version
    settings.AGENTOPS_PROMPT_VERSION = "release-prompt-9"

    workflow = drive(workflow.pk)

    assert workflow.status == "failed"
    assert f"pinned to a release with prompt_version {pinned_prompts!r}" in workflow.reason
    assert "this worker runs prompt_version 'release-prompt-9'" in workflow.reason
    assert not UsageEntry.objects.filter(workflow=workflow).exists()


def test_release_change_under_revalidate_rebuilds_and_asks_again(git_repo, deploy_target, requester, approver,
                                                                 settings):
    """Policy revalidate: the new release is adopted and the candidate, which names the old one, is re-approved."""
    workflow, wait = waiting_for_approval(git_repo, requester, "revalidate")
    old = workflow.release
    seq_before = workflow.event_seq
    settings.AGENTOPS_PROMPT_VERSION = "release-prompt-2"

    services.wait_approve(wait_id=wait.pk, user=approver, candidate_hash=wait.candidate_hash)

    workflow.refresh_from_db()
    new = BehavioralRelease.objects.get(prompt_version="release-prompt-2")
    assert workflow.release_id == new.pk
    assert events(workflow, "release.changed") == [
        {"policy": "revalidate", "old": old.fingerprint, "new": new.fingerprint},
    ]
    assert (workflow.status, workflow.current_node) == ("running", "REVALIDATE")

    workflow = drive(workflow.pk)

    assert (workflow.status, workflow.current_node) == ("waiting", "WAIT_FOR_APPROVAL")
    path = [e.data["node"] for e in Event.objects.filter(workflow=workflow, seq__gt=seq_before, kind="node.entered")]
    assert path == ["REVALIDATE", "BUILD_CANDIDATE", "VERIFY_CANDIDATE", "REQUEST_APPROVAL", "WAIT_FOR_APPROVAL"]
    second = open_approval(workflow.pk)
    assert (wait.candidate["release"], second.candidate["release"]) == (old.fingerprint, new.fingerprint)
    assert second.candidate_hash != wait.candidate_hash
    assert deploy_target.store.stats()["requests"] == 0
    assert not Activity.objects.filter(workflow=workflow, name="deploy").exists()


def test_release_change_under_fail_fails_naming_the_release(git_repo, deploy_target, requester, approver,
                                                            settings):
    """Policy fail: the workflow stops with a message naming the old and the new release."""
    workflow, wait = waiting_for_approval(git_repo, requester, "fail")
    settings.AGENTOPS_PROMPT_VERSION = "release-prompt-2"

    services.wait_approve(wait_id=wait.pk, user=approver, candidate_hash=wait.candidate_hash)

    workflow = drive(workflow.pk)
    assert workflow.status == "failed"
    assert "prompt=prompts-2" in workflow.reason
    assert "prompt=release-prompt-2" in workflow.reason
    assert "its release policy is 'fail'" in workflow.reason
    assert events(workflow, "release.changed")[0]["policy"] == "fail"
    assert deploy_target.store.stats()["requests"] == 0


def test_rejection_stands_when_the_release_changed(git_repo, deploy_target, requester, approver, settings):
    """Policy revalidate does not turn a rejection into a fresh approval request: the workflow fails."""
    workflow, wait = waiting_for_approval(git_repo, requester, "revalidate")
    settings.AGENTOPS_PROMPT_VERSION = "release-prompt-2"

    services.wait_reject(wait_id=wait.pk, user=approver, comment="wrong approach")

    workflow = drive(workflow.pk)
    assert workflow.status == "failed"
    assert workflow.reason == "Rejected by alice: wrong approach"
    assert Wait.objects.filter(workflow=workflow).count() == 1
    assert deploy_target.store.stats()["requests"] == 0


def test_expiry_stands_when_the_release_changed(git_repo, deploy_target, requester, settings):
    """Policy revalidate does not reopen an approval that expired: the workflow fails as expired."""
    workflow, wait = waiting_for_approval(git_repo, requester, "revalidate")
    settings.AGENTOPS_PROMPT_VERSION = "release-prompt-2"
    Timer.objects.filter(wait=wait).update(fire_at=clock.now() - timedelta(seconds=1))
    Wait.objects.filter(pk=wait.pk).update(expires_at=clock.now() - timedelta(seconds=1))

    assert services.timers_fire_due() == 1

    workflow = drive(workflow.pk)
    assert workflow.status == "failed"
    assert workflow.reason == "The approval wait expired before anyone decided."
    assert workflow.release.prompt_version == "release-prompt-2"
    assert Wait.objects.filter(workflow=workflow).count() == 1


def test_unchanged_release_records_no_release_event(git_repo, deploy_target, requester, approver):
    """Without a release change, waking records no release.changed event and keeps the release."""
    workflow, wait = waiting_for_approval(git_repo, requester, "fail")
    services.wait_approve(wait_id=wait.pk, user=approver, candidate_hash=wait.candidate_hash)
    workflow.refresh_from_db()
    assert workflow.status == "running"
    assert not events(workflow, "release.changed")


# --- Signals and event waits ------------------------------------------------------------------


def test_signal_satisfies_the_open_event_wait():
    """A "go" signal satisfies the waiting workflow, which completes with its payload."""
    workflow = waiting_for_go()
    payload = {"n": 1, "note": "ship it \U0001F680"}  # a surrogate pair in JSON, valid Unicode

    outcome = services.workflow_signal(workflow_id=workflow.pk, name="go", payload=payload, dedupe_key="k1")

    assert outcome.outcome == Outcome.APPLIED
    wait = Wait.objects.get(workflow=workflow)
    assert (wait.status, wait.payload) == ("satisfied", payload)
    assert Signal.objects.get(workflow=workflow).consumed_by == wait
    services.workflow_advance_if_runnable(workflow_id=workflow.pk)
    workflow.refresh_from_db()
    assert (workflow.status, workflow.result) == ("completed", {"payload": payload})


def test_signal_before_the_wait_is_consumed_when_it_opens():
    """A signal that arrives early is queued, says so, and satisfies the wait the moment it opens."""
    workflow = services.workflow_launch(kind=EVENT_KIND, goal="Wait for the go")
    early = services.workflow_signal(workflow_id=workflow.pk, name="go", payload={"early": True})
    assert early.outcome == Outcome.QUEUED
    assert "No wait for signal 'go' is open" in early.message
    signal = Signal.objects.get(workflow=workflow)
    assert signal.consumed_by is None
    assert not Wait.objects.filter(workflow=workflow).exists()

    workflow = drive(workflow.pk)

    assert (workflow.status, workflow.result) == ("completed", {"payload": {"early": True}})
    wait = Wait.objects.get(workflow=workflow)
    signal.refresh_from_db()
    assert (wait.status, signal.consumed_by) == ("satisfied", wait)
    assert not events(workflow, "workflow.woken"), "the workflow never parked"


def test_signal_with_another_name_leaves_the_wait_open():
    """A signal for a name nobody waits on is queued (and answered so), and the workflow keeps waiting."""
    workflow = waiting_for_go()
    assert services.workflow_signal(workflow_id=workflow.pk, name="stop").outcome == Outcome.QUEUED
    workflow.refresh_from_db()
    assert workflow.status == "waiting"
    assert Wait.objects.get(workflow=workflow).status == "open"
    assert Signal.objects.get(workflow=workflow).consumed_by is None


def test_repeated_dedupe_key_changes_nothing():
    """A signal delivered twice with the same key is applied once; the repeat's payload is ignored."""
    workflow = waiting_for_go()
    services.workflow_signal(workflow_id=workflow.pk, name="go", payload={"n": 1}, dedupe_key="deliver-1")
    before = unchanged(workflow)

    again = services.workflow_signal(workflow_id=workflow.pk, name="go", payload={"n": 2}, dedupe_key="deliver-1")

    wait = Wait.objects.get(workflow=workflow)
    assert (again.outcome, again.message) == (
        Outcome.ALREADY_APPLIED,
        f"A signal with dedupe key 'deliver-1' was received before (delivered to wait {wait.pk}); nothing changed.")
    assert unchanged(workflow) == before
    assert list(Signal.objects.filter(workflow=workflow).values_list("payload", flat=True)) == [{"n": 1}]
    assert len(events(workflow, "signal.received")) == 1


def test_signal_to_a_finished_workflow_is_refused():
    """A completed workflow takes no more signals; nothing is stored."""
    workflow = waiting_for_go()
    services.workflow_signal(workflow_id=workflow.pk, name="go")
    services.workflow_advance_if_runnable(workflow_id=workflow.pk)
    before = unchanged(workflow)
    assert before[0] == "completed"

    with pytest.raises(TransitionRefused, match=f"Workflow {workflow.pk} is completed; it takes no more signals"):
        services.workflow_signal(workflow_id=workflow.pk, name="go", dedupe_key="late")

    assert unchanged(workflow) == before


@pytest.mark.parametrize(("name", "payload", "message"), [
    ("go", {"text": "a\x00b"}, "The signal payload contains a NUL character"),
    ("go", {"tags": {1, 2}}, "The signal payload is not JSON-serializable"),
    ("go", {"text": "bad \ud800"}, "The signal payload contains characters that are not valid Unicode"),
    ("go", {"bad \udc00": 1}, "The signal payload contains characters that are not valid Unicode"),
    ("", None, "The signal name must be non-empty"),
    ("g\x00o", None, "The signal name contains a NUL character"),
    ("g" * 101, None, "The signal name is 101 characters long"),
])
def test_bad_signal_is_refused(name, payload, message):
    """A signal with a bad name or payload is refused; the wait stays open and nothing is stored."""
    workflow = waiting_for_go()
    before = unchanged(workflow)
    with pytest.raises(InvalidInput, match=message):
        services.workflow_signal(workflow_id=workflow.pk, name=name, payload=payload)
    assert unchanged(workflow) == before
    assert Wait.objects.get(workflow=workflow).status == "open"


def test_signal_to_an_unknown_workflow_is_not_found(db):
    with pytest.raises(NotFound, match="Workflow 987654 does not exist"):
        services.workflow_signal(workflow_id=987654, name="go")


def test_a_release_no_worker_announced_is_replaced_by_the_first_workers(git_repo, deploy_target, requester,
                                                                        settings):
    """Launched from a shell before any worker started (its own settings recorded, here the
    scripted provider's other model), the first model call records and runs the worker's release
    instead, so the release shown is the one that ran; a pinned workflow keeps what it pinned."""
    settings.AGENTOPS_MODEL = "claude-of-the-shell"
    free = services.workflow_launch(kind="release", goal="Ship the release notes", params=release_params(git_repo),
                                    user=requester)
    pinned = services.workflow_launch(kind="release", goal="Ship the release notes", params=release_params(git_repo),
                                      user=requester, options=services.LaunchOptions(release_policy="pin"))
    settings.AGENTOPS_MODEL = "claude-of-the-workers"

    free, pinned = drive(free.pk), drive(pinned.pk)

    assert free.release.model == free.state["proposal"]["model"]["model"] == "scripted/claude-of-the-workers"
    assert [(e["where"], e["policy"]) for e in events(free, "release.changed")] == [("worker", "revalidate")]
    assert pinned.release.model == pinned.state["proposal"]["model"]["model"] == "scripted/claude-of-the-shell"
    assert events(pinned, "release.changed") == []
