"""A worker SIGKILLed while it waits for a slow Claude answer.

Real workers and beat, the real SDK, the fake Messages API on loopback in this process. The
model-call lease is the default (AGENTOPS_MODEL_CALL_LEASE_SECONDS, 20 s), heartbeated while the
answer is awaited; nothing moves ``lease_expires_at`` by hand. Measured: the seconds from the
kill to the start of another worker's attempt, and the ledger against the server's usage.
"""
from __future__ import annotations

import threading
import time
from decimal import Decimal
from typing import Any

import pytest

from tests.fakes.anthropic_api import Answer, FakeAnthropicAPI
from tests.fakes.claude_agent import TASKS, ClaudeForAutonomous, first_text, seed_workspace, task_of, tool_results
from tests.process.harness import assert_event_seqs_contiguous, billed_usd, wait_until_status
from workflows import services
from workflows.metering import USAGE_KEY_HEADER
from workflows.models import Activity, ActivityAttempt, Event, UsageEntry, Workflow
from workflows.prices import usage_fields
from workflows.provider import Usage
from workflows.selectors import spent_usd

pytestmark = [pytest.mark.process, pytest.mark.django_db(transaction=True)]

MODEL = "claude-sonnet-5-5"
MODEL_CALL_LEASE_SECONDS = 20  # the default of AGENTOPS_MODEL_CALL_LEASE_SECONDS
SLOW_ANSWER_SECONDS = 40.0  # longer than the lease: only heartbeats keep a live worker's attempt
RECOVERY_TARGET_SECONDS = 30.0
SLOW_TASK = TASKS[1]["title"]


class SlowOnceAfterFirstTool(ClaudeForAutonomous):
    """Plays the workflow; the second task's second model call (after its first tool call) is
    answered slowly, once."""

    def __init__(self) -> None:
        super().__init__()
        self.slowed = threading.Event()

    def __call__(self, body: dict[str, Any]) -> Answer:
        answer = super().__call__(body)
        if (task_of(body) == "execute_task" and SLOW_TASK in first_text(body) and tool_results(body) == 1
                and not self.slowed.is_set()):
            self.slowed.set()
            answer.delay_seconds = SLOW_ANSWER_SECONDS
        return answer


def test_a_worker_killed_during_a_slow_model_call_is_replaced_within_seconds(
    cluster: Any, claude_api: FakeAnthropicAPI, tmp_path: Any, figures: Any,
) -> None:
    """SIGKILL the worker whose attempt waits for a slow answer: its lease (20 s, heartbeated
    while it waited) runs out and another worker's attempt starts within 30 s, resumes the task
    from the turn checkpointed before the call, and redoes no tool call. The killed request is
    uncertain in the ledger; every other request is charged what the server's usage says or
    released, and settled from the server's usage the ledger equals the bill to the cent."""
    responder = SlowOnceAfterFirstTool()
    claude_api.responder = responder
    cluster.extra_env.update({
        "AGENTOPS_MODEL_PROVIDER": "anthropic", "ANTHROPIC_API_KEY": "sk-ant-test-0000-secret",
        "ANTHROPIC_BASE_URL": claude_api.url, "AGENTOPS_MODEL": MODEL, "AGENTOPS_ANTHROPIC_MAX_RETRIES": "0",
        "AGENTOPS_LEASE_SECONDS": "60",  # the harness's 4 s would hide what the model-call lease does
    })
    wf = services.workflow_launch(kind="autonomous", goal="Prepare onboarding notes from the docs").pk
    seed_workspace(tmp_path / "workspaces" / f"wf-{wf}")
    workers = cluster.start(workers=("wa", "wb"), beats=("beat",))[:2]

    cluster.wait_for(responder.slowed.is_set, timeout=60, what="the slow model call to reach the API")
    waiting = cluster.wait_for(lambda: ActivityAttempt.objects.filter(
        activity__workflow_id=wf, activity__name="execute_task", activity__input__task__title=SLOW_TASK,
        status="running").first(), timeout=10, what="the attempt waiting for the slow answer")
    op = waiting.activity.operation_id
    time.sleep(MODEL_CALL_LEASE_SECONDS + 2)  # past the lease: only the heartbeats keep the attempt
    assert ActivityAttempt.objects.get(pk=waiting.pk).status == "running", "the slow call lost its lease"
    assert Activity.objects.get(operation_id=op).heartbeat_detail == "waiting for model call 1"
    holder = next(w for w in workers if w.name == waiting.worker.split("@")[0])
    killed_at = time.time()
    assert holder.kill_group() == -9

    def next_attempt() -> ActivityAttempt | None:
        return ActivityAttempt.objects.filter(activity__operation_id=op, number=waiting.number + 1).first()

    replacement = cluster.wait_for(next_attempt, timeout=60, what="another worker's attempt")
    recovery_s = replacement.started_at.timestamp() - killed_at
    wait_until_status(cluster, [wf], "completed", timeout=90)
    cluster.wait_for(lambda: all(r.status != 0 for r in claude_api.requests), timeout=SLOW_ANSWER_SECONDS + 5,
                     what="the fake API to finish the slow answer")

    # Recovery: another worker, from the checkpoint, no tool call redone.
    assert replacement.worker.split("@")[0] != holder.name
    attempts = list(Activity.objects.get(operation_id=op).attempts.order_by("number"))
    assert [(a.number, a.status) for a in attempts] == [(1, "lost"), (2, "succeeded")]
    resumed = Event.objects.get(workflow_id=wf, kind="task.resumed", data__operation_id=op)
    assert (resumed.data["attempt"], resumed.data["turn"]) == (2, 1)
    tools = [(e.data["tool"], e.data["input"], e.data["attempt"]) for e in Event.objects.filter(
        workflow_id=wf, kind="tool.called", data__operation_id=op).order_by("seq")]
    assert len(tools) == len({(t, i) for t, i, _ in tools}) == 6, tools
    assert [a for _, _, a in tools] == [1, 2, 2, 2, 2, 2]

    # The ledger: one row per request the server saw, under the key it was sent with.
    entries = {e.key: e for e in UsageEntry.objects.filter(workflow_id=wf)}
    by_key = {r.headers[USAGE_KEY_HEADER]: r for r in claude_api.requests}
    assert set(entries) == set(by_key) and len(by_key) == len(claude_api.requests)
    killed_key = f"{op}#1@1.0"
    assert entries[killed_key].status == "uncertain"
    assert entries[killed_key].reserved_usd >= billed_usd(MODEL, by_key[killed_key])
    assert {e.status for k, e in entries.items() if k != killed_key} == {"charged"}
    assert all(e.cost_usd == billed_usd(MODEL, by_key[k]) for k, e in entries.items() if k != killed_key)
    bill = sum((billed_usd(MODEL, r) for r in claude_api.requests), Decimal(0))
    charged = sum((e.cost_usd for e in entries.values() if e.status == "charged"), Decimal(0))
    uncertain = entries[killed_key].reserved_usd
    assert spent_usd(Workflow.objects.get(pk=wf)) == charged + uncertain >= bill
    usage = Usage(**{k: (by_key[killed_key].usage or {}).get(k, 0) for k in Usage.__dataclass_fields__})
    assert services.budget_charge_once(key=killed_key, cost_usd=billed_usd(MODEL, by_key[killed_key]),
                                       usage=usage_fields(usage))
    settled = spent_usd(Workflow.objects.get(pk=wf))
    assert settled == bill
    assert_event_seqs_contiguous([wf])
    # Launched from this process (no API key: the scripted provider) before any worker started:
    # the workers' first call recorded the release they run, so nothing shows as "simulated".
    workflow = Workflow.objects.select_related("release").get(pk=wf)
    assert (workflow.release.provider, workflow.release.model) == ("anthropic", MODEL)
    assert [e.data["where"] for e in Event.objects.filter(workflow_id=wf, kind="release.changed")] == ["worker"]
    figures("SIGKILL during a slow model call", model_call_lease_s=MODEL_CALL_LEASE_SECONDS,
            slow_answer_s=SLOW_ANSWER_SECONDS,
            recovery_s=f"{recovery_s:.2f}", tool_calls=len(tools), tool_calls_redone=0, requests=len(by_key),
            server_bill_usd=bill, ledger_charged_usd=charged, ledger_uncertain_usd=uncertain,
            ledger_charged_plus_uncertain_usd=charged + uncertain, ledger_after_settling_usd=settled)
    assert recovery_s <= RECOVERY_TARGET_SECONDS
