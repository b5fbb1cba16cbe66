"""The project ``manage.py agent new-kind NAME`` writes: a kind in its own pip-installable package.

It is the layout docs/authoring.md describes ("A kind as a package"): the kind's package (a
definition, a model-calling activity with its offline answers, an effect with its
compensation), a pyproject.toml whose entry point registers the kind wherever the package is
installed, and a unit test that passes as written (the test kit, no database).
"""
from __future__ import annotations

from pathlib import Path

from workflows.errors import InvalidInput
from workflows.registry import KIND_PATTERN

PYPROJECT = '''[build-system]
requires = ["setuptools>=64"]
build-backend = "setuptools.build_meta"

[project]
name = "agentops-kind-{kind}"
version = "0.1.0"
description = "The {kind} agent kind for agentops."
requires-python = ">=3.11"
# No dependencies listed: the kind runs inside an agentops installation; install this package
# into the environment agentops runs in (its web, worker and beat hosts).
dependencies = []

# Installing the package registers the kind: agentops imports every module of this group at start-up.
[project.entry-points."agentops.kinds"]
{kind} = "{module}"

[tool.setuptools]
packages = ["{module}"]

[tool.setuptools.package-data]
{module} = ["offline_answers.json"]

[tool.pytest.ini_options]
DJANGO_SETTINGS_MODULE = "agentops.settings"
testpaths = ["tests"]
'''

INIT = '''"""The {kind} agent kind: importing the package registers its definition and activities."""
from {module} import activities, definition  # noqa: F401
'''

ACTIVITIES = '''"""The {kind} kind's activities: a model call that drafts, and the effect that sends."""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from agentops.kind import MODEL_CALL_LEASE, metered_complete
from agentops.kind import ActivityContext, CompensationInput, InvalidInput, RetryPolicy, activity
from agentops.providers.scripted import offline_answers_file

# What the offline scripted provider answers this kind's <task>{module}_draft</task> (no API key).
offline_answers_file(Path(__file__).with_name("offline_answers.json"))

DRAFT_SYSTEM = "<task>{module}_draft</task> Write a short, friendly message that serves the goal."


@dataclass(frozen=True)
class DraftInput:
    goal: str
    recipient: str


@dataclass(frozen=True)
class Draft:
    text: str


@activity(lease_seconds=MODEL_CALL_LEASE, io_bound=True, retry=RetryPolicy(max_attempts=3))
def {module}_draft(ctx: ActivityContext, input: DraftInput) -> Draft:
    response = metered_complete(ctx, call=0, system=DRAFT_SYSTEM, max_tokens=400, messages=[
        {{"role": "user", "content": f"Goal: {{input.goal}}\\nRecipient: {{input.recipient}}"}}])
    if response.stop_reason == "max_tokens" or not response.text.strip():
        raise InvalidInput("The model's draft was cut off or empty.")
    return Draft(text=response.text.strip())


@dataclass(frozen=True)
class SendInput:
    recipient: str
    text: str


@dataclass(frozen=True)
class Sent:
    message_id: str


@activity
def {module}_unsend(ctx: ActivityContext, input: CompensationInput) -> dict:
    # Undo what {module}_send did, addressed by the key it sent (input.sent_key).
    ctx.fence("retract the message")
    return {{"retracted": input.sent_key}}


@activity(commitment="message", compensation={module}_unsend)
def {module}_send(ctx: ActivityContext, input: SendInput) -> Sent:
    ctx.fence("send the message")  # right before the effect; raises LeaseLost if it is no longer wanted
    # Send input.text to input.recipient here, with ctx.idempotency_key as the idempotency key.
    return Sent(message_id=ctx.idempotency_key)
'''

DEFINITION = '''"""The {kind} kind: DRAFT with the model, REVIEW by a person, SEND once."""
from __future__ import annotations

from typing import TypedDict

from pydantic import Field

from agentops.kind import (
    ROLE_MAX_LENGTH, Complete, Decision, Fail, Goto, LaunchParams, NodeContext, WorkflowDefinition, node,
    register_definition,
)
from {module}.activities import Draft, DraftInput, SendInput, {module}_draft, {module}_send


class {cls}Params(LaunchParams):
    recipient: str = Field(pattern=r"^[^@\\s]+@[^@\\s]+$", max_length=200, description="who the message goes to")
    approver_role: str = Field("{kind}-approvers", min_length=1, max_length=ROLE_MAX_LENGTH,
                               description="the group whose members approve the draft")


class State(TypedDict, total=False):
    draft: Draft  # comes back as a Draft in every handler


@register_definition
class {cls}(WorkflowDefinition):
    kind = "{kind}"
    start_node = "DRAFT"
    revalidate_node = "DRAFT"  # where a new goal (agent supersede) sends the workflow
    launch_params = {cls}Params  # checked at launch, shown by `agent launch --help`

    @node("DRAFT")
    def draft(self, ctx: NodeContext[State]) -> Decision:
        draft = ctx.activity({module}_draft, DraftInput(goal=ctx.goal, recipient=ctx.params["recipient"]))
        return Goto("REVIEW", {{"draft": draft}})

    @node("REVIEW")
    def review(self, ctx: NodeContext[State]) -> Decision:
        outcome = ctx.approval(candidate=ctx.state["draft"], role=ctx.params["approver_role"],
                               expires_in_seconds=24 * 3600)
        if not outcome.approved:
            return Fail("The draft expired unreviewed." if outcome.expired else f"Rejected by {{outcome.decided_by}}.")
        return Goto("SEND")

    @node("SEND")
    def send(self, ctx: NodeContext[State]) -> Decision:
        sent = ctx.activity({module}_send, SendInput(recipient=ctx.params["recipient"], text=ctx.state["draft"].text))
        return Complete({{"message_id": sent.message_id, "text": ctx.state["draft"].text}})
'''

OFFLINE_ANSWERS = '''{{
  "{module}_draft": "Hello! Following up on your request: everything is on track, and we will write again soon."
}}
'''

TEST = '''"""The {kind} kind, tested with the test kit: no database, no worker, no model."""
from {module}.activities import Draft, DraftInput, Sent, {module}_draft, {module}_send
from {module}.definition import {cls}
from agentops.kind.testing import ActivityEnvironment, FakeModel, WorkflowRun, registered

PARAMS = {{"recipient": "ada@example.com"}}


def test_the_draft_is_the_model_s_answer():
    env = ActivityEnvironment(model=FakeModel(["Hi Ada, your order ships today."]))
    with registered({module}_draft):
        draft = env.run({module}_draft, DraftInput(goal="Tell Ada", recipient="ada@example.com"))
    assert draft == Draft(text="Hi Ada, your order ships today.")
    assert env.ledger.spent_usd > 0  # metered in the fake ledger


def test_an_approved_draft_is_sent_once():
    with registered({cls}, {module}_draft, {module}_send):
        run = WorkflowRun({cls}, goal="Tell Ada her order ships", params=PARAMS)
        run.run({module}_draft, ActivityEnvironment(model=FakeModel(["Hi Ada, it ships today."])))
        assert (run.status, run.node) == ("waiting", "REVIEW")
        run.approve(by="bob")
        run.complete({module}_send, Sent(message_id="m-1"))
    assert run.result == {{"message_id": "m-1", "text": "Hi Ada, it ships today."}}


def test_a_rejected_draft_is_never_sent():
    with registered({cls}, {module}_draft, {module}_send):
        run = WorkflowRun({cls}, goal="Tell Ada", params=PARAMS)
        run.complete({module}_draft, Draft(text="Hi"))
        run.reject(by="bob", comment="too short")
    assert (run.status, run.reason) == ("failed", "Rejected by bob.")
'''

README = '''# {kind}

An agentops agent kind (docs/authoring.md of agentops, "A kind as a package").

    pip install -e .            # into the environment agentops runs in: registers the kind
    python -m pytest            # the unit tests: the test kit, no database
    python manage.py agent launch {kind} --goal "..." --param recipient=ada@example.com
'''


def write_skeleton(kind: str, into: Path) -> Path:
    """Write the project of kind ``kind`` as ``into/<kind>``; returns its folder. Refuses a bad
    name or a folder that already exists (InvalidInput), writing nothing."""
    if not KIND_PATTERN.match(kind):
        raise InvalidInput(f"Kind {kind!r} must be 1–60 lowercase letters, digits, underscores or hyphens, starting "
                           "with a letter, e.g. followup.")
    module = kind.replace("-", "_")
    if not module.isidentifier():
        raise InvalidInput(f"Kind {kind!r} does not make a Python package name ({module!r}).")
    root = into / kind
    if root.exists():
        raise InvalidInput(f"{root} already exists; choose another --dir or remove it.")
    if not into.is_dir():
        raise InvalidInput(f"--dir {into} is not a folder.")
    names = {"kind": kind, "module": module, "cls": "".join(p.capitalize() for p in module.split("_"))}
    files = {
        "pyproject.toml": PYPROJECT, "README.md": README, f"{module}/__init__.py": INIT,
        f"{module}/activities.py": ACTIVITIES, f"{module}/definition.py": DEFINITION,
        f"{module}/offline_answers.json": OFFLINE_ANSWERS, f"tests/test_{module}.py": TEST,
    }
    for path, template in files.items():
        target = root / path
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_text(template.format(**names), encoding="utf-8")
    return root
