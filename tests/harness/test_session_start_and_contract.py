"""H5 (init.sh and the smoke check at session start, "repair main"), H7 (isolation probed, fail
closed) and H2 (propose_feature_change → a new approval) on the two-feature project."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from agentops import sandbox
from agentops.kind.presentation import Activity, Wait
from agentops.kind.testing import approve, launch, reject, resume
from tests.harness.conftest import (
    APP_BOTH,
    APP_GREET,
    CHECK_TEMPLATE,
    MINI_FEATURES,
    approve_feature_list,
    commit,
    drive_all,
    events,
    launch_approved,
    request_pass,
    solve,
    write,
)

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.timeout(180)]


def test_a_red_smoke_at_session_start_sends_the_session_to_repair_main(harness_approver, mini_schedule):
    """F02's first session breaks greet and leaves; the next session's smoke is red (it was green
    before), so that session's lease is REPAIR; its fix is verified by the smoke in a clean
    worktree, then F02 goes on and F01's count is untouched."""
    mini_schedule({
        "F01/1": solve("F01", APP_GREET),
        "F02/1": [write("app.py", "print('bye')\n"), commit("F02: start over"),
                  {"tool": "end_session", "input": {"summary": "rewrote app.py"}}],
        "REPAIR/1": [{"tool": "read_file", "input": {"path": "checks/smoke.sh"}}, write("app.py", APP_GREET),
                     commit("Repair main"), request_pass("REPAIR")],
        "F02/2": solve("F02", APP_BOTH),
    })
    workflow = launch_approved(harness_approver)
    assert workflow.status == "completed", workflow.reason
    smokes = [(s["passed"], s["exit_code"] != 0) for s in events(workflow.pk, "harness.smoke_ran")]
    assert smokes == [(False, True), (True, False), (False, True), (True, False)]
    sessions = [e.input["feature"]["id"] for e in Activity.objects.filter(
        workflow_id=workflow.pk, name="harness_session").order_by("pk")]
    assert sessions == ["F01", "F02", "REPAIR", "F02"]
    repair = [e for e in events(workflow.pk, "harness.check_ran") if e["purpose"] == "repair"]
    assert [(r["command"], r["passed"], r["where"]) for r in repair] == [("sh checks/smoke.sh", True, "worktree")]
    board = {f["id"]: f for f in workflow.state["features"]}
    assert (board["F01"]["attempts"], board["F02"]["attempts"]) == (1, 2)
    assert any(row["feature"] == "REPAIR" and row["status"] == "repaired" for row in workflow.state["memory"])


def test_without_the_required_isolation_the_workflow_pauses_before_anything_runs(
        harness_approver, mini_schedule, settings):
    """isolation=bwrap (the default) on a worker without it: paused at INITIALIZE with the reason,
    no initializer, no workspace; once bubblewrap is there, resume probes again and goes on."""
    mini_schedule({})
    settings.AGENTOPS_SANDBOX = "none"
    wf = launch("harness", goal="Build app.py", params={})
    workflow = drive_all(wf.pk)
    assert (workflow.status, workflow.pause_cause, workflow.current_node) == ("paused", "definition", "INITIALIZE")
    assert "must run under bubblewrap" in workflow.reason and "--param isolation=none" in workflow.reason
    assert workflow.state["isolation"]["level"] == "none"
    assert not Activity.objects.filter(workflow_id=wf.pk, name="harness_initialize").exists()
    assert [e["level"] for e in events(wf.pk, "harness.isolation_probed")] == ["none"]

    settings.AGENTOPS_SANDBOX = "auto"
    resume(wf, by="hana")
    workflow = drive_all(wf.pk)
    assert (workflow.status, workflow.current_node) == ("waiting", "WAIT_FOR_APPROVAL")
    assert workflow.state["isolation"]["level"] == "bwrap"


def test_a_real_model_without_bubblewrap_pauses_even_with_isolation_none(harness_approver, mini_schedule, settings,
                                                                        monkeypatch):
    """isolation=none lets a launch run unisolated; with a real model and no bubblewrap the worker
    still refuses (only AGENTOPS_SANDBOX=none accepts that risk): paused at INITIALIZE saying what to
    install and which setting, nothing run; with the setting, resume goes on."""
    mini_schedule({})
    settings.AGENTOPS_SANDBOX = "auto"
    monkeypatch.setattr(sandbox, "bwrap_works", lambda: (False, "bwrap is not installed (apt-get install bubblewrap)"))
    wf = launch("harness", goal="Build app.py", params={"isolation": "none"})
    settings.AGENTOPS_MODEL_PROVIDER = "anthropic"  # the worker's: the probe asks it, no model is called
    workflow = drive_all(wf.pk)
    assert (workflow.status, workflow.pause_cause, workflow.current_node) == ("paused", "definition", "INITIALIZE")
    assert "A model-chosen command needs bubblewrap" in workflow.reason
    assert "apt-get install bubblewrap" in workflow.reason and "AGENTOPS_SANDBOX=none" in workflow.reason
    assert workflow.state["isolation"]["level"] == "refused"
    assert not Activity.objects.filter(workflow_id=wf.pk, name="harness_initialize").exists()

    settings.AGENTOPS_SANDBOX = "none"
    settings.AGENTOPS_MODEL_PROVIDER = "scripted"
    resume(wf, by="hana")
    workflow = drive_all(wf.pk)
    assert (workflow.status, workflow.current_node) == ("waiting", "WAIT_FOR_APPROVAL")
    assert workflow.state["isolation"]["level"] == "none"


def test_weaker_isolation_runs_only_when_the_launch_allows_it_and_is_recorded(harness_approver, mini_schedule,
                                                                             settings):
    mini_schedule({"F01/1": solve("F01", APP_GREET), "F02/1": solve("F02", APP_BOTH)})
    settings.AGENTOPS_SANDBOX = "none"
    workflow = launch_approved(harness_approver, isolation="none")
    assert workflow.status == "completed"
    assert (workflow.state["isolation"]["level"], workflow.result["isolation"]) == ("none", "none")


def test_a_proposed_feature_change_waits_for_a_new_approval_bound_to_the_new_contract(
        harness_approver, mini_schedule):
    """F01's session proposes a third feature with its check: staged on proposal/1, its checks run,
    a new approval bound to the new contract hash; the workspace keeps the approved list until a
    person approves, then F03 is on the board and worked on."""
    proposed = [*MINI_FEATURES, {"id": "F03", "description": "app.py wave prints o/", "steps": ["wave"],
                                 "priority": 3, "check": "python checks/check_f03.py", "passes": False}]
    app_all = APP_BOTH + "if sys.argv[1] == 'wave':\n    print('o/')\n"
    mini_schedule({
        "F01/1": [write("app.py", APP_GREET), commit("F01"),
                  {"tool": "propose_feature_change", "input": {
                      "features_json": json.dumps(proposed), "reason": "waving was forgotten",
                      "checks": {"checks/check_f03.py": CHECK_TEMPLATE.format(cmd="wave", want="o/")}}},
                  request_pass("F01")],
        "F02/1": solve("F02", APP_BOTH),
        "F03/1": solve("F03", app_all),
    })
    wf = launch("harness", goal="Build app.py", params={})
    drive_all(wf.pk)
    first = Wait.objects.get(workflow_id=wf.pk, kind=Wait.Kind.APPROVAL)
    approve_feature_list(wf.pk, harness_approver)
    workflow = drive_all(wf.pk)
    assert (workflow.status, workflow.current_node) == ("waiting", "REVIEW_PROPOSAL")
    second = Wait.objects.get(workflow_id=wf.pk, kind=Wait.Kind.APPROVAL, status=Wait.Status.OPEN)
    staged = events(wf.pk, "harness.proposal_staged")[0]
    assert second.candidate_hash == staged["contract_hash"] != first.candidate_hash
    assert second.candidate["scaffold_checks"] == {"F01": 0, "F02": 1, "F03": 1}
    root = Path(workflow.state["workspace"])
    assert len(json.loads((root / "features.json").read_text())) == 2  # the approved list stands
    assert not (root / "checks" / "check_f03.py").exists()

    approve(wf, by="hana", candidate_hash=second.candidate_hash)
    workflow = drive_all(wf.pk)
    assert workflow.status == "completed", workflow.reason
    assert [f["id"] for f in workflow.state["features"]] == ["F01", "F02", "F03"]
    assert workflow.state["contract_hash"] == staged["contract_hash"]
    assert workflow.state["proposals"][0]["outcome"] == "approved by hana"


def test_a_rejected_proposal_changes_nothing(harness_approver, mini_schedule):
    mini_schedule({
        "F01/1": [write("app.py", APP_GREET), commit("F01"),
                  {"tool": "propose_feature_change", "input": {"features_json": json.dumps(MINI_FEATURES[:1]),
                                                               "reason": "drop F02"}},
                  request_pass("F01")],
        "F02/1": solve("F02", APP_BOTH),
    })
    workflow = launch_approved(harness_approver)
    contract = workflow.state["contract_hash"]
    reject(workflow, by="hana", comment="F02 stays")
    workflow = drive_all(workflow.pk)
    assert workflow.status == "completed"
    assert [f["id"] for f in workflow.state["features"]] == ["F01", "F02"]
    assert workflow.state["contract_hash"] == contract
    assert workflow.state["proposals"][0]["outcome"] == "rejected by hana"


def test_a_goal_naming_a_script_variant_plays_its_sessions_beside_workflows_on_the_plain_ones(
        harness_approver, mini_schedule):
    """One schedule for both (as every soak worker reads one file): the goal with ``[script: propose]``
    plays ``propose:F01/1`` and proposes; the other plays ``F01/1`` and completes without a proposal."""
    mini_schedule({
        "F01/1": solve("F01", APP_GREET),
        "propose:F01/1": [write("app.py", APP_GREET), commit("F01"),
                          {"tool": "propose_feature_change", "input": {
                              "features_json": json.dumps(MINI_FEATURES[:1]), "reason": "drop F02"}},
                          request_pass("F01")],
        "F02/1": solve("F02", APP_BOTH),
    })
    plain = launch_approved(harness_approver)
    wf = launch("harness", goal="Build app.py [script: propose]", params={})
    drive_all(wf.pk)
    approve_feature_list(wf.pk, harness_approver)
    variant = drive_all(wf.pk)
    assert (plain.status, plain.state.get("proposals", [])) == ("completed", [])
    assert (variant.status, variant.current_node) == ("waiting", "REVIEW_PROPOSAL")
    assert [p["reason"] for p in events(wf.pk, "harness.proposal_staged")] == ["drop F02"]


@pytest.mark.parametrize("existing", [False, True], ids=["new repository", "existing commit"])
def test_an_initializer_retried_after_its_commit_starts_over_from_the_repository_before_it(
        harness_approver, mini_schedule, settings, tmp_path, existing):
    """The soak's bug: attempt 1 committed the scaffold, then failed before it ended (a lost
    connection while charging the last model call). Attempt 2 plays the same session: it must not
    find its own earlier commit as its base, see nothing to commit and fail the workflow."""
    from agentops.agents.harness import gitops

    workspace = tmp_path / "project"
    if existing:
        gitops.ensure_repo(workspace)
        (workspace / "README.md").write_text("a project\n")
        user_commit = gitops.commit_all(workspace, "the user's first commit")
    settings.AGENTOPS_TESTING_FAULTS = json.dumps([{"point": "harness.after_tool", "action": "raise",
                                                     "when": {"tool": "git_commit", "feature": "INIT",
                                                              "activity": "harness_initialize", "attempt": 1}}])
    settings.AGENTOPS_FAULT_LOG = str(tmp_path / "faults.log")
    mini_schedule({"F01/1": solve("F01", APP_GREET), "F02/1": solve("F02", APP_BOTH)})
    wf = launch("harness", goal="Build app.py", params={"workspace": str(workspace)})
    workflow = drive_all(wf.pk)
    assert len(Path(settings.AGENTOPS_FAULT_LOG).read_text().splitlines()) == 1  # the fault fired once
    init = Activity.objects.get(workflow=wf, name="harness_initialize")
    assert (init.status, init.attempt) == ("succeeded", 2)
    assert (workflow.status, workflow.current_node) == ("waiting", "WAIT_FOR_APPROVAL"), workflow.reason
    # One scaffold commit on the line, on top of where the session started; attempt 1's is kept on a WIP ref.
    line = gitops.git(workspace, "log", "--first-parent", "--format=%s").splitlines()
    assert line == (["scaffold", "the user's first commit"] if existing else ["scaffold"])
    saved = gitops.git(workspace, "log", "-1", "--format=%s", "refs/heads/wip/initializer/2")
    assert saved == "scaffold"
    if existing:
        assert gitops.git(workspace, "rev-parse", "HEAD~1") == user_commit
    approve_feature_list(wf.pk, harness_approver)
    assert drive_all(wf.pk).status == "completed"


def test_a_release_change_at_the_feature_list_approval_builds_the_scaffold_again(
        harness_approver, mini_schedule, settings, tmp_path):
    """A release change sends a waiting harness back to INITIALIZE (its revalidate node). The new
    visit plays the same session on a workspace that already holds the first visit's scaffold: it
    starts over from before that scaffold (saved on a WIP ref), instead of seeing nothing to commit
    and failing the workflow, "The initializer made no commit"."""
    from agentops.agents.harness import gitops

    workspace = tmp_path / "project"
    mini_schedule({"F01/1": solve("F01", APP_GREET), "F02/1": solve("F02", APP_BOTH)})
    wf = launch("harness", goal="Build app.py", params={"workspace": str(workspace)})
    assert drive_all(wf.pk).current_node == "WAIT_FOR_APPROVAL"
    first_scaffold = gitops.head(workspace)

    settings.AGENTOPS_PROMPT_VERSION = "harness-prompt-2"  # a worker restarted on a new release
    approve_feature_list(wf.pk, harness_approver)
    workflow = drive_all(wf.pk)
    assert [e["why"] for e in events(wf.pk, "signal.requeued")] == [] and events(wf.pk, "release.changed")
    assert (workflow.status, workflow.current_node) == ("waiting", "WAIT_FOR_APPROVAL"), workflow.reason
    inits = Activity.objects.filter(workflow=wf, name="harness_initialize").order_by("pk")
    assert [a.status for a in inits] == ["succeeded", "succeeded"]
    assert len({a.operation_id.split("/")[1] for a in inits}) == 2  # two visits of INITIALIZE
    line = gitops.git(workspace, "log", "--first-parent", "--format=%s").splitlines()
    assert line == ["scaffold"], line  # one scaffold on the line: the new visit's
    assert gitops.git(workspace, "rev-parse", "refs/heads/wip/initializer/1") == first_scaffold
    approve_feature_list(wf.pk, harness_approver)
    assert drive_all(wf.pk).status == "completed"


def test_a_release_change_after_sessions_ran_keeps_the_workflows_count_of_sessions(
        harness_approver, mini_schedule, settings, tmp_path):
    """max_sessions bounds the workflow, not each visit of INITIALIZE: a release change after a
    session ran builds the scaffold again, and the session already spent still counts."""
    mini_schedule({"F01/1": solve("F01", APP_GREET), "F02/1": solve("F02", APP_BOTH)})
    wf = launch("harness", goal="Build app.py",
                                  params={"workspace": str(tmp_path / "project"), "max_sessions": 1})
    drive_all(wf.pk)
    approve_feature_list(wf.pk, harness_approver)
    workflow = drive_all(wf.pk)
    assert (workflow.status, workflow.state["paused_for"]["kind"]) == ("paused", "max_sessions"), workflow.reason

    settings.AGENTOPS_PROMPT_VERSION = "harness-prompt-2"  # a worker restarted on a new release
    resume(wf, by="hana")
    workflow = drive_all(wf.pk)
    assert events(wf.pk, "release.changed")
    assert (workflow.status, workflow.current_node) == ("waiting", "WAIT_FOR_APPROVAL"), workflow.reason
    approve_feature_list(wf.pk, harness_approver)
    workflow = drive_all(wf.pk)
    ran = Activity.objects.filter(workflow=wf, name="harness_session").count()
    assert workflow.state["sessions"] == ran, (workflow.state["sessions"], ran)
    assert workflow.state["sessions"] <= workflow.state["session_limit"]
