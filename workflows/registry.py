"""Registries of workflow definitions (by kind) and activity types (by name).

Both fill at import time: a kind's package registers its definition with
``@register_definition`` and its activities with ``@activity``; the kernel imports the
packages listed in AGENTOPS_AGENT_MODULES when Django starts. A definition or activity that
is wrong in a way a reader could see fails there, with ``DefinitionError``, not in production.
"""
from __future__ import annotations

import dataclasses
import re
import typing
from collections.abc import Callable
from functools import cached_property, update_wrapper
from typing import Any, Generic, TypeVar, overload

from django.conf import settings
from django.core.exceptions import ImproperlyConfigured

from workflows import codec
from workflows.activity_context import ActivityContext
from workflows.engine import WorkflowDefinition
from workflows.errors import InvalidInput
from workflows.params import params_help

I = TypeVar("I")  # noqa: E741  (the input type of an activity)
O = TypeVar("O")  # noqa: E741  (its result type)

KIND_PATTERN = re.compile(r"^[a-z][a-z0-9_-]{0,59}$")
NAME_MAX_LENGTH = 100  # Activity.name
NODE_MAX_LENGTH = 60  # Workflow.current_node


class DefinitionError(ImproperlyConfigured):
    """A workflow definition or activity that cannot run as written; raised when it registers."""


@dataclasses.dataclass(frozen=True)
class RetryPolicy:
    """How an activity is retried: attempts, exponential backoff, errors never retried."""

    max_attempts: int = 5
    initial_interval_seconds: float = 1.0
    backoff: float = 2.0
    max_interval_seconds: float = 300.0
    non_retryable: tuple[type[BaseException], ...] = ()

    def delay_after(self, attempt: int) -> float:
        """Seconds to wait before attempt number ``attempt + 1``."""
        return min(self.initial_interval_seconds * self.backoff ** max(attempt - 1, 0), self.max_interval_seconds)


@dataclasses.dataclass(frozen=True)
class CompensationInput:
    """What a compensation activity receives: the operation it undoes, the commitment's data (the
    result, or ``{"uncertain": true}`` for an attempt that never reported), the idempotency key
    that operation sent (empty when it was scheduled before installations had ids: it sent its
    operation id; ``sent_key`` gives the one to use either way), the **input** the operation was
    given and its **result** (None when it never recorded one), so an uncertain effect can be
    found and undone by what was asked for. Compensations scheduled before these fields existed
    get None for both."""

    operation_id: str
    data: dict[str, Any]
    idempotency_key: str = ""
    input: Any = None
    result: Any = None

    @property
    def uncertain(self) -> bool:
        """Whether the undone attempt never reported: its effect may or may not exist."""
        return self.result is None and self.data == {"uncertain": True}

    @property
    def sent_key(self) -> str:
        """The idempotency key the undone operation sent out."""
        return self.idempotency_key or self.operation_id


class ActivityType(Generic[I, O]):
    """A registered activity. A handler calls it by reference, ``ctx.activity(deploy, DeployInput(...))``;
    a test may call it directly, ``deploy(ctx, DeployInput(...))``."""

    def __init__(
        self, fn: Callable[[ActivityContext, I], O], *, name: str, retry: RetryPolicy,
        lease_seconds: int | str | None,
        reconcile: Callable[[ActivityContext, I], O | None] | None, commitment: str,
        compensation: ActivityType[Any, Any] | str, records_progress: bool, io_bound: bool = False,
    ) -> None:
        self.fn = fn
        self.name = name
        self.retry = retry
        self._lease_seconds = lease_seconds
        self.reconcile = reconcile
        self.commitment = commitment
        self._compensation = compensation
        self.records_progress = records_progress
        self.io_bound = io_bound
        update_wrapper(self, fn)

    def __call__(self, ctx: ActivityContext, input: I) -> O:
        return self.fn(ctx, input)

    def __repr__(self) -> str:
        return f"<activity {self.name}>"

    @property
    def lease_seconds(self) -> int | None:
        """Seconds a lease of this activity lasts between heartbeats; None for AGENTOPS_LEASE_SECONDS.
        Declared as a number, or as the name of a setting read when the lease is granted
        (``lease_seconds="AGENTOPS_MODEL_CALL_LEASE_SECONDS"``)."""
        if isinstance(self._lease_seconds, str):
            return int(getattr(settings, self._lease_seconds))
        return self._lease_seconds

    @property
    def compensation(self) -> str:
        """The name of the activity that undoes this one's commitment ('' when none)."""
        c = self._compensation
        return c if isinstance(c, str) else c.name

    @cached_property
    def _types(self) -> tuple[Any, Any]:
        hints = typing.get_type_hints(self.fn)
        params = [p for p in self.fn.__code__.co_varnames[: self.fn.__code__.co_argcount]]
        input_type = hints.get(params[1], Any) if len(params) > 1 else Any
        return input_type, hints.get("return", Any)

    @property
    def input_type(self) -> Any:
        return self._types[0]

    @property
    def output_type(self) -> Any:
        return self._types[1]

    def problems(self) -> list[str]:
        """What stops this activity from running, for the start-up check; empty when nothing."""
        try:
            input_type, output_type = self._types
        except NameError as exc:
            return [f"activity {self.name!r}: its type annotations do not resolve ({exc})"]
        found = []
        if self.fn.__code__.co_argcount != 2:
            found.append(f"activity {self.name!r} must take (ctx, input); it takes "
                         f"{self.fn.__code__.co_argcount} positional parameter(s)")
        for what, tp in (("input", input_type), ("result", output_type)):
            if not codec.supported(tp):
                found.append(f"activity {self.name!r}: its {what} type {tp!r} is not a dataclass, TypedDict or dict")
        if self.compensation and self.compensation not in _activities:
            found.append(f"activity {self.name!r} names compensation {self.compensation!r}, which is not registered")
        if self.commitment and not self.compensation:
            found.append(f"activity {self.name!r} makes a {self.commitment!r} commitment but names no compensation")
        return found

    def encode_input(self, value: Any) -> Any:
        """The JSON of an input a handler passes; refuses a value of another type than declared
        (TypeError), or one whose fields do not fit their types (InvalidInput): both are bugs of
        the definition, which its failure boundary records before anything is scheduled."""
        tp = self.input_type
        if isinstance(tp, type) and dataclasses.is_dataclass(tp) and not isinstance(value, tp):
            raise TypeError(f"Activity {self.name!r} takes a {tp.__name__}; the handler passed "
                            f"{type(value).__name__}.")
        codec.check(value, what=f"The input of activity {self.name}")
        return codec.to_json(value)

    def encode_output(self, value: Any) -> Any:
        """The JSON of a result the activity returned; InvalidInput (the attempt fails, not
        retried) for a dataclass whose fields do not fit their types."""
        codec.check(value, what=f"The result of activity {self.name}")
        return codec.to_json(value)

    def decode_input(self, data: Any) -> Any:
        return codec.from_json(self.input_type, data, what=f"The input of activity {self.name}")

    def decode_output(self, data: Any) -> O:
        decoded: O = codec.from_json(self.output_type, data, what=f"The recorded result of activity {self.name}")
        return decoded

    def execute(self, ctx: ActivityContext, input_json: Any) -> Any:
        """Run the activity on its recorded input; the result as JSON."""
        return self.encode_output(self.fn(ctx, self.decode_input(input_json)))

    def reconcile_json(self, ctx: ActivityContext, input_json: Any) -> Any:
        """Ask the outside world whether a lost attempt took effect: its result as JSON, or None."""
        if self.reconcile is None:
            return None
        found = self.reconcile(ctx, self.decode_input(input_json))
        return None if found is None else self.encode_output(found)


_definitions: dict[str, type[WorkflowDefinition]] = {}
_activities: dict[str, ActivityType[Any, Any]] = {}

D = TypeVar("D", bound="type[WorkflowDefinition]")


def register_definition(cls: D) -> D:
    """Register a workflow definition under its ``kind``; raises DefinitionError when it cannot run."""
    problems = definition_problems(cls)
    if problems:
        raise DefinitionError(f"Workflow definition {cls.__module__}.{cls.__qualname__} cannot be registered: "
                              + "; ".join(problems) + ".")
    if cls.kind in _definitions and _definitions[cls.kind] is not cls:
        other = _definitions[cls.kind]
        raise DefinitionError(f"Workflow kind {cls.kind!r} is registered twice: by {other.__module__}."
                              f"{other.__qualname__} and by {cls.__module__}.{cls.__qualname__}.")
    _definitions[cls.kind] = cls
    return cls


def definition_problems(cls: type[WorkflowDefinition]) -> list[str]:
    """What stops a definition from running; empty when nothing."""
    found = []
    kind = getattr(cls, "kind", None)
    if not isinstance(kind, str) or not KIND_PATTERN.match(kind):
        found.append(f"kind {kind!r} must be 1–60 lowercase letters, digits, underscores or hyphens, "
                     "starting with a letter")
    version = getattr(cls, "version", None)
    if not isinstance(version, int) or version < 1:
        found.append(f"version {version!r} must be a whole number from 1")
    nodes = cls.nodes
    if not nodes:
        found.append("it has no nodes: mark each handler with @node(\"NAME\")")
    for name in nodes:
        if not 0 < len(name) <= NODE_MAX_LENGTH:
            found.append(f"node name {name!r} must be 1–{NODE_MAX_LENGTH} characters")
    for attr in ("start_node", "revalidate_node", "adapt_node"):
        value = getattr(cls, attr, "")
        if (value or attr != "adapt_node") and value not in nodes:
            found.append(f"{attr} {value!r} is not one of its nodes ({', '.join(nodes) or 'none'})")
    hours = cls.default_max_hours
    if hours is not None and not (isinstance(hours, int | float) and hours > 0):
        found.append(f"default_max_hours {hours!r} must be a positive number of hours or None")
    return found


def definition(kind: str) -> WorkflowDefinition:
    try:
        return _definitions[kind]()
    except KeyError:
        known = ", ".join(sorted(_definitions)) or "none"
        raise InvalidInput(f"Unknown workflow kind {kind!r}; known kinds: {known}.", kind=kind) from None


def definition_kinds() -> list[str]:
    return sorted(_definitions)


def definitions() -> list[type[WorkflowDefinition]]:
    return [_definitions[kind] for kind in sorted(_definitions)]


def launch_params_schema(kind: str) -> dict[str, Any] | None:
    """The JSON schema of a kind's launch parameters (``WorkflowDefinition.launch_params``), for
    an interface to show (an OpenAPI document, a form); None for a kind that takes none."""
    model = definition(kind).launch_params
    return None if model is None else model.model_json_schema()


def launch_params_help() -> str:
    """The launch parameters of every registered kind, for ``agent launch --help``."""
    blocks = []
    for cls in definitions():
        lines = params_help(cls.launch_params) if cls.launch_params is not None else ["(no parameters)"]
        blocks.append("\n".join([f"{cls.kind}:", *(f"  --param {line}" for line in lines)]))
    return "launch parameters by kind:\n" + "\n".join(blocks)


def activity_types() -> list[ActivityType[Any, Any]]:
    return [_activities[name] for name in sorted(_activities)]


@overload
def activity(fn: Callable[[ActivityContext, I], O], /) -> ActivityType[I, O]: ...


@overload
def activity(
    name: str | None = None, /, *, retry: RetryPolicy | None = None, lease_seconds: int | str | None = None,
    reconcile: Callable[[ActivityContext, Any], Any] | None = None, commitment: str = "",
    compensation: ActivityType[Any, Any] | str = "", records_progress: bool = False, io_bound: bool = False,
) -> Callable[[Callable[[ActivityContext, I], O]], ActivityType[I, O]]: ...


def activity(
    fn_or_name: Any = None, /, *, retry: RetryPolicy | None = None, lease_seconds: int | str | None = None,
    reconcile: Callable[[ActivityContext, Any], Any] | None = None, commitment: str = "",
    compensation: ActivityType[Any, Any] | str = "", records_progress: bool = False, io_bound: bool = False,
) -> Any:
    """Register an activity: ``fn(ctx, input) -> result``, one input object and one result.

    Its name is the function's name unless given (``@activity("deploy", ...)``); the name is
    stored with every recorded step, so keep it when renaming the function. ``reconcile(ctx,
    input)`` asks the outside world whether a lost attempt took effect; ``commitment`` with
    ``compensation`` makes each success an obligation that a cancel undoes; ``records_progress``
    stores the result's ``progress`` object as a progress sample. ``lease_seconds`` is a number
    or the name of a setting (read when each lease is granted). ``io_bound`` says the activity
    spends its time waiting (a model's answer, a tool, a remote system): its doorbells go to the
    I/O queue (AGENTOPS_IO_QUEUE), which a threads-pool worker keeps hundreds of in flight.
    """

    def register(fn: Callable[[ActivityContext, I], O]) -> ActivityType[I, O]:
        name = fn_or_name if isinstance(fn_or_name, str) else fn.__name__
        if not 0 < len(name) <= NAME_MAX_LENGTH:
            raise DefinitionError(f"Activity name {name!r} must be 1–{NAME_MAX_LENGTH} characters.")
        spec = ActivityType(fn, name=name, retry=retry or RetryPolicy(), lease_seconds=lease_seconds,
                            reconcile=reconcile, commitment=commitment, compensation=compensation,
                            records_progress=records_progress, io_bound=io_bound)
        register_activity(spec)
        return spec

    if callable(fn_or_name):
        return register(fn_or_name)
    return register


def activity_type(name: str) -> ActivityType[Any, Any]:
    try:
        return _activities[name]
    except KeyError:
        raise InvalidInput(f"Unknown activity type {name!r}; is the package that defines it listed in "
                           "AGENTOPS_AGENT_MODULES on this worker?", name=name) from None


Snapshot = tuple[dict[str, "type[WorkflowDefinition]"], dict[str, ActivityType[Any, Any]]]


def snapshot() -> Snapshot:
    """The registry as it is now, for ``restore`` (the test kit's ``registered`` uses both)."""
    return dict(_definitions), dict(_activities)


def restore(saved: Snapshot) -> None:
    _definitions.clear()
    _definitions.update(saved[0])
    _activities.clear()
    _activities.update(saved[1])


def register_activity(spec: ActivityType[Any, Any]) -> None:
    """Register an activity (``@activity`` does; so does the test kit after a ``restore`` removed it).

    Registering the same function again is a no-op; another function under the same name is refused.
    """
    known = _activities.get(spec.name)
    if known is not None and known.fn is not spec.fn:
        raise DefinitionError(f"Activity {spec.name!r} is registered twice: by {known.fn.__module__} "
                              f"and by {spec.fn.__module__}; give one of them another name.")
    _activities[spec.name] = spec
