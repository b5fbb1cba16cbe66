"""OpenTelemetry traces: one trace per workflow whose ids come from the workflow,
spans for advances, attempts, model calls (GenAI conventions, ledger cost) and tool calls; a
replayed step makes no span; off, nothing is set up."""
from __future__ import annotations

from collections import Counter
from collections.abc import Iterator
from decimal import Decimal
from typing import Any

import pytest
from opentelemetry.sdk.trace.export import ConsoleSpanExporter
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from tests.conftest import drive
from workflows import selectors, services, telemetry
from workflows.models import Activity, ActivityAttempt, Event, UsageEntry

pytestmark = pytest.mark.django_db


@pytest.fixture
def spans(settings: Any, tmp_path: Any) -> Iterator[InMemorySpanExporter]:
    settings.AGENTOPS_WORKSPACE_DIR = tmp_path / "workspaces"
    exporter = InMemorySpanExporter()
    telemetry.configure([(exporter, False)])
    yield exporter
    telemetry.configure(None)


def by_name(finished: Any, prefix: str) -> list[Any]:
    return [s for s in finished if s.name.startswith(prefix)]


def test_an_autonomous_run_is_one_trace_of_advances_attempts_model_and_tool_calls(
    spans: InMemorySpanExporter, django_capture_on_commit_callbacks: Any
) -> None:
    with django_capture_on_commit_callbacks(execute=True):
        workflow = drive(services.workflow_launch(kind="autonomous", goal="Prepare onboarding notes").pk)
    assert workflow.status == "completed", workflow.reason
    finished = spans.get_finished_spans()
    trace_id, root_id = telemetry.workflow_ids(workflow.pk)

    [root] = by_name(finished, "workflow ")
    assert (root.name, root.context.trace_id, root.context.span_id, root.parent) == (
        "workflow autonomous", trace_id, root_id, None)
    assert root.attributes["agentops.workflow.status"] == "completed"
    assert {s.context.trace_id for s in finished} == {trace_id}

    attempts = by_name(finished, "activity ")
    advances = by_name(finished, "advance ")
    assert {s.parent.span_id for s in attempts + advances} == {root_id}
    assert len(attempts) == ActivityAttempt.objects.filter(activity__workflow=workflow).count()
    assert Counter(s.name for s in attempts) == Counter(
        f"activity {a.name}" for a in Activity.objects.filter(workflow=workflow))
    assert advances and all(s.attributes["agentops.events"] > 0 for s in advances)

    attempt_ids = {s.context.span_id for s in attempts}
    calls = by_name(finished, "chat ")
    assert len(calls) == UsageEntry.objects.filter(workflow=workflow).count() == 11
    assert {s.parent.span_id for s in calls} <= attempt_ids
    call = calls[0]
    assert call.attributes["gen_ai.operation.name"] == "chat"
    assert call.attributes["gen_ai.system"] == "scripted"
    assert call.attributes["gen_ai.request.model"] == UsageEntry.objects.filter(workflow=workflow).first().model
    assert call.attributes["gen_ai.usage.input_tokens"] > 0 and call.attributes["gen_ai.usage.output_tokens"] > 0
    assert "gen_ai.usage.cache_read.input_tokens" in call.attributes
    assert sum(Decimal(str(s.attributes["agentops.cost_usd"])) for s in calls) == selectors.spent_usd(workflow)

    tools = by_name(finished, "execute_tool ")
    assert [s.attributes["gen_ai.tool.name"] for s in sorted(tools, key=lambda s: s.start_time)] == [
        e.data["tool"] for e in Event.objects.filter(workflow=workflow, kind="tool.called")]
    assert {s.parent.span_id for s in tools} <= attempt_ids


def test_a_replayed_step_makes_no_second_span(spans: InMemorySpanExporter,
                                              django_capture_on_commit_callbacks: Any) -> None:
    """A duplicate doorbell replays the recorded steps and changes nothing; a recorded activity is not
    run again: neither makes a span."""
    with django_capture_on_commit_callbacks(execute=True):
        workflow_id = services.workflow_launch(kind="autonomous", goal="Prepare onboarding notes").pk
        services.workflow_advance_if_runnable(workflow_id=workflow_id)
        [plan] = Activity.objects.filter(workflow_id=workflow_id, status="scheduled")
        services.activity_run_if_runnable(activity_id=plan.pk, worker="w1")
    assert Activity.objects.get(pk=plan.pk).status == "succeeded"
    before = [s.name for s in spans.get_finished_spans()]
    assert f"activity {plan.name}" in before and f"advance {plan.workflow.kind}" in before

    with django_capture_on_commit_callbacks(execute=True):
        services.workflow_advance_if_runnable(workflow_id=workflow_id)
        services.workflow_advance_if_runnable(workflow_id=workflow_id)
        services.activity_run_if_runnable(activity_id=plan.pk, worker="w2")
    assert [s.name for s in spans.get_finished_spans()] == before


def test_the_trace_ids_of_a_workflow_are_the_same_in_every_process() -> None:
    """Derived from the installation and the workflow: nothing to carry between workers."""
    assert telemetry.workflow_ids(7) == telemetry.workflow_ids(7) != telemetry.workflow_ids(8)


def test_off_by_default_and_console_when_asked(settings: Any) -> None:
    assert settings.AGENTOPS_OTEL_TRACES_EXPORTER == ()
    assert telemetry.exporters_from_settings() == []
    telemetry.configure(None)
    with telemetry.span("anything") as span:
        assert span is None
    assert not telemetry.enabled()
    settings.AGENTOPS_OTEL_TRACES_EXPORTER = ("console",)
    [(exporter, batched)] = telemetry.exporters_from_settings()
    assert isinstance(exporter, ConsoleSpanExporter) and not batched
