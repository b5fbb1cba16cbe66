"""State that does not grow (workflows/statestore.py): long values stored once, checkpoints of what
changed, the kinds at their limits, and workflows parked with state in the old shape finishing."""
from __future__ import annotations

import io
import json
import re
from typing import Any

import pytest
from django.contrib.auth.models import User
from django.core.management import call_command
from django.test import Client
from django.urls import reverse

from agentops.agents.autonomous.definition import Autonomous
from agentops.agents.autonomous.presentation import earlier_tasks
from agentops.providers import scripted
from tests.conftest import drive, open_approval, release_params
from workflows import replay, services, statestore
from workflows.errors import InvalidInput
from workflows.models import Activity, Checkpoint, StateBlob, Workflow
from workflows.provider import ModelResponse

pytestmark = pytest.mark.django_db


# --- the stored form and deltas, without the database ------------------------------------------

def test_a_long_string_is_stored_once_and_resolves_back(settings):
    """Strings of AGENTOPS_STATE_BLOB_MIN_CHARS or more become references; the same text twice is one blob."""
    tail = "x" * settings.AGENTOPS_STATE_BLOB_MIN_CHARS
    value = {"a": tail, "b": [tail, "short"], "c": {"$blob": "not a reference", "chars": 3}}
    ext = statestore.externalize(value, what="The test value")
    assert len(ext.blobs) == 1 and ext.value["a"] == ext.value["b"][0] == {"$blob": next(iter(ext.blobs)),
                                                                           "chars": len(tail)}
    assert ext.value["c"] == {"$lit": {"$blob": "not a reference", "chars": 3}}  # never misread as a reference
    assert statestore.internalize(ext.value, ext.blobs) == value


def test_elements_of_a_long_list_are_items_and_an_unchanged_one_keeps_its_digest(settings):
    """A list over AGENTOPS_STATE_ITEM_LIST_MIN_BYTES stores its object elements once each: changing one
    element changes one reference, and the delta names only that index."""
    features = [{"id": f"F{i:03d}", "description": "d" * 300, "status": "failing"} for i in range(60)]
    before = statestore.externalize({"features": features}, what="s")
    changed = [*features[:7], {**features[7], "status": "passing"}, *features[8:]]
    after = statestore.externalize({"features": changed}, what="s")
    assert all("$item" in ref for ref in before.value["features"])
    differing = [i for i, (x, y) in enumerate(zip(before.value["features"], after.value["features"], strict=True))
                 if x != y]
    assert differing == [7]
    delta = statestore.diff(before.value, after.value)
    assert list(delta["{}"]["features"]["[]"]) == ["7"]
    assert statestore.apply(before.value, delta) == after.value
    assert statestore.internalize(after.value, {**before.blobs, **after.blobs}) == {"features": changed}


@pytest.mark.parametrize(("old", "new"), [
    ({"a": 1, "b": [1, 2, 3]}, {"a": 1, "b": [1, 2]}),
    ({"a": {"x": 1, "y": 2}}, {"a": {"x": 1}, "c": None}),
    ({"a": [1, {"k": "v"}]}, {"a": [1, {"k": "w"}, 3, 4]}),
    ({}, {"a": "b"}),
    ({"a": [1]}, {"a": "now text"}),
])
def test_a_delta_applied_to_the_old_state_gives_the_new_one(old, new):
    assert statestore.apply(old, statestore.diff(old, new)) == new


def test_one_value_over_the_limit_is_refused_with_what_to_do():
    with pytest.raises(InvalidInput, match="holds one value of 1000001 characters; the limit for one value"):
        statestore.externalize({"log": "x" * 1_000_001}, what="State written by node RUN")


# --- through the services --------------------------------------------------------------------

def _autonomous_at_its_limits(monkeypatch: pytest.MonkeyPatch, *, rounds: int) -> None:
    """The scripted model at the kind's maxima: 12 tasks of 4,000-character instructions per plan,
    2,000-character summaries, the goal met in round ``rounds`` (task titles carry their round)."""

    def plan(round_: int) -> str:
        return json.dumps({"tasks": [{"title": f"Round {round_} task {i}",
                                      "instructions": (f"round {round_} task {i}: " * 400)[:4000]}
                                     for i in range(1, 13)]})

    def round_of(prompt: str) -> int:
        return max((int(n) for n in re.findall(r"Round (\d+) task", prompt)), default=0)

    def verdict(self: Any, prompt: str) -> str:
        met = round_of(prompt) >= rounds
        return json.dumps({"goal_met": met, "reason": f"round {round_of(prompt)}", "progress": {
            "percent": min(100, 100 * round_of(prompt) // rounds), "achievements": [], "remaining": [],
            "confidence": 0.8}})

    original = scripted.ScriptedProvider._execute_turn

    def execute(self: Any, prompt: str, messages: list[dict[str, Any]], system: str) -> ModelResponse:
        answer = original(self, prompt, messages, system)
        return answer if answer.tool_calls else ModelResponse(
            text=(f"summary of {prompt[-60:]} " * 100)[:2000], stop_reason="end_turn", usage=answer.usage)

    monkeypatch.setattr(scripted.ScriptedProvider, "_answer_plan_tasks", lambda self, prompt: plan(1))
    monkeypatch.setattr(scripted.ScriptedProvider, "_answer_replan", lambda self, prompt: plan(round_of(prompt) + 1))
    monkeypatch.setattr(scripted.ScriptedProvider, "_answer_verify_goal", verdict)
    monkeypatch.setattr(scripted.ScriptedProvider, "_execute_turn", execute)


def _stored_bytes_per_visit(workflow_id: int) -> list[int]:
    return [checkpoint + row for _, checkpoint, row in statestore.stored_sizes(workflow_id)]


# Committed as a worker commits: in one test transaction its thousands of savepoints made the run 1.5
# times as long, and checking the deferred foreign keys of every row at the end took another 7 s.
@pytest.mark.django_db(transaction=True)
@pytest.mark.usefixtures("rung")
def test_autonomous_completes_20_rounds_of_12_tasks_with_flat_state(settings, tmp_path, monkeypatch):
    """At 20 rounds × 12 tasks, 4 KB instructions, 2 KB summaries (with every round kept in its state
    it stopped in round 13 over the 1 MB state limit) the agent completes; the row keeps one round,
    and what a visit stores late in the run is what it stored early."""
    settings.AGENTOPS_WORKSPACE_DIR = tmp_path / "workspaces"
    _autonomous_at_its_limits(monkeypatch, rounds=20)
    workflow = drive(services.workflow_launch(kind="autonomous", goal="Reach round 20",
                                              params={"max_rounds": "20"}).pk, max_rounds=2000)

    assert workflow.status == "completed", workflow.reason
    assert workflow.result["rounds"] == 20 and workflow.result["tasks_done"] == 240
    assert len(json.dumps(workflow.state)) < 20_000  # one round of references, not 240 tasks
    sizes = _stored_bytes_per_visit(workflow.pk)
    tenth = len(sizes) // 10
    early, late = sum(sizes[:tenth]) / tenth, sum(sizes[-tenth:]) / tenth
    assert late <= 1.5 * early, (early, late)
    every = earlier_tasks(workflow)  # every earlier round, read back from its checkpoint
    assert len(every) == 228 and every[0]["title"] == "Round 1 task 1" and len(every[0]["summary"]) == 2000
    shown = Autonomous().show_extras(workflow)  # a bounded read: three earlier rounds and the current one
    assert len(shown["tasks"]) == 48 and shown["tasks"][0]["title"] == "Round 17 task 1"
    assert shown["earlier_rounds_left_out"] == 16
    earlier, current = shown["tasks"][0], shown["tasks"][-1]  # the earlier rounds' texts cut, the current's whole
    assert earlier["summary"].endswith("[… 1,400 more characters: agent export-history]")
    assert len(current["summary"]) == 2000
    detail = io.StringIO()
    call_command("agent", "show", str(workflow.pk), "--json", stdout=detail)
    assert len(detail.getvalue()) < 300_000, len(detail.getvalue())
    admin = User.objects.create_superuser("root", "root@example.invalid", "root-password")
    client = Client()
    client.force_login(admin)
    page = client.get(reverse("admin:workflows_workflow_change", args=[workflow.pk])).content.decode()
    assert len(page) < 300_000 and page.count('<tr id="task-') == 48, len(page)
    assert "more characters: agent show --json]" in page and "more characters: agent export-history]" in page
    assert replay.check(replay.history_of(workflow)) is None


def test_autonomous_rounds_are_not_capped_at_20():
    """A launch may ask for 200 rounds, or none (0: the time limit and the budget bound the run)."""
    assert Autonomous().validate_params({"max_rounds": "200"}) == {"max_rounds": 200}
    assert Autonomous().validate_params({"max_rounds": "0"}) == {"max_rounds": 0}
    with pytest.raises(InvalidInput, match="between 0 and 1000000"):
        Autonomous().validate_params({"max_rounds": "-1"})


def _to_the_old_shape(workflow_id: int, **state: Any) -> None:
    """Rewrite a workflow's rows as the code before delta checkpoints left them: every checkpoint the
    whole state (no hash), the row the whole state, long values inline, no blob rows."""
    workflow = Workflow.objects.get(pk=workflow_id)
    for _, (checkpoint, entered) in statestore.states_by_visit(workflow).items():
        Checkpoint.objects.filter(pk=checkpoint.pk).update(state=entered, delta=None, state_hash="", chain_bytes=0)
    current = {**statestore.state_of(workflow), **state}
    Workflow.objects.filter(pk=workflow_id).update(state=current)
    Checkpoint.objects.filter(pk=workflow.checkpoint_id).update(state=current)
    for activity in Activity.objects.filter(workflow_id=workflow_id, result__isnull=False):
        Activity.objects.filter(pk=activity.pk).update(result=statestore.resolve(workflow_id, activity.result))
    StateBlob.objects.filter(workflow_id=workflow_id).delete()


@pytest.mark.usefixtures("rung")
def test_a_release_parked_with_state_in_the_old_shape_completes_and_replays(git_repo, deploy_target, approver):
    """A workflow parked at its approval before the change (whole checkpoints, inline values)
    resumes on the new code: its next checkpoint is a whole one, the later ones deltas, and the
    replay check passes over all of its visits, old and new."""
    wf = services.workflow_launch(kind="release", goal="Ship it", params=release_params(git_repo))
    drive(wf.pk)
    _to_the_old_shape(wf.pk)
    parked_at = Workflow.objects.get(pk=wf.pk).node_visit
    wait = open_approval(wf.pk)
    services.wait_approve(wait_id=wait.pk, user=approver, candidate_hash=wait.candidate_hash)
    workflow = drive(wf.pk)

    assert workflow.status == "completed", workflow.reason
    after = list(Checkpoint.objects.filter(workflow=workflow, node_visit__gt=parked_at).order_by("node_visit"))
    assert after[0].delta is None and after[0].state_hash  # the first one after the change is whole
    assert any(c.delta is not None for c in after[1:])
    assert replay.check(replay.history_of(workflow)) is None


def test_an_autonomous_agent_with_history_in_its_state_finishes_and_counts_it(settings, tmp_path):
    """An agent started before the change keeps its earlier rounds in ``state["history"]``; after
    the change its replan moves them out (counted) and it completes with every task counted and listed."""
    settings.AGENTOPS_WORKSPACE_DIR = tmp_path / "workspaces"
    settings.AGENTOPS_FAULT_LOG = str(tmp_path / "faults.log")
    wf = services.workflow_launch(kind="autonomous", goal="Prepare onboarding notes")
    settings.AGENTOPS_TESTING_FAULTS = json.dumps([{
        "point": "activity.before_external_call", "action": "raise",
        "when": {"operation_id": f"wf-{wf.pk}/EXECUTION.2/i1/0"}}])
    for _ in range(10):  # to VERIFICATION of round 1: the first task skipped, two done
        workflow = drive(wf.pk, max_rounds=1)
        Activity.objects.filter(workflow=wf, status="scheduled").update(next_attempt_at=workflow.created_at)
        if workflow.current_node == "VERIFICATION":
            break
    assert workflow.current_node == "VERIFICATION"
    legacy_history = [{"id": 90, "title": "An old round's task", "status": "done", "round": 0, "summary": "old"}]
    _to_the_old_shape(wf.pk, history=legacy_history)
    workflow = Workflow.objects.get(pk=wf.pk)
    state = dict(workflow.state)
    state.pop("done_before"), state.pop("skipped_before")
    Workflow.objects.filter(pk=wf.pk).update(state=state)
    Checkpoint.objects.filter(pk=workflow.checkpoint_id).update(state=state)
    for _ in range(10):
        workflow = drive(wf.pk)
        Activity.objects.filter(workflow=wf, status="scheduled").update(next_attempt_at=workflow.created_at)
        if workflow.is_terminal:
            break

    assert workflow.status == "completed", workflow.reason
    assert workflow.result["tasks_done"] == 4 and workflow.result["tasks_skipped"] == 1  # the old round counted
    assert workflow.state["history"] == [] and workflow.state["done_before"] == 3
    assert [t["title"] for t in earlier_tasks(workflow)] == ["Write a brief", "Lay out the steps", "Record the outcome"]
    assert replay.check(replay.history_of(workflow)) is None


def test_a_feature_list_of_500_is_accepted_and_501_is_refused():
    """MAX_FEATURES is 500: the source's "over 200 features" project can be launched."""
    from agentops.agents.harness.checks import validate_features

    def features(n: int) -> str:
        return json.dumps([{"id": f"F{i:03d}", "description": f"feature {i}", "steps": [], "priority": i,
                            "check": f"sh checks/check.sh F{i:03d}"} for i in range(1, n + 1)])

    assert len(validate_features(features(500), check_exists=lambda path: True)) == 500
    with pytest.raises(InvalidInput, match="must be a list of 1–500 features"):
        validate_features(features(501), check_exists=lambda path: True)


def test_a_very_long_list_is_kept_as_chunks_and_one_change_rewrites_one_chunk(settings):
    """500 features: the stored list is 16 chunk references; changing one feature changes one of them."""
    features = [{"id": f"F{i:03d}", "description": "d" * 300, "status": "failing"} for i in range(500)]
    before = statestore.externalize({"features": features}, what="s")
    changed = [*features[:100], {**features[100], "status": "passing"}, *features[101:]]
    after = statestore.externalize({"features": changed}, what="s")
    assert len(before.value["features"]) == 16 and all("$chunk" in ref for ref in before.value["features"])
    delta = statestore.diff(before.value, after.value)
    assert list(delta["{}"]["features"]["[]"]) == ["3"]  # elements 96–127
    blobs = {**before.blobs, **after.blobs}
    assert statestore.internalize(after.value, blobs) == {"features": changed}
    assert statestore.internalize(statestore.apply(before.value, delta), blobs) == {"features": changed}
