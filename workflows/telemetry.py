"""OpenTelemetry traces of workflows (docs/live.md, "Traces"): one trace per workflow, the same on
every worker and after every restart, because its ids are derived from the workflow, not carried.

Spans: each advance that recorded something, each activity attempt, each model call (GenAI
semantic conventions, with the cost from our ledger) and each tool call; and, once the workflow
has finished, the workflow's own root span, under whose id the others were recorded all along.
Recorded results are replayed without running again, so a replayed step makes no span.

Off unless OTEL_TRACES_EXPORTER names an exporter (``otlp``: OTLP over HTTP/protobuf, configured
by the standard OTEL_EXPORTER_OTLP_* variables; ``console``: one JSON line per span). Off, every
helper here costs one check of a module global.
"""
from __future__ import annotations

import hashlib
import sys
import threading
import time
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from contextvars import ContextVar
from datetime import datetime
from typing import IO, TYPE_CHECKING, Any

from django.conf import settings
from opentelemetry import context as otel_context
from opentelemetry import trace
from opentelemetry.trace import NonRecordingSpan, SpanContext, SpanKind, Status, StatusCode, TraceFlags

if TYPE_CHECKING:  # the SDK is imported only once tracing is on
    from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
    from opentelemetry.sdk.trace.export import SpanExporter

Attributes = Mapping[str, Any]

_lock = threading.Lock()
_configured = False
_provider: TracerProvider | None = None
_tracer: trace.Tracer | None = None
# The ids the next span takes, when it is a workflow's root span (WorkflowIds).
_forced_ids: ContextVar[tuple[int, int] | None] = ContextVar("forced_span_ids", default=None)


def tracer() -> trace.Tracer | None:
    """This process's tracer, or None when tracing is off (set up once, on first use)."""
    if _configured:
        return _tracer
    with _lock:
        if not _configured:
            configure(exporters_from_settings())
    return _tracer


def exporters_from_settings() -> list[tuple[SpanExporter, bool]]:
    """The exporters OTEL_TRACES_EXPORTER names, each with whether it is sent in batches."""
    from opentelemetry.sdk.trace.export import ConsoleSpanExporter

    chosen: list[tuple[SpanExporter, bool]] = []
    if settings.AGENTOPS_OTEL_SDK_DISABLED:
        return chosen
    for name in settings.AGENTOPS_OTEL_TRACES_EXPORTER:
        if name == "otlp":
            from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter

            chosen.append((OTLPSpanExporter(), True))
        elif name == "console":
            chosen.append((ConsoleSpanExporter(out=console_out(), formatter=one_line), False))
    return chosen


def console_out() -> IO[str]:
    path = settings.AGENTOPS_OTEL_CONSOLE_PATH
    return open(path, "a", buffering=1, encoding="utf-8") if path else sys.stdout  # noqa: SIM115 - the process's


def one_line(span: ReadableSpan) -> str:
    return span.to_json(indent=None) + "\n"


def configure(exporters: list[tuple[SpanExporter, bool]] | None) -> None:
    """Trace to ``exporters`` from now on ([]: off; None: from the settings again, on next use).
    Called once per process from the settings, and by tests with an in-memory exporter."""
    global _configured, _provider, _tracer
    from opentelemetry.sdk.resources import Resource
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import BatchSpanProcessor, SimpleSpanProcessor
    from opentelemetry.sdk.trace.id_generator import RandomIdGenerator

    class WorkflowIds(RandomIdGenerator):
        """Random ids, except for a workflow's root span, whose ids were fixed by the workflow."""

        def generate_trace_id(self) -> int:
            forced = _forced_ids.get()
            return forced[0] if forced else super().generate_trace_id()

        def generate_span_id(self) -> int:
            forced = _forced_ids.get()
            return forced[1] if forced else super().generate_span_id()

    if _provider is not None:
        _provider.shutdown()
    _provider = _tracer = None
    if exporters is None:
        _configured = False
        return
    if exporters:
        _provider = TracerProvider(resource=Resource.create({"service.name": settings.AGENTOPS_OTEL_SERVICE_NAME}),
                                   id_generator=WorkflowIds())
        for exporter, batched in exporters:
            _provider.add_span_processor(BatchSpanProcessor(exporter) if batched else SimpleSpanProcessor(exporter))
        _tracer = _provider.get_tracer("agentops")
    _configured = True


def enabled() -> bool:
    return tracer() is not None


def flush() -> None:
    """Export what is buffered (a worker process that is about to exit)."""
    if _provider is not None:
        _provider.force_flush()


def workflow_ids(workflow_id: int) -> tuple[int, int]:
    """The workflow's trace id and root span id: from this installation's id and the workflow's,
    so that two databases' workflow 7 are two traces."""
    from workflows.installation import installation_id

    digest = hashlib.sha256(f"agentops-trace:{installation_id()}:{workflow_id}".encode()).digest()
    return int.from_bytes(digest[:16], "big") or 1, int.from_bytes(digest[16:24], "big") or 1


def workflow_context(workflow_id: int) -> otel_context.Context:
    trace_id, root_id = workflow_ids(workflow_id)
    root = SpanContext(trace_id=trace_id, span_id=root_id, is_remote=True,
                       trace_flags=TraceFlags(TraceFlags.SAMPLED))
    return trace.set_span_in_context(NonRecordingSpan(root))


@contextmanager
def span(name: str, *, workflow_id: int | None = None, kind: SpanKind = SpanKind.INTERNAL,
         attributes: Attributes | None = None) -> Iterator[trace.Span | None]:
    """A span around the block: a child of the workflow's root span when ``workflow_id`` is given,
    else of the current span. None (and nothing recorded) when tracing is off. An exception
    marks the span as an error and propagates."""
    t = tracer()
    if t is None:
        yield None
        return
    parent = workflow_context(workflow_id) if workflow_id is not None else None
    with t.start_as_current_span(name, context=parent, kind=kind, attributes=dict(attributes or {})) as current:
        yield current


def tool_span(name: str) -> Any:
    """A tool call's span, a child of the attempt's (GenAI semantic conventions)."""
    return span(f"execute_tool {name}", attributes={"gen_ai.operation.name": "execute_tool", "gen_ai.tool.name": name})


def annotate(current: trace.Span | None, attributes: Attributes) -> None:
    if current is not None:
        current.set_attributes({k: v for k, v in attributes.items() if v is not None})


def failed(current: trace.Span | None, error: BaseException) -> None:
    if current is not None:
        current.set_status(Status(StatusCode.ERROR, f"{type(error).__name__}: {error}"[:500]))


def span_recorded(name: str, *, workflow_id: int, started_ns: int, attributes: Attributes) -> None:
    """A span of work already done (from ``started_ns`` to now), recorded only once it is known to
    have done something: an advance that replayed recorded steps and changed nothing makes none."""
    t = tracer()
    if t is not None:
        t.start_span(name, context=workflow_context(workflow_id), start_time=started_ns,
                     attributes=dict(attributes)).end()


def workflow_finished(*, workflow_id: int, kind: str, status: str, created_at: datetime) -> None:
    """The workflow's root span, from its launch to now: recorded once, when it has finished
    (the caller rings it after the COMMIT of the final transition)."""
    t = tracer()
    if t is None:
        return
    token = _forced_ids.set(workflow_ids(workflow_id))
    try:
        root = t.start_span(f"workflow {kind}", context=otel_context.Context(),
                            start_time=int(created_at.timestamp() * 1e9),
                            attributes={"agentops.workflow.id": workflow_id, "agentops.workflow.kind": kind,
                                        "agentops.workflow.status": status})
    finally:
        _forced_ids.reset(token)
    if status != "completed":
        root.set_status(Status(StatusCode.ERROR, status))
    root.end()


def now_ns() -> int:
    return time.time_ns()
