"""The values a node handler and the services exchange: what a handler decides (``Goto``,
``Complete``, ``Fail``), the commands a new step becomes (``ScheduleActivity``, ``OpenWait``,
``StartChild``), and the recorded steps and outcomes it is handed back on replay. Plain frozen
data: the engine (``workflows.engine``) makes and reads them, the services persist them."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, ClassVar, Protocol, TypeVar

O_co = TypeVar("O_co", covariant=True)



class ActivityRef(Protocol[O_co]):
    """What a handler passes to ``ctx.activity``: a registered activity (``registry.ActivityType``),
    seen only through what the engine needs of it, so the engine imports nothing of the registry."""

    name: str

    def encode_input(self, value: Any) -> Any: ...

    def decode_output(self, data: Any) -> O_co: ...



@dataclass(frozen=True)
class Goto:
    """Enter ``node`` next, merging ``updates`` into the workflow's durable state.

    With ``pause`` (a reason for people), the workflow pauses for a person once it entered
    ``node`` (pause cause ``definition``); ``manage.py agent resume`` runs ``node``'s handler.
    """

    node: str
    updates: dict[str, Any] = field(default_factory=dict)
    pause: str = ""



@dataclass(frozen=True)
class Complete:
    result: Any = None



@dataclass(frozen=True)
class Fail:
    reason: str



Decision = Goto | Complete | Fail



@dataclass(frozen=True)
class ScheduleActivity:
    operation_id: str
    name: str
    input: dict[str, Any]



@dataclass(frozen=True)
class OpenWait:
    operation_id: str
    kind: str
    expires_in_seconds: float | None
    candidate: Any = None
    candidate_hash: str = ""
    required_role: str = ""
    state_versions: dict[str, Any] = field(default_factory=dict)
    event_name: str = ""
    timeout_policy: str = "fail"
    children: tuple[str, ...] = ()  # a first-of wait's child waits (their operation ids), in the order given



@dataclass(frozen=True)
class StartChild:
    """Start a child workflow of ``child_kind`` (``ctx.child``); its end is recorded as the child
    wait ``operation_id``. Starting does not suspend the handler: only ``ctx.wait_children`` does."""

    operation_id: str
    child_kind: str
    goal: str
    params: dict[str, Any]
    budget_usd: str | None  # a decimal as text; None: what remains of the parent's total budget, if it has one

    kind: ClassVar[str] = "child"

    @property
    def name(self) -> str:
        return self.child_kind



Command = ScheduleActivity | OpenWait | StartChild



@dataclass(frozen=True)
class Suspended:
    """The handler needs steps that are not recorded yet; ``commands`` are the new ones.
    ``on_children``: it stopped at ``ctx.wait_children`` (the workflow waits, as at a wait)."""

    commands: tuple[Command, ...]
    on_children: bool = False



@dataclass(frozen=True)
class RecordedActivity:
    name: str
    status: str
    result: Any
    error: str



@dataclass(frozen=True)
class RecordedWait:
    kind: str
    status: str
    decision: str
    decided_by: str
    comment: str
    payload: Any
    name: str = ""  # an event wait's signal name; a child wait's child kind



@dataclass(frozen=True)
class WaitOutcome:
    """How a wait ended: ``status`` is satisfied or expired; approvals carry the decision."""

    status: str
    decision: str = ""
    decided_by: str = ""
    comment: str = ""
    payload: Any = None

    @property
    def approved(self) -> bool:
        return self.status == "satisfied" and self.decision == "approved"

    @property
    def expired(self) -> bool:
        return self.status == "expired"



@dataclass(frozen=True)
class Step:
    """One recorded step of a node visit, as histories list them (the test kit's runs, the replay check)."""

    operation_id: str
    node: str
    kind: str  # "activity", or the wait's kind: "approval", "event", "timer", "child", "first"
    name: str  # the activity's name, or the event's name
    status: str
    result: Any = None
    error: str = ""
    decision: str = ""
    decided_by: str = ""
    comment: str = ""
    input: Any = None  # an activity's input as stored at scheduling (JSON); None where not recorded

    @property
    def label(self) -> str:
        if self.kind == "activity":
            return f"activity {self.name!r}"
        return f"{self.kind} wait" + (f" {self.name!r}" if self.name else "")

    @property
    def seq(self) -> int:
        """Its position among the steps its handler asked for (the last part of its operation id)."""
        return int(self.operation_id.rsplit("/", 1)[-1])



@dataclass(frozen=True)
class ChildHandle:
    """A child workflow a handler started (``ctx.child``); pass it to ``ctx.wait_children``."""

    operation_id: str
    kind: str



@dataclass(frozen=True)
class ChildOutcome:
    """How a child workflow ended: ``status`` is completed, failed or cancelled; ``result`` is
    its result when completed, ``reason`` why it failed or was cancelled."""

    workflow_id: int
    kind: str
    status: str
    result: Any = None
    reason: str = ""

    @property
    def completed(self) -> bool:
        return self.status == "completed"



FIRST_SOURCES = ("signal", "child", "timer")



@dataclass(frozen=True)
class FirstOutcome:
    """Which source ended a ``ctx.wait_first``: ``won`` is signal, child or timer. ``payload`` is
    the signal's payload when the signal won; ``child`` the winning child's outcome (and
    ``operation_id`` its handle's) when a child's end won."""

    won: str
    payload: Any = None
    child: ChildOutcome | None = None
    operation_id: str = ""

    @property
    def signalled(self) -> bool:
        return self.won == "signal"

    @property
    def timed_out(self) -> bool:
        return self.won == "timer"



def child_outcome_of(payload: Any, kind: str, status: str = "") -> ChildOutcome:
    """The ``ChildOutcome`` a child wait's payload records (``children.child_outcome``)."""
    payload = payload if isinstance(payload, dict) else {}
    return ChildOutcome(workflow_id=int(payload.get("workflow_id") or 0), kind=kind,
                        status=str(payload.get("status") or status), result=payload.get("result"),
                        reason=str(payload.get("reason") or ""))



def first_outcome_of(payload: Any) -> FirstOutcome:
    """The ``FirstOutcome`` a settled first-of wait's payload records (``races.first_wait_settle``)."""
    payload = payload if isinstance(payload, dict) else {}
    won = str(payload.get("won") or "")
    if won == "child":
        return FirstOutcome(won=won, child=child_outcome_of(payload.get("child"), str(payload.get("kind") or "")),
                            operation_id=str(payload.get("operation_id") or ""))
    return FirstOutcome(won=won, payload=payload.get("payload"))
