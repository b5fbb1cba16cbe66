"""Deciding approval waits: duplicates, stale candidates, roles, expiry, supersession and races."""
from __future__ import annotations

import threading
from collections.abc import Iterator
from datetime import timedelta
from typing import Any

import pytest
from django.contrib.auth.models import Group, User
from django.db import connection

from tests.conftest import drive, open_approval, release_params
from workflows import clock, engine, services
from workflows.activity_context import ActivityContext
from workflows.errors import InvalidInput, NotFound, WaitRefused
from workflows.features.notifications.activity import NOTIFY_ACTIVITY
from workflows.models import Activity, Event, Wait, Workflow
from workflows.registry import activity
from workflows.services import Decision
from workflows.testing import registered

GATE_KIND = "test-approval-gate"
GATE_ROLE = "release-approvers"
GATE_HASH = "gate-candidate"


# A tiny approval-gated definition. Deciding is the same service whatever the definition;
# the race needs many fresh waiting workflows, and the release agent takes half a second
# (git, tests) to reach its approval, so only the candidate-specific tests use it.
@activity("test_gate_commit")
def gate_commit(ctx: ActivityContext, input: dict[str, Any]) -> dict[str, Any]:
    return {"committed": ctx.operation_id}


class ApprovalGate(engine.WorkflowDefinition):
    kind = GATE_KIND
    start_node = "ASK"
    revalidate_node = "ASK"

    @engine.node("ASK")
    def ask(self, ctx: engine.NodeContext) -> engine.Decision:
        outcome = ctx.approval(candidate={"change": "race"}, candidate_hash=GATE_HASH, role=GATE_ROLE,
                               expires_in_seconds=3600, state_versions={})
        if outcome.approved:
            return engine.Goto("COMMIT")
        return engine.Fail(f"Rejected by {outcome.decided_by}")

    @engine.node("COMMIT")
    def commit(self, ctx: engine.NodeContext) -> engine.Decision:
        ctx.activity(gate_commit, {})
        return engine.Goto("DONE")

    @engine.node("DONE")
    def done(self, ctx: engine.NodeContext) -> engine.Decision:
        return engine.Complete()


@pytest.fixture(autouse=True)
def gate_registered() -> Iterator[None]:
    with registered(ApprovalGate, gate_commit):
        yield


def launch(repo: Any, user: User | None = None, **extra: Any) -> Workflow:
    return services.workflow_launch(kind="release", goal="Ship the release notes",
                                    params=release_params(repo, **extra), user=user)


def gate(user: User | None = None) -> Wait:
    """A fresh gate workflow launched by ``user``, waiting for approval."""
    workflow = services.workflow_launch(kind=GATE_KIND, goal="Open the gate", user=user)
    services.workflow_advance_if_runnable(workflow_id=workflow.pk)
    return open_approval(workflow.pk)


def snapshot(wait: Wait) -> tuple[Any, ...]:
    """What a refused or repeated decision must leave untouched."""
    wait.refresh_from_db()
    workflow = Workflow.objects.get(pk=wait.workflow_id)
    return (wait.status, wait.decided_at, wait.decision, wait.decided_by_id, workflow.status, workflow.updated_at,
            workflow.current_node, Event.objects.filter(workflow=workflow).count())


@pytest.fixture
def release_wait(git_repo: Any, requester: User, rung: list) -> Wait:
    """A release workflow launched by rita, waiting for approval of its candidate."""
    workflow = drive(launch(git_repo, requester).pk)
    assert (workflow.status, workflow.current_node) == ("waiting", "WAIT_FOR_APPROVAL")
    return open_approval(workflow.pk)


@pytest.fixture
def gate_wait(requester: User, rung: list) -> Wait:
    return gate(requester)


@pytest.mark.django_db
class TestReleaseApproval:
    def test_duplicate_approval_changes_nothing(self, release_wait, approver):
        """A second approval of the same candidate is a no-op."""
        wait = release_wait
        first = services.wait_approve(wait_id=wait.pk, user=approver, candidate_hash=wait.candidate_hash)
        assert first.outcome == Decision.APPLIED
        before = snapshot(wait)

        again = services.wait_approve(wait_id=wait.pk, user=approver, candidate_hash=wait.candidate_hash)

        assert again.outcome == Decision.ALREADY_APPLIED
        assert "already approved by alice" in again.message
        assert snapshot(wait) == before
        assert Event.objects.filter(workflow_id=wait.workflow_id, kind="wait.approved").count() == 1

    def test_approval_of_a_stale_candidate_is_refused(self, release_wait, approver):
        """An approval carrying another candidate's hash is refused; the wait stays open."""
        wait = release_wait
        before = snapshot(wait)
        with pytest.raises(WaitRefused, match="bound to candidate"):
            services.wait_approve(wait_id=wait.pk, user=approver, candidate_hash="0" * 64)
        with pytest.raises(WaitRefused, match="bound to candidate"):
            services.wait_approve(wait_id=wait.pk, user=approver, candidate_hash="")
        assert snapshot(wait) == before
        assert before[0] == "open"

    def test_invalidated_wait_is_refused_with_the_intent_change(self, release_wait, approver, requester):
        """After the goal changed, the old approval names the intent versions and changes nothing."""
        wait = release_wait
        services.workflow_supersede(workflow_id=wait.workflow_id, goal="Ship the changelog", user=requester)
        before = snapshot(wait)
        assert before[0] == "invalidated"
        with pytest.raises(WaitRefused, match=r"invalidated .* because the goal changed \(intent v1 → v2\)"):
            services.wait_approve(wait_id=wait.pk, user=approver, candidate_hash=wait.candidate_hash)
        with pytest.raises(WaitRefused, match=r"invalidated .* \(intent v1 → v2\)"):
            services.wait_reject(wait_id=wait.pk, user=approver)
        assert snapshot(wait) == before


@pytest.mark.django_db
class TestDecisionRules:
    def test_duplicate_rejection_changes_nothing(self, gate_wait, approver):
        """A second rejection of the same wait is a no-op."""
        services.wait_reject(wait_id=gate_wait.pk, user=approver, comment="not now")
        before = snapshot(gate_wait)
        again = services.wait_reject(wait_id=gate_wait.pk, user=approver, comment="still not")
        assert again.outcome == Decision.ALREADY_APPLIED
        assert "already rejected by alice" in again.message
        assert snapshot(gate_wait) == before

    def test_reject_after_approval_is_refused(self, gate_wait, approver):
        """Once approved, a rejection is refused and the approval stands."""
        services.wait_approve(wait_id=gate_wait.pk, user=approver, candidate_hash=GATE_HASH)
        before = snapshot(gate_wait)
        with pytest.raises(WaitRefused, match="already approved by alice .* a decision cannot be changed"):
            services.wait_reject(wait_id=gate_wait.pk, user=approver, comment="changed my mind")
        assert snapshot(gate_wait) == before
        assert before[2] == "approved"

    def test_approve_after_rejection_is_refused(self, gate_wait, approver):
        """Once rejected, an approval is refused and the rejection stands."""
        services.wait_reject(wait_id=gate_wait.pk, user=approver, comment="no")
        before = snapshot(gate_wait)
        with pytest.raises(WaitRefused, match="already rejected by alice .* a decision cannot be changed"):
            services.wait_approve(wait_id=gate_wait.pk, user=approver, candidate_hash=GATE_HASH)
        assert snapshot(gate_wait) == before
        assert before[2] == "rejected"

    def test_user_without_the_role_may_not_decide(self, gate_wait, outsider):
        """A user outside the required group can neither approve nor reject."""
        before = snapshot(gate_wait)
        with pytest.raises(WaitRefused, match="needs a member of group 'release-approvers', and oscar is not one"):
            services.wait_approve(wait_id=gate_wait.pk, user=outsider, candidate_hash=GATE_HASH)
        with pytest.raises(WaitRefused, match="needs a member of group 'release-approvers', and oscar is not one"):
            services.wait_reject(wait_id=gate_wait.pk, user=outsider, comment="no")
        assert snapshot(gate_wait) == before

    def test_approver_who_launched_may_not_approve(self, rung, approver, settings):
        """Self-approval is refused for a member of the approver group."""
        settings.AGENTOPS_ALLOW_SELF_APPROVAL = False
        wait = gate(approver)
        before = snapshot(wait)
        with pytest.raises(WaitRefused, match="alice launched workflow .* may not decide its approvals"):
            services.wait_approve(wait_id=wait.pk, user=approver, candidate_hash=GATE_HASH)
        assert snapshot(wait) == before

    def test_superuser_who_launched_may_not_approve(self, rung, settings):
        """Self-approval is refused even for a superuser."""
        settings.AGENTOPS_ALLOW_SELF_APPROVAL = False
        boss = User.objects.create_superuser("boss", password="boss-password")
        wait = gate(boss)
        before = snapshot(wait)
        with pytest.raises(WaitRefused, match="boss launched workflow .* may not decide its approvals"):
            services.wait_approve(wait_id=wait.pk, user=boss, candidate_hash=GATE_HASH)
        with pytest.raises(WaitRefused, match="boss launched workflow"):
            services.wait_reject(wait_id=wait.pk, user=boss)
        assert snapshot(wait) == before

    def test_superuser_who_did_not_launch_may_approve(self, gate_wait):
        """A superuser may approve without being in the group, if someone else launched."""
        root = User.objects.create_superuser("root", password="root-password")
        result = services.wait_approve(wait_id=gate_wait.pk, user=root, candidate_hash=GATE_HASH)
        assert result.outcome == Decision.APPLIED
        gate_wait.refresh_from_db()
        assert (gate_wait.status, gate_wait.decision, gate_wait.decided_by) == ("satisfied", "approved", root)
        assert Workflow.objects.get(pk=gate_wait.workflow_id).status == "running"

    def test_expired_wait_is_refused(self, gate_wait, approver):
        """A wait past its expires_at cannot be decided, even before its timer fired."""
        Wait.objects.filter(pk=gate_wait.pk).update(expires_at=clock.now() - timedelta(seconds=1))
        before = snapshot(gate_wait)
        with pytest.raises(WaitRefused, match="expired at"):
            services.wait_approve(wait_id=gate_wait.pk, user=approver, candidate_hash=GATE_HASH)
        with pytest.raises(WaitRefused, match="expired at"):
            services.wait_reject(wait_id=gate_wait.pk, user=approver)
        assert snapshot(gate_wait) == before

    def test_unknown_wait_is_not_found(self, db, approver):
        """Deciding a wait that does not exist raises NotFound."""
        with pytest.raises(NotFound, match="Wait 987654 does not exist"):
            services.wait_approve(wait_id=987654, user=approver, candidate_hash="x")
        with pytest.raises(NotFound, match="Wait 987654 does not exist"):
            services.wait_reject(wait_id=987654, user=approver)

    @pytest.mark.parametrize(("comment", "message"), [("ok\x00", "NUL"), ("x" * 5001, "limit is 5000"),
                                                       ("bad \ud800", "lone surrogates")],
                             ids=["nul", "too-long", "surrogate"])
    def test_bad_comment_is_refused(self, gate_wait, approver, comment, message):
        """A comment PostgreSQL cannot store, or too long, is refused before anything is decided."""
        before = snapshot(gate_wait)
        with pytest.raises(InvalidInput, match=message):
            services.wait_approve(wait_id=gate_wait.pk, user=approver, candidate_hash=GATE_HASH, comment=comment)
        with pytest.raises(InvalidInput, match=message):
            services.wait_reject(wait_id=gate_wait.pk, user=approver, comment=comment)
        assert snapshot(gate_wait) == before


# --- Concurrent decisions (real transactions, one connection per thread) ------------------------


def _race_once(calls: list[tuple[Any, dict[str, Any]]]) -> list[Any]:
    """Run each (service, kwargs) in its own thread, released together by a barrier."""
    barrier = threading.Barrier(len(calls))
    results: list[Any] = [None] * len(calls)

    def run(i: int, fn: Any, kwargs: dict[str, Any]) -> None:
        try:
            barrier.wait(timeout=10)
            results[i] = fn(**kwargs)
        except Exception as exc:  # noqa: BLE001 - the assertion below reports it
            results[i] = exc
        finally:
            connection.close()

    threads = [threading.Thread(target=run, args=(i, fn, kw)) for i, (fn, kw) in enumerate(calls)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=30)
    assert not any(t.is_alive() for t in threads), "a decision hung"
    return results


@pytest.fixture
def bob(transactional_db: None) -> User:
    user = User.objects.create_user("bob", password="bob-password")
    user.groups.add(Group.objects.get_or_create(name=GATE_ROLE)[0])
    return user


@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize("variant", ["approve twice", "approve vs reject"])
def test_concurrent_decisions_apply_exactly_once(variant, approver, bob, rung):
    """Two decisions on one wait at the same instant: one applies, the other changes nothing.

    "approve twice" alternates a double submit by one approver and two approvers at once.
    """
    for round_ in range(20):
        wait = gate()
        workflow = Workflow.objects.get(pk=wait.workflow_id)
        approve = (services.wait_approve, {"wait_id": wait.pk, "user": approver, "candidate_hash": GATE_HASH})
        if variant == "approve vs reject":
            second = (services.wait_reject, {"wait_id": wait.pk, "user": bob, "comment": "no"})
        else:
            second = (services.wait_approve,
                      {"wait_id": wait.pk, "user": approver if round_ % 2 else bob, "candidate_hash": GATE_HASH})
        rung.clear()

        results = _race_once([approve, second])

        unexpected = [r for r in results if isinstance(r, Exception) and not isinstance(r, WaitRefused)]
        assert not unexpected, unexpected
        applied = [r for r in results if not isinstance(r, Exception) and r.outcome == Decision.APPLIED]
        losers = [r for r in results if r not in applied]
        assert (len(applied), len(losers)) == (1, 1), (round_, results)
        loser = losers[0]
        if isinstance(loser, WaitRefused):
            assert variant == "approve vs reject"
            assert "a decision cannot be changed" in str(loser)
        else:
            assert loser.outcome == Decision.ALREADY_APPLIED
            assert "nothing changed" in loser.message
        decided = Event.objects.filter(workflow=workflow, kind__in=["wait.approved", "wait.rejected"])
        assert decided.count() == 1
        assert [r for r in rung if r[0] == "workflow"] == [("workflow", workflow.pk)], \
            "the workflow must be woken exactly once"
        # Waking re-rings due scheduled work: here only the wait's notification, which no
        # worker ran in this test (a duplicate doorbell finds nothing to claim).
        notify = set(workflow.activities.filter(name=NOTIFY_ACTIVITY).values_list("pk", flat=True))
        assert {pk for what, pk in rung if what == "activity"} <= notify

        # Deliver the wake-up doorbell twice: the next step is scheduled once.
        services.workflow_advance_if_runnable(workflow_id=workflow.pk)
        services.workflow_advance_if_runnable(workflow_id=workflow.pk)
        wait.refresh_from_db()
        workflow.refresh_from_db()
        commits = Activity.objects.filter(workflow=workflow, name="test_gate_commit")
        if wait.decision == "approved":
            assert decided.get().kind == "wait.approved"
            assert (workflow.status, workflow.current_node, commits.count()) == ("running", "COMMIT", 1)
        else:
            assert decided.get().kind == "wait.rejected"
            assert (workflow.status, commits.count()) == ("failed", 0)
