"""`agent usage uncertain` and `agent usage settle`: requests whose outcome was unknown are settled
from the provider's usage, all or nothing, once."""
from __future__ import annotations

import json
from decimal import Decimal
from io import StringIO
from pathlib import Path
from typing import Any

import pytest
from django.core.management import call_command
from django.core.management.base import CommandError

from workflows import services
from workflows.models import Event, UsageEntry, Workflow
from workflows.prices import cost_usd
from workflows.provider import Usage
from workflows.selectors import spent_usd

pytestmark = pytest.mark.django_db

MODEL = "claude-sonnet-5-5"


def ledger(workflow: Workflow, *keys: str, uncertain: bool = True) -> None:
    for key in keys:
        services.budget_reserve_ensure(workflow_id=workflow.pk, key=key, operation_id=key.split("#")[0],
                                       provider="anthropic", model=MODEL, estimate_usd=Decimal("0.050000"))
        if uncertain:
            services.budget_uncertain_once(key=key, reason="no answer seen: a read timeout")


@pytest.fixture
def workflow(django_user_model: Any) -> Workflow:
    django_user_model.objects.create_user("olga")
    return services.workflow_launch(kind="autonomous", goal="Summarise the docs")


def settle(tmp_path: Path, *lines: Any) -> dict[str, Any]:
    report = tmp_path / "usage.jsonl"
    report.write_text("\n".join(line if isinstance(line, str) else json.dumps(line) for line in lines) + "\n")
    out = StringIO()
    call_command("agent", "usage", "settle", "--file", str(report), "--json", "--user", "olga", stdout=out)
    return json.loads(out.getvalue())


def state(workflow: Workflow) -> list[tuple[str, str, Any]]:
    return sorted(UsageEntry.objects.filter(workflow=workflow).values_list("key", "status", "cost_usd"))


USAGE = {"input_tokens": 120, "output_tokens": 40, "cache_read_input_tokens": 2000,
         "cache_creation_input_tokens": 300, "cache_creation": {"ephemeral_5m_input_tokens": 100,
                                                                "ephemeral_1h_input_tokens": 200},
         "service_tier": "standard", "server_tool_use": None}


def test_uncertain_requests_are_listed_oldest_first(workflow: Workflow) -> None:
    ledger(workflow, "op#0@1.0", "op#1@1.0")
    ledger(workflow, "op#2@1.0", uncertain=False)
    out = StringIO()
    call_command("agent", "usage", "uncertain", "--workflow", str(workflow.pk), "--json", stdout=out)
    rows = json.loads(out.getvalue())
    assert [(r["key"], r["reserved_usd"], r["outcome"]) for r in rows] == [
        ("op#0@1.0", "0.050000", "no answer seen: a read timeout"),
        ("op#1@1.0", "0.050000", "no answer seen: a read timeout")]


def test_a_report_charges_billed_requests_and_releases_the_rest_once(workflow: Workflow, tmp_path: Path) -> None:
    """The Messages API's usage object as it comes (unknown fields ignored, 1-hour writes priced
    as such) charges the row; "billed": false releases it; a second run changes nothing."""
    ledger(workflow, "op#0@1.0", "op#1@1.0")
    ledger(workflow, "op#2@1.0", uncertain=False)

    done = settle(tmp_path, {"key": "op#0@1.0", "usage": USAGE, "request_id": "req_011"}, "",
                  {"key": "op#1@1.0", "billed": False, "reason": "not in the gateway's log"},
                  {"key": "op#2@1.0", "billed": False})

    cost = cost_usd(MODEL, Usage(input_tokens=120, output_tokens=40, cache_read_input_tokens=2000,
                                 cache_creation_input_tokens=300, cache_creation_1h_input_tokens=200))
    assert (done["charged"], done["released"], done["in_flight"]) == (["op#0@1.0"], ["op#1@1.0"], ["op#2@1.0"])
    assert state(workflow) == [("op#0@1.0", "charged", cost), ("op#1@1.0", "released", None),
                               ("op#2@1.0", "reserved", None)]
    charged = UsageEntry.objects.get(key="op#0@1.0")
    assert (charged.request_id, charged.cache_write_1h_tokens, charged.cache_read_tokens) == ("req_011", 200, 2000)
    assert spent_usd(workflow) == cost + Decimal("0.050000"), "the reserved request still counts its estimate"
    [event] = Event.objects.filter(workflow=workflow, kind="usage.settled")
    assert (event.data["by"], event.data["requests"]) == ("olga", 2)

    again = settle(tmp_path, {"key": "op#0@1.0", "usage": USAGE}, {"key": "op#1@1.0", "billed": False})
    assert (again["charged"], again["released"], sorted(again["already_settled"])) == ([], [], ["op#0@1.0",
                                                                                              "op#1@1.0"])
    assert Event.objects.filter(workflow=workflow, kind="usage.settled").count() == 1


@pytest.mark.parametrize(("lines", "message"), [
    (["{not json"], "line 1: not JSON"),
    ([{"usage": USAGE}], 'line 1: not an object with a "key" string'),
    ([{"key": "op#0@1.0"}], 'needs "usage"'),
    ([{"key": "op#0@1.0", "usage": {**USAGE, "output_tokens": -4}}], "usage.output_tokens must be a whole number"),
    ([{"key": "op#0@1.0", "usage": {**USAGE, "input_tokens": "12"}}], "usage.input_tokens must be a whole number"),
    ([{"key": "op#0@1.0", "usage": {**USAGE, "cache_creation": {"ephemeral_1h_input_tokens": 301}}}],
     "at most cache_creation_input_tokens"),
    ([{"key": "op#0@1.0", "usage": USAGE, "billed": False}], 'both "usage" and "billed": false'),
    ([{"key": "op#0@1.0", "billed": False}, {"key": "op#0@1.0", "usage": USAGE}],
     "line 2: key 'op#0@1.0' was already given on line 1"),
    ([{"key": "op#0@1.0", "billed": False}, {"key": "op#9@1.0", "billed": False}],
     "not in the ledger, so nothing was settled: line 2: 'op#9@1.0'"),
], ids=["not json", "no key", "neither", "negative", "string", "1h over total", "both", "twice", "unknown key"])
def test_a_bad_report_is_refused_whole_and_changes_nothing(
    workflow: Workflow, tmp_path: Path, lines: list[Any], message: str,
) -> None:
    ledger(workflow, "op#0@1.0")
    before = state(workflow)
    with pytest.raises(CommandError, match=message) as refused:
        settle(tmp_path, *lines)
    assert refused.value.returncode == 2
    assert state(workflow) == before
    assert not Event.objects.filter(workflow=workflow, kind="usage.settled").exists()


def test_settle_needs_a_file_that_exists(tmp_path: Path) -> None:
    with pytest.raises(CommandError, match="needs --file PATH"):
        call_command("agent", "usage", "settle")
    with pytest.raises(CommandError, match="no such file"):
        call_command("agent", "usage", "settle", "--file", str(tmp_path / "missing.jsonl"))
