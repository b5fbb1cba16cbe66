"""The ``autonomous`` agent: plan, execute one task at a time, verify, adapt, complete."""
from __future__ import annotations

from collections.abc import Mapping
from typing import Any, TypedDict, cast

from pydantic import Field

from agentops.agents.autonomous.activities import (
    PlanInput,
    ReplanInput,
    Task,
    TaskInput,
    Verdict,
    VerifyInput,
    execute_task,
    plan_tasks,
    replan,
    verify_goal,
)
from agentops.kind import (
    EMPTY_QUERY,
    ActivityFailed,
    AdminPanel,
    Complete,
    Decision,
    Fail,
    Goto,
    LaunchParams,
    NodeContext,
    WorkflowDefinition,
    node,
    register_definition,
)

DEFAULT_ROUNDS = 3
# A round cap a launch may set; the run is bounded by its time limit (max_hours) and budget. 0: no cap.
MAX_ROUNDS = 1_000_000


class AutonomousParams(LaunchParams):
    max_rounds: int = Field(DEFAULT_ROUNDS, ge=0, le=MAX_ROUNDS, description=(
        "adaptation rounds at most; 0: no cap (the time limit and the budget bound the run)"))


class State(TypedDict, total=False):
    """What the handlers keep between nodes: the current round only. Earlier rounds are history
    (their checkpoints, read by ``presentation.earlier_tasks``), counted here."""

    tasks: list[Task]  # the current round's tasks
    history: list[Task]  # earlier rounds' tasks: non-empty only in a state that kept every round; a replan empties it
    done_before: int  # tasks done in earlier rounds
    skipped_before: int  # tasks skipped in earlier rounds
    round: int
    verdict: Verdict
    stagnation: Any  # set by the stagnation sweep before a replan


Ctx = NodeContext[State]


def _task(base: Task, **changes: Any) -> Task:
    return cast(Task, {**base, **changes})


def _brief(task: Task, *keys: str) -> Task:
    return cast(Task, {k: task[k] for k in keys if k in task})  # type: ignore[literal-required]


def _with_status(tasks: list[Task], task_id: int, **changes: Any) -> list[Task]:
    return [_task(t, **changes) if t["id"] == task_id else t for t in tasks]


@register_definition
class Autonomous(WorkflowDefinition):
    kind = "autonomous"
    version = 1
    start_node = "PLANNING"
    revalidate_node = "PLANNING"
    adapt_node = "ADAPTATION"
    default_max_hours = 72.0
    launch_params = AutonomousParams
    reads_steering = True  # every model call: plan, each task's turns, verify, replan

    @node("PLANNING")
    def planning(self, ctx: Ctx) -> Decision:
        plan = ctx.activity(plan_tasks, PlanInput(goal=ctx.goal))
        tasks = [_task(task, status="pending", round=1) for task in plan["tasks"]]
        return Goto("EXECUTION", {"tasks": tasks, "round": 1, "history": [], "done_before": 0, "skipped_before": 0})

    @node("EXECUTION")
    def execution(self, ctx: Ctx) -> Decision:
        """One task per visit: a failed task (after its retries) is skipped with the reason."""
        tasks = ctx.state["tasks"]
        pending = [t for t in tasks if t["status"] == "pending"]
        if not pending:
            return Goto("VERIFICATION")
        task = pending[0]
        try:
            outcome = ctx.activity(execute_task, TaskInput(goal=ctx.goal, task=task))
        except ActivityFailed as exc:
            return Goto("EXECUTION", {"tasks": _with_status(tasks, task["id"], status="skipped", reason=exc.error)})
        return Goto("EXECUTION", {"tasks": _with_status(tasks, task["id"], status="done", summary=outcome["summary"])})

    @node("VERIFICATION")
    def verification(self, ctx: Ctx) -> Decision:
        verdict = ctx.activity(verify_goal, VerifyInput(goal=ctx.goal, tasks=[
            _brief(t, "id", "title", "status", "reason") for t in ctx.state["tasks"]]))
        if verdict["goal_met"]:
            return Goto("COMPLETED", {"verdict": verdict})
        if ctx.params["max_rounds"] and ctx.state["round"] >= ctx.params["max_rounds"]:
            return Fail(f"The goal was not met after {ctx.state['round']} rounds: {verdict['reason']}")
        return Goto("ADAPTATION", {"verdict": verdict})

    @node("ADAPTATION")
    def adaptation(self, ctx: Ctx) -> Decision:
        """Re-plan from what worked and what did not; task ids keep counting up."""
        tasks = ctx.state["tasks"]
        # The prompt shows 400 characters of each task's line: the rest of a summary is not sent.
        plan = ctx.activity(replan, ReplanInput(goal=ctx.goal, tasks=[
            {**_brief(t, "id", "title", "status", "reason"), **({"summary": t["summary"][:400]} if t.get("summary")
                                                               else {})} for t in tasks],
            verdict=ctx.state.get("verdict"), stagnation=ctx.state.get("stagnation")))
        first_id = max((t["id"] for t in tasks), default=0) + 1
        round_ = ctx.state["round"] + 1
        fresh = [_task(task, id=first_id + i, status="pending", round=round_) for i, task in enumerate(plan["tasks"])]
        # The finished round leaves the hot state: its tasks stay in this visit's checkpoint, counted here.
        earlier = [*ctx.state.get("history", []), *tasks]
        return Goto("EXECUTION", {
            "tasks": fresh, "round": round_, "history": [],
            "done_before": ctx.state.get("done_before", 0) + sum(t["status"] == "done" for t in earlier),
            "skipped_before": ctx.state.get("skipped_before", 0) + sum(t["status"] == "skipped" for t in earlier),
            "stagnation": None,
        })

    @node("COMPLETED")
    def completed(self, ctx: Ctx) -> Decision:
        tasks = [*ctx.state.get("history", []), *ctx.state["tasks"]]
        return Complete({
            "rounds": ctx.state["round"],
            "tasks_done": ctx.state.get("done_before", 0) + sum(t["status"] == "done" for t in tasks),
            "tasks_skipped": ctx.state.get("skipped_before", 0) + sum(t["status"] == "skipped" for t in tasks),
            "summary": ctx.state["verdict"]["reason"],
        })

    def admin_panels(self, workflow: Any, query: Mapping[str, str] = EMPTY_QUERY) -> list[AdminPanel]:
        from agentops.agents.autonomous.presentation import tasks_panel

        return [tasks_panel(workflow)]

    def show_extras(self, workflow: Any) -> dict[str, Any]:
        """``agent show --json`` lists the tasks of the last three earlier rounds (from their checkpoints)
        and the current one's, and how many earlier rounds it leaves out (``agent export-history`` has them)."""
        from agentops.agents.autonomous.presentation import EARLIER_ROUNDS_SHOWN, earlier_rounds, shown_tasks

        return {"tasks": shown_tasks(workflow),
                "earlier_rounds_left_out": max(0, earlier_rounds(workflow) - EARLIER_ROUNDS_SHOWN)}
