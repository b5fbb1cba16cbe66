"""The approval queue through Django's test client: what each user sees, permissions, CSRF, refusals."""
from __future__ import annotations

import re

import pytest
from django.test import Client
from django.urls import reverse

from tests.admin.conftest import GATE_HASH, gate_wait, logged_in, messages_of, state_of
from workflows.models import Event, Wait, Workflow

QUEUE = reverse("admin:workflows_wait_approvals")


def decide_url(wait: Wait) -> str:
    return reverse("admin:workflows_wait_decide", args=[wait.pk])


def approve(client: Client, wait: Wait, candidate_hash: str | None = None, **extra: str):
    data = {"decision": "approve", "candidate_hash": wait.candidate_hash if candidate_hash is None else candidate_hash,
            "comment": "", **extra}
    return client.post(decide_url(wait), data, follow=True)


@pytest.mark.django_db
class TestQueuePage:
    def test_approver_sees_the_candidate_in_full_and_escaped(self, waiting_gate, staff_approver):
        """Title, summary, every file with its content, HEAD, tests, hash, goal, requester and time left."""
        page = logged_in(staff_approver).get(QUEUE).content.decode()

        assert f'id="wait-{waiting_gate.pk}"' in page
        assert "Ship &lt;b&gt;notes&lt;/b&gt;" in page
        assert "&lt;img src=x onerror=alert(1)&gt;" in page
        assert "&lt;script&gt;alert(&#x27;owned&#x27;)&lt;/script&gt;" in page
        assert "<script>alert" not in page and "<img src=x" not in page
        assert "NOTES.md" in page and "VERSION" in page
        assert GATE_HASH in page
        assert "0123456789abcdef0123456789abcdef01234567" in page
        assert "Open the gate for &lt;release&gt; 1.0" in page
        assert "rita" in page
        assert re.search(r"<strong>2\xa0hours, 59\xa0minutes left</strong>|<strong>3\xa0hours left</strong>", page)
        assert page.count('value="approve"') == 1 and page.count('value="reject"') == 1

    def test_user_without_the_role_sees_no_buttons_but_learns_why(self, waiting_gate, staff_outsider):
        page = logged_in(staff_outsider).get(QUEUE).content.decode()

        assert "Nothing is waiting for your decision." in page
        assert 'value="approve"' not in page and 'value="reject"' not in page
        assert f'id="other-wait-{waiting_gate.pk}"' in page
        assert "needs a member of group &#x27;release-approvers&#x27;" in page
        assert "&lt;script&gt;" not in page  # no candidate content for non-deciders

    def test_the_requester_may_not_decide_their_own_workflow(self, staff_requester):
        wait = gate_wait(staff_requester)
        page = logged_in(staff_requester).get(QUEUE).content.decode()

        assert 'value="approve"' not in page
        assert f"{staff_requester.username} launched workflow {wait.workflow_id}" in page

    def test_a_superuser_may_decide_without_being_in_the_group(self, waiting_gate, admin_user):
        page = logged_in(admin_user).get(QUEUE).content.decode()
        assert page.count('value="approve"') == 1

    def test_non_staff_and_anonymous_users_are_sent_to_the_login_page(self, waiting_gate, approver):
        for client in (Client(), logged_in(approver)):
            assert client.get(QUEUE).status_code == 302
            before = state_of(waiting_gate)
            response = client.post(decide_url(waiting_gate), {"decision": "approve",
                                                              "candidate_hash": waiting_gate.candidate_hash})
            assert response.status_code == 302 and "/admin/login/" in response["Location"]
            assert state_of(waiting_gate) == before

    def test_the_index_and_the_wait_list_link_to_the_queue(self, waiting_gate, staff_approver):
        client = logged_in(staff_approver)
        index = client.get(reverse("admin:index")).content.decode()
        assert f'href="{QUEUE}"' in index and "1 approval waiting for your decision" in index
        waits = client.get(reverse("admin:workflows_wait_changelist")).content.decode()
        assert f'href="{QUEUE}"' in waits


@pytest.mark.django_db
class TestDecisions:
    def test_approval_applies_and_a_duplicate_says_who_decided_and_when(self, waiting_gate, staff_approver, rung):
        client = logged_in(staff_approver)

        first = approve(client, waiting_gate, comment="looks right")
        assert messages_of(first) == [("success", f"Wait {waiting_gate.pk} approved by alice.")]
        assert ("workflow", waiting_gate.workflow_id) in rung
        before = state_of(waiting_gate)

        again = approve(client, waiting_gate)
        [(level, text)] = messages_of(again)
        assert level == "warning"
        expected = rf"Wait {waiting_gate.pk} was already approved by alice at \S+ \S+ UTC; nothing changed\."
        assert re.fullmatch(expected, text)
        assert state_of(waiting_gate) == before
        assert Event.objects.filter(workflow_id=waiting_gate.workflow_id, kind="wait.approved").count() == 1
        assert waiting_gate.comment == "looks right"

    def test_two_decisions_in_a_row_each_lead_to_their_own_message(self, staff_approver, requester):
        """Two POSTs before either page is shown (a double click, or a second card decided while the
        first page loads): each redirect carries its own outcome, so neither page shows the other's
        message, and no message waits in the browser's storage to turn up on a later page."""
        first, second = gate_wait(requester), gate_wait(requester)
        client = logged_in(staff_approver)

        posts = [client.post(decide_url(first), {"decision": "approve", "candidate_hash": GATE_HASH}),
                 client.post(decide_url(first), {"decision": "approve", "candidate_hash": GATE_HASH}),
                 client.post(decide_url(second), {"decision": "reject", "comment": "not this one"})]

        assert [p.status_code for p in posts] == [302, 302, 302]
        pages = [client.get(p["Location"]) for p in posts]
        assert messages_of(pages[0]) == [("success", f"Wait {first.pk} approved by alice.")]
        [(level, text)] = messages_of(pages[1])
        assert level == "warning" and text.startswith(f"Wait {first.pk} was already approved by alice at ")
        assert messages_of(pages[2]) == [("success", f"Wait {second.pk} rejected by alice.")]
        assert messages_of(client.get(QUEUE)) == []

    def test_an_altered_outcome_link_shows_no_message(self, waiting_gate, staff_approver):
        """Only this admin writes the messages its pages show: the outcome in the link is signed."""
        client = logged_in(staff_approver)
        location = approve(client, waiting_gate).redirect_chain[-1][0]
        token = location.split("outcome=", 1)[1]

        forged = client.get(QUEUE, {"outcome": token[:-4] + "AAAA"})

        assert forged.status_code == 200 and messages_of(forged) == []

    def test_rejection_fails_the_workflow_with_the_comment(self, waiting_gate, staff_approver):
        from tests.conftest import drive

        response = logged_in(staff_approver).post(
            decide_url(waiting_gate), {"decision": "reject", "comment": "not this week"}, follow=True)

        assert messages_of(response) == [("success", f"Wait {waiting_gate.pk} rejected by alice.")]
        workflow = drive(waiting_gate.workflow_id)
        assert workflow.status == Workflow.Status.FAILED
        assert workflow.reason == "Rejected by alice: not this week"

    def test_a_stale_candidate_hash_is_refused_with_the_services_message(self, waiting_gate, staff_approver):
        before = state_of(waiting_gate)

        response = approve(logged_in(staff_approver), waiting_gate, candidate_hash="f" * 64)

        [(level, text)] = messages_of(response)
        assert level == "error"
        assert f"Wait {waiting_gate.pk} is bound to candidate {GATE_HASH[:12]}…, not ffffffffffff…" in text
        assert state_of(waiting_gate) == before

    def test_a_forged_post_from_a_user_without_the_role_gets_403(self, waiting_gate, staff_outsider):
        before = state_of(waiting_gate)

        response = approve(logged_in(staff_outsider), waiting_gate)

        assert response.status_code == 403
        assert "needs a member of group &#x27;release-approvers&#x27;" in response.content.decode()
        assert state_of(waiting_gate) == before

    def test_a_forged_post_from_the_requester_gets_403(self, staff_requester):
        wait = gate_wait(staff_requester)
        before = state_of(wait)

        response = approve(logged_in(staff_requester), wait)

        assert response.status_code == 403
        assert state_of(wait) == before

    def test_a_post_without_a_csrf_token_gets_403_and_changes_nothing(self, waiting_gate, staff_approver):
        client = logged_in(staff_approver, enforce_csrf_checks=True)
        before = state_of(waiting_gate)

        response = client.post(decide_url(waiting_gate), {"decision": "approve",
                                                          "candidate_hash": waiting_gate.candidate_hash})

        assert response.status_code == 403
        assert b"CSRF" in response.content
        assert state_of(waiting_gate) == before

    def test_the_queue_forms_carry_a_working_csrf_token(self, waiting_gate, staff_approver):
        client = logged_in(staff_approver, enforce_csrf_checks=True)
        page = client.get(QUEUE).content.decode()
        token = re.search(r'name="csrfmiddlewaretoken" value="([^"]+)"', page).group(1)

        response = client.post(decide_url(waiting_gate), {"decision": "approve", "csrfmiddlewaretoken": token,
                                                          "candidate_hash": waiting_gate.candidate_hash})

        assert response.status_code == 302 and response["Location"].startswith(QUEUE + "?outcome=")
        waiting_gate.refresh_from_db()
        assert waiting_gate.decision == Wait.Decision.APPROVED

    def test_get_never_decides(self, waiting_gate, staff_approver):
        before = state_of(waiting_gate)
        response = logged_in(staff_approver).get(decide_url(waiting_gate), {"decision": "approve",
                                                                            "candidate_hash": GATE_HASH})
        assert response.status_code == 405
        assert state_of(waiting_gate) == before

    def test_an_unknown_decision_is_a_bad_request(self, waiting_gate, staff_approver):
        before = state_of(waiting_gate)
        response = logged_in(staff_approver).post(decide_url(waiting_gate), {"decision": "approve-all"})
        assert response.status_code == 400
        assert state_of(waiting_gate) == before

    def test_an_expired_wait_leaves_the_queue_and_is_refused(self, waiting_gate, staff_approver, time_machine):
        from datetime import timedelta

        from workflows import clock

        time_machine.move_to(clock.now() + timedelta(hours=4))
        client = logged_in(staff_approver)
        assert 'value="approve"' not in client.get(QUEUE).content.decode()
        before = state_of(waiting_gate)

        response = approve(client, waiting_gate)

        [(level, text)] = messages_of(response)
        assert level == "error" and f"Wait {waiting_gate.pk} expired at" in text
        assert state_of(waiting_gate) == before
