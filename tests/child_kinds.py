"""Kinds for the child-workflow tests: a parent that fans out to children and waits for all of
them, a child that computes, and a child that holds a deployment (a commitment on the deploy
target) until it is told to finish. Importing the module registers them (AGENTOPS_AGENT_MODULES
on the process tests' workers)."""
from __future__ import annotations

import time
from typing import Any

from agentops.agents.release.activities import DeployInput, deploy
from workflows.activity_context import ActivityContext
from workflows.engine import Complete, Decision, Fail, Goto, NodeContext, WorkflowDefinition, node
from workflows.errors import Permanent
from workflows.registry import activity, register_definition


@activity("test_child_square")
def square(ctx: ActivityContext, input: dict[str, Any]) -> dict[str, Any]:
    """n squared, after ``seconds`` of work (heartbeating), so parallel children overlap."""
    if input["n"] < 0:
        raise Permanent(f"no square for {input['n']} here")
    until = time.monotonic() + input.get("seconds", 0)
    while time.monotonic() < until:
        ctx.heartbeat("squaring")
        time.sleep(0.1)
    return {"n": input["n"], "square": input["n"] ** 2}


@register_definition
class FanOut(WorkflowDefinition):
    """Deploys first when ``deploy_first`` (a commitment of its own), then starts one child of
    ``child_kind`` per entry of ``ns`` (each with ``budget_usd``) and waits for all of them."""

    kind = "test-fanout"
    start_node = "PREP"
    revalidate_node = "PREP"

    def validate_params(self, params: dict[str, Any]) -> dict[str, Any]:
        return {"ns": list(params.get("ns", [1, 2])), "child_kind": params.get("child_kind", "test-square"),
                "budget_usd": params.get("budget_usd"), "deploy_first": bool(params.get("deploy_first", False)),
                "seconds": float(params.get("seconds", 0))}

    @node("PREP")
    def prep(self, ctx: NodeContext[Any]) -> Decision:
        if ctx.params["deploy_first"]:
            ctx.activity(deploy, DeployInput(candidate_hash="parent", head="0" * 40, title="parent", files={}))
        return Goto("FAN")

    @node("FAN")
    def fan(self, ctx: NodeContext[Any]) -> Decision:
        extra = {"seconds": ctx.params["seconds"]} if ctx.params["seconds"] else {}
        handles = [ctx.child(ctx.params["child_kind"], f"child {n}", {"n": n, **extra},
                             budget=ctx.params["budget_usd"]) for n in ctx.params["ns"]]
        outcomes = ctx.wait_children(*handles)
        if not all(o.completed for o in outcomes):
            return Fail("; ".join(f"child {o.workflow_id} {o.status}: {o.reason}" for o in outcomes if not o.completed))
        return Complete({"children": [o.workflow_id for o in outcomes], "results": [o.result for o in outcomes]})


@register_definition
class Square(WorkflowDefinition):
    kind = "test-square"
    start_node = "WORK"
    revalidate_node = "WORK"

    def validate_params(self, params: dict[str, Any]) -> dict[str, Any]:
        return {"n": int(params["n"]), "seconds": float(params.get("seconds", 0))}

    @node("WORK")
    def work(self, ctx: NodeContext[Any]) -> Decision:
        return Complete(ctx.activity(square, dict(ctx.params)))


@register_definition
class Deployer(WorkflowDefinition):
    """Deploys (a commitment), then holds the deployment until the signal ``finish``."""

    kind = "test-deployer"
    start_node = "DEPLOY"
    revalidate_node = "DEPLOY"

    def validate_params(self, params: dict[str, Any]) -> dict[str, Any]:
        return {"n": int(params["n"])}

    @node("DEPLOY")
    def deploy_node(self, ctx: NodeContext[Any]) -> Decision:
        n = ctx.params["n"]
        deployment = ctx.activity(deploy, DeployInput(candidate_hash=f"child-{n}", head="0" * 40,
                                                      title=f"child {n}", files={}))
        return Goto("HOLD", {"deployment": deployment})

    @node("HOLD")
    def hold(self, ctx: NodeContext[Any]) -> Decision:
        ctx.wait_for_event("finish")
        return Complete(ctx.state["deployment"])
