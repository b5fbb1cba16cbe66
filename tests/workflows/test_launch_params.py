"""A kind's launch parameters are declared once (``WorkflowDefinition.launch_params``, a pydantic
model): the declaration validates a launch by type and range, prints the parameters in
``agent launch --help`` and is the JSON schema an interface can show."""
from __future__ import annotations

import subprocess
import sys
from collections.abc import Iterator
from decimal import Decimal
from pathlib import Path

import pytest
from pydantic import Field

from agentops.agents.harness.definition import Harness
from tests.conftest import one_event_kind
from workflows import engine, registry, services
from workflows.errors import InvalidInput
from workflows.models import Workflow
from workflows.params import LaunchParams, params_help, params_validated
from workflows.testing import registered

REPO_ROOT = Path(__file__).resolve().parents[2]
KIND = "test-launch-params"


class Greeting(LaunchParams):
    name: str = Field(description="who to greet")
    times: int = Field(1, ge=1, le=10, description="how often")
    loud: bool = Field(False, description="shout it")


class Greet(engine.WorkflowDefinition):
    """A plug-in kind that declares its parameters and adds no checks of its own."""

    kind = KIND
    start_node = "GREET"
    revalidate_node = "GREET"
    launch_params = Greeting

    @engine.node("GREET")
    def greet(self, ctx: engine.NodeContext) -> engine.Decision:
        return engine.Complete({"said": [ctx.params["name"]] * ctx.params["times"], "loud": ctx.params["loud"]})


@pytest.fixture
def greet_registered(rung: object) -> Iterator[None]:
    with registered(Greet):
        yield


@pytest.mark.django_db
@pytest.mark.usefixtures("greet_registered")
def test_declared_parameters_are_read_by_type_with_their_defaults() -> None:
    """Text from ``--param KEY=VALUE`` is read as its declared type; a missing one takes its default."""
    workflow = services.workflow_launch(kind=KIND, goal="g", params={"name": " Ada ", "times": "2"})
    assert workflow.params == {"name": "Ada", "times": 2, "loud": False}
    assert (workflow.status, workflow.result) == ("completed", {"said": ["Ada", "Ada"], "loud": False})


@pytest.mark.django_db
@pytest.mark.usefixtures("greet_registered")
@pytest.mark.parametrize(("params", "message"), [
    ({}, r"^Parameter name is required \(who to greet\): --param name=VALUE\.$"),
    ({"name": "Ada", "times": "many"}, r"^Parameter times must be a number: --param times=1\.$"),
    ({"name": "Ada", "times": "2.5"}, r"^Parameter times must be a number: --param times=1\.$"),
    ({"name": "Ada", "times": 2.5}, r"^Parameter times=2\.5 must be a whole number\.$"),
    ({"name": "Ada", "times": "11"}, r"^Parameter times=11 must be between 1 and 10: how often\.$"),
    ({"name": "Ada", "loud": "perhaps"}, r"^Parameter loud='perhaps': input should be a valid boolean"),
    ({"name": 5}, r"^Parameter name=5: input should be a valid string\.$"),
    ({"name": "Ada", "colour": "red"}, r"^Unknown parameter\(s\) colour for kind 'test-launch-params'; "
                                       r"allowed: name, times, loud\.$"),
], ids=["missing", "not-a-number", "not-whole-text", "not-whole", "out-of-range", "not-a-bool", "not-text",
        "unknown"])
def test_a_parameter_that_does_not_fit_its_declaration_is_refused_and_nothing_is_written(
    params: dict[str, object], message: str
) -> None:
    with pytest.raises(InvalidInput, match=message):
        services.workflow_launch(kind=KIND, goal="g", params=params)
    assert not Workflow.objects.exists()


def test_the_declaration_is_the_json_schema_an_interface_shows() -> None:
    schema = registry.launch_params_schema("release")
    assert schema is not None
    assert schema["required"] == ["repo", "test_command"]
    assert schema["additionalProperties"] is False
    hours = schema["properties"]["approval_expiry_hours"]
    assert (hours["type"], hours["exclusiveMinimum"], hours["maximum"], hours["default"]) == ("number", 0, 8760, 24.0)
    assert schema["properties"]["repo"]["description"] == "path of the git repository to change and deploy"


def test_a_kind_without_parameters_has_no_schema_and_refuses_any() -> None:
    kind = one_event_kind("test-launch-params-none")
    with registered(kind):
        assert registry.launch_params_schema("test-launch-params-none") is None
        with pytest.raises(InvalidInput, match="takes no parameters"):
            kind().validate_params({"x": 1})


def test_the_harness_defaults_come_from_its_declaration() -> None:
    assert Harness().validate_params({})["session_max_tokens"] == 400_000
    assert Harness().validate_params({"max_sessions": "7"})["max_sessions"] == 7


def test_agent_launch_help_lists_every_kinds_parameters_from_their_declarations() -> None:
    done = subprocess.run([sys.executable, "manage.py", "agent", "launch", "--help"], cwd=REPO_ROOT,
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    lines = [line.strip() for line in done.stdout.splitlines()]
    assert "release:" in lines and "autonomous:" in lines and "harness:" in lines
    assert "--param repo=TEXT (required): path of the git repository to change and deploy" in lines
    assert ("--param approval_expiry_hours=NUMBER (default 24, more than 0, at most 8760): hours an approval stays "
            "open") in lines
    assert ("--param max_rounds=INT (default 3, 0 to 1000000): adaptation rounds at most; 0: no cap (the time limit "
            "and the budget bound the run)") in lines
    assert "--param max_sessions=INT (default 40, 1 to 1000): coding sessions at most" in lines


class Spend(LaunchParams):
    budget: Decimal = Field(Decimal("0.50"), gt=0, le=1000, description="what a run may spend")
    ratio: float = Field(0.5, gt=0, lt=1)
    floor: int = Field(0, ge=0)
    tags: list[str] = Field(default_factory=list, description="labels")


@pytest.mark.parametrize(("params", "message"), [
    ({"budget": "0"}, r"^Parameter budget=0 must be more than 0 and at most 1000: what a run may spend\.$"),
    ({"ratio": "1"}, r"^Parameter ratio=1 must be more than 0 and less than 1\.$"),
    ({"floor": "-1"}, r"^Parameter floor=-1 must be at least 0\.$"),
])
def test_a_bound_reads_as_a_person_says_it(params: dict[str, str], message: str) -> None:
    with pytest.raises(InvalidInput, match=message):
        params_validated("test-spend", Spend, params)


def test_help_shows_defaults_as_they_are_typed() -> None:
    assert params_help(Spend) == [
        "budget=NUMBER (default 0.50, more than 0, at most 1000): what a run may spend",
        "ratio=NUMBER (default 0.5, more than 0, less than 1)",
        "floor=INT (default 0, at least 0)",
        "tags=JSON (default []): labels",
    ]
