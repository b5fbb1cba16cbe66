"""The release agent end to end in one process, with the real deploy target over HTTP."""
from __future__ import annotations

import pytest

from agentops.kind import InvalidInput
from agentops.kind.presentation import Activity, Wait, Workflow
from agentops.kind.testing import approve, drive, events
from agentops.kind.testing import launch as kit_launch
from tests.conftest import git_commit, release_params

pytestmark = pytest.mark.django_db


def launch(repo, user=None, **extra):
    return kit_launch("release", goal="Ship the release notes", params=release_params(repo, **extra),
                      by=user.username if user else "")


def open_approval(workflow):
    return Wait.objects.get(workflow=workflow, kind=Wait.Kind.APPROVAL, status=Wait.Status.OPEN)


def test_release_runs_to_completion_with_one_deployment(git_repo, deploy_target, approver, requester):
    """Launch, approve, and the workflow deploys exactly once, verifies, reconciles and completes."""
    workflow = drive(launch(git_repo, requester))
    assert (workflow.status, workflow.current_node) == ("waiting", "WAIT_FOR_APPROVAL")
    wait = open_approval(workflow)
    assert wait.candidate["head"] == workflow.state["evidence"]["head"]

    approve(workflow, by=approver.username)
    workflow = drive(workflow)

    assert workflow.status == "completed", workflow.reason
    assert workflow.result["approved_by"] == "alice"
    stats = deploy_target.store.stats()
    assert stats["deployments"] == 1
    assert list(stats["effects"].values()) == [{"created": 1, "deleted": 0}]
    assert [e.kind for e in events(workflow) if e.kind.startswith("commitment.")] == ["commitment.released"]


def test_failing_tests_fail_the_workflow_before_approval(tmp_path, deploy_target, requester):
    """A candidate whose tests fail never reaches the approval queue."""
    from tests.conftest import make_git_repo

    repo = make_git_repo(tmp_path / "red", test_script="raise SystemExit(3)\n")
    workflow = drive(launch(repo, requester))
    assert workflow.status == "failed"
    assert "tests failed (exit 3)" in workflow.reason
    assert not workflow.waits.exists()
    assert deploy_target.store.stats()["deployments"] == 0


def test_repository_moving_during_the_wait_rebuilds_the_candidate(git_repo, deploy_target, approver, requester):
    """REVALIDATE notices a new HEAD after approval and asks for approval of a fresh candidate."""
    workflow = drive(launch(git_repo, requester))
    first = open_approval(workflow)
    git_commit(git_repo, "later.txt", "someone pushed\n")
    approve(workflow, by=approver.username)
    workflow = drive(workflow)

    assert (workflow.status, workflow.current_node) == ("waiting", "WAIT_FOR_APPROVAL")
    second = open_approval(workflow)
    assert second.candidate_hash != first.candidate_hash
    assert deploy_target.store.stats()["deployments"] == 0


@pytest.mark.parametrize(
    ("params", "message"),
    [
        ({"test_command": "true"}, "repo is required"),
        ({"repo": "/definitely/not/here", "test_command": "true"}, "not a git repository"),
        ({"repo": "REPO", "test_command": ""}, "test_command is required"),
        ({"repo": "REPO", "test_command": "echo 'unterminated"}, "cannot be parsed"),
        ({"repo": "REPO", "test_command": "true", "colour": "red"}, "Unknown parameter"),
        ({"repo": "REPO", "test_command": "true", "approval_expiry_hours": "-1"}, "more than 0 and at most 8760"),
    ],
)
def test_bad_launch_parameters_are_refused_and_nothing_is_written(git_repo, params, message):
    """Every malformed launch is refused with a field-level message and creates no rows."""
    params = {k: (str(git_repo) if v == "REPO" else v) for k, v in params.items()}
    with pytest.raises(InvalidInput, match=message):
        kit_launch("release", goal="g", params=params)
    assert not Workflow.objects.exists()


def test_a_committed_link_never_carries_the_proposal_outside_the_clone(tmp_path, deploy_target, requester):
    """The repository commits ``release-notes`` as a link to a directory outside: the proposed
    notes are refused in the test clone, never written there."""
    import subprocess

    from tests.conftest import git_commit, make_git_repo

    outside = tmp_path / "outside"
    outside.mkdir()
    repo = make_git_repo(tmp_path / "linked")
    (repo / "release-notes").symlink_to(outside)
    git_commit(repo, "README.md", "notes live elsewhere\n")
    assert "release-notes" in subprocess.run(["git", "-C", str(repo), "ls-files"], capture_output=True,
                                             text=True, check=True).stdout
    workflow = drive(launch(repo, requester))
    tests_run = Activity.objects.get(workflow=workflow, name="run_tests")
    assert tests_run.result is None and "goes through a symbolic link ('release-notes')" in tests_run.error
    assert list(outside.iterdir()) == []
