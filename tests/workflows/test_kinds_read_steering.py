"""The shipped kinds read steering where they call the model; the test kit's FakeLease holds messages."""
from __future__ import annotations

from typing import Any

from agentops.agents.autonomous.activities import PlanInput, TaskInput, execute_task, plan_tasks
from agentops.agents.harness import session as harness
from agentops.agents.harness.tools import Session
from agentops.agents.release.activities import ProposalInput, propose_change
from workflows import registry
from workflows.activity_context import ActivityContext
from workflows.leases import Claim
from workflows.testing import ActivityEnvironment, FakeLease, FakeModel

STEER = "Keep it short."


def steer_turns(model: FakeModel) -> list[int]:
    """For each request, how many of its user turns hold the steer message."""
    return [sum(1 for m in call["messages"] if m["role"] == "user" and STEER in str(m["content"]))
            for call in model.calls]


def test_the_shipped_kinds_read_steering_and_the_harness_refuses_forks() -> None:
    assert all(registry.definition(kind).reads_steering for kind in ("autonomous", "harness", "release"))
    assert "workspace" in registry.definition("harness").fork_refusal
    assert not registry.definition("autonomous").fork_refusal and not registry.definition("release").fork_refusal


def test_an_autonomous_task_takes_the_message_at_its_next_turn_and_keeps_it_once(tmp_path: Any, settings: Any) -> None:
    settings.AGENTOPS_WORKSPACE_DIR = tmp_path
    lease = FakeLease(steer=[STEER])
    model = FakeModel(["Done."])
    env = ActivityEnvironment(lease=lease, model=model)
    assert env.run(execute_task, TaskInput(goal="g", task={"id": 1, "title": "t", "instructions": "i"}))["turns"] == 1
    assert [call for call, _ in lease.steered] == [0] and steer_turns(model) == [1]


def test_structured_answers_and_release_proposals_take_it(tmp_path: Any) -> None:
    lease = FakeLease(steer=[STEER])
    model = FakeModel([{"tasks": [{"title": "a", "instructions": "b"}]}])
    ActivityEnvironment(lease=lease, model=model).run(plan_tasks, PlanInput(goal="g"))
    assert steer_turns(model) == [1]
    lease = FakeLease(steer=[STEER])
    model = FakeModel([{"title": "t", "summary": "s", "files": {"a.txt": "x"}}])
    ActivityEnvironment(lease=lease, model=model).run(propose_change, ProposalInput(
        goal="g", evidence={"head": "abc", "branch": "main", "files": 1}))
    assert steer_turns(model) == [1]


def test_a_harness_session_turn_takes_it(tmp_path: Any) -> None:
    lease = FakeLease(steer=[STEER])
    model = FakeModel(["All done."])
    claim = Claim(activity_id=0, workflow_id=1, operation_id="wf-1/SESSION.1/i1/0", name="harness_session",
                  attempt=1, lease_token="t", input={}, previous_attempt_lost=False)
    session = Session(root=tmp_path, operation_id=claim.operation_id)
    from workflows.metering import answered_by

    with answered_by(model, ActivityEnvironment().ledger):
        turns = harness._loop(ActivityContext(claim=claim, lease=lease), session, system="<task>harness_session</task>",
                              brief="Work on the feature.", toolset=[])
    assert turns == 1 and steer_turns(model) == [1] and [call for call, _ in lease.steered] == [0]
