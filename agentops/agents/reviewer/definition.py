"""The reviewer kind: one node that reviews a diff and completes with its findings.

The harness starts one as a child workflow after each accepted feature (launch parameter
``reviewer``, docs/harness.md), with its own budget reserved from the harness's; its findings
go into the next session's briefing.
"""
from __future__ import annotations

from typing import Any

from pydantic import Field

from agentops.agents.reviewer.activities import ReviewInput, reviewer_review
from agentops.kind import Complete, Decision, LaunchParams, NodeContext, WorkflowDefinition, node, register_definition


class ReviewerParams(LaunchParams):
    workspace: str = Field(description="the git repository to review (absolute path)")
    base_sha: str = Field(pattern=r"^[0-9a-f]{40}$", description="the commit before the feature")
    head: str = Field(pattern=r"^[0-9a-f]{40}$", description="the commit that passed the feature's check")
    feature: str = Field(max_length=200, description="the feature's id")
    description: str = Field("", max_length=2000, description="what the feature is")
    steps: list[str] = Field(default_factory=list, max_length=50, description="the feature's steps")


@register_definition
class Reviewer(WorkflowDefinition):
    kind = "reviewer"
    start_node = "REVIEW"
    revalidate_node = "REVIEW"
    default_max_hours = 2.0
    launch_params = ReviewerParams

    @node("REVIEW")
    def review(self, ctx: NodeContext[Any]) -> Decision:
        p = ctx.params
        return Complete(ctx.activity(reviewer_review, ReviewInput(
            workspace=p["workspace"], base_sha=p["base_sha"], head=p["head"], feature=p["feature"],
            description=p["description"], steps=list(p["steps"]))))
