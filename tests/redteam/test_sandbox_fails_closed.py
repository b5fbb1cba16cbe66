"""Without bubblewrap, a real model's commands do not run: the sandbox fails closed.

Each test takes bubblewrap away (``sandbox.bwrap_works`` answers as on a worker without it) and
configures a real model; only the offline scripted model, or an operator's explicit
AGENTOPS_SANDBOX=none, runs a command unisolated.
"""
from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

import pytest
from django.core import checks

from agentops import sandbox
from agentops.agents.autonomous.activities import run_tool_isolated
from agentops.agents.harness import checks as harness_checks
from agentops.agents.harness import gitops, tools
from tests.conftest import drive
from tests.fakes import anthropic_api as fake
from tests.fakes.anthropic_api import FakeAnthropicAPI
from tests.fakes.claude_agent import ClaudeForAutonomous, seed_workspace, task_of, tool_results
from tests.providers.conftest import anthropic_api, claude, sdk_sleeps  # noqa: F401 (fixtures)
from tests.redteam.conftest import contained
from workflows import services

MISSING = "bwrap is not installed (apt-get install bubblewrap)"


@pytest.fixture
def no_bwrap(monkeypatch: pytest.MonkeyPatch, settings: Any) -> None:
    settings.AGENTOPS_SANDBOX = "auto"
    monkeypatch.setattr(sandbox, "bwrap_works", lambda: (False, MISSING))


@pytest.fixture
def real_model(settings: Any, no_bwrap: None) -> None:
    settings.AGENTOPS_MODEL_PROVIDER = "anthropic"


@pytest.fixture
def root(tmp_path: Path) -> Path:
    path = (tmp_path / "wf-1").resolve()
    path.mkdir()
    return path


def isolation_warnings() -> list[checks.CheckMessage]:
    return [m for m in sandbox.check_isolation() if m.id.startswith("agentops.W01")]


def test_a_real_models_command_service_and_check_do_not_run_without_bubblewrap(real_model, root, tmp_path):
    with pytest.raises(sandbox.SandboxUnavailable) as refused:
        sandbox.run(["touch", "made.txt"], workspace=root, timeout_seconds=5)
    message = str(refused.value)
    assert "apt-get install bubblewrap" in message and "AGENTOPS_SANDBOX=none" in message
    assert "it was not run" in message

    with pytest.raises(sandbox.SandboxUnavailable):
        run_tool_isolated(root, "run_command", {"command": "touch made.txt"})

    gitops.ensure_repo(root)
    session = tools.Session(root=root, operation_id="op", feature="F01", service_dir=tmp_path / "services")
    for name, args in [("run_command", {"command": "touch made.txt"}),
                       ("service_start", {"name": "web", "command": "touch made.txt"})]:
        ok, out = tools.call(session, name, args)
        assert not ok and out.startswith("refused: A model-chosen command needs bubblewrap"), (name, out)
    assert [r["tool"] for r in session.refused] == ["run_command", "service_start"] and not session.services

    (root / "check.sh").write_text("touch made.txt\n")
    commit = gitops.commit_all(root, "a check")
    [result] = harness_checks.run_checks(root, commit, [{"id": "F01", "check": "sh check.sh"}], where="worktree",
                                         timeout_seconds=10, scratch=tmp_path / "scratch")
    assert (result["exit_code"], result["passed"]) == (-1, False)
    assert result["output_tail"].startswith("unverified: the check could not run: A model-chosen command")
    assert not (root / "made.txt").exists()
    contained("no bubblewrap, a real model: commands, services and checks",
              "sandbox.isolation fails closed (SandboxUnavailable)")


def test_the_worker_says_so_at_start_up(real_model, caplog):
    [warning] = isolation_warnings()
    assert warning.id == "agentops.W012" and "refuses every model-chosen command" in warning.msg
    assert "AGENTOPS_SANDBOX=none" in warning.hint

    with caplog.at_level(logging.WARNING, logger="agentops.sandbox"):
        from agentops.celery import report_isolation
        report_isolation()
    [record] = [r for r in caplog.records if r.getMessage() == "sandbox.isolation"]
    assert record.check == "agentops.W012" and MISSING in record.detail


def test_accepting_the_risk_takes_one_setting(real_model, settings, root):
    settings.AGENTOPS_SANDBOX = "none"
    done = sandbox.run(["touch", "made.txt"], workspace=root, timeout_seconds=5)
    assert done.isolation == "none" and (root / "made.txt").exists()
    [warning] = isolation_warnings()
    assert warning.id == "agentops.W010" and "the worker's file system, network and user" in warning.msg


def test_the_offline_model_runs_its_own_commands_unisolated_and_says_so_once(no_bwrap, settings, root, caplog):
    settings.AGENTOPS_MODEL_PROVIDER = "scripted"
    sandbox._say_unisolated_offline.cache_clear()
    with caplog.at_level(logging.WARNING, logger="agentops.sandbox"):
        first = sandbox.run(["touch", "one.txt"], workspace=root, timeout_seconds=5)
        second = sandbox.run(["touch", "two.txt"], workspace=root, timeout_seconds=5)
    assert (first.isolation, second.isolation) == ("none", "none")
    assert [r.getMessage() for r in caplog.records].count("sandbox.unisolated_offline") == 1
    [warning] = isolation_warnings()
    assert warning.id == "agentops.W011" and "the offline scripted model's commands" in warning.msg


def test_bubblewrap_present_means_no_warning(settings, monkeypatch):
    settings.AGENTOPS_MODEL_PROVIDER = "anthropic"
    settings.AGENTOPS_SANDBOX = "auto"
    monkeypatch.setattr(sandbox, "bwrap_works", lambda: (True, "/usr/bin/bwrap"))
    assert isolation_warnings() == []
    assert sandbox.isolation() == "bwrap"


class ClaudeThatRuns(ClaudeForAutonomous):
    """Claude asking, in its first task, for a command that would leave a mark."""

    def work(self, body: dict[str, Any]) -> fake.Answer:
        if task_of(body) == "execute_task" and tool_results(body) == 0:
            return fake.tool_use("run_command", {"command": "touch escaped.txt"}, say="Let me run something.")
        return super().work(body)


@pytest.mark.django_db
def test_an_autonomous_agent_on_claude_runs_no_command_without_bubblewrap(request, real_model, settings, tmp_path):
    api: FakeAnthropicAPI = request.getfixturevalue("claude")
    settings.AGENTOPS_WORKSPACE_DIR = tmp_path / "workspaces"
    api.responder = ClaudeThatRuns()
    workflow = services.workflow_launch(kind="autonomous", goal="Prepare onboarding notes from the docs")
    workspace = Path(settings.AGENTOPS_WORKSPACE_DIR) / f"wf-{workflow.pk}"
    seed_workspace(workspace)

    workflow = drive(workflow.pk)

    skipped = [t for t in workflow.state["tasks"] if t["status"] == "skipped"]
    assert skipped and all("A model-chosen command needs bubblewrap" in t["reason"] for t in skipped), \
        workflow.state["tasks"]
    assert "AGENTOPS_SANDBOX=none" in skipped[0]["reason"]
    assert not (workspace / "escaped.txt").exists()
    contained("no bubblewrap, an agent on Claude asks for a command",
              "the activity fails through the failure boundary; nothing runs")
