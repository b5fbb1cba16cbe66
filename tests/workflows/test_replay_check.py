"""`manage.py agent replay-check`: a definition change that would break recorded histories is named,
with the workflow, node and step, before it reaches workflows in flight."""
from __future__ import annotations

import json
from dataclasses import replace
from io import StringIO
from pathlib import Path

import pytest
from django.core.management import CommandError, call_command

from agentops.agents.harness.definition import Harness
from agentops.agents.harness.state import Ctx as HarnessCtx
from agentops.agents.release.activities import RepoInput, inspect_repository
from agentops.agents.release.definition import Ctx, Release
from tests.conftest import drive, release_params
from workflows import histories, replay, services
from workflows.engine import Decision, Goto, node
from workflows.models import Activity
from workflows.testing import deployed

HISTORIES = Path(__file__).resolve().parents[1] / "fixtures" / "histories"


class InspectsAgainBeforeProposing(Release):
    """A new step inserted before a recorded one: BUILD_CANDIDATE looks at the repository first."""

    @node("BUILD_CANDIDATE")
    def build_candidate(self, ctx: Ctx) -> Decision:
        ctx.activity(inspect_repository, RepoInput(repo=ctx.params["repo"]))
        return super().build_candidate(ctx)


class SkipsTheTests(Release):
    """A path change: the candidate goes to approval without VERIFY_CANDIDATE's tests."""

    @node("BUILD_CANDIDATE")
    def build_candidate(self, ctx: Ctx) -> Decision:
        decision = super().build_candidate(ctx)
        return Goto("REQUEST_APPROVAL", decision.updates) if isinstance(decision, Goto) else decision


def replay_check(*args: str) -> tuple[int, str]:
    out = StringIO()
    try:
        call_command("agent", "replay-check", *args, stdout=out)
    except CommandError as exc:
        return exc.returncode, out.getvalue() + str(exc)
    return 0, out.getvalue()


@pytest.mark.django_db
def test_the_recorded_histories_of_the_shipped_kinds_replay():
    """CI's guard: a change to `release`, `autonomous` or `harness` that breaks these histories fails
    here. The harness's is the `todo` demo of docs/harness.md run to completed (112 node visits:
    the approval, repairs, the budget pause and its resume), as `agent export-history` printed it."""
    assert sorted(p.name for p in HISTORIES.glob("*.json")) == [
        "autonomous-completed.json", "harness-completed.json", "release-completed.json",
        "release-goal-superseded.json", "release-waiting-for-approval.json",
    ]
    code, out = replay_check("--fixtures", str(HISTORIES))
    assert (code, out.strip()) == (0, "5 of 5 histories replay on the current definitions.")


@pytest.mark.django_db
@pytest.mark.parametrize(("changed", "node", "step", "reason"), [
    (InspectsAgainBeforeProposing, "BUILD_CANDIDATE", "/BUILD_CANDIDATE.2/i1/0",
     "was recorded as activity 'propose_change' but the handler now asks for 'inspect_repository'"),
    (SkipsTheTests, "BUILD_CANDIDATE", "", "the handler now goes to REQUEST_APPROVAL, where the workflow went to "
                                          "VERIFY_CANDIDATE"),
])
def test_a_changed_definition_is_named_with_its_node_and_step(changed, node, step, reason):
    with deployed(changed):
        code, out = replay_check("--fixtures", str(HISTORIES / "release-completed.json"), "--json")

    assert code == 1
    report = json.loads(out[: out.rindex("}") + 1])
    [found] = report["diverged"]
    assert (report["checked"], found["kind"], found["node"]) == (1, "release", node)
    assert found["operation_id"].endswith(step) and reason in found["reason"]


class SkipsTheFeatureListCheck(Harness):
    """A harness change that would break its workflows in flight: the scaffold goes to approval unvalidated."""

    @node("VALIDATE_FEATURE_LIST")
    def validate_feature_list(self, ctx: HarnessCtx) -> Decision:
        return Goto("WAIT_FOR_APPROVAL")


@pytest.mark.django_db
def test_a_changed_harness_definition_is_named_against_the_demos_history():
    with deployed(SkipsTheFeatureListCheck):
        code, out = replay_check("--fixtures", str(HISTORIES / "harness-completed.json"), "--json")

    assert code == 1
    report = json.loads(out[: out.rindex("}") + 1])
    [found] = report["diverged"]
    assert (found["kind"], found["node"]) == ("harness", "VALIDATE_FEATURE_LIST")
    assert found["reason"] == ("recorded activity 'harness_validate' (succeeded) is no longer asked for; the handler "
                               "now goes to WAIT_FOR_APPROVAL"), found


@pytest.mark.django_db
def test_a_removed_node_is_named(git_repo, deploy_target, requester):
    """A workflow in flight waits at a node the new definition no longer has."""
    workflow = drive(services.workflow_launch(kind="release", goal="Ship the release notes",
                                              params=release_params(git_repo), user=requester).pk)
    assert workflow.current_node == "WAIT_FOR_APPROVAL"
    history = replay.history_of(workflow, current_visit_only=True)

    class Renamed(Release):
        """WAIT_FOR_APPROVAL is gone (say, renamed)."""

    Renamed._handlers = {n: attr for n, attr in Release._handlers.items() if n != "WAIT_FOR_APPROVAL"}
    Renamed.nodes = tuple(Renamed._handlers)

    with deployed(Renamed):
        divergence = replay.check(history)

    assert divergence is not None
    assert str(divergence) == (f"workflow {workflow.pk} (release) at node WAIT_FOR_APPROVAL (visit "
                               f"{workflow.node_visit}): the definition (version 1) has no node WAIT_FOR_APPROVAL")


@pytest.mark.django_db
def test_workflows_in_flight_are_checked_at_the_visit_the_engine_will_replay(git_repo, deploy_target, requester):
    """Without --fixtures the command checks each running, waiting or paused workflow's current
    visit: a change elsewhere in the path does not concern it, a change at its node does."""
    waiting = drive(services.workflow_launch(kind="release", goal="Ship the release notes",
                                             params=release_params(git_repo), user=requester).pk)
    services.workflow_launch(kind="autonomous", goal="Prepare notes")

    class AsksTwice(Release):
        @node("WAIT_FOR_APPROVAL")
        def wait_for_approval(self, ctx: Ctx) -> Decision:
            ctx.activity(inspect_repository, RepoInput(repo=ctx.params["repo"]))
            return super().wait_for_approval(ctx)

    assert replay_check() == (0, "2 of 2 histories replay on the current definitions.\n")
    with deployed(SkipsTheTests):
        assert replay_check()[0] == 0, "a change at BUILD_CANDIDATE does not touch a workflow waiting for approval"
    with deployed(AsksTwice):
        code, out = replay_check()
        assert replay_check("--kind", "autonomous")[0] == 0

    assert code == 1
    assert f"workflow {waiting.pk}: workflow {waiting.pk} (release) at node WAIT_FOR_APPROVAL" in out
    assert "recorded approval wait (open) here; the handler now asks for activity 'inspect_repository'" in out
    assert "1 of 2 histories would no longer replay" in out


@pytest.mark.django_db
def test_a_file_that_is_not_a_history_is_refused_with_exit_status_2(tmp_path):
    bad = tmp_path / "notes.json"
    bad.write_text('{"hello": 1}')

    assert replay_check("--fixtures", str(bad))[0] == 2
    assert replay_check("--fixtures", str(tmp_path / "missing"))[0] == 2


@pytest.mark.django_db
def test_an_exported_history_round_trips_and_replays(git_repo, deploy_target, requester):
    workflow = drive(services.workflow_launch(kind="release", goal="Ship the release notes",
                                              params=release_params(git_repo), user=requester).pk)
    out = StringIO()
    call_command("agent", "export-history", str(workflow.pk), stdout=out)

    header, visits = histories.read(out.getvalue().splitlines(keepends=True))
    history = replace(header, visits=list(visits))

    assert history == replay.history_of(workflow)
    assert [v.node for v in history.visits] == ["GATHER_EVIDENCE", "BUILD_CANDIDATE", "VERIFY_CANDIDATE",
                                                "REQUEST_APPROVAL", "WAIT_FOR_APPROVAL"]
    assert replay.check(history) is None


@pytest.mark.django_db
def test_recorded_results_are_replayed_not_recomputed(git_repo, deploy_target, requester):
    """Advancing a waiting workflow again re-runs nothing: no new activity appears."""
    workflow = drive(services.workflow_launch(kind="release", goal="Ship the release notes",
                                              params=release_params(git_repo), user=requester).pk)
    before = list(Activity.objects.filter(workflow=workflow).values_list("operation_id", "attempt"))
    for _ in range(3):
        services.workflow_advance_if_runnable(workflow_id=workflow.pk)  # a waiting workflow is not runnable
    after = list(Activity.objects.filter(workflow=workflow).values_list("operation_id", "attempt"))
    assert before == after


@pytest.mark.django_db
def test_a_doorbell_for_a_missing_workflow_is_a_no_op():
    """A message outliving its workflow (deleted by an operator) changes nothing and does not fail."""
    assert services.workflow_advance_if_runnable(workflow_id=987654) == services.Outcome.NOT_RUNNABLE
    assert services.activity_run_if_runnable(activity_id=987654) == services.RunOutcome.SKIPPED
