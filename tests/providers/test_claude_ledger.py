"""A ledger that equals the bill: one row per request that left the process, reconciled against the
usage the fake Messages API reported, under faults (429, 529, a timeout, a dropped connection, a
malformed answer retried)."""
from __future__ import annotations

import json
import socket
import time
from decimal import Decimal
from io import StringIO
from pathlib import Path
from typing import Any

import pytest
from django.core.management import call_command

from tests.conftest import drive
from tests.fakes import anthropic_api as fake
from tests.fakes.anthropic_api import FakeAnthropicAPI, Recorded
from tests.fakes.claude_agent import TASKS, ClaudeForAutonomous, seed_workspace
from tests.providers.conftest import MODEL
from tests.providers.test_claude_throttling import run_until_done
from workflows import clock, services
from workflows.metering import USAGE_KEY_HEADER
from workflows.models import UsageEntry, Workflow
from workflows.prices import cost_usd
from workflows.provider import Usage
from workflows.selectors import spend_summary, spent_usd

pytestmark = pytest.mark.django_db

GOAL = "Prepare onboarding notes from the docs"
CENT = Decimal("0.01")


@pytest.fixture(autouse=True)
def workspaces(settings: Any, tmp_path: Path) -> Path:
    settings.AGENTOPS_WORKSPACE_DIR = tmp_path / "workspaces"
    return Path(settings.AGENTOPS_WORKSPACE_DIR)


def launch(workspaces: Path, *, user: Any = None, **options: Any) -> Workflow:
    workflow = services.workflow_launch(kind="autonomous", goal=GOAL, user=user,
                                        options=services.LaunchOptions(**options))
    seed_workspace(workspaces / f"wf-{workflow.pk}")
    return workflow


def billed(recorded: Recorded) -> Decimal:
    """What the server's usage says a request costs (nothing for a request it answered with an
    error or did not answer)."""
    usage = recorded.usage or {}
    return cost_usd(MODEL, Usage(**{k: usage.get(k, 0) for k in (
        "input_tokens", "output_tokens", "cache_read_input_tokens", "cache_creation_input_tokens")}))


def server_settled(api: FakeAnthropicAPI, timeout: float = 10.0) -> None:
    """Wait for the server to finish answering (a slow answer goes on after the client gave up)."""
    deadline = time.monotonic() + timeout
    while any(r.status == 0 for r in api.requests):
        assert time.monotonic() < deadline, "the fake API is still answering a request"
        time.sleep(0.05)


def test_the_ledger_equals_the_servers_bill_under_faults(
    claude: FakeAnthropicAPI, workspaces: Path, settings: Any, time_machine: Any, sdk_sleeps: list[float],
    tmp_path: Path,
) -> None:
    """Every request the server saw has exactly one ledger row under the key it was sent with:
    charged rows cost what the server's usage says, 429/529 answers are released (not billed),
    the timed-out, dropped and unreadable requests are uncertain at an estimate no lower than
    what the server billed; settled from the server's report (`agent usage settle`), the ledger
    equals the bill to the cent. The faults: a 429 with retry-after, a 529, a malformed plan sent
    back, a dropped connection, a timeout, a truncated 200 body, a max_tokens cut-off and a plan
    in fenced JSON; the workflow completes through all of them."""
    settings.AGENTOPS_ANTHROPIC_MAX_RETRIES = 1
    settings.AGENTOPS_ANTHROPIC_TIMEOUT_SECONDS = 1.0
    time_machine.move_to(clock.now(), tick=False)
    claude.script(
        fake.rate_limited(retry_after=1), fake.overloaded(),  # planning attempt 1: the SDK's retry, then throttled
        fake.tool_use("submit_plan", {"tasks": []}),  # attempt 2: a malformed plan, sent back with the reason
        fake.dropped(),  # … the corrected answer's request is dropped, the SDK's retry times out
        fake.slow(2.5, fake.tool_use("submit_plan", {"tasks": TASKS})),
        fake.raw(b'{"id": "msg_01", "type": "mess'),  # attempt 3: a truncated body, retried
        fake.cut_off('{"tasks": [{"title": "Read the'),  # attempt 4: cut off by max_tokens, sent back
        fake.fenced_json({"tasks": TASKS}),  # … then the plan in a fenced block, as Claude writes it
    )
    claude.responder = ClaudeForAutonomous()
    workflow = launch(workspaces)

    run_until_done(workflow.pk, time_machine)
    server_settled(claude)

    workflow = Workflow.objects.get(pk=workflow.pk)
    assert workflow.status == "completed", workflow.reason
    entries = {e.key: e for e in UsageEntry.objects.filter(workflow=workflow)}
    by_key = {r.headers[USAGE_KEY_HEADER]: r for r in claude.requests}
    assert len(by_key) == len(claude.requests), "each request carried its own ledger key"
    assert set(entries) == set(by_key), "one ledger row per request the server saw, and no other"
    plan_op = f"wf-{workflow.pk}/PLANNING.1/i1/0"
    assert {k: (e.status, by_key[k].status) for k, e in entries.items() if k.startswith(plan_op)} == {
        f"{plan_op}#0@1.0": ("released", 429), f"{plan_op}#0@1.1": ("released", 529),
        f"{plan_op}#0@2.0": ("charged", 200), f"{plan_op}#1@2.0": ("uncertain", -1),
        f"{plan_op}#1@2.1": ("uncertain", 200), f"{plan_op}#0@3.0": ("uncertain", 200),
        f"{plan_op}#0@4.0": ("charged", 200), f"{plan_op}#1@4.0": ("charged", 200),
    }
    for key, entry in entries.items():
        served = by_key[key]
        if entry.status == "charged":
            assert (entry.cost_usd, entry.request_id) == (billed(served), served.request_id), key
        elif entry.status == "uncertain":
            assert entry.reserved_usd >= billed(served), f"{key}: the estimate is below what the server billed"
        else:
            assert served.status in (429, 529) and served.usage is None, key

    bill = sum((billed(r) for r in claude.requests), Decimal(0))
    charged = sum((e.cost_usd for e in entries.values() if e.status == "charged"), Decimal(0))
    uncertain = sum((e.reserved_usd for e in entries.values() if e.status == "uncertain"), Decimal(0))
    billed_uncertain = sum((billed(by_key[k]) for k, e in entries.items() if e.status == "uncertain"), Decimal(0))
    assert charged == bill - billed_uncertain, "what the ledger charged is what the server billed for it"
    assert spent_usd(workflow) == charged + uncertain >= bill, "the ledger never shows less than the bill"
    assert Decimal(spend_summary(workflow)["uncertain_usd"]) == uncertain

    # The provider's usage report (README, "Settling uncertain requests"), written from what the
    # server saw: the answered one with the usage object it sent, the dropped one as not billed.
    report = tmp_path / "usage.jsonl"
    report.write_text("".join(json.dumps(
        {"key": key, "usage": by_key[key].usage, "request_id": by_key[key].request_id} if by_key[key].usage
        else {"key": key, "billed": False, "reason": "no response in the gateway's log"}) + "\n"
        for key, entry in entries.items() if entry.status == "uncertain"))
    out = StringIO()
    call_command("agent", "usage", "settle", "--file", str(report), "--json", stdout=out)
    first = json.loads(out.getvalue())
    assert (len(first["charged"]), len(first["released"]), first["already_settled"]) == (1, 2, [])
    out = StringIO()
    call_command("agent", "usage", "settle", "--file", str(report), "--json", stdout=out)
    assert len(json.loads(out.getvalue())["already_settled"]) == 3, "settling the same report again changes nothing"
    assert not UsageEntry.objects.filter(workflow=workflow, status="uncertain").exists()
    settled = spent_usd(workflow)
    print(f"\nledger vs server under faults: {len(claude.requests)} requests "
          f"({sum(e.status == 'charged' for e in entries.values())} charged, "
          f"{sum(e.status == 'released' for e in entries.values())} released, "
          f"{sum(e.status == 'uncertain' for e in entries.values())} uncertain); server bill {bill} USD; "
          f"ledger charged {charged} + uncertain {uncertain} = {charged + uncertain} USD; "
          f"after settling uncertain from the server's usage {settled} USD; SDK sleeps {sdk_sleeps}")
    assert settled == bill
    assert settled.quantize(CENT) == bill.quantize(CENT)


def test_a_request_that_never_reached_the_provider_is_released(
    claude: FakeAnthropicAPI, workspaces: Path, settings: Any,
) -> None:
    """Connection refused: the request never left, so its reservation is given back (spend 0)
    and the attempt fails as retryable."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        settings.ANTHROPIC_BASE_URL = f"http://127.0.0.1:{sock.getsockname()[1]}"  # bound, not listening
        workflow = launch(workspaces)
        drive(workflow.pk, max_rounds=1)
    entries = list(UsageEntry.objects.filter(workflow=workflow))
    assert [(e.status, e.key.rsplit("#", 1)[1]) for e in entries] == [("released", "0@1.0")], entries
    assert "never reached the provider" in entries[0].outcome
    assert spent_usd(workflow) == 0


def test_every_request_is_checked_against_the_budget_retries_included(
    claude: FakeAnthropicAPI, workspaces: Path, settings: Any,
) -> None:
    """A timed-out request stays counted (uncertain); the SDK's retry of it is a new request,
    checked against the budget like the first, and refused when both would not fit."""
    settings.AGENTOPS_ANTHROPIC_MAX_RETRIES = 1
    settings.AGENTOPS_ANTHROPIC_TIMEOUT_SECONDS = 0.5
    claude.script(fake.slow(1.0, fake.tool_use("submit_plan", {"tasks": TASKS})))
    workflow = launch(workspaces, budget_total_usd=Decimal("0.04"))
    drive(workflow.pk, max_rounds=1)
    server_settled(claude)

    workflow = Workflow.objects.get(pk=workflow.pk)
    entries = list(UsageEntry.objects.filter(workflow=workflow))
    assert [(e.key.rsplit("#", 1)[1], e.status) for e in entries] == [("0@1.0", "uncertain")]
    assert entries[0].reserved_usd < workflow.budget_total_usd < 2 * entries[0].reserved_usd
    assert len(claude.requests) == 1, "the retry was refused before it was sent"
    assert (workflow.status, workflow.pause_cause) == ("paused", "budget"), workflow.reason
