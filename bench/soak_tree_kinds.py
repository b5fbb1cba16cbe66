"""The soak's tree kinds (bench/soak_tree.py): a root that plans, starts two children and closes; a
child that pauses, asks the model for a note and deploys once. Importing the module registers them
(``AGENTOPS_AGENT_MODULES`` on the soak's workers, and the soak's own process, which launches them)."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from agentops.agents.release.activities import DeployInput, deploy
from agentops.kind import MODEL_CALL_LEASE, metered_complete
from agentops.providers.scripted import offline_answer
from bench.soak_tree import CHILD_BUDGET_USD, LEAF_KIND, ROOT_KIND
from workflows.activity_context import ActivityContext
from workflows.engine import Complete, Decision, Fail, Goto, NodeContext, WorkflowDefinition, node
from workflows.registry import RetryPolicy, activity, register_definition

offline_answer("soak_tree_note", "Noted: the part is ready to ship.")


@dataclass(frozen=True)
class NoteInput:
    goal: str
    step: str


@activity("soak_tree_note", retry=RetryPolicy(max_attempts=4, initial_interval_seconds=1.0),
          lease_seconds=MODEL_CALL_LEASE, io_bound=True)
def tree_note(ctx: ActivityContext, input: NoteInput) -> dict[str, Any]:
    """One model call: a short note on the step, so that each step's spend is in the ledger."""
    answer = metered_complete(ctx, call=0, max_tokens=100, system="<task>soak_tree_note</task> One short line.",
                              messages=[{"role": "user", "content": f"{input.step}: {input.goal}"}])
    return {"step": input.step, "note": answer.text}


@register_definition
class SoakTree(WorkflowDefinition):
    """Plan, two children that deploy, a closing note."""

    kind = ROOT_KIND
    start_node = "PLAN"
    revalidate_node = "PLAN"

    def validate_params(self, params: dict[str, Any]) -> dict[str, Any]:
        return {"pause_seconds": [int(s) for s in params.get("pause_seconds", [0, 0])][:2],
                "child_budget_usd": str(params.get("child_budget_usd", CHILD_BUDGET_USD))}

    @node("PLAN")
    def plan(self, ctx: NodeContext[Any]) -> Decision:
        return Goto("FAN", {"plan": ctx.activity(tree_note, NoteInput(goal=ctx.goal, step="plan"))})

    @node("FAN")
    def fan(self, ctx: NodeContext[Any]) -> Decision:
        handles = [ctx.child(LEAF_KIND, f"{ctx.goal}: part {n}", {"n": n, "pause_seconds": pause},
                             budget=ctx.params["child_budget_usd"])
                   for n, pause in enumerate(ctx.params["pause_seconds"], start=1)]
        outcomes = ctx.wait_children(*handles)
        if not all(o.completed for o in outcomes):
            return Fail("; ".join(f"child {o.workflow_id} {o.status}: {o.reason}" for o in outcomes if not o.completed))
        return Goto("CLOSE", {"children": [o.workflow_id for o in outcomes],
                              "deployments": [o.result["deployment"] for o in outcomes]})

    @node("CLOSE")
    def close(self, ctx: NodeContext[Any]) -> Decision:
        ctx.activity(tree_note, NoteInput(goal=ctx.goal, step="close"))
        return Complete({"children": ctx.state["children"], "deployments": ctx.state["deployments"]})


@register_definition
class SoakTreeLeaf(WorkflowDefinition):
    """A pause, a note, one deployment."""

    kind = LEAF_KIND
    start_node = "WORK"
    revalidate_node = "WORK"

    def validate_params(self, params: dict[str, Any]) -> dict[str, Any]:
        return {"n": int(params["n"]), "pause_seconds": int(params.get("pause_seconds", 0))}

    @node("WORK")
    def work(self, ctx: NodeContext[Any]) -> Decision:
        if ctx.params["pause_seconds"]:
            ctx.sleep(ctx.params["pause_seconds"])
        note = ctx.activity(tree_note, NoteInput(goal=ctx.goal, step="part"))
        deployment = ctx.activity(deploy, DeployInput(candidate_hash=f"tree-part-{ctx.params['n']}", head="0" * 40,
                                                      title=ctx.goal[:200], files={}))
        return Complete({"deployment": deployment, "note": note})
