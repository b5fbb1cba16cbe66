"""The activity and attempt lifecycle: one module makes every status change, each a
transition the models declare; what a failed attempt leads to is decided in named parts; whether
an attempt was throttled or given back is a column, not parsed error text.
"""
from __future__ import annotations

import ast
import re
from collections.abc import Iterator
from datetime import timedelta
from decimal import Decimal
from pathlib import Path
from typing import Any

import pytest
from django.core.management import call_command
from django.db import connection
from django.db.migrations.executor import MigrationExecutor
from django.utils import timezone
from django_fsm import TransitionNotAllowed

from workflows import clock, engine, services
from workflows.activity_context import ActivityContext
from workflows.errors import BudgetDeferred, BudgetExhausted, Permanent, Throttled
from workflows.leases import Claim
from workflows.models import Activity, ActivityAttempt, Timer, UsageEntry, Wait, WebhookDelivery, WebhookSubscription
from workflows.registry import RetryPolicy, activity
from workflows.services import lifecycle
from workflows.services.lifecycle import RunOutcome
from workflows.testing import registered

ROOT = Path(__file__).resolve().parents[2]
KIND = "test-lifecycle"
AT = timezone.now()

# Arguments for each declared transition; a transition added without a row here fails
# test_every_declared_transition_has_arguments_here.
ARGUMENTS: dict[tuple[type[Any], str], dict[str, Any]] = {
    (Activity, "claim"): {"attempt": 3, "lease_token": "t" * 32, "lease_expires_at": AT, "at": AT, "tenant": "system"},
    (Activity, "succeed"): {"result": {"ok": True}, "at": AT},
    (Activity, "retry"): {"error": "RuntimeError: x", "next_attempt_at": AT, "max_attempts": 6, "dispatched_at": None},
    (Activity, "fail"): {"error": "Permanent: x", "at": AT},
    (Activity, "void"): {"reason": "workflow cancelled", "at": AT},
    (Activity, "reopen"): {"max_attempts": 9, "at": AT},
    (ActivityAttempt, "succeed"): {"at": AT},
    (ActivityAttempt, "fail"): {"error": "Throttled: 529", "at": AT, "throttled": True, "refunded": True,
                                "retry_after_seconds": 2.5},
    (ActivityAttempt, "lose"): {"error": "attempt 1 lost", "at": AT},
    (ActivityAttempt, "discard"): {"at": AT},
    (ActivityAttempt, "cancel"): {"reason": "node left", "at": AT},
    (Timer, "fire"): {"at": AT},
    (Timer, "ignore"): {"note": "workflow cancelled"},
    (WebhookDelivery, "deliver"): {"attempt": 2, "status_code": 204, "error": "", "at": AT},
    (WebhookDelivery, "retry"): {"attempt": 1, "status_code": 503, "error": "HTTP 503", "next_attempt_at": AT},
    (WebhookDelivery, "fail"): {"attempt": 8, "status_code": None, "error": "connection refused"},
    (WebhookDelivery, "redeliver"): {"at": AT},
    (UsageEntry, "charge"): {"cost_usd": Decimal("0.012"), "usage": {"input_tokens": 900, "output_tokens": 40},
                             "request_id": "req_1", "http_status": 200, "at": AT},
    (UsageEntry, "release"): {"reason": "HTTP 529 overloaded", "http_status": 529, "request_id": "req_2", "at": AT},
    (UsageEntry, "doubt"): {"reason": "no answer seen: read timeout"},
}
# The table, as docs/state-machines.md states it: (transition, from, to).
TABLE = {
    Activity: {
        ("claim", "scheduled", "running"), ("succeed", "running", "succeeded"), ("retry", "running", "scheduled"),
        ("fail", "running", "failed"), ("void", "scheduled", "cancelled"), ("void", "running", "cancelled"),
        ("reopen", "failed", "scheduled"),
    },
    ActivityAttempt: {
        ("succeed", "running", "succeeded"), ("fail", "running", "failed"), ("lose", "running", "lost"),
        ("discard", "running", "stale"), ("discard", "lost", "stale"), ("cancel", "running", "cancelled"),
    },
    Timer: {("fire", "pending", "fired"), ("ignore", "pending", "ignored"), ("ignore", "fired", "ignored")},
    WebhookDelivery: {
        ("deliver", "pending", "delivered"), ("retry", "pending", "pending"), ("fail", "pending", "failed"),
        ("redeliver", "delivered", "pending"), ("redeliver", "failed", "pending"),
    },
    UsageEntry: {
        ("charge", "reserved", "charged"), ("charge", "uncertain", "charged"), ("release", "reserved", "released"),
        ("release", "uncertain", "released"), ("doubt", "reserved", "uncertain"),
    },
}
MACHINES = [Activity, ActivityAttempt, Timer, WebhookDelivery, UsageEntry]
# A model call's charge or release is SQL by hand (``lifecycle.row_moving``: it may ride in the
# statement of the call's note); the others issue the ORM's UPDATE (``lifecycle.rows_move``).
SETTLED_BY_SQL = {(UsageEntry, "charge"), (UsageEntry, "release")}
TRANSITIONS = sorted(ARGUMENTS, key=lambda key: (key[0].__name__, key[1]))
CASES = [(model, name, status) for model, name in TRANSITIONS for status in model.Status.values]


def _id(case: Any) -> str:
    return case.__name__ if isinstance(case, type) else str(case)


@pytest.mark.parametrize("model", MACHINES, ids=_id)
def test_the_models_declare_the_table(model: type[Any]) -> None:
    """Each status machine has exactly the transitions of the documented table."""
    declared = {(t.name, source, t.target) for t in lifecycle.declared_all(model) for source in t.sources}
    assert declared == TABLE[model]


@pytest.mark.parametrize("model", MACHINES, ids=_id)
def test_every_declared_transition_has_arguments_here(model: type[Any]) -> None:
    assert {t.name for t in lifecycle.declared_all(model)} == {name for m, name in ARGUMENTS if m is model}


@pytest.mark.parametrize(("model", "name", "status"), CASES, ids=_id)
def test_a_transition_is_allowed_from_its_sources_and_refused_from_any_other_state(
    model: type[Any], name: str, status: str
) -> None:
    """On an instance: a declared source moves to the target; any other state raises and changes nothing."""
    transition = lifecycle.declared(model, name)
    row = model(status=status)
    if status in transition.sources:
        getattr(row, name)(**ARGUMENTS[model, name])
        assert row.status == transition.target
    else:
        with pytest.raises(TransitionNotAllowed):
            getattr(row, name)(**ARGUMENTS[model, name])
        assert row.status == status


@pytest.mark.parametrize(("model", "name"), TRANSITIONS, ids=_id)
def test_what_the_sql_writes_is_what_the_transition_sets(model: type[Any], name: str) -> None:
    """The hot path's UPDATE sets what the method sets on an instance, from its arguments alone."""
    transition = lifecycle.declared(model, name)
    row = model(status=transition.sources[0])
    before = {f.attname: getattr(row, f.attname) for f in model._meta.concrete_fields}
    getattr(row, name)(**ARGUMENTS[model, name])
    changed = {a: getattr(row, a) for a, value in before.items() if getattr(row, a) != value}
    written = lifecycle._changes(transition, ARGUMENTS[model, name])
    assert changed.items() <= written.items()
    assert all(getattr(row, a) == value for a, value in written.items())


def test_a_status_cannot_be_assigned() -> None:
    """The status fields are protected: only a declared transition changes them."""
    for row in (Activity(), ActivityAttempt(), Timer(), WebhookDelivery(), UsageEntry()):
        with pytest.raises(AttributeError, match="Direct status modification is not allowed"):
            row.status = "failed"


# --- the SQL path moves only along the table -------------------------------------------------------

@activity("test_lifecycle_step", retry=RetryPolicy(max_attempts=3, initial_interval_seconds=5, backoff=2.0,
                                                    non_retryable=(KeyError,)))
def step(ctx: ActivityContext, input: dict[str, Any]) -> dict[str, Any]:
    return {"ok": True}


class OneStep(engine.WorkflowDefinition):
    kind = KIND
    start_node = "RUN"
    revalidate_node = "RUN"

    @engine.node("RUN")
    def run(self, ctx: engine.NodeContext) -> engine.Decision:
        ctx.activity(step, {})
        return engine.Complete()


@pytest.fixture
def one_step(rung: Any) -> Iterator[Activity]:
    with registered(OneStep, step):
        workflow = services.workflow_launch(kind=KIND, goal="one step")
        yield Activity.objects.get(workflow=workflow)


@pytest.mark.django_db
@pytest.mark.parametrize(("model", "name", "status"), CASES, ids=_id)
def test_the_sql_of_a_transition_moves_only_rows_in_its_sources(
    one_step: Activity, model: type[Any], name: str, status: str
) -> None:
    """The conditional UPDATE of each transition matches a row only in a declared source state."""
    if model is Activity:
        rows, where = Activity.objects.filter(pk=one_step.pk), {"id": one_step.pk}
    elif model is ActivityAttempt:
        ActivityAttempt.objects.create(activity=one_step, number=1, lease_token="t", started_at=AT)
        rows, where = ActivityAttempt.objects.filter(activity=one_step), {"activity": one_step.pk, "number": 1}
    elif model is Timer:
        wait = Wait.objects.create(workflow=one_step.workflow, operation_id="op/timer", kind=Wait.Kind.TIMER,
                                   node="RUN", node_visit=1, intent_version=1, created_at=AT)
        timer = Timer.objects.create(workflow=one_step.workflow, wait=wait, purpose=Timer.Purpose.WAKE, fire_at=AT,
                                     intent_version=1)
        rows, where = Timer.objects.filter(pk=timer.pk), {"id": timer.pk}
    elif model is UsageEntry:
        entry = UsageEntry.objects.create(workflow=one_step.workflow, key="op#0@1.0", operation_id="op", attempt=1,
                                          provider="anthropic", model="claude-haiku-4-5", reserved_usd=Decimal("0.02"),
                                          created_at=AT)
        rows, where = UsageEntry.objects.filter(pk=entry.pk), {"key": entry.key}
    else:
        subscription = WebhookSubscription.objects.create(name="ci", url="http://127.0.0.1:9/", secret="s" * 32,
                                                          created_at=AT)
        delivery = WebhookDelivery.objects.create(subscription=subscription, delivery_id="d1", event_id=1,
                                                  workflow_id=one_step.workflow_id, seq=1, kind="workflow.launched",
                                                  body="{}", next_attempt_at=AT, created_at=AT)
        rows, where = WebhookDelivery.objects.filter(pk=delivery.pk), {"id": delivery.pk}
    rows.update(status=status)  # the test puts the row in each state; the product never does this
    transition = lifecycle.declared(model, name)
    if model in (Activity, ActivityAttempt) or (model, name) in SETTLED_BY_SQL:  # the hot path's SQL by hand
        moved = lifecycle._move(model, name, where, **ARGUMENTS[model, name])
    else:  # the ORM's UPDATE, as their services issue it
        moved = lifecycle.rows_move(model.objects.filter(**where), name, **ARGUMENTS[model, name])
    assert (moved, rows.get().status) == ((1, transition.target) if status in transition.sources else (0, status))


# --- nothing else writes these statuses -------------------------------------------------------------

LIFECYCLE_TABLES = {"Activity", "ActivityAttempt"}
SQL_WRITES = {"row_update", "rows_insert", "row_insert", "row_insert_unless_exists"}
ORM_WRITES = {"update", "create", "get_or_create", "update_or_create", "bulk_create", "bulk_update"}
MENTIONS = ("Activity", "activit", "attempt", "compensation")


def status_writes(source: str) -> list[str]:
    """Where ``source`` writes an activity's or attempt's status without the lifecycle: SQL by hand
    on those tables, ORM writes naming a status of theirs or reached through them, assignments."""
    tree = ast.parse(source)
    # Names bound to a query of those tables (``fenced = Activity.objects.filter(...)``) count as naming them.
    bound = {target.id for node in ast.walk(tree) if isinstance(node, ast.Assign)
             and any(m in ast.unparse(node.value) for m in MENTIONS)
             for target in node.targets if isinstance(target, ast.Name)}
    mentions = (*MENTIONS, *bound)
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Call):
            func = node.func
            name = func.attr if isinstance(func, ast.Attribute) else func.id if isinstance(func, ast.Name) else ""
            if name in SQL_WRITES and node.args and ast.unparse(node.args[0]) in LIFECYCLE_TABLES:
                found.append(ast.unparse(node))
            elif name in LIFECYCLE_TABLES or name in ORM_WRITES:
                status = [k for k in node.keywords if k.arg in ("status", None)]
                if not status:
                    continue
                receiver = ast.unparse(func.value) if isinstance(func, ast.Attribute) else name
                other = re.match(r"(\w+)\.objects\b", receiver)  # a query of another model names its own table
                if other and other.group(1) not in LIFECYCLE_TABLES:
                    continue
                if any(m in receiver for m in mentions) or any(
                        f"{t}.Status" in ast.unparse(k.value) for k in status for t in LIFECYCLE_TABLES):
                    found.append(ast.unparse(node))
        elif isinstance(node, ast.Assign | ast.AugAssign | ast.AnnAssign):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            for target in targets:
                for part in ast.walk(target):
                    if isinstance(part, ast.Attribute) and part.attr == "status" and any(
                            m in ast.unparse(part.value) for m in MENTIONS):
                        found.append(ast.unparse(node))
    return found


# The lifecycle's own module, and the test kit's in-memory copy of it (its records are dataclasses
# of a dictionary, never rows: tests/workflows/test_kit_lifecycle.py holds it to the services).
NOT_SCANNED = {ROOT / "workflows/services/lifecycle.py", ROOT / "workflows/testing/lifecycle.py"}


def product_sources() -> Iterator[Path]:
    for package in ("workflows", "agentops", "tasks"):
        for path in sorted((ROOT / package).rglob("*.py")):
            if "migrations" not in path.parts and path not in NOT_SCANNED:
                yield path


def test_no_module_but_the_lifecycle_writes_an_activity_or_attempt_status() -> None:
    """Scan the product's source: only workflows/services/lifecycle.py changes these statuses."""
    found = {str(path.relative_to(ROOT)): writes for path in product_sources()
             if (writes := status_writes(path.read_text()))}
    assert found == {}


@pytest.mark.parametrize("write", [
    # How the services wrote these statuses before the lifecycle owned them.
    "Activity.objects.filter(pk__in=pks, status__in=LIVE).update(status=Activity.Status.CANCELLED, error=reason)",
    "ActivityAttempt.objects.filter(activity_id__in=pks).update(status=ActivityAttempt.Status.CANCELLED)",
    "fenced = Activity.objects.filter(pk=pk, status='running')\nfenced.update(status=status, error=error)",
    "activity.attempts.filter(number=n).update(status=ActivityAttempt.Status.LOST)",
    "row_update(ActivityAttempt, {'status': status, 'error': error[:2000]}, {'activity': a, 'number': n})",
    "row_update(Activity, values, fence)",
    "activity.status, activity.attempt = Activity.Status.RUNNING, 1",
    "Activity.objects.filter(pk=compensation.pk).update(status=Activity.Status.SCHEDULED, max_attempts=3)",
    "Activity(workflow=workflow, status=Activity.Status.RUNNING)",
])
def test_the_scan_finds_status_writes(write: str) -> None:
    assert status_writes(write), write


def test_the_scan_leaves_other_models_alone() -> None:
    assert status_writes("UsageEntry.objects.filter(key=key).update(status=UsageEntry.Status.UNCERTAIN)\n"
                         "workflow.timers.filter(status=Timer.Status.PENDING).update(status=Timer.Status.IGNORED)\n"
                         "claim.update(dispatched_at=now)") == []


# --- what a failed attempt leads to -------------------------------------------------------------------

def claim_of(activity_row: Activity, attempt: int) -> Claim:
    return Claim(activity_id=activity_row.pk, workflow_id=activity_row.workflow_id,
                 operation_id=activity_row.operation_id, name=activity_row.name, attempt=attempt, lease_token="t",
                 input={}, previous_attempt_lost=False)


@pytest.mark.django_db
@pytest.mark.parametrize(("error", "attempt", "outcome", "refunded", "delay"), [
    (BudgetExhausted("Budget exhausted: 2.00 of 2.00 USD"), 1, RunOutcome.PAUSED, True, None),
    (BudgetDeferred("over the hourly budget", retry_after_seconds=600), 3, RunOutcome.DEFERRED, True, 600.0),
    (Throttled("529 overloaded", retry_after_seconds=45), 3, RunOutcome.THROTTLED, True, 45.0),
    (RuntimeError("flaky"), 1, RunOutcome.RETRY_SCHEDULED, False, 5.0),
    (RuntimeError("flaky"), 2, RunOutcome.RETRY_SCHEDULED, False, 10.0),
    (RuntimeError("flaky"), 3, RunOutcome.FAILED, False, None),
    (Permanent("no such target"), 1, RunOutcome.FAILED, False, None),
    (KeyError("non-retryable by the policy"), 1, RunOutcome.FAILED, False, None),
], ids=["budget-exhausted", "budget-deferred", "throttled", "retry-1", "retry-2", "out-of-attempts", "permanent",
        "policy-non-retryable"])
def test_a_failure_is_judged_pause_retry_refund_or_fail(
    one_step: Activity, error: BaseException, attempt: int, outcome: RunOutcome, refunded: bool, delay: float | None
) -> None:
    claim = claim_of(one_step, attempt)
    verdict = lifecycle.failure_judge(claim, error, retryable=lifecycle.failure_retryable(claim, error),
                                      max_attempts=3)
    assert (verdict.outcome, verdict.refunded, verdict.retry_after_seconds) == (outcome, refunded, delay)
    assert verdict.throttled == isinstance(error, Throttled)
    assert verdict.message == f"{type(error).__name__}: {error}"


@pytest.mark.django_db
def test_a_throttled_attempt_is_given_back_even_past_the_last_attempt(one_step: Activity) -> None:
    """Throttling is not a failed try: attempt 3 of 3 throttled still retries, after the backoff."""
    verdict = lifecycle.failure_judge(claim_of(one_step, 3), Throttled("429"), retryable=True, max_attempts=3)
    assert (verdict.outcome, verdict.refunded) == (RunOutcome.THROTTLED, True)
    assert verdict.retry_after_seconds is not None and verdict.retry_after_seconds > 0


@pytest.mark.django_db
def test_throttling_the_policy_calls_final_fails_and_is_not_given_back(one_step: Activity) -> None:
    verdict = lifecycle.failure_judge(claim_of(one_step, 1), Throttled("429"), retryable=False, max_attempts=3)
    assert (verdict.outcome, verdict.throttled, verdict.refunded) == (RunOutcome.FAILED, True, False)


@pytest.mark.django_db
def test_a_throttled_attempt_records_its_columns_and_the_window(one_step: Activity, time_machine: Any) -> None:
    """Run through the service: the attempt row says throttled, refunded and the window it opened."""
    time_machine.move_to(clock.now(), tick=False)
    claim = services.activity_claim_if_runnable(activity_id=one_step.pk, worker="w", task_id="")
    assert claim is not None
    error = Throttled("529 overloaded", retry_after_seconds=30)
    assert services.activity_failure_record_if_current(claim=claim, error=error) == RunOutcome.THROTTLED
    row = Activity.objects.get(pk=one_step.pk)
    attempt = row.attempts.get()
    assert (attempt.status, attempt.throttled, attempt.refunded, attempt.retry_after_seconds) == (
        "failed", True, True, 30.0)
    assert (row.status, row.max_attempts, row.next_attempt_at) == ("scheduled", 4, clock.now() + timedelta(seconds=30))
    assert lifecycle.throttled_streak(row.pk, before=2) == 1


# --- rows written before the columns ------------------------------------------------------------------

def migrate(target: str) -> None:
    executor = MigrationExecutor(connection)
    executor.loader.build_graph()
    executor.migrate([("workflows", target)])


OLD_ATTEMPTS = [  # (activity, number, status, error) as the code before migration 0016 wrote them
    ("a", 1, "failed", "RuntimeError: flaky"),
    ("a", 2, "failed", "Throttled: The Messages API is overloaded (529)"),
    ("a", 3, "failed", "Throttled: The Messages API is overloaded (529)"),
    ("a", 4, "running", ""),
    ("b", 1, "failed", "BudgetDeferred: over the hourly budget until 14:00"),
    ("b", 2, "failed", "BudgetExhausted: Budget exhausted: 2.00 of 2.00 USD"),
    ("b", 3, "failed", "Throttled: rate limited (429)"),  # b failed with it: its policy made it final
]


@pytest.mark.django_db(transaction=True)
def test_attempts_recorded_before_the_columns_read_the_same_after_the_migration(rung: Any) -> None:
    """Attempts whose only record of throttling was their error text: after migration 0016 the
    columns say what the text said, and the throttle streak reads them as it read the text."""
    with registered(OneStep, step):
        a = Activity.objects.get(workflow=services.workflow_launch(kind=KIND, goal="a"))
        b = Activity.objects.get(workflow=services.workflow_launch(kind=KIND, goal="b"))
    migrate("0015_outbound_webhooks")
    try:
        with connection.cursor() as cursor:
            cursor.execute("UPDATE workflows_activity SET status = 'failed', attempt = 3 WHERE id = %s", [b.pk])
            for which, number, status, error in OLD_ATTEMPTS:
                cursor.execute(
                    "INSERT INTO workflows_activityattempt (activity_id, number, lease_token, worker, task_id, status,"
                    " error, started_at) VALUES (%s, %s, 't', '', '', %s, %s, %s)",
                    [{"a": a.pk, "b": b.pk}[which], number, status, error, AT])
        migrate("0016_attempt_outcome_columns")
    finally:
        call_command("migrate", "workflows", verbosity=0)
    columns = {(which, number): (row.throttled, row.refunded, row.retry_after_seconds)
               for which, pk in (("a", a.pk), ("b", b.pk))
               for number, row in ((r.number, r) for r in ActivityAttempt.objects.filter(activity_id=pk))}
    assert columns == {
        ("a", 1): (False, False, None), ("a", 2): (True, True, None), ("a", 3): (True, True, None),
        ("a", 4): (False, False, None),
        ("b", 1): (False, True, None), ("b", 2): (False, True, None), ("b", 3): (True, False, None),
    }
    assert lifecycle.throttled_streak(a.pk, before=4) == 2
    assert lifecycle.throttled_streak(b.pk, before=4) == 1
