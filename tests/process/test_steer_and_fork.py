"""Steering and forks with real workers and beat: a steer message reaches the agent's next model call
exactly once; a fork from visit N reuses N visits' results and repeats no effect.

The steer scenario runs the autonomous agent against the fake Messages API on loopback (the real SDK),
which records every request the workers send: the model-call input is read there, not from our own rows.
The fork scenario runs the release agent against the real deploy target and counts its effects per key.
"""
from __future__ import annotations

import json
import threading
import time
from typing import Any

import pytest
from django.contrib.auth.models import User

from tests.fakes.anthropic_api import Answer, FakeAnthropicAPI
from tests.fakes.claude_agent import TASKS, ClaudeForAutonomous, first_text, seed_workspace, task_of
from tests.process.harness import (
    approve,
    assert_event_seqs_contiguous,
    assert_one_effect_per_key,
    launch_release,
    wait_until_status,
)
from workflows import services
from workflows.features import forks
from workflows.models import Activity, Event, SteerMessage, Workflow

pytestmark = [pytest.mark.process, pytest.mark.django_db(transaction=True)]

MODEL = "claude-sonnet-5-5"
STEER = "Also add a one-line changelog entry to notes/CHANGES.md for what you write."


class HoldsTheFirstTaskCall(ClaudeForAutonomous):
    """Plays the workflow; the first task's first model call is answered only once the test has steered."""

    def __init__(self) -> None:
        super().__init__()
        self.reached = threading.Event()
        self.go = threading.Event()

    def __call__(self, body: dict[str, Any]) -> Answer:
        answer = super().__call__(body)
        if task_of(body) == "execute_task" and not self.reached.is_set():
            self.reached.set()
            self.go.wait(timeout=30)
        return answer


def holding(body: dict[str, Any]) -> int:
    """How many user turns of a request hold the steer message."""
    return sum(1 for m in body["messages"] if m["role"] == "user" and STEER in json.dumps(m["content"]))


def test_a_steer_message_reaches_the_next_model_call_exactly_once(
    cluster: Any, claude_api: FakeAnthropicAPI, tmp_path: Any, figures: Any,
) -> None:
    """Sent while the first task's first model call is in flight: the call after it (that task's second
    turn) carries it as a new user turn; the task's later turns carry that turn once as history; no request
    of another activity (the other tasks, the verdict) carries it; the row says delivered to that call."""
    responder = HoldsTheFirstTaskCall()
    claude_api.responder = responder
    cluster.extra_env.update({
        "AGENTOPS_MODEL_PROVIDER": "anthropic", "ANTHROPIC_API_KEY": "sk-ant-test-0000-secret",
        "ANTHROPIC_BASE_URL": claude_api.url, "AGENTOPS_MODEL": MODEL, "AGENTOPS_ANTHROPIC_MAX_RETRIES": "0",
    })
    olga = User.objects.create_user("olga")
    wf = services.workflow_launch(kind="autonomous", goal="Prepare onboarding notes from the docs").pk
    seed_workspace(tmp_path / "workspaces" / f"wf-{wf}")
    cluster.start(workers=("wa", "wb"), beats=("beat",))

    cluster.wait_for(responder.reached.is_set, timeout=60, what="the first task's first model call")
    held_at = len(claude_api.requests)
    sent = services.workflow_steer(workflow_id=wf, message=STEER, user=olga)
    sent_at = time.time()
    responder.go.set()
    wait_until_status(cluster, [wf], "completed", timeout=120)

    bodies = claude_api.bodies()
    carrying = [n for n, body in enumerate(bodies) if holding(body)]
    first_task = TASKS[0]["title"]
    assert carrying, "no request carried the steer message"
    assert carrying[0] == held_at, (carrying, held_at)  # the very next request after the held one
    assert all(holding(bodies[n]) == 1 for n in carrying), "a request carried the message twice"
    assert all(task_of(bodies[n]) == "execute_task" and first_task in first_text(bodies[n]) for n in carrying)
    newly = [n for n in carrying if bodies[n]["messages"][-1]["role"] == "user"
             and STEER in json.dumps(bodies[n]["messages"][-1]["content"])]
    assert newly == [held_at], "only one request received it as its new user turn"
    others = [n for n, body in enumerate(bodies) if not (task_of(body) == "execute_task"
                                                          and first_task in first_text(body))]
    assert others and not set(others) & set(carrying)

    row = SteerMessage.objects.get(workflow_id=wf)
    task = Activity.objects.get(pk=row.activity_id)
    assert (task.name, task.status, row.call, row.sender, sent.seq) == ("execute_task", "succeeded", 1, "olga", 1)
    delivered = list(Event.objects.filter(workflow_id=wf, kind="steer.delivered"))
    assert [(e.data["operation_id"], e.data["call"]) for e in delivered] == [(task.operation_id, 1)]
    assert Event.objects.get(workflow_id=wf, kind="steer.received").data["by"] == "olga"
    assert_event_seqs_contiguous([wf])
    delivery_s = claude_api.requests[held_at].at - sent_at
    figures("steer reaches the next model call once", requests=len(bodies),
            requests_carrying=len(carrying), received_as_new_turn=len(newly),
            other_activities_requests_carrying=0, delivered_to=f"{task.operation_id} call {row.call}",
            steer_to_request_s=f"{delivery_s:.2f}")


def test_a_fork_from_visit_n_reuses_n_results_and_repeats_no_effect(
    cluster: Any, git_repo: Any, deploy_target: Any, approver: Any, requester: Any, figures: Any,
) -> None:
    """A completed release forked after its deploy (visit 7) completes on the original's deployment with
    no new effect; forked before its approval (visit 4) it reuses the proposal and the tests, asks again
    and deploys once under its own key. The target sees one effect per key, none deleted."""
    cluster.start(workers=("wa", "wb"), beats=("beat",))
    original = launch_release(git_repo, requester, "Ship the release notes")
    wait_until_status(cluster, [original], "waiting", node="WAIT_FOR_APPROVAL", timeout=60)
    approve(original, approver)
    wait_until_status(cluster, [original], "completed", timeout=60)
    deploy_key = Activity.objects.get(workflow_id=original, name="deploy").sent_key

    after_deploy = forks.workflow_fork(workflow_id=original, from_visit=7, user=approver).pk
    before_approval = forks.workflow_fork(workflow_id=original, from_visit=4, user=requester).pk
    wait_until_status(cluster, [after_deploy], "completed", timeout=60)
    wait_until_status(cluster, [before_approval], "waiting", node="WAIT_FOR_APPROVAL", timeout=60)
    approve(before_approval, approver)
    wait_until_status(cluster, [before_approval], "completed", timeout=60)

    def names(pk: int) -> list[str]:
        """The steps of its node visits (its approvers' notifications left out)."""
        return list(Activity.objects.filter(workflow_id=pk).exclude(node="NOTIFY").order_by("pk").values_list(
            "name", flat=True))

    assert names(after_deploy) == ["verify_deployment", "reconcile_deployment"]
    assert names(before_approval) == ["inspect_repository", "deploy", "verify_deployment", "reconcile_deployment"]
    fork_key = Activity.objects.get(workflow_id=before_approval, name="deploy").sent_key
    assert fork_key != deploy_key and f"/wf-{before_approval}/" in fork_key
    stats = assert_one_effect_per_key(deploy_target, {deploy_key, fork_key})
    results = {pk: Workflow.objects.get(pk=pk).result["deployment_id"] for pk in (original, after_deploy,
                                                                                  before_approval)}
    assert results[after_deploy] == results[original] != results[before_approval]
    assert_event_seqs_contiguous([original, after_deploy, before_approval])
    original_visits = Workflow.objects.get(pk=original).node_visit
    figures("fork from visit N", original_visits=original_visits,
            original_activities=len(names(original)), fork7_reused_visits=7,
            fork7_activities=len(names(after_deploy)), fork7_new_effects=0, fork4_reused_visits=4,
            fork4_activities=len(names(before_approval)), fork4_new_effects=1,
            target_effects=len(stats["effects"]), deleted=0)


class SlowAfterTheSteer(HoldsTheFirstTaskCall):
    """As HoldsTheFirstTaskCall; then the first request that carries the steer message is answered slowly, once,
    so that the test can kill the worker waiting for it."""

    def __init__(self) -> None:
        super().__init__()
        self.slowed = threading.Event()

    def __call__(self, body: dict[str, Any]) -> Answer:
        answer = super().__call__(body)
        if holding(body) and not self.slowed.is_set():
            self.slowed.set()
            answer.delay_seconds = SLOW_ANSWER_SECONDS
        return answer


SLOW_ANSWER_SECONDS = 20.0
KILL_LEASE_SECONDS = 8


def test_a_worker_killed_after_its_call_took_the_steer_message_loses_it_not_and_repeats_it_not(
    cluster: Any, claude_api: FakeAnthropicAPI, tmp_path: Any, figures: Any,
) -> None:
    """The model call that took the message is in flight when its worker is SIGKILLed: the next attempt
    resumes from the turn checkpointed before the message was added and sends the same request again, the
    message in it once; the conversation that goes on (and every later request) has it once; no other
    activity takes it; the history shows the second delivery as the same operation and call."""
    responder = SlowAfterTheSteer()
    claude_api.responder = responder
    cluster.extra_env.update({
        "AGENTOPS_MODEL_PROVIDER": "anthropic", "ANTHROPIC_API_KEY": "sk-ant-test-0000-secret",
        "ANTHROPIC_BASE_URL": claude_api.url, "AGENTOPS_MODEL": MODEL, "AGENTOPS_ANTHROPIC_MAX_RETRIES": "0",
        "AGENTOPS_MODEL_CALL_LEASE_SECONDS": str(KILL_LEASE_SECONDS),
    })
    wf = services.workflow_launch(kind="autonomous", goal="Prepare onboarding notes from the docs").pk
    seed_workspace(tmp_path / "workspaces" / f"wf-{wf}")
    workers = cluster.start(workers=("wa", "wb"), beats=("beat",))[:2]
    cluster.wait_for(responder.reached.is_set, timeout=60, what="the first task's first model call")
    services.workflow_steer(workflow_id=wf, message=STEER, by="shell:ops")
    responder.go.set()
    cluster.wait_for(responder.slowed.is_set, timeout=30, what="the request carrying the steer message")
    waiting = cluster.wait_for(lambda: Activity.objects.filter(
        workflow_id=wf, name="execute_task", status="running").first(), timeout=10, what="the task's attempt")
    attempt = waiting.attempts.get(number=waiting.attempt)
    holder = next(w for w in workers if w.name == attempt.worker.split("@")[0])
    killed_at = time.time()
    assert holder.kill_group() == -9
    wait_until_status(cluster, [wf], "completed", timeout=120)
    cluster.wait_for(lambda: all(r.status != 0 for r in claude_api.requests), timeout=SLOW_ANSWER_SECONDS + 5,
                     what="the fake API to finish the slow answer")

    bodies = claude_api.bodies()
    carrying = [n for n, body in enumerate(bodies) if holding(body)]
    assert all(holding(bodies[n]) == 1 for n in carrying), "a request carried the message twice"
    newly = [n for n in carrying if STEER in json.dumps(bodies[n]["messages"][-1]["content"])]
    assert len(newly) == 2, newly  # the killed attempt's request and its retry: one model call, sent twice
    killed, retried = (bodies[n] for n in newly)
    assert retried["messages"] == killed["messages"], "the retry sent the same conversation, the message once"
    assert all(task_of(bodies[n]) == "execute_task" and TASKS[0]["title"] in first_text(bodies[n]) for n in carrying)
    delivered = [(e.data["operation_id"], e.data["call"], e.data["attempt"], e.data.get("again", False))
                 for e in Event.objects.filter(workflow_id=wf, kind="steer.delivered").order_by("seq")]
    assert delivered == [(waiting.operation_id, 1, 1, False), (waiting.operation_id, 1, 2, True)]
    row = SteerMessage.objects.get(workflow_id=wf)
    assert (row.activity_id, row.call) == (waiting.pk, 1)
    assert Activity.objects.get(pk=waiting.pk).status == "succeeded"
    assert_event_seqs_contiguous([wf])
    retry_at = claude_api.requests[newly[1]].at
    figures("steer across a killed model call", requests=len(bodies), requests_carrying=len(carrying),
            sent_as_new_turn=len(newly), model_calls_that_took_it=1, deliveries_recorded=len(delivered),
            kill_to_retried_request_s=f"{retry_at - killed_at:.2f}", model_call_lease_s=KILL_LEASE_SECONDS)
