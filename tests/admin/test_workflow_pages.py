"""Workflow inspection and operator actions through Django's test client."""
from __future__ import annotations

import re

import pytest
from django.urls import reverse

from tests.admin.conftest import gate_wait, logged_in, messages_of, state_of
from tests.conftest import drive, release_params
from workflows import services
from workflows.models import ActivityAttempt, Intent, Wait, Workflow

CHANGELIST = reverse("admin:workflows_workflow_changelist")


def page_of(workflow_id: int) -> str:
    return reverse("admin:workflows_workflow_change", args=[workflow_id])


def action_url(workflow_id: int, action: str) -> str:
    return reverse(f"admin:workflows_workflow_{action}", args=[workflow_id])


@pytest.fixture
def completed_release(waiting_release, approver, deploy_target):
    services.wait_approve(wait_id=waiting_release.pk, user=approver, candidate_hash=waiting_release.candidate_hash)
    workflow = drive(waiting_release.workflow_id)
    assert workflow.status == Workflow.Status.COMPLETED
    return workflow


@pytest.mark.django_db
class TestWorkflowList:
    def test_filters_and_search_find_workflows_by_status_node_wait_id_and_goal(self, staff_outsider, requester,
                                                                               git_repo):
        waiting = gate_wait(requester).workflow
        other = services.workflow_launch(kind="release", goal="Rotate the signing keys", user=requester,
                                         params=release_params(git_repo))
        client = logged_in(staff_outsider)

        def ids(**query: str) -> set[int]:
            response = client.get(CHANGELIST, query)
            assert response.status_code == 200
            return {w.pk for w in response.context["cl"].result_list}

        assert ids() == {waiting.pk, other.pk}
        assert ids(status__exact="waiting") == {waiting.pk}
        assert ids(current_node__exact="ASK") == {waiting.pk}
        assert ids(status__exact="running") == {other.pk}
        assert ids(waiting_on="approval") == {waiting.pk}
        assert ids(q="signing keys") == {other.pk}
        assert ids(q=str(waiting.pk)) == {waiting.pk}
        assert ids(quiet="1h") == set()

    def test_the_list_shows_status_node_goal_and_what_it_waits_on(self, staff_outsider, requester):
        wait = gate_wait(requester)
        page = logged_in(staff_outsider).get(CHANGELIST).content.decode()
        assert '<span class="ao-badge ao-waiting">waiting</span>' in page
        assert "Open the gate for &lt;release&gt; 1.0" in page
        queue = reverse("admin:workflows_wait_approvals")
        assert f'<a href="{queue}#wait-{wait.pk}" title="approval by release-approvers">approval</a>' in page
        assert f'href="{page_of(wait.workflow_id)}"' in page

    def test_an_id_search_finds_that_workflow_alone(self, staff_outsider, requester):
        workflows = [gate_wait(requester).workflow for _ in range(12)]
        page = logged_in(staff_outsider).get(CHANGELIST, {"q": str(workflows[3].pk)}).content.decode()
        assert re.findall(r'<th class="field-id"><a href="[^"]*/(\d+)/change/', page) == [str(workflows[3].pk)]

    def test_history_is_the_event_timeline_and_the_site_root_is_the_admin(self, staff_outsider, requester):
        workflow = gate_wait(requester).workflow
        client = logged_in(staff_outsider)
        history = client.get(reverse("admin:workflows_workflow_history", args=[workflow.pk]))
        assert history.status_code == 302 and history["Location"] == page_of(workflow.pk) + "#timeline"
        assert client.get("/")["Location"] == "/admin/"
        assert "View site" not in client.get(CHANGELIST).content.decode()


@pytest.mark.django_db
class TestWorkflowPage:
    def test_the_page_shows_path_history_attempts_commitments_and_release(self, completed_release, staff_outsider):
        page = logged_in(staff_outsider).get(page_of(completed_release.pk)).content.decode()

        assert "<svg" in page and "Path through the nodes so far" in page
        path = re.search(r'<p class="ao-path-text">(.*?)</p>', page, re.S).group(1)
        assert path.split(" → ") == [
            "GATHER_EVIDENCE", "BUILD_CANDIDATE", "VERIFY_CANDIDATE", "REQUEST_APPROVAL", "WAIT_FOR_APPROVAL",
            "REVALIDATE", "COMMIT_OPERATION", "VERIFY_POSTCONDITION", "RECONCILE", "COMPLETE",
        ]
        for section in ("Goal history (intents)", "Waits", "Activities and their attempts", "Commitments",
                        "Timers", "Behavioral release", "Event timeline", "Checkpoints"):
            assert f"<h2>{section}</h2>" in page
        assert "approved by alice at" in page
        assert "deploy" in page and "in-process" in page  # an activity and the worker of its attempt
        assert '{&quot;deployment_id&quot;: &quot;dep_' in page  # commitment data as JSON, not a Python repr
        assert '<span class="ao-badge ao-released">released</span>' in page
        assert "workflow.completed" in page
        assert completed_release.release.fingerprint in page
        assert "Set <code>AGENTOPS_FLOWER_URL</code>" in page
        assert "Lifecycle status; changes only through the workflow services." in page  # help text, computed field
        assert "Launch parameters (validated by the definition)." in page

    def test_attempts_link_to_flower_when_its_url_is_set(self, completed_release, staff_outsider, settings):
        settings.AGENTOPS_FLOWER_URL = "http://flower.example:5555/"
        attempt = ActivityAttempt.objects.filter(activity__workflow=completed_release).first()
        ActivityAttempt.objects.filter(pk=attempt.pk).update(task_id="3f2c9a7e-task")

        page = logged_in(staff_outsider).get(page_of(completed_release.pk)).content.decode()

        assert '<a href="http://flower.example:5555/task/3f2c9a7e-task" class="ao-flower">' in page

    def test_generic_admin_forms_cannot_add_change_or_delete(self, admin_user, requester):
        workflow = gate_wait(requester).workflow
        client = logged_in(admin_user)
        before = Workflow.objects.values().get(pk=workflow.pk)

        assert client.get(reverse("admin:workflows_workflow_add")).status_code == 403
        delete = reverse("admin:workflows_workflow_delete", args=[workflow.pk])
        assert client.post(delete, {"post": "yes"}).status_code == 403
        client.post(page_of(workflow.pk), {"status": "completed", "current_node": "DONE"})
        assert Workflow.objects.values().get(pk=workflow.pk) == before
        assert 'name="_save"' not in client.get(page_of(workflow.pk)).content.decode()


@pytest.mark.django_db
class TestOperatorActions:
    def test_a_confirmation_page_reached_by_url_says_what_applies_instead_of_promising_it(
        self, completed_release, operator
    ):
        client = logged_in(operator)
        for action, label in (("resume", "Resume workflow"), ("cancel", "Cancel workflow")):
            response = client.get(action_url(completed_release.pk, action), follow=True)
            [(url, status)] = response.redirect_chain
            assert status == 302 and url.startswith(page_of(completed_release.pk) + "?outcome=")
            assert messages_of(response) == [
                ("warning", f"Workflow {completed_release.pk} is completed; “{label}” does not apply to it.")]
            assert "Yes," not in response.content.decode()

    def test_without_the_change_permission_there_are_no_buttons_and_a_post_gets_403(self, staff_outsider, requester):
        wait = gate_wait(requester)
        client = logged_in(staff_outsider)
        assert "Cancel workflow…" not in client.get(page_of(wait.workflow_id)).content.decode()
        before = state_of(wait)

        for action, data in (("cancel", {"reason": "x"}), ("resume", {}), ("supersede", {"goal": "y"})):
            assert client.get(action_url(wait.workflow_id, action)).status_code == 403
            response = client.post(action_url(wait.workflow_id, action), data)
            assert response.status_code == 403
            assert "workflows.change_workflow" in response.content.decode()
        assert state_of(wait) == before

    def test_cancel_asks_for_confirmation_then_cancels_through_the_service(self, operator, requester):
        wait = gate_wait(requester)
        client = logged_in(operator)
        page = client.get(page_of(wait.workflow_id)).content.decode()
        assert f'href="{action_url(wait.workflow_id, "cancel")}"' in page

        confirm = client.get(action_url(wait.workflow_id, "cancel")).content.decode()
        assert f"Yes, cancel workflow {wait.workflow_id}" in confirm and "This cannot be" in confirm
        assert Workflow.objects.get(pk=wait.workflow_id).status == Workflow.Status.WAITING

        response = client.post(action_url(wait.workflow_id, "cancel"), {"reason": "wrong release train"}, follow=True)

        workflow = Workflow.objects.get(pk=wait.workflow_id)
        assert workflow.status == Workflow.Status.CANCELLED and workflow.reason == "wrong release train"
        assert messages_of(response) == [("success", f"Workflow {workflow.pk} is cancelled.")]
        again = client.post(action_url(wait.workflow_id, "cancel"), {"reason": ""}, follow=True)
        assert messages_of(again) == [("warning", f"Workflow {workflow.pk} was already cancelled; nothing changed.")]

    def test_change_goal_records_a_new_intent_and_withdraws_the_approval(self, operator, requester):
        wait = gate_wait(requester)
        client = logged_in(operator)
        assert "Open the gate for &lt;release&gt; 1.0</textarea>" in client.get(
            action_url(wait.workflow_id, "supersede")).content.decode()

        response = client.post(action_url(wait.workflow_id, "supersede"), {"goal": "Open the gate for 1.1"},
                               follow=True)

        [(level, text)] = messages_of(response)
        assert level == "success" and f"Workflow {wait.workflow_id} now pursues intent v2" in text
        assert Intent.objects.get(workflow_id=wait.workflow_id, version=2).goal == "Open the gate for 1.1"
        assert Intent.objects.get(workflow_id=wait.workflow_id, version=2).created_by == operator
        wait.refresh_from_db()
        assert wait.status == Wait.Status.INVALIDATED

    def test_the_supersede_form_sent_twice_makes_one_intent_version(self, operator, requester):
        """The page carries a key made when it was shown: a double click or a resent POST is one
        supersede, and the second says so."""
        wait = gate_wait(requester)
        client = logged_in(operator)
        page = client.get(action_url(wait.workflow_id, "supersede")).content.decode()
        found = re.search(r'name="request_key" value="(admin-[0-9a-f]{32})"', page)
        assert found, "the form carries its key"
        data = {"goal": "Open the gate for 1.1", "request_key": found.group(1)}

        first = client.post(action_url(wait.workflow_id, "supersede"), data, follow=True)
        again = client.post(action_url(wait.workflow_id, "supersede"), data, follow=True)

        assert [level for level, _ in messages_of(first)] == ["success"]
        [(level, text)] = messages_of(again)
        assert level == "warning" and f"already made intent v2 of workflow {wait.workflow_id}" in text
        assert Intent.objects.filter(workflow_id=wait.workflow_id).count() == 2

    def test_an_empty_goal_is_a_form_error_and_changes_nothing(self, operator, requester):
        wait = gate_wait(requester)
        before = state_of(wait)
        response = logged_in(operator).post(action_url(wait.workflow_id, "supersede"), {"goal": "  "})
        assert response.status_code == 200 and "This field is required." in response.content.decode()
        assert state_of(wait) == before

    def test_a_refused_action_shows_the_services_message(self, operator, requester):
        wait = gate_wait(requester)
        before = state_of(wait)

        response = logged_in(operator).post(action_url(wait.workflow_id, "resume"), {}, follow=True)

        assert messages_of(response) == [("error", f"Workflow {wait.workflow_id} is waiting on approval wait "
                                                   f"{wait.pk}; decide or signal it instead.")]
        assert state_of(wait) == before

    def test_actions_need_a_csrf_token(self, operator, requester):
        wait = gate_wait(requester)
        before = state_of(wait)
        client = logged_in(operator, enforce_csrf_checks=True)
        assert client.post(action_url(wait.workflow_id, "cancel"), {"reason": "x"}).status_code == 403
        assert state_of(wait) == before
