"""A threads-pool worker SIGKILLed while it holds many model calls in flight.

Real workers and beat, the real SDK, the fake Messages API on loopback in this process. The
threads worker consumes the I/O queue with a pool of AGENTOPS_DB_POOL_SIZE=4 connections for
AGENTS activities and their heartbeat threads. Every agent's second model call of its task
(after it wrote a note) is held by the server; once all of them are held, the worker dies. Each
held call's attempt is lost and retried once on the worker started in its place, from the turn
checkpointed before the call: no note is written twice, every request the server saw is one
ledger row (the killed ones uncertain, every other charged what the server's usage says), and
settled from the server's usage the ledger equals the bill.
"""
from __future__ import annotations

import threading
import time
from decimal import Decimal
from typing import Any

import pytest
from django.conf import settings
from django.db import connection

from tests.fakes import anthropic_api as fake
from tests.fakes.anthropic_api import Answer, FakeAnthropicAPI
from tests.fakes.claude_agent import TASKS, ClaudeForAutonomous, first_text, structured, task_of, tool_results
from tests.process.harness import assert_event_seqs_contiguous, billed_usd, wait_until_status
from workflows import services
from workflows.metering import USAGE_KEY_HEADER
from workflows.models import Activity, Event, UsageEntry, Workflow
from workflows.prices import usage_fields
from workflows.provider import Usage
from workflows.selectors import spent_usd

pytestmark = [pytest.mark.process, pytest.mark.django_db(transaction=True)]

MODEL = "claude-sonnet-5-5"
AGENTS = 32
DB_POOL_SIZE = 4
HELD_SECONDS = 45.0  # longer than the model-call lease (20 s): only heartbeats keep the attempts
# The threads worker's pool, the prefork worker's and the beat's connection, this test's own.
CONNECTION_BOUND = DB_POOL_SIZE + 1 + 1 + 1


class HoldsSecondCall(ClaudeForAutonomous):
    """One task per agent: write a note, read it back, report. The call that asks what to do after
    the note (the task's second) is held the first time each agent sends it."""

    def __init__(self) -> None:
        super().__init__()
        self.held: set[str] = set()
        self.lock = threading.Lock()

    def __call__(self, body: dict[str, Any]) -> Answer:
        if task_of(body) == "plan_tasks":
            return structured(body, {"tasks": TASKS[:1]}, preamble="Here is the plan:")
        return super().__call__(body)

    def work(self, body: dict[str, Any]) -> Answer:
        step, goal = tool_results(body), first_text(body)
        if step == 0:
            return fake.tool_use("write_file", {"path": "notes/note.md", "content": "a note\n"}, say="Writing.")
        if step == 1:
            answer = fake.tool_use("read_file", {"path": "notes/note.md"}, say="Checking it.")
            with self.lock:
                if goal not in self.held:
                    self.held.add(goal)
                    answer.delay_seconds = HELD_SECONDS
            return answer
        return fake.text("Wrote notes/note.md and checked it.")


def connections_now() -> int:
    with connection.cursor() as cursor:
        cursor.execute("SELECT count(*) FROM pg_stat_activity WHERE datname = current_database()")
        return int(cursor.fetchone()[0])


def test_a_threads_worker_killed_with_many_model_calls_in_flight_loses_nothing_and_repeats_nothing(
    cluster: Any, claude_api: FakeAnthropicAPI, figures: Any,
) -> None:
    """SIGKILL the threads worker while it holds AGENTS model calls: each of those calls' attempts
    is retried once, from its checkpoint, on the worker that replaces it; no tool call is made
    twice; the ledger has one row per request that reached the provider, charged once, and
    settled from the server's usage equals the bill; the workers never held more connections
    than their pools allow."""
    responder = HoldsSecondCall()
    claude_api.responder = responder
    cluster.extra_env.update({
        "AGENTOPS_MODEL_PROVIDER": "anthropic", "ANTHROPIC_API_KEY": "sk-ant-test-0000-secret",
        "ANTHROPIC_BASE_URL": claude_api.url, "AGENTOPS_MODEL": MODEL, "AGENTOPS_ANTHROPIC_MAX_RETRIES": "0",
        "AGENTOPS_LEASE_SECONDS": "60",  # the harness's 4 s would hide what the model-call lease does
    })
    io = {"pool": "threads", "concurrency": 50, "queues": (settings.AGENTOPS_IO_QUEUE,),
          "extra_env": {"AGENTOPS_DB_POOL_SIZE": str(DB_POOL_SIZE)}}
    ids = [services.workflow_launch(kind="autonomous", goal=f"Write note {n}", params={"max_rounds": 1}).pk
           for n in range(AGENTS)]
    victim = cluster.start_worker("io1", ready=False, **io)
    cluster.start_worker("short", queues=(settings.CELERY_TASK_DEFAULT_QUEUE,), ready=False)
    cluster.start_beat(ready=False)
    cluster.wait_ready(*cluster.live())

    peak_connections = 0

    def all_held() -> bool:
        nonlocal peak_connections
        peak_connections = max(peak_connections, connections_now())
        return len(responder.held) == AGENTS

    cluster.wait_for(all_held, timeout=90, what=f"{AGENTS} held model calls", interval=0.2)
    held = list(Activity.objects.filter(workflow_id__in=ids, name="execute_task", status="running"))
    assert len(held) == AGENTS and {a.attempt for a in held} == {1}
    assert all(a.heartbeat_detail.startswith("before model call") or a.heartbeat_detail.startswith("waiting")
               for a in held)
    killed_at = time.time()
    assert victim.kill_group() == -9
    cluster.start_worker("io2", **io)
    wait_until_status(cluster, ids, "completed", timeout=120)
    cluster.wait_for(lambda: all(r.status != 0 for r in claude_api.requests), timeout=HELD_SECONDS + 5,
                     what="the fake API to finish the held answers")

    for activity in held:
        attempts = [(a.number, a.status) for a in activity.attempts.order_by("number")]
        assert attempts == [(1, "lost"), (2, "succeeded")], (activity.operation_id, attempts)
        resumed = Event.objects.get(workflow_id=activity.workflow_id, kind="task.resumed",
                                    data__operation_id=activity.operation_id)
        assert (resumed.data["attempt"], resumed.data["turn"]) == (2, 1)
        tools = [(e.data["tool"], e.data["attempt"]) for e in Event.objects.filter(
            workflow_id=activity.workflow_id, kind="tool.called", data__operation_id=activity.operation_id)]
        assert sorted(tools) == [("read_file", 2), ("write_file", 1)], tools
    others = Activity.objects.filter(workflow_id__in=ids).exclude(pk__in=[a.pk for a in held])
    assert set(others.values_list("attempt", "status")) == {(1, "succeeded")}

    # The ledger: one row per request the server saw, under the key it was sent with.
    entries = {e.key: e for e in UsageEntry.objects.filter(workflow_id__in=ids)}
    by_key = {r.headers[USAGE_KEY_HEADER]: r for r in claude_api.requests}
    assert set(entries) == set(by_key) and len(by_key) == len(claude_api.requests)
    killed = {f"{a.operation_id}#1@1.0" for a in held}  # calls count from 0: the task's second
    assert {k for k, e in entries.items() if e.status == "uncertain"} == killed
    assert all(e.status == "charged" and e.cost_usd == billed_usd(MODEL, by_key[k]) for k, e in entries.items()
               if k not in killed)
    bill = sum((billed_usd(MODEL, r) for r in claude_api.requests), Decimal(0))
    for key in killed:
        usage = Usage(**{k: (by_key[key].usage or {}).get(k, 0) for k in Usage.__dataclass_fields__})
        assert services.budget_charge_once(key=key, cost_usd=billed_usd(MODEL, by_key[key]), usage=usage_fields(usage))
    assert sum((spent_usd(w) for w in Workflow.objects.filter(pk__in=ids)), Decimal(0)) == bill
    assert_event_seqs_contiguous(ids)
    assert peak_connections <= CONNECTION_BOUND, peak_connections
    recovered = max(a.attempts.get(number=2).started_at.timestamp() for a in held) - killed_at
    figures("SIGKILL of a threads worker holding model calls", calls_in_flight=AGENTS,
            db_pool_size=DB_POOL_SIZE, peak_db_connections=peak_connections, last_retry_started_s=f"{recovered:.2f}",
            requests=len(by_key), server_bill_usd=bill)
