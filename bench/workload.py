"""Bench-only workflow definitions and activities, registered in the orchestrator and in the workers.

Nothing in the product imports this module: the workers load it through ``bench.celery_app``.
"""
from __future__ import annotations

import time
from typing import Any

from agentops.kind import MODEL_CALL_LEASE, metered_complete
from workflows.activity_context import ActivityContext
from workflows.engine import Complete, Decision, Goto, NodeContext, WorkflowDefinition, node
from workflows.errors import InvalidInput
from workflows.registry import RetryPolicy, activity, register_definition

NOOP = "bench.noop"
# A heartbeating activity whose first attempt sleeps (and is killed by the recovery benchmark);
# later attempts return at once. Lease 10 s with a heartbeat every 2 s: with the 2 s beat
# interval a dead attempt is re-run at most lease + one sweep interval = 12 s after its last beat.
SLEEP = "bench.heartbeat_sleep"
SLEEP_LEASE_SECONDS = 10
SLEEP_HEARTBEAT_SECONDS = 2.0
# The same with a 3 s lease (heartbeat every 1 s), so that --quick finishes quickly.
SLEEP_SHORT = "bench.heartbeat_sleep_short"
SLEEP_SHORT_LEASE_SECONDS = 3
SLEEP_SHORT_HEARTBEAT_SECONDS = 1.0


@activity(NOOP, retry=RetryPolicy(max_attempts=3))
def noop(ctx: ActivityContext, input: dict[str, Any]) -> dict[str, Any]:
    return {"i": input.get("i", 0)}


def _sleep_first_attempt(ctx: ActivityContext, input: dict[str, Any], heartbeat_seconds: float) -> dict[str, Any]:
    if ctx.attempt > 1:
        return {"attempt": ctx.attempt}
    deadline = time.monotonic() + float(input.get("seconds", 60))
    while time.monotonic() < deadline:
        time.sleep(heartbeat_seconds)
        ctx.heartbeat("sleeping")
    return {"attempt": ctx.attempt}


@activity(SLEEP, retry=RetryPolicy(max_attempts=5), lease_seconds=SLEEP_LEASE_SECONDS)
def heartbeat_sleep(ctx: ActivityContext, input: dict[str, Any]) -> dict[str, Any]:
    return _sleep_first_attempt(ctx, input, SLEEP_HEARTBEAT_SECONDS)


@activity(SLEEP_SHORT, retry=RetryPolicy(max_attempts=5), lease_seconds=SLEEP_SHORT_LEASE_SECONDS)
def heartbeat_sleep_short(ctx: ActivityContext, input: dict[str, Any]) -> dict[str, Any]:
    return _sleep_first_attempt(ctx, input, SLEEP_SHORT_HEARTBEAT_SECONDS)


@activity("bench.model_call", retry=RetryPolicy(max_attempts=5), lease_seconds=MODEL_CALL_LEASE, io_bound=True)
def model_call(ctx: ActivityContext, input: dict[str, Any]) -> dict[str, Any]:
    """One model call of ``prompt_chars`` characters (the rate-limits benchmark); the operation id
    in the prompt keeps every prompt its own."""
    response = metered_complete(ctx, call=0, system="You answer benchmark calls.", max_tokens=int(input["max_tokens"]),
                                messages=[{"role": "user", "content": f"{ctx.operation_id} " + "x" * int(
                                    input["prompt_chars"])}])
    return {"stop_reason": response.stop_reason}


BY_NAME = {NOOP: noop, SLEEP: heartbeat_sleep, SLEEP_SHORT: heartbeat_sleep_short}


def _int_param(params: dict[str, Any], name: str, default: int, low: int, high: int) -> int:
    try:
        value = int(params.get(name, default))
    except (TypeError, ValueError):
        raise InvalidInput(f"Parameter {name} must be a whole number.") from None
    if not low <= value <= high:
        raise InvalidInput(f"Parameter {name}={value} must be between {low} and {high}.")
    return value


@register_definition
class BenchSteps(WorkflowDefinition):
    """``steps`` sequential activities (no-ops unless ``activity`` says otherwise) in one node, then done."""

    kind = "bench_steps"
    start_node = "STEPS"
    revalidate_node = "STEPS"

    def validate_params(self, params: dict[str, Any]) -> dict[str, Any]:
        name = str(params.get("activity", NOOP))
        if name not in (NOOP, SLEEP, SLEEP_SHORT):
            raise InvalidInput(f"Parameter activity={name!r} is not a bench activity.")
        return {"steps": _int_param(params, "steps", 10, 1, 1000), "activity": name,
                "seconds": _int_param(params, "seconds", 60, 0, 3600)}

    @node("STEPS")
    def steps(self, ctx: NodeContext) -> Decision:
        for i in range(ctx.params["steps"]):
            ctx.activity(BY_NAME[ctx.params["activity"]], {"i": i, "seconds": ctx.params["seconds"]})
        return Complete({"steps": ctx.params["steps"]})


@register_definition
class BenchPark(WorkflowDefinition):
    """One activity, then a park: an approval that expires, or a durable sleep, ``seconds`` long."""

    kind = "bench_park"
    start_node = "PREPARE"
    revalidate_node = "PREPARE"

    def validate_params(self, params: dict[str, Any]) -> dict[str, Any]:
        wait = str(params.get("wait", "timer"))
        if wait not in ("timer", "approval"):
            raise InvalidInput("Parameter wait must be 'timer' or 'approval'.")
        return {"wait": wait, "seconds": _int_param(params, "seconds", 3 * 86400, 1, 365 * 86400)}

    @node("PREPARE")
    def prepare(self, ctx: NodeContext) -> Decision:
        evidence = ctx.activity(noop, {"i": 0})
        return Goto("PARK", {"evidence": evidence})

    @node("PARK")
    def park(self, ctx: NodeContext) -> Decision:
        if ctx.params["wait"] == "approval":
            outcome = ctx.approval(
                candidate={"title": "bench candidate", "files": []}, candidate_hash="0" * 64,
                role="bench-approvers", expires_in_seconds=ctx.params["seconds"], state_versions={"intent": 1},
            )
            return Complete({"approved": outcome.approved})
        ctx.sleep(ctx.params["seconds"])
        return Complete({"slept": ctx.params["seconds"]})


@register_definition
class BenchModelCalls(WorkflowDefinition):
    """``calls`` model calls in a row (``bench.model_call``), each of ``prompt_chars`` characters."""

    kind = "bench_model_calls"
    start_node = "CALLS"
    revalidate_node = "CALLS"

    def validate_params(self, params: dict[str, Any]) -> dict[str, Any]:
        return {"calls": _int_param(params, "calls", 3, 1, 100),
                "prompt_chars": _int_param(params, "prompt_chars", 1200, 1, 400_000),
                "max_tokens": _int_param(params, "max_tokens", 64, 1, 64_000)}

    @node("CALLS")
    def calls(self, ctx: NodeContext) -> Decision:
        for i in range(ctx.params["calls"]):
            ctx.activity(model_call, {"i": i, "prompt_chars": ctx.params["prompt_chars"],
                                      "max_tokens": ctx.params["max_tokens"]})
        return Complete({"calls": ctx.params["calls"]})
