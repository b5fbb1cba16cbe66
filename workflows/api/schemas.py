"""Typed request and response bodies: they generate the OpenAPI document, so every limit a service
checks is stated here too (lengths, ranges, enums, precision), and a value of the wrong type is
refused, never coerced (``"priority": "5"`` and ``true`` are errors, as is a budget with more
decimal places than the column keeps). The services check again: the command line and the admin
reach them without these schemas."""
from __future__ import annotations

import re
from decimal import Decimal
from typing import TYPE_CHECKING, Annotated, Any, Literal

from ninja import Field, Path, Schema
from pydantic import BeforeValidator, ConfigDict, StrictFloat, StrictInt, StringConstraints, WithJsonSchema

from workflows.models import Schedule, ScheduleOccurrence, Wait, Workflow
from workflows.models.steering import MAX_STEER_CHARS
from workflows.selectors import MAX_ID
from workflows.services.labels import LABEL_KEY, LABEL_VALUE, MAX_LABELS
from workflows.services.launch_options import HELP
from workflows.services.launch_options import MODEL_NAME as MODEL_NAME_RE
from workflows.services.steps import MAX_GOAL_CHARS, MAX_HOURS, Outcome

# Text a person wrote: no control characters but tab and line breaks (PostgreSQL cannot store NUL).
TEXT = r"^[^\x00-\x08\x0b\x0c\x0e-\x1f]*$"
KIND = r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,59}$"
MODEL_NAME = rf"^({MODEL_NAME_RE.pattern})?$"  # or empty: none
# What str.strip() removes, spelt out: JSON Schema's (ECMA) \s and Python's differ (U+0085).
SPACE = r"\x00-\x20\x7f\x85\xa0\u1680\u2000-\u200a\u2028\u2029\u202f\u205f\u3000"
# Text with something in it besides spaces (the services strip it and refuse it empty).
FILLED_TEXT = rf"^[^\x00-\x08\x0b\x0c\x0e-\x1f]*[^{SPACE}][^\x00-\x08\x0b\x0c\x0e-\x1f]*$"
SIGNAL_NAME = rf"^[^{SPACE}][^\x00-\x1f\x7f]{{0,99}}$"
DEDUPE_KEY = r"^[^\x00-\x1f\x7f]{0,200}$"

if TYPE_CHECKING:
    StatusName = str
else:  # an enum in the document, from the model's choices
    StatusName = Literal[tuple(Workflow.Status.values)]


# A budget as the column keeps it (12 digits, 4 after the point): positive, under 10^8, at most 4
# decimal places, as a JSON number or a decimal string. Stated in the document as JSON Schema can
# (multipleOf, a pattern), and checked exactly by pydantic (max_digits, decimal_places).
AMOUNT_SCHEMA: dict[str, Any] = {"anyOf": [
    {"type": "number", "exclusiveMinimum": 0, "exclusiveMaximum": 100_000_000, "multipleOf": 0.0001},
    {"type": "string", "pattern": r"^(?=.*[1-9])[0-9]{1,8}(\.[0-9]{1,4})?$"},
]}
AMOUNT_TEXT = re.compile(AMOUNT_SCHEMA["anyOf"][1]["pattern"])


def amount_as_given(value: Any) -> Any:
    """A decimal string exactly as the document states it ("12.50"; not " 1", "+1", "1e2" or "1.00000"),
    a number that is not a boolean; pydantic then checks the range and the precision."""
    if isinstance(value, bool) or (isinstance(value, str) and not AMOUNT_TEXT.fullmatch(value)):
        raise ValueError("must be a positive amount of USD under 10^8 with at most 4 decimal places, as a number or "
                         "a decimal string such as \"12.50\"")
    return value


Amount = Annotated[Decimal, BeforeValidator(amount_as_given), WithJsonSchema(AMOUNT_SCHEMA)]


def amount(description: str) -> Any:
    return Field(default=None, gt=0, lt=10**8, max_digits=12, decimal_places=4, description=description,
                 examples=["12.50"])


LabelKey = Annotated[str, StringConstraints(pattern=f"^{LABEL_KEY}$")]
LabelValue = Annotated[str, StringConstraints(pattern=f"^{LABEL_VALUE}$")]
# `?label=team=infra`: the filter's one value, as `--label` takes it.
LABEL_PAIR = f"^{LABEL_KEY}={LABEL_VALUE}$"
LABELS_DESCRIPTION = (f"labels to find and count it by, at most {MAX_LABELS}: a key of 1–63 lowercase letters, digits, "
                      "_ and -, starting with a letter; a value of 1–128 letters, digits and . _ - : / @ +")


def labels_field() -> Any:
    # additionalProperties false: a key outside the pattern is refused, as the document then says.
    return Field(default_factory=dict, max_length=MAX_LABELS, description=LABELS_DESCRIPTION,
                 examples=[{"team": "infra", "env": "prod"}], json_schema_extra={"additionalProperties": False})


# A workflow's id in a path: every router's routes take it the same way.
WORKFLOW_ID = Path(..., ge=1, le=MAX_ID, description="the workflow's id", examples=[7])


class Body(Schema):
    # A misspelt optional field is an error, not a silent default.
    model_config = ConfigDict(extra="forbid")


class LaunchIn(Body):
    kind: str = Field(pattern=KIND, description="workflow kind, e.g. release", examples=["release"])
    goal: str = Field(min_length=1, max_length=MAX_GOAL_CHARS, pattern=FILLED_TEXT,
                      description="what the agent should achieve", examples=["Publish release notes"])
    params: dict[str, str] = Field(default_factory=dict, description=(
        "launch parameters, as `--param KEY=VALUE`: text each kind's declaration reads by type and range "
        "(its schema: GET /api/kinds, or `LaunchParams_<kind>` in this document's components)"),
                                   examples=[{"repo": "/srv/repo", "test_command": "make test"}])
    # The launch options (workflows.services.LaunchOptions), as the document states them.
    max_hours: StrictFloat | StrictInt | None = Field(default=None, gt=0, le=MAX_HOURS, description=HELP["max_hours"])
    budget_total_usd: Amount | None = amount(HELP["budget_total_usd"])
    budget_hourly_usd: Amount | None = amount(HELP["budget_hourly_usd"])
    priority: StrictInt = Field(default=5, ge=0, le=10, description=HELP["priority"])
    stagnation_policy: Literal[tuple(Workflow.StagnationPolicy.values)] = Field(  # type: ignore[valid-type]
        default=Workflow.StagnationPolicy.RECORD, description=HELP["stagnation_policy"])
    release_policy: Literal[("", *Workflow.ReleasePolicy.values)] = Field(  # type: ignore[valid-type]
        default="", description=HELP["release_policy"])
    fallback_model: str = Field(default="", pattern=MODEL_NAME, max_length=120, description=HELP["fallback_model"],
                                examples=["claude-haiku-4-5"])
    labels: dict[LabelKey, LabelValue] = labels_field()


class ApproveIn(Body):
    candidate_hash: str = Field(max_length=64, examples=["9f1c" + "0" * 60],
                                description="SHA-256 of the candidate you reviewed (from the workflow's waits)")
    comment: str = Field(default="", max_length=5000, pattern=TEXT, examples=["Read it; fine."])


class RejectIn(Body):
    comment: str = Field(default="", max_length=5000, pattern=TEXT)


class SignalIn(Body):
    name: str = Field(pattern=SIGNAL_NAME, description="the event's name", examples=["ci.done"])
    payload: Any = Field(default=None, description="any JSON value (no NUL character in its strings), under 1 MB",
                         examples=[{"build": 812, "passed": True}])
    dedupe_key: str = Field(default="", pattern=DEDUPE_KEY, max_length=200, description=(
        "a repeated key is delivered once; at most 200 characters, not starting with 'auto-' or 'webhook:' "
        "(reserved for keyless signals and for signed webhook deliveries)"), examples=["build-812"])


class SupersedeIn(Body):
    goal: str = Field(min_length=1, max_length=MAX_GOAL_CHARS, pattern=FILLED_TEXT,
                      description="the new goal; it becomes the next intent version")


class SteerIn(Body):
    message: str = Field(min_length=1, max_length=MAX_STEER_CHARS, pattern=FILLED_TEXT, description=(
        "what to tell the agent: its next model call receives it as a user turn (the goal stays)"),
                         examples=["Also update the changelog."])
    dedupe_key: str = Field(default="", pattern=DEDUPE_KEY, max_length=200, description=(
        "a repeated key is one message: the second send answers already_applied and changes nothing"),
                            examples=["changelog-1"])


# Node visits are a PositiveIntegerField: PostgreSQL's integer.
MAX_VISIT = 2**31 - 1


def whole_number(value: Any) -> int:
    """A JSON number without a fraction (JSON Schema's integer: 4 and 4.0 alike), never a boolean or a string."""
    if isinstance(value, bool) or not isinstance(value, int | float) or (
            isinstance(value, float) and not value.is_integer()):
        raise ValueError("must be a whole number, e.g. 4")
    return int(value)


WholeNumber = Annotated[int, BeforeValidator(whole_number)]


class PriorityIn(Body):
    priority: WholeNumber = Field(ge=0, le=10, description="0–10; 9 and above may pass the hourly budget",
                                  examples=[9])


class ForkIn(Body):
    from_visit: WholeNumber = Field(ge=1, le=MAX_VISIT, description=(
        "how many node visits of the original to reuse (1 to its current visit minus one); the fork starts at "
        "visit from_visit + 1"), examples=[4])


class CancelIn(Body):
    reason: str = Field(default="", max_length=2000, pattern=TEXT)


class PauseIn(Body):
    reason: str = Field(default="", max_length=2000, pattern=TEXT,
                        description="why, recorded on the workflow and in its history", examples=["investigating"])


class BudgetIn(Body):
    """One of the two, or both; a limit cannot be removed (null is refused)."""
    model_config = ConfigDict(extra="forbid", json_schema_extra={
        "anyOf": [{"required": ["total_usd"]}, {"required": ["hourly_usd"]}]})
    total_usd: Amount = amount("the new total budget (USD, at most 4 decimal places)")
    hourly_usd: Amount = amount("the new hourly budget (USD, at most 4 decimal places)")


class WebhookIn(Schema):
    payload: Any = Field(default=None, description="becomes the signal's payload")


class ErrorOut(Schema):
    error: str = Field(description="what went wrong and what to do next; nothing was changed",
                       examples=["Workflow 7 does not exist; GET /api/workflows lists the existing ones."])


class Open(Schema):
    # Answers may gain keys (a kind's `show` extras): clients ignore the ones they do not know.
    model_config = ConfigDict(extra="allow")


class LaunchOut(Schema):
    id: int = Field(examples=[7])
    kind: str = Field(examples=["release"])
    status: StatusName = Field(examples=["running"])


class ReleaseOut(Schema):
    provider: str
    model: str
    prompt_version: str


class WorkflowOut(Open):
    """``agent list --json``: one workflow, without nested lists."""
    id: int
    kind: str
    status: StatusName
    current_node: str
    intent_version: int
    goal: str
    release: ReleaseOut
    fallback_model: str
    labels: dict[str, str] = Field(description="its launch labels, key to value")
    reason: str
    pause_cause: str
    handler_failures: int
    advance_retry_at: str | None
    deadline: str | None
    created_at: str
    updated_at: str


class WaitOut(Open):
    id: int
    kind: Literal[tuple(Wait.Kind.values)]  # type: ignore[valid-type]
    status: Literal[tuple(Wait.Status.values)]  # type: ignore[valid-type]
    node: str
    candidate_hash: str
    required_role: str
    intent_version: int
    expires_at: str | None
    decision: str
    decided_by: str | None
    candidate: Any = Field(description="an open approval's candidate (what candidate_hash is of); else null")
    state_versions: dict[str, Any] | None = Field(description="an open approval's state versions; else null")


class EventOut(Schema):
    seq: int = Field(examples=[12])
    kind: str = Field(examples=["wait.opened"])
    at: str
    data: dict[str, Any]


class ParentOut(Schema):
    id: int = Field(examples=[7])
    kind: str = Field(examples=["harness"])
    operation_id: str = Field(description="the child's operation id in its parent", examples=["wf-7/WORK.3/i1/1"])


class ChildOut(Schema):
    id: int = Field(examples=[8])
    kind: str = Field(examples=["reviewer"])
    status: StatusName = Field(examples=["running"])
    operation_id: str = Field(description="its operation id in this workflow", examples=["wf-7/WORK.3/i1/1"])
    budget_total_usd: str | None = Field(description="its budget, reserved from this workflow's; null: none")
    reason: str = Field(description="why it failed or was cancelled (cut at 300 characters)")


class SteerMessageOut(Schema):
    seq: int = Field(ge=1, examples=[1])
    text: str
    sender: str = Field(examples=["alice"])
    sent_at: str
    dedupe_key: str
    status: Literal["pending", "in_flight", "delivered"] = Field(description=(
        "pending: no model call took it yet; in_flight: a model call of a live activity took it; delivered: "
        "that activity succeeded"))
    operation_id: str | None = Field(description="the activity whose model call took it; null while pending")
    call: int | None = Field(description="that activity's model call (0, 1, …); null while pending")
    taken_at: str | None


class ForkOfOut(Schema):
    id: int
    from_visit: int | None
    status: StatusName


class WorkflowDetailOut(WorkflowOut):
    """``agent show --json``: the summary with waits (and their candidate hashes), activities, spend, events…"""
    params: dict[str, Any]
    result: Any
    waits: list[WaitOut]
    activities: list[dict[str, Any]] = Field(
        description="every activity not finished and the newest 50 finished ones, oldest first")
    activities_left_out: int = Field(ge=0, description="the older finished activities not listed")
    commitments: list[dict[str, Any]]
    signals_queued: list[dict[str, Any]]
    installation_id: str | None
    spend: dict[str, Any]
    progress: list[dict[str, Any]]
    events: list[EventOut]
    history_archive: dict[str, Any] | None
    retrying: list[dict[str, Any]] = Field(
        description="activities in a retry window: name, operation, failed attempt, of how many, next try, error")
    parent: ParentOut | None = Field(description="the workflow that started this one (ctx.child); else null")
    children: list[ChildOut] = Field(description="the child workflows it started, oldest first (at most 100)")
    steering: list[SteerMessageOut] = Field(description="its steer messages, oldest first")
    forked_from: int | None = Field(description="the workflow this one was forked from; null for a launch")
    forked_from_visit: int | None = Field(description="the original's node visits the fork reused (1 to N)")
    forks: list[ForkOfOut] = Field(description="forks made of this workflow, newest first (at most 20)")


class WorkflowPage(Schema):
    items: list[WorkflowOut]
    next_cursor: str | None = Field(description="pass as `cursor` for the next page; null on the last page")


class EventPage(Schema):
    items: list[EventOut]
    next_cursor: str | None = Field(description="pass as `cursor` for the next page; null when there are no "
                                                "more events yet (poll again with the last cursor)")


class ResultOut(Schema):
    """What signal, supersede, cancel, pause, resume, a priority change and a webhook delivery answer."""
    id: int
    outcome: Literal[tuple(o.value for o in Outcome)] = Field(examples=["applied"])  # type: ignore[valid-type]
    status: StatusName
    intent_version: int
    message: str


class SteerOut(Schema):
    """What a steer answers."""
    id: int
    outcome: Literal["applied", "already_applied"]
    status: StatusName
    seq: int = Field(ge=1, description="the message's place in the workflow's order")
    message: str


class ForkOut(Schema):
    """What a fork answers: the new workflow."""
    id: int
    kind: str
    status: StatusName
    current_node: str
    node_visit: int
    forked_from: int
    forked_from_visit: int


class DecisionOut(Schema):
    wait_id: int
    workflow_id: int
    outcome: Literal["applied", "already_applied"]
    message: str = Field(examples=["Wait 3 approved by alice."])


class BudgetOut(Schema):
    id: int
    status: StatusName
    spend: dict[str, Any]


DURATION = r"^([0-9]+|([0-9]+d)?([0-9]+h)?([0-9]+m)?([0-9]+s)?)$"


class ScheduleIn(Body):
    """`agent schedule add`: a cron or an interval (one of the two)."""
    name: str = Field(pattern=r"^[A-Za-z0-9_-]{1,80}$", description="the schedule's name", examples=["nightly"])
    kind: str = Field(pattern=KIND, description="workflow kind each occurrence launches", examples=["release"])
    goal: str = Field(min_length=1, max_length=MAX_GOAL_CHARS, pattern=FILLED_TEXT,
                      description="the goal of each launch", examples=["Check tonight's release"])
    params: dict[str, str] = Field(default_factory=dict, description="launch parameters, as `--param KEY=VALUE`")
    labels: dict[LabelKey, LabelValue] = labels_field()
    cron: str = Field(default="", max_length=120, pattern=r"^[0-9A-Za-z*/,\- ]*$",
                      description="five-field cron expression in UTC", examples=["0 3 * * *"])
    every: str = Field(default="", max_length=20, pattern=f"({DURATION[1:-1]})?",
                       description="or an interval from 10 s, e.g. 6h, 30m, 1h30m", examples=["6h"])
    overlap: Literal[tuple(Schedule.Overlap.values)] = Field(  # type: ignore[valid-type]
        default=Schedule.Overlap.SKIP, description="what an occurrence does while the previous run is live")
    catch_up: str = Field(default="0", max_length=20, pattern=DURATION,
                          description="missed occurrences up to this long ago still launch")
    jitter: str = Field(default="0", max_length=20, pattern=DURATION,
                        description="launch each occurrence up to this long after its time")


class OccurrenceOut(Schema):
    at: str
    outcome: Literal[tuple(ScheduleOccurrence.Outcome.values)]  # type: ignore[valid-type]
    workflow_id: int | None
    reason: str
    triggered_by: str | None


class ScheduleOut(Schema):
    """`agent schedule list --json` items."""
    name: str
    kind: str
    goal: str
    params: dict[str, Any]
    labels: dict[str, str]
    cron: str
    every_seconds: int | None
    when: str = Field(examples=["every 6h"])
    overlap: str
    catch_up_seconds: int
    jitter_seconds: int
    paused: bool
    created_by: str | None
    next_due_at: str
    buffered_at: str | None
    launched: int = Field(ge=0, description="occurrences that launched a workflow")
    last_occurrence: OccurrenceOut | None


class KindOut(Schema):
    kind: str = Field(examples=["release"])
    version: int = Field(ge=1)
    params_schema: dict[str, Any] | None = Field(
        description="JSON schema of its launch parameters (`params` of POST /api/workflows), or null: none")


class KindList(Schema):
    items: list[KindOut]


class ScheduleList(Schema):
    items: list[ScheduleOut] = Field(description="every schedule, by name (at most 200)")


class ScheduleRemovedOut(Schema):
    name: str
    removed: bool

