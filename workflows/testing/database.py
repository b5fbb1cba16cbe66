"""The test kit's database tier: a kind's workflows run in the test's process against the test's
database (pytest-django's), as workers and beat would run them, without a broker.

- ``launch(kind, goal=, params=, max_hours=, budget_total_usd=, by=)``: start a workflow as
  ``manage.py agent launch`` does.
- ``drive(workflow, retry_now=False)``: run it and its child workflows to their next wait: due
  activities run (with ``retry_now``, also those waiting for a retry window), due timers fire,
  expired leases are reaped and each child's end is delivered to its parent, until nothing
  changes.
- ``events(workflow, kind="")``: its events as recorded, as ``Event`` values.
- ``doorbells_recorded()``: the doorbells the services ring (what would be published to the
  broker after commit) are kept in a ``Doorbells`` instead of sent.
- ``Clock``: the durable clock (``workflows.clock.now``), moved by the test (time-machine).
- ``signal``, ``approve``, ``reject``, ``cancel``, ``supersede``, ``resume``, ``set_budget``: what
  people and other systems do to a workflow, as ``manage.py agent`` does it; ``drive`` then runs
  what follows.
- ``Faults``: crash the process, as far as the services can tell, at a named fault point
  (``FAULT_POINTS``), then drive again to see what the next attempt does.

``agentops.kind.pytest_plugin`` gives these as pytest fixtures.
"""
from __future__ import annotations

import json
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from decimal import Decimal
from pathlib import Path
from typing import Any

from django.test import override_settings

from workflows import clock, doorbells, services
from workflows.errors import NotFound
from workflows.faults import Crashed
from workflows.models import Activity, Timer, Wait, Workflow
from workflows.models import Event as EventRow
from workflows.services.children import children_collect_if_finished
from workflows.testing.lifecycle import Event

# Every named fault point, with when it fires and what a crash there tests (docs/authoring.md,
# "Fault points"; tests/authoring/test_kit_database.py keeps this, the code and the page in step).
FAULT_POINTS: dict[str, str] = {
    "activity.after_claim": "an attempt is claimed (committed), before its function runs",
    "activity.before_external_call": "the activity marks it (ctx.faultpoint) right before its effect",
    "activity.after_external_call": "the activity marks it (ctx.faultpoint) right after its effect",
    "activity.before_writeback": "the function returned, before its result is written",
    "transition.before_commit": "the result and the workflow's next step are written, before they commit",
    "notify.before_send": "a notification is about to go to a channel",
    "retention.archive_written": "a finished workflow's history archive is written, before its rows are removed",
    "harness.after_tool": "the harness kind ran one tool call of a session",
}


def launch(kind: str, *, goal: str = "", params: dict[str, Any] | None = None, max_hours: float | None = None,
           budget_total_usd: Decimal | str | int | None = None, by: str = "") -> Workflow:
    """Launch a workflow of ``kind`` (its definition registered) with ``goal`` and ``params``, a
    time limit and a total budget (USD) as ``--max-hours`` and ``--budget-total`` give them, as
    the user ``by`` (made if new; none when empty) as ``--user`` does, as ``manage.py agent
    launch`` does; it has advanced to its first step when this returns."""
    budget = None if budget_total_usd is None else Decimal(str(budget_total_usd))
    return services.workflow_launch(kind=kind, goal=goal or f"A test of {kind}", params=params,
                                    user=_user(by) if by else None,
                                    options=services.LaunchOptions(max_hours=max_hours, budget_total_usd=budget))


def drive(workflow: Workflow | int, *, max_rounds: int = 100, retry_now: bool = False) -> Workflow:
    """Run ``workflow`` (a row or its id) and its child workflows in this process until nothing
    changes, and return its row as it is then: waiting (for a signal, an approval, a timer not yet
    due, a retry window not yet open), completed, failed, paused or cancelled.

    Each round advances every unfinished workflow of the tree, runs its due activities, fires its
    due timers, cancels it past its time limit, reaps its attempts whose lease ran out
    (``clock.now()`` past it: a crashed attempt's) and delivers each ended child's end to its
    parent, as workers and beat would after the doorbells. With ``retry_now``, an activity of a
    running workflow that waits for its retry window (or was deferred by a budget or a limit)
    is due at once instead, so a test of retries needs no clock. Raises TypeError for anything but a row
    or an id, NotFound for an id of no workflow, AssertionError when the tree still changes after
    ``max_rounds`` rounds (a definition that never waits).
    """
    if not isinstance(workflow, Workflow | int) or isinstance(workflow, bool):
        raise TypeError(f"drive takes a workflow row or its id (what launch returns), not {type(workflow).__name__}; "
                        "a WorkflowRun runs in memory and is answered step by step instead.")
    root = _pk(workflow)
    if not Workflow.objects.filter(pk=root).exists():
        raise NotFound(f"Workflow {root} does not exist in this test's database: drive the workflow (or the id) "
                       "that launch returned, in the same test.")
    seen: tuple[Any, ...] = ()
    for _ in range(max_rounds):
        tree = _tree(root)
        if retry_now:
            Activity.objects.filter(workflow_id__in=tree, workflow__status=Workflow.Status.RUNNING,
                                    status=Activity.Status.SCHEDULED,
                                    next_attempt_at__gt=clock.now()).update(next_attempt_at=clock.now())
        _round(tree)
        now_seen = _fingerprint(_tree(root))
        if now_seen == seen:
            return Workflow.objects.get(pk=root)
        seen = now_seen
    raise AssertionError(f"Workflow {root} still changes after {max_rounds} rounds of drive: its definition (or a "
                         "child's) never waits.")


def events(workflow: Workflow | int, kind: str = "") -> list[Event]:
    """The workflow's events as the services recorded them, oldest first, as ``Event`` values
    (a ``WorkflowRun``'s ``run.events`` are the same kinds; here the data hold database ids);
    with ``kind`` (``"child.started"``), only those of that kind."""
    rows = EventRow.objects.filter(workflow_id=_pk(workflow)).order_by("seq")
    if kind:
        rows = rows.filter(kind=kind)
    return [Event(kind=k, data=data) for k, data in rows.values_list("kind", "data")]


# --- what people and other systems do to a workflow, as the command line and the API do it ---

def signal(workflow: Workflow | int, name: str, payload: Any = None, *, dedupe_key: str = "") -> str:
    """Send the signal ``name`` with ``payload`` to ``workflow`` (``agent signal``). Returns what it
    did: ``"applied"`` (an open wait for the name took it), ``"queued"`` (no wait for it is open: the
    next one takes it), ``"already_applied"`` (``dedupe_key`` was delivered before). ``drive`` next."""
    return str(services.workflow_signal(workflow_id=_pk(workflow), name=name, payload=payload,
                                        dedupe_key=dedupe_key).outcome)


def approve(workflow: Workflow | int, *, by: str = "approver", comment: str = "",
            candidate_hash: str | None = None) -> str:
    """Approve the workflow's open approval (with none open, its latest), for the candidate it
    shows, as the user ``by`` (made if new, and put in the group of the wait's required role).
    Returns ``"applied"``, or ``"already_applied"`` for the same approval again; the refusals a
    person meets (``WaitRefused``: ``by`` launched the workflow, the wait expired, another
    ``candidate_hash`` than the wait's, ...) are raised as they are. ``drive`` next."""
    wait = _open_approval(workflow)
    seen = wait.candidate_hash if candidate_hash is None else candidate_hash
    return str(services.wait_approve(wait_id=wait.pk, user=_approver(by, wait), candidate_hash=seen,
                                     comment=comment).outcome)


def reject(workflow: Workflow | int, *, by: str = "approver", comment: str = "") -> str:
    """Reject the workflow's open approval as the user ``by`` (as ``approve`` makes them): the
    workflow fails with the comment as its reason. Returns ``"applied"`` or ``"already_applied"``."""
    wait = _open_approval(workflow)
    return str(services.wait_reject(wait_id=wait.pk, user=_approver(by, wait), comment=comment).outcome)


def cancel(workflow: Workflow | int, *, reason: str = "") -> str:
    """Cancel the workflow (``agent cancel``): its work in flight is voided and its active
    commitments are compensated, newest first, by activities that ``drive`` runs. Returns
    ``"applied"`` (cancelled now), ``"suspended"`` (cancelling: compensations to run) or
    ``"already_applied"``; a completed or failed workflow raises ``TransitionRefused``."""
    return str(services.workflow_cancel(workflow_id=_pk(workflow), reason=reason, by="test").outcome)


def supersede(workflow: Workflow | int, goal: str) -> str:
    """Give the workflow a new goal (``agent supersede``): the old goal's work in flight is voided
    and its commitments compensated, and the workflow revalidates for the new one. Returns
    ``"applied"``. ``drive`` next."""
    return str(services.workflow_supersede(workflow_id=_pk(workflow), goal=goal).outcome)


def resume(workflow: Workflow | int, *, by: str = "operator") -> str:
    """Resume the workflow (``agent resume``): one paused (by a person, by its definition, after
    failed advances) goes on where it stopped, and failed compensations get new attempts. Returns
    ``"applied"`` (or ``"already_applied"`` for a running one); a workflow waiting for something,
    or paused for its budget (``set_budget`` resumes it), raises ``TransitionRefused`` naming
    what it waits for. ``drive`` next."""
    return str(services.workflow_resume(workflow_id=_pk(workflow), by=by).outcome)


def set_budget(workflow: Workflow | int, *, total_usd: Decimal | str | int | None = None,
               hourly_usd: Decimal | str | int | None = None, by: str = "operator") -> Workflow:
    """Set the workflow's total budget, hourly budget or both (USD) as ``agent budget --total
    --hourly`` does, as the user ``by`` (made if new; the change is a ``budget.changed`` event):
    a workflow paused for its budget goes on. Returns its row. ``InvalidInput`` for neither, or
    for an amount that is none. ``drive`` next."""
    total, hourly = (None if amount is None else Decimal(str(amount)) for amount in (total_usd, hourly_usd))
    return services.workflow_budget_set(workflow_id=_pk(workflow), user=_user(by),
                                        total_usd=total, hourly_usd=hourly)


def _pk(workflow: Workflow | int) -> int:
    if not isinstance(workflow, Workflow | int) or isinstance(workflow, bool):
        raise TypeError(f"Give a workflow row or its id (what launch returns), not {type(workflow).__name__}.")
    return workflow if isinstance(workflow, int) else workflow.pk


def _open_approval(workflow: Workflow | int) -> Wait:
    """The workflow's open approval; with none open, its latest one (deciding it again is what a
    person repeating a decision does: the services answer it as already applied, or refuse it)."""
    approvals = Wait.objects.filter(workflow_id=_pk(workflow), kind=Wait.Kind.APPROVAL)
    waits = list(approvals.filter(status=Wait.Status.OPEN)) or list(approvals.order_by("-pk")[:1])
    if len(waits) != 1:
        raise AssertionError(f"Workflow {_pk(workflow)} has {len(waits)} open approvals, not one: drive it to its "
                             "approval first.")
    return waits[0]


def _user(username: str) -> Any:
    """The user ``username`` of the test's database, made if new."""
    from django.contrib.auth.models import User

    return User.objects.get_or_create(username=username)[0]


def _approver(username: str, wait: Wait) -> Any:
    from django.contrib.auth.models import Group

    user = _user(username)
    if wait.required_role:
        user.groups.add(Group.objects.get_or_create(name=wait.required_role)[0])
    return user


def _tree(root: int) -> list[int]:
    """The workflow and its descendants, parents first."""
    found, frontier = [root], [root]
    while frontier:
        frontier = list(Workflow.objects.filter(parent_id__in=frontier).order_by("pk").values_list("pk", flat=True))
        found += frontier
    return found


def _round(tree: list[int]) -> None:
    now = clock.now()
    for pk in Timer.objects.filter(workflow_id__in=tree, status=Timer.Status.PENDING,
                                   fire_at__lte=now).values_list("pk", flat=True):
        services.timer_fire_if_due(timer_id=pk)
    for pk in Activity.objects.filter(workflow_id__in=tree, status=Activity.Status.RUNNING,
                                      lease_expires_at__lt=now).values_list("pk", flat=True):
        services.activity_lease_expire_if_due(activity_id=pk)
    for pk in Workflow.objects.filter(pk__in=tree, deadline__lte=now).exclude(
            status__in=Workflow.TERMINAL).values_list("pk", flat=True):
        services.workflow_deadline_enforce_if_due(workflow_id=pk)
    for workflow_id in reversed(tree):  # children first: a child that ends this round reaches its parent
        services.workflow_advance_if_runnable(workflow_id=workflow_id)
        # A paused workflow's activities wait for a person (a worker's doorbell is ignored).
        due = Activity.objects.filter(workflow_id=workflow_id, status=Activity.Status.SCHEDULED,
                                      next_attempt_at__lte=clock.now()).exclude(
            workflow__status=Workflow.Status.PAUSED).order_by("pk")
        for pk in due.values_list("pk", flat=True):
            services.activity_run_if_runnable(activity_id=pk, worker="in-process")
        children_collect_if_finished(workflow_id=workflow_id)


def _fingerprint(tree: list[int]) -> tuple[Any, ...]:
    return (
        tuple(Workflow.objects.filter(pk__in=tree).order_by("pk").values_list(
            "pk", "status", "current_node", "node_visit", "event_seq")),
        tuple(Activity.objects.filter(workflow_id__in=tree).order_by("pk").values_list("pk", "status", "attempt")),
        tuple(Timer.objects.filter(workflow_id__in=tree).order_by("pk").values_list("pk", "status")),
        tuple(Wait.objects.filter(workflow_id__in=tree).order_by("pk").values_list("pk", "status")),
    )


@dataclass(frozen=True)
class Doorbell:
    """One message a service rang: the Celery task it would publish after commit, its keyword
    arguments (ids, e.g. ``{"workflow_id": 7}``) and its queue (None: the default queue)."""

    task: str
    kwargs: dict[str, Any]
    queue: str | None = None


@dataclass
class Doorbells:
    """The doorbells rung while recording, oldest first (``rung``)."""

    rung: list[Doorbell] = field(default_factory=list)

    def of(self, task: str) -> list[dict[str, Any]]:
        """The keyword arguments of each doorbell of ``task`` (``"agentops.workflow.advance"``,
        ``"agentops.activity.run"``, ``"agentops.workflow.children_collect"``, ...)."""
        return [bell.kwargs for bell in self.rung if bell.task == task]

    def clear(self) -> None:
        self.rung.clear()


@contextmanager
def doorbells_recorded() -> Iterator[Doorbells]:
    """Keep every doorbell rung in the block instead of publishing it: no broker is needed, and
    the test sees what workers would have been asked to do. A doorbell is kept when it is rung,
    in the transaction that would publish it once committed."""
    recorded = Doorbells()
    publish = doorbells._publish_on_commit

    def record(task_name: str, queue: str | None = None, **kwargs: Any) -> None:
        recorded.rung.append(Doorbell(task=task_name, kwargs=kwargs, queue=queue))

    doorbells._publish_on_commit = record
    try:
        yield recorded
    finally:
        doorbells._publish_on_commit = publish


class Clock:
    """The durable clock while a test moves it: it starts at the real time and goes on ticking;
    ``advance`` moves it forward (to a timer's wake time, past a lease or a retry window).
    Needs time-machine (in agentops's ``test`` extra)."""

    def __init__(self) -> None:
        self._coordinates: Any = None

    @contextmanager
    def running(self) -> Iterator[Clock]:
        """Move the clock only within the block; afterwards time is real again."""
        try:
            import time_machine
        except ImportError:
            raise ImportError("The test kit's clock needs time-machine: pip install time-machine "
                              "(agentops's test extra has it).") from None
        with time_machine.travel(datetime.now(UTC), tick=True) as coordinates:
            self._coordinates = coordinates
            try:
                yield self
            finally:
                self._coordinates = None

    def now(self) -> datetime:
        """What ``agentops.kind.now()`` (and every service) reads now."""
        return clock.now()

    def advance(self, *, days: float = 0, hours: float = 0, minutes: float = 0, seconds: float = 0) -> datetime:
        """Move the clock forward by the given time; returns the new ``now()``. Raises ValueError
        for a step back (durable times are compared across hosts: they never go back)."""
        step = timedelta(days=days, hours=hours, minutes=minutes, seconds=seconds)
        if step < timedelta(0):
            raise ValueError(f"The clock only moves forward; {step} is a step back.")
        if self._coordinates is None:
            raise RuntimeError("The clock is not running: use it inside Clock().running() (the clock fixture does).")
        self._coordinates.shift(step)
        return self.now()


class Faults:
    """Crash at named fault points (``FAULT_POINTS``); each firing is logged in ``log``."""

    def __init__(self, log: Path) -> None:
        self.log = log

    @contextmanager
    def crash_at(self, point: str, **when: Any) -> Iterator[None]:
        """Within the block, crash at ``point`` where its context matches ``when`` (``activity=``
        the activity's name, ``attempt=``, ``operation_id=``; a point an activity fires itself adds
        what it passes to ``ctx.faultpoint``). The crash (``Crashed``) ends what the block runs, as if
        the process died there, and the block then ends quietly; an attempt it stopped keeps its
        lease until it runs out, then ``drive`` runs the next attempt (its ``reconcile`` first).

        Raises ValueError for an unknown point, AssertionError when the block never reached it."""
        if point not in FAULT_POINTS:
            raise ValueError(f"Unknown fault point {point!r}; the points are: {', '.join(FAULT_POINTS)}.")
        before = len(self.fired)
        rule = {"point": point, "when": when, "action": "crash"}
        with override_settings(AGENTOPS_TESTING_FAULTS=json.dumps([rule]), AGENTOPS_FAULT_LOG=str(self.log)):
            try:
                yield
            except Crashed:
                pass
        if len(self.fired) == before:
            where = ", ".join(f"{key}={value!r}" for key, value in when.items()) or "anywhere"
            raise AssertionError(f"No crash at {point} ({where}): the block never reached that point.")

    @property
    def fired(self) -> list[dict[str, Any]]:
        """Each crash so far: its point and the context it fired with (activity, attempt, ...)."""
        if not self.log.exists():
            return []
        return [json.loads(line) for line in self.log.read_text(encoding="utf-8").splitlines() if line]
