"""Inputs refused where they enter: a clear error, exit status 2 on the command line,
and nothing changed. Dedupe keys, `show --events`, deactivated users, and self-approval by the
operator who set the goal."""
from __future__ import annotations

import re
import subprocess
import sys
from collections.abc import Iterator
from io import StringIO
from pathlib import Path
from typing import Any

import pytest
from django.contrib.auth.models import Group, User
from django.core.management import CommandError, call_command
from django.urls import reverse

from tests.admin.conftest import GATE_HASH, GATE_KIND, ROLE, AdminGate, gate_wait, logged_in, make_staff, state_of
from tests.conftest import open_approval, release_params
from workflows import services
from workflows.errors import InvalidInput, WaitRefused
from workflows.models import Event, Signal, Wait, Workflow
from workflows.services import Decision, Outcome
from workflows.testing import registered

pytestmark = pytest.mark.django_db
REPO_ROOT = Path(__file__).resolve().parents[2]
KEY_LIMIT = 200  # Signal.dedupe_key's max_length


@pytest.fixture(autouse=True)
def gate_registered(rung: list[tuple[str, int]]) -> Iterator[None]:
    """The admin tests' approval gate (a candidate the queue can show); doorbells are recorded."""
    with registered(AdminGate):
        yield


def agent(*args: str) -> str:
    out = StringIO()
    call_command("agent", *args, stdout=out)
    return out.getvalue()


def refused_on_the_command_line(*args: str) -> str:
    """The message of a bad-input refusal: exit status 2, one line."""
    with pytest.raises(CommandError) as excinfo:
        agent(*args)
    assert excinfo.value.returncode == 2
    message = str(excinfo.value)
    assert "\n" not in message
    return message


def approver_named(username: str, **fields: Any) -> User:
    user = User.objects.create_user(username, password=f"{username}-password", **fields)
    user.groups.add(Group.objects.get_or_create(name=ROLE)[0])
    return user


def signals_of(workflow_id: int) -> list[tuple[str, str]]:
    return list(Signal.objects.filter(workflow_id=workflow_id).order_by("pk").values_list("name", "dedupe_key"))


def history(workflow_id: int) -> list[tuple[int, str]]:
    return list(Event.objects.filter(workflow_id=workflow_id).order_by("seq").values_list("seq", "kind"))


# --- 1. Dedupe keys longer than the column ------------------------------------------------


def test_a_dedupe_key_longer_than_the_column_is_refused_and_stores_nothing(requester):
    """A 201-character key is refused before the database sees it (no DataError), naming the limit."""
    wait = gate_wait(requester)
    before = history(wait.workflow_id)
    with pytest.raises(InvalidInput, match=f"The dedupe key is 201 characters long; the limit is {KEY_LIMIT}"):
        services.workflow_signal(workflow_id=wait.workflow_id, name="go", dedupe_key="k" * (KEY_LIMIT + 1))
    assert (signals_of(wait.workflow_id), history(wait.workflow_id)) == ([], before)


def test_a_dedupe_key_of_exactly_the_column_length_is_received_once(requester):
    """(The workflow waits for an approval, not for "go": the signal is queued.)"""
    key = "k" * KEY_LIMIT
    wait = gate_wait(requester)
    assert services.workflow_signal(workflow_id=wait.workflow_id, name="go", dedupe_key=key).outcome == Outcome.QUEUED
    assert services.workflow_signal(workflow_id=wait.workflow_id, name="go", dedupe_key=key).outcome == \
        Outcome.ALREADY_APPLIED
    assert signals_of(wait.workflow_id) == [("go", key)]


def test_the_command_refuses_a_long_dedupe_key_with_exit_status_2(requester):
    wait = gate_wait(requester)
    before = history(wait.workflow_id)
    message = refused_on_the_command_line("signal", str(wait.workflow_id), "go", "--dedupe-key", "k" * 201)
    assert message == f"The dedupe key is 201 characters long; the limit is {KEY_LIMIT}. " \
                      "Send a shorter key, e.g. a hash of this one."
    assert (signals_of(wait.workflow_id), history(wait.workflow_id)) == ([], before)


# --- 2. Negative event counts -------------------------------------------------------------


def test_show_refuses_a_negative_event_count_with_exit_status_2(requester):
    wait = gate_wait(requester)
    message = refused_on_the_command_line("show", str(wait.workflow_id), "--events", "-1")
    assert message == "--events must be 0 or more; got -1."


def test_show_with_zero_events_lists_none(requester):
    wait = gate_wait(requester)
    detail = agent("show", str(wait.workflow_id), "--events", "0", "--json")
    assert '"events": []' in detail


def test_the_real_command_line_refuses_a_negative_event_count_in_one_line():
    """A real process exits 2 with one line on stderr, no traceback (checked before any lookup)."""
    done = subprocess.run([sys.executable, "manage.py", "agent", "show", "1", "--events", "-1"], cwd=REPO_ROOT,
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 2
    assert done.stderr.strip() == "CommandError: --events must be 0 or more; got -1."


# --- 3. User keys and generated keys never collide ----------------------------------------


def test_a_user_key_in_the_generated_namespace_is_refused(requester):
    """`auto-…` is reserved for keyless signals: refused with the reason, nothing stored."""
    wait = gate_wait(requester)
    before = history(wait.workflow_id)
    with pytest.raises(InvalidInput, match="The dedupe key 'auto-7' starts with 'auto-', which is reserved"):
        services.workflow_signal(workflow_id=wait.workflow_id, name="go", dedupe_key="auto-7")
    assert (signals_of(wait.workflow_id), history(wait.workflow_id)) == ([], before)
    message = refused_on_the_command_line("signal", str(wait.workflow_id), "go", "--dedupe-key", "auto-7")
    assert "reserved for the keys of signals sent without one" in message


def test_a_keyless_signal_is_kept_even_when_a_stored_user_key_has_its_generated_key(requester):
    """A row stored before the namespace was reserved (a user's `auto-N`) never swallows a keyless
    signal (queued: the workflow waits for an approval, not for "go")."""
    wait = gate_wait(requester)
    workflow = Workflow.objects.get(pk=wait.workflow_id)
    taken = f"auto-{workflow.event_seq + 1}"  # the key today's code would generate next
    Signal.objects.create(workflow=workflow, name="user", dedupe_key=taken, received_at=workflow.created_at)

    assert services.workflow_signal(workflow_id=workflow.pk, name="go").outcome == Outcome.QUEUED

    assert signals_of(workflow.pk) == [("user", taken), ("go", f"{taken}.1")]
    assert history(workflow.pk)[-1][1] == "signal.received"


def test_keyless_signals_are_each_queued_and_stored_keys_still_deduplicate(requester):
    """No wait for "go" is open: each keyless signal is a new one, queued; a repeated key is not."""
    wait = gate_wait(requester)
    workflow_id = wait.workflow_id
    assert services.workflow_signal(workflow_id=workflow_id, name="go").outcome == Outcome.QUEUED
    assert services.workflow_signal(workflow_id=workflow_id, name="go").outcome == Outcome.QUEUED
    first = services.workflow_signal(workflow_id=workflow_id, name="go", dedupe_key="deliver-1")
    assert first.outcome == Outcome.QUEUED
    assert services.workflow_signal(workflow_id=workflow_id, name="go", dedupe_key="deliver-1").outcome == \
        Outcome.ALREADY_APPLIED
    keys = [key for _, key in signals_of(workflow_id)]
    assert len(keys) == 3 and keys[2] == "deliver-1"
    assert all(re.fullmatch(r"auto-\d+", key) for key in keys[:2]) and keys[0] != keys[1]


def test_the_signal_help_names_the_limit_and_the_reserved_prefix():
    done = subprocess.run([sys.executable, "manage.py", "agent", "signal", "--help"], cwd=REPO_ROOT,
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 0
    help_text = " ".join(done.stdout.split())
    assert f"at most {KEY_LIMIT} characters, not starting with 'auto-'" in help_text
    assert "or 'webhook:' (reserved for signed webhook deliveries)" in help_text


def test_a_user_key_in_the_webhook_namespace_is_refused(requester):
    """`webhook:…` holds the keys of signed deliveries: no caller of the service, the command line
    included, may store one (README, "Webhooks")."""
    wait = gate_wait(requester)
    before = history(wait.workflow_id)
    with pytest.raises(InvalidInput, match="starts with 'webhook:', which is reserved for signed webhook deliveries"):
        services.workflow_signal(workflow_id=wait.workflow_id, name="go", dedupe_key="webhook:ci:build-1")
    message = refused_on_the_command_line("signal", str(wait.workflow_id), "go", "--dedupe-key", "webhook:x")
    assert message == ("The dedupe key 'webhook:x' starts with 'webhook:', which is reserved for signed webhook "
                       "deliveries; choose a key without that prefix.")
    assert (signals_of(wait.workflow_id), history(wait.workflow_id)) == ([], before)
    delivered = services.workflow_signal_from_webhook(workflow_id=wait.workflow_id, name="go", payload=None,
                                                      source="ci", delivery_id="build-1")
    assert delivered.outcome == Outcome.QUEUED  # the workflow waits for an approval, not for "go"
    assert signals_of(wait.workflow_id) == [("go", "webhook:ci:build-1")]


# --- 4. Deactivated users -----------------------------------------------------------------


def test_a_deactivated_approver_is_refused_and_the_wait_stays_open(requester):
    approver_named("bob", is_active=False)
    wait = gate_wait(requester)
    before = state_of(wait)
    message = refused_on_the_command_line("approve", str(wait.pk), "--user", "bob", "--candidate-hash", GATE_HASH)
    assert message == "User 'bob' is deactivated (Active is off in the admin); act as an active user, " \
                      "or reactivate bob first."
    assert state_of(wait) == before


def test_a_deactivated_user_cannot_launch(db):
    User.objects.create_user("gone", password="gone-password", is_active=False)
    message = refused_on_the_command_line("launch", GATE_KIND, "--goal", "Open the gate", "--user", "gone")
    assert "User 'gone' is deactivated" in message
    assert Workflow.objects.count() == 0


# --- 5. Whoever set the goal may not approve its candidate --------------------------------


def superseded_by(wait: Wait, user: User | None) -> Wait:
    """The wait opened again after ``user`` changed the goal of ``wait``'s workflow."""
    services.workflow_supersede(workflow_id=wait.workflow_id, goal="Open the gate for 2.0", user=user)
    services.workflow_advance_if_runnable(workflow_id=wait.workflow_id)
    return open_approval(wait.workflow_id)


def test_the_author_of_the_waits_intent_may_not_decide_it(requester, settings):
    """alice changed the goal (intent v2): the candidate built for it needs another approver."""
    settings.AGENTOPS_ALLOW_SELF_APPROVAL = False
    alice = approver_named("alice")
    wait = superseded_by(gate_wait(requester), alice)
    assert wait.intent_version == 2
    before = state_of(wait)
    expected = (f"alice set the goal of workflow {wait.workflow_id} \\(intent v2\\) that wait {wait.pk} was opened "
                "for, and may not decide its approvals \\(AGENTOPS_ALLOW_SELF_APPROVAL is off\\); another approver")
    with pytest.raises(WaitRefused, match=expected):
        services.wait_approve(wait_id=wait.pk, user=alice, candidate_hash=GATE_HASH)
    with pytest.raises(WaitRefused, match=expected):
        services.wait_reject(wait_id=wait.pk, user=alice)
    assert state_of(wait) == before

    result = services.wait_approve(wait_id=wait.pk, user=approver_named("bob"), candidate_hash=GATE_HASH)
    assert result.outcome == Decision.APPLIED


def test_only_the_author_of_the_waits_own_intent_version_is_refused(requester, settings):
    """alice set v2, bob set v3: the wait under v3 is bob's goal, so alice may decide it."""
    settings.AGENTOPS_ALLOW_SELF_APPROVAL = False
    alice, bob = approver_named("alice"), approver_named("bob")
    wait = superseded_by(superseded_by(gate_wait(requester), alice), bob)
    assert wait.intent_version == 3
    with pytest.raises(WaitRefused, match="bob set the goal"):
        services.wait_approve(wait_id=wait.pk, user=bob, candidate_hash=GATE_HASH)
    assert services.wait_approve(wait_id=wait.pk, user=alice, candidate_hash=GATE_HASH).outcome == Decision.APPLIED


def test_allowing_self_approval_lets_the_author_of_the_goal_decide(requester, settings):
    settings.AGENTOPS_ALLOW_SELF_APPROVAL = True
    alice = approver_named("alice")
    wait = superseded_by(gate_wait(requester), alice)
    assert services.wait_approve(wait_id=wait.pk, user=alice, candidate_hash=GATE_HASH).outcome == Decision.APPLIED


def test_the_admin_shows_the_author_of_the_goal_no_buttons_and_answers_a_forged_post_with_403(requester, settings):
    settings.AGENTOPS_ALLOW_SELF_APPROVAL = False
    alice = make_staff(approver_named("alice"), "workflows.view_workflow", "workflows.view_wait")
    wait = superseded_by(gate_wait(requester), alice)
    client = logged_in(alice)
    reason = f"alice set the goal of workflow {wait.workflow_id} (intent v2) that wait {wait.pk} was opened for"

    page = client.get(reverse("admin:workflows_wait_approvals")).content.decode()
    assert 'value="approve"' not in page and 'value="reject"' not in page
    assert f'id="other-wait-{wait.pk}"' in page and reason in page

    before = state_of(wait)
    response = client.post(reverse("admin:workflows_wait_decide", args=[wait.pk]),
                           {"decision": "approve", "candidate_hash": GATE_HASH, "comment": ""})
    assert response.status_code == 403
    assert reason in response.content.decode()
    assert state_of(wait) == before


def test_unknown_kind_is_refused():
    with pytest.raises(InvalidInput, match="Unknown workflow kind 'nope'; known kinds: .*autonomous, "):
        services.workflow_launch(kind="nope", goal="g")


@pytest.mark.parametrize(
    ("goal", "message"),
    [("", "non-empty"), ("x" * 10_001, "limit is 10000"), ("a\x00b", "NUL"), ("bad \ud800", "lone surrogates")],
)
def test_bad_goals_are_refused(git_repo, goal, message):
    with pytest.raises(InvalidInput, match=message):
        services.workflow_launch(kind="release", goal=goal, params=release_params(git_repo))
    assert not Workflow.objects.exists()
