"""Two threads workers share one organisation limit through the limiter in Redis.

Real workers (the product's defaults: the limiter on the broker's Redis), the real SDK, the fake
Messages API enforcing 60 requests a minute, its buckets a tenth full at first. One agent
teaches the limiter the limits (the answers' headers), then 24 agents go at once: no 429, the
requests go at the limit's pace, both workers send them, and a priority-9 agent launched into
the saturated limit waits for about one gap per call.
"""
from __future__ import annotations

import statistics
import time
from typing import Any

import pytest
from django.conf import settings

from tests.fakes import anthropic_api as fake
from tests.fakes.anthropic_api import Answer, FakeAnthropicAPI, OrganisationLimit
from tests.fakes.claude_agent import TASKS, ClaudeForAutonomous, structured, task_of
from tests.process.harness import wait_until_status
from workflows import services
from workflows.models import ActivityAttempt, Event

pytestmark = [pytest.mark.process, pytest.mark.django_db(transaction=True)]

MODEL = "claude-sonnet-5-5"
AGENTS = 24
# Low enough that the agents ask faster than it even when the workers share a loaded host: at 120 a
# minute, on a CI run where the in-process tests ran beside it, the workers' own pace (113 a minute) stayed
# under the limit and only 4 calls queued.
RPM = 60


class OneTask(ClaudeForAutonomous):
    """A plan of one task, the task done in one answer, a verdict: three calls an agent."""

    def __call__(self, body: dict[str, Any]) -> Answer:
        if task_of(body) in ("plan_tasks", "replan"):
            return structured(body, {"tasks": TASKS[:1]}, preamble="Here is the plan:")
        return super().__call__(body)

    def work(self, body: dict[str, Any]) -> Answer:
        return fake.text("Wrote the notes and checked them.")


def launch(n: int, **options: Any) -> list[int]:
    return [services.workflow_launch(kind="autonomous", goal=f"Write notes {i}", params={"max_rounds": 1},
                                     options=services.LaunchOptions(**options)).pk for i in range(n)]


def test_two_workers_share_one_limit_without_429s_and_priority_nine_goes_first(
    cluster: Any, claude_api: FakeAnthropicAPI, figures: Any,
) -> None:
    claude_api.limit = OrganisationLimit(requests_per_minute=RPM, input_tokens_per_minute=2_000_000, full=0.1)
    claude_api.responder = OneTask()
    cluster.extra_env.update({
        "AGENTOPS_MODEL_PROVIDER": "anthropic", "ANTHROPIC_API_KEY": "sk-ant-test-0000-secret",
        "ANTHROPIC_BASE_URL": claude_api.url, "AGENTOPS_MODEL": MODEL, "AGENTOPS_ANTHROPIC_MAX_RETRIES": "0",
        "AGENTOPS_LEASE_SECONDS": "60",
    })
    io = {"pool": "threads", "concurrency": 30, "queues": (settings.AGENTOPS_IO_QUEUE,),
          "extra_env": {"AGENTOPS_DB_POOL_SIZE": "4"}}
    cluster.start_worker("io1", ready=False, **io)
    cluster.start_worker("io2", ready=False, **io)
    cluster.start_worker("short", queues=(settings.CELERY_TASK_DEFAULT_QUEUE,), ready=False)
    cluster.start_beat(ready=False)
    cluster.wait_ready(*cluster.live())
    wait_until_status(cluster, launch(1), "completed", timeout=60)  # the limiter learns the limits
    taught = len(claude_api.requests)

    started = time.time()
    ids = launch(AGENTS)
    time.sleep(8)  # the limit is saturated: 24 agents ask faster than one request a second
    urgent = launch(1, priority=9)
    wait_until_status(cluster, ids + urgent, "completed", timeout=180)

    later = claude_api.requests[taught:]
    statuses = [r.status for r in later]
    assert statuses.count(429) == 0, f"{statuses.count(429)} of {len(later)} requests were refused"
    # The rate once the limiter's burst (a few seconds of the rate) is spent: from 2 s after the launch.
    # The limiter paces below the provider's rate, so the provider's bucket need never run low.
    sent = sorted(r.at for r in later if r.at >= started + 2)
    rate = 60 * (len(sent) - 1) / (sent[-1] - sent[0])
    # Never over the limit. Under it by half at most: on CI's loaded lane the workers' CPU, not the
    # limiter, set the pace once (73 a minute); the limit's use on a host that keeps up is bench
    # section 9's figure (0.95x).
    assert 0.5 * RPM <= rate <= 1.02 * RPM, f"{rate:.0f} requests a minute against a limit of {RPM}"
    workers = set(ActivityAttempt.objects.filter(activity__workflow_id__in=ids).values_list("worker", flat=True))
    assert len({w.split("@")[0] for w in workers}) >= 2, workers
    waits = [(e.workflow_id, (e.data.get("rate_wait_ms") or 0) / 1000)
             for e in Event.objects.filter(workflow_id__in=ids + urgent, kind="model.called")]
    others = [w for wf, w in waits if wf != urgent[0]]
    mine = [w for wf, w in waits if wf == urgent[0]]
    gap = 60 / (RPM * 0.95)
    # The others queued: calls of theirs waited longer than priority 9 may (how many depends on how
    # fast the workers ask, so not the median: on a loaded CI host most calls came before the queue).
    queued = sum(w > 3 * gap for w in others)
    figures("shared rate limit", requests=len(later), rate_per_min=round(rate), median_wait_s=round(
        statistics.median(others), 2), queued_calls=queued, max_wait_s=round(max(others), 2),
        priority9_waits_s=[round(w, 2) for w in mine], gap_s=round(gap, 2))
    assert queued >= 5, f"only {queued} of {len(others)} calls waited over {3 * gap:.2f} s: the limit never queued"
    assert max(mine) <= 3 * gap, f"priority 9 waited {mine} s; a gap is {gap:.2f} s"
