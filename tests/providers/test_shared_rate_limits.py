"""Model calls through the shared rate limiter (real Redis) and the real SDK against the fake API."""
from __future__ import annotations

import threading
from collections.abc import Iterator
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
import redis
from django.contrib.auth.models import User

from tests.conftest import drive
from tests.fakes import anthropic_api as fake
from tests.fakes.anthropic_api import FakeAnthropicAPI, OrganisationLimit
from tests.fakes.claude_agent import ClaudeForAutonomous, seed_workspace
from tests.providers.conftest import MODEL
from tests.ratelimits.conftest import TEST_REDIS_URL
from workflows import clock, ratelimits, services
from workflows.models import Activity, Event, UsageEntry, Workflow
from workflows.ratelimits import Ask

pytestmark = pytest.mark.django_db
SCOPE = f"anthropic:{MODEL}"


@pytest.fixture(autouse=True)
def workspaces(settings: Any, tmp_path: Path) -> Path:
    settings.AGENTOPS_WORKSPACE_DIR = tmp_path / "workspaces"
    return Path(settings.AGENTOPS_WORKSPACE_DIR)


def _forget(client: Any) -> None:
    for key in client.scan_iter(match="agentops:rl:*", count=500):
        client.delete(key)


@pytest.fixture
def shared(settings: Any, monkeypatch: pytest.MonkeyPatch) -> Iterator[Any]:
    """The limiter on, on this engineer's Redis DB, with no state from before."""
    settings.AGENTOPS_RATE_LIMIT_REDIS_URL = TEST_REDIS_URL
    monkeypatch.setattr(ratelimits, "_down_until", 0.0)
    client = redis.Redis.from_url(TEST_REDIS_URL)
    _forget(client)
    yield client
    _forget(client)


def run_until_done(workflow_id: int, time_machine: Any, *, rounds: int = 80) -> None:
    for _ in range(rounds):
        workflow = drive(workflow_id)
        if workflow.is_terminal:
            return
        due = Activity.objects.filter(workflow_id=workflow_id, status="scheduled").order_by("next_attempt_at").first()
        assert due is not None, f"workflow {workflow_id} is {workflow.status} with nothing scheduled: {workflow.reason}"
        time_machine.shift(max(due.next_attempt_at - clock.now(), timedelta(0)) + timedelta(milliseconds=1))


def launch(workspaces: Path, *, user: Any = None, **options: Any) -> Workflow:
    workflow = services.workflow_launch(kind="autonomous", goal="Prepare onboarding notes from the docs", user=user,
                                        options=services.LaunchOptions(**options))
    seed_workspace(workspaces / f"wf-{workflow.pk}")
    return workflow


def test_limits_are_learned_from_the_answers_headers(claude: FakeAnthropicAPI, shared: Any, workspaces: Path,
                                                     time_machine: Any) -> None:
    """Nothing configured: the first answer's anthropic-ratelimit-* headers teach the limits (0.95
    of them hold), and the workflow completes without a 429."""
    claude.limit = OrganisationLimit(requests_per_minute=600, input_tokens_per_minute=200_000,
                                     output_tokens_per_minute=80_000)
    claude.responder = ClaudeForAutonomous()
    workflow = launch(workspaces)

    run_until_done(workflow.pk, time_machine)

    assert Workflow.objects.get(pk=workflow.pk).status == "completed"
    assert {r.status for r in claude.requests} == {200}
    state = ratelimits.limiter().state(SCOPE)  # type: ignore[union-attr]
    assert state["learned"] == {"requests": 600, "input_tokens": 200_000, "output_tokens": 80_000}
    assert state["effective"] == {"requests": 570.0, "input_tokens": 190_000.0, "output_tokens": 76_000.0}
    assert Event.objects.filter(workflow=workflow, kind="model.called").count() == len(claude.requests)


def test_a_429_is_never_charged_nor_an_attempt_and_its_retry_after_holds_every_call(
    claude: FakeAnthropicAPI, shared: Any, workspaces: Path, settings: Any, time_machine: Any,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A 429 with retry-after 2 s: its attempt is throttled and given back, its ledger row
    released (nothing charged); the next attempts wait for the 2 s in the limiter and are not sent
    (past AGENTOPS_RATE_LIMIT_MAX_WAIT_SECONDS they give their attempt back too); once the 2 s
    have passed the call goes, and the API saw a single 429."""
    settings.AGENTOPS_RATE_LIMIT_MAX_WAIT_SECONDS = 0.5
    settings.AGENTOPS_THROTTLE_BACKOFF_SECONDS = 0.2
    time_machine.move_to(clock.now(), tick=False)
    # The limiter on the test's clock, as the retry windows are: moved only by the test, so how
    # fast this machine runs the rounds changes nothing of what the limiter sees.
    monkeypatch.setattr(ratelimits.limiter(), "clock", lambda: clock.now().timestamp())
    claude.script(fake.rate_limited(retry_after=2))
    claude.responder = ClaudeForAutonomous()
    workflow = launch(workspaces)

    run_until_done(workflow.pk, time_machine, rounds=400)

    assert Workflow.objects.get(pk=workflow.pk).status == "completed"
    assert [r.status for r in claude.requests].count(429) == 1, "the limiter held every later call"
    planning = Activity.objects.get(workflow=workflow, name="plan_tasks")
    attempts = list(planning.attempts.order_by("number").values_list("throttled", "refunded", "error"))
    throttled = [a for a in attempts if a[0]]
    assert attempts[0][:2] == (True, True) and "rate limited" in attempts[0][2]
    assert len(throttled) >= 2 and all(refunded for _, refunded, _ in throttled), "each throttled attempt given back"
    assert any("stopped waiting" in error for _, _, error in throttled[1:]), "held in the limiter, not sent"
    assert planning.max_attempts == 4 + len(throttled)
    refused = UsageEntry.objects.get(workflow=workflow, http_status=429)
    assert (refused.status, refused.cost_usd) == (UsageEntry.Status.RELEASED, None), "never charged"
    assert UsageEntry.objects.filter(workflow=workflow).count() == len(claude.requests), "one row per request sent"


@pytest.mark.parametrize("policy", ["open", "closed"])
def test_an_unreachable_limiter_fails_open_or_closed_and_never_fails_the_workflow(
    claude: FakeAnthropicAPI, shared: Any, workspaces: Path, settings: Any, time_machine: Any, policy: str,
) -> None:
    settings.AGENTOPS_RATE_LIMIT_REDIS_URL = "redis://127.0.0.1:1/0"
    settings.AGENTOPS_RATE_LIMIT_ON_REDIS_DOWN = policy
    time_machine.move_to(clock.now(), tick=False)
    claude.responder = ClaudeForAutonomous()
    workflow = launch(workspaces)

    drive(workflow.pk)

    planning = Activity.objects.get(workflow=workflow, name="plan_tasks")
    if policy == "open":
        assert planning.status == "succeeded" and claude.requests, "sent without the limiter"
        run_until_done(workflow.pk, time_machine)
        assert Workflow.objects.get(pk=workflow.pk).status == "completed"
        return
    assert not claude.requests, "closed: nothing sent"
    attempt = planning.attempts.get()
    assert (attempt.throttled, attempt.refunded) == (True, True)
    assert "AGENTOPS_RATE_LIMIT_ON_REDIS_DOWN" in attempt.error
    assert Workflow.objects.get(pk=workflow.pk).status == "running"
    settings.AGENTOPS_RATE_LIMIT_REDIS_URL = TEST_REDIS_URL
    ratelimits._down_until = 0.0
    run_until_done(workflow.pk, time_machine)
    assert Workflow.objects.get(pk=workflow.pk).status == "completed"


def test_more_calls_waiting_at_once_than_redis_pys_default_pool_each_wait_their_turn(shared: Any) -> None:
    """150 threads wait for a drained limit at once, as a threads worker's calls do, each holding a
    connection while it waits (BLPOP): none is refused a connection (redis-py's default pool of 100
    raised "Too many connections", which the limiter takes for Redis down and fails open)."""
    limiter = ratelimits.limiter()
    assert limiter is not None
    request = Ask(scope=SCOPE, tenant="user:1", kind="autonomous", priority=5, input_tokens=10, output_tokens=10,
                  configured=(6000, 0, 0), tenant_cap=0, kind_cap=0)
    admitted: list[float] = []
    errors: list[BaseException] = []
    start = threading.Barrier(151)  # the waiters and this thread, which drains the limit last

    def call() -> None:
        start.wait()
        try:
            admitted.append(limiter.acquire(request, poll_seconds=5.0, max_wait_seconds=30).waited_seconds)
        except Exception as exc:  # the failure the test looks for: recorded, then asserted on
            errors.append(exc)

    threads = [threading.Thread(target=call) for _ in range(150)]
    for thread in threads:
        thread.start()
    # Drained once every waiter is ready, so the refill while 150 threads start does not admit them:
    # each waits for the bucket's refill, about 95 a second.
    while limiter.try_acquire(request, limiter.new_ticket()).admitted:
        pass
    start.wait()
    for thread in threads:
        thread.join(timeout=40)
    assert errors == []
    assert len(admitted) == 150
    assert max(admitted) > 1.0, "the last waiters waited for the refill, many of them at once"


def test_an_attempt_carries_its_workflows_tenant_kind_and_priority(workspaces: Path) -> None:
    user = User.objects.create_user("launcher")
    workflow = launch(workspaces, user=user, priority=9)
    activity = Activity.objects.get(workflow=workflow, status="scheduled")

    claim = services.activity_claim_if_runnable(activity_id=activity.pk, worker="w", task_id="t")

    assert claim is not None
    assert (claim.tenant, claim.kind, claim.priority) == (f"user:{user.pk}", "autonomous", 9)
    assert Event.objects.filter(workflow=workflow, kind="activity.started").exists()


def test_a_tenant_label_names_the_tenant_when_configured(workspaces: Path, settings: Any) -> None:
    user = User.objects.create_user("launcher")
    labelled = launch(workspaces, user=user, labels={"team": "infra", "env": "prod"})
    unlabelled = launch(workspaces, user=user, labels={"env": "prod"})

    def tenant(workflow: Workflow) -> str:
        activity = Activity.objects.get(workflow=workflow, status="scheduled")
        claim = services.activity_claim_if_runnable(activity_id=activity.pk, worker="w", task_id=f"t{workflow.pk}")
        assert claim is not None
        return claim.tenant

    settings.AGENTOPS_TENANT_LABEL = "team"
    assert (tenant(labelled), tenant(unlabelled)) == ("team=infra", f"user:{user.pk}")


def test_metrics_show_each_limit_its_use_the_waiting_calls_and_the_429s(client: Any, settings: Any, shared: Any,
                                                                         workspaces: Path) -> None:
    from decimal import Decimal

    from tests.test_metrics import TOKEN, samples, scrape
    from workflows.services.budgets import budget_release_once, budget_reserve_ensure

    settings.AGENTOPS_METRICS_TOKEN = TOKEN
    settings.AGENTOPS_RATE_LIMITS = {SCOPE: {"requests_per_minute": 2}}
    settings.AGENTOPS_RATE_LIMIT_BURST_SECONDS = 60  # the bucket holds the minute's 2
    settings.AGENTOPS_MODEL_CALL_CONCURRENCY = {"tenant:*": 5}
    limiter = ratelimits.limiter()
    assert limiter is not None
    urgent = ratelimits.Ask(scope=SCOPE, tenant="user:7", kind="autonomous", priority=9, input_tokens=100,
                            output_tokens=10, configured=(2, 0, 0), tenant_cap=5)
    assert [limiter.try_acquire(urgent, t).admitted for t in ("a", "b", "c")] == [True, True, False]
    limiter.settle(ratelimits.Admission(ask=urgent, ticket="x", waited_seconds=0, tracked=False),
                   info=ratelimits.RateLimitInfo(limits={"requests": 600}, remaining={}))
    workflow = launch(workspaces)
    budget_reserve_ensure(workflow_id=workflow.pk, key="k429", operation_id="op", provider="anthropic", model=MODEL,
                          estimate_usd=Decimal("0.01"))
    budget_release_once(key="k429", reason="answered 429: the API does not bill errors", http_status=429)

    found = samples(scrape(client).content.decode())

    def value(name: str, **labels: str) -> float:
        return found[(name, tuple(sorted(labels.items())))]

    where = {"provider": "anthropic", "model": MODEL}
    assert value("agentops_rate_limiter_up") == 1
    assert value("agentops_model_rate_limited_total", model=MODEL) == 1
    assert value("agentops_rate_limit_per_minute", **where, dimension="requests", source="configured") == 2
    assert value("agentops_rate_limit_per_minute", **where, dimension="requests", source="learned") == 600
    assert value("agentops_rate_limit_per_minute", **where, dimension="requests", source="effective") == 2
    assert value("agentops_rate_limit_burst", **where, dimension="requests") == 2
    assert 1 <= value("agentops_rate_limit_used", **where, dimension="requests") <= 2, "2 taken, refilling"
    assert value("agentops_rate_limit_pace", **where) == 1, "no 429 yet"
    assert value("agentops_rate_limit_waiting", **where, tenant="user:7", priority="9") == 1
    assert value("agentops_model_call_slots", key="tenant:user:7") == 2
    assert value("agentops_model_call_slots_limit", key="tenant:*") == 5


def test_the_admin_rate_limits_page_shows_limits_waiting_calls_by_launcher_and_slots(
    admin_client: Any, settings: Any, shared: Any,
) -> None:
    settings.AGENTOPS_RATE_LIMITS = {SCOPE: {"requests_per_minute": 1}}
    settings.AGENTOPS_MODEL_CALL_CONCURRENCY = {"kind:harness": 3}
    launcher = User.objects.create_user("night-batch")
    limiter = ratelimits.limiter()
    assert limiter is not None
    batch = ratelimits.Ask(scope=SCOPE, tenant=f"user:{launcher.pk}", kind="harness", priority=2, input_tokens=10,
                           output_tokens=10, configured=(1, 0, 0), kind_cap=3)
    assert [limiter.try_acquire(batch, t).admitted for t in ("a", "b")] == [True, False]
    refused = ratelimits.RateLimitInfo(limits={}, remaining={"requests": 0}, retry_after_seconds=2, rate_limited=True)
    limiter.settle(ratelimits.Admission(ask=batch, ticket="a", waited_seconds=0, tracked=True), info=refused)

    page = admin_client.get("/admin/workflows/workflow/rate-limits/").content.decode()

    assert SCOPE in page and "requests / minute" in page
    assert "Pace 70 % of what holds; 1 429, the last 0 s ago: 429 from the provider (requests at 0, retry-after 2 s)" \
        in " ".join(page.split())
    assert f"night-batch (user:{launcher.pk})" in page, "a waiting call is shown by its launcher's name"
    assert "kind:harness" in page
    listing = admin_client.get("/admin/workflows/workflow/").content.decode()
    assert "/admin/workflows/workflow/rate-limits/" in listing


def test_the_admin_rate_limits_page_says_when_the_limiter_is_off(admin_client: Any) -> None:
    page = admin_client.get("/admin/workflows/workflow/rate-limits/").content.decode()
    assert "The shared rate limiter is off" in page
