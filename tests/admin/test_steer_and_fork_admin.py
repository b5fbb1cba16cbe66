"""The workflow page's steer form and its steer messages and fork relation, through Django's test client."""
from __future__ import annotations

import re

import pytest
from django.urls import reverse

from tests.admin.conftest import gate_wait, logged_in, messages_of
from workflows.features import forks
from workflows.models import SteerMessage

pytestmark = pytest.mark.django_db


def page_of(workflow_id: int) -> str:
    return reverse("admin:workflows_workflow_change", args=[workflow_id])


def steer_url(workflow_id: int) -> str:
    return reverse("admin:workflows_workflow_steer", args=[workflow_id])


def test_steer_is_sent_once_with_the_operators_name_and_listed_on_the_page(operator, waiting_release):
    """The form carries a key made when it was shown: sent twice it is one message, and the page lists it."""
    workflow_id = waiting_release.workflow_id
    client = logged_in(operator)
    assert f'href="{steer_url(workflow_id)}"' in client.get(page_of(workflow_id)).content.decode()
    form = client.get(steer_url(workflow_id)).content.decode()
    assert f"Yes, steer the agent {workflow_id}" in form and "receives it" in form
    key = re.search(r'name="request_key" value="(admin-[0-9a-f]{32})"', form).group(1)
    data = {"message": "Mention the <migration> in the summary.", "request_key": key}

    first = client.post(steer_url(workflow_id), data, follow=True)
    again = client.post(steer_url(workflow_id), data, follow=True)

    [(level, text)] = messages_of(first)
    assert level == "success" and f"Steer message #1 recorded for workflow {workflow_id}" in text
    assert [level for level, _ in messages_of(again)] == ["warning"]
    row = SteerMessage.objects.get(workflow_id=workflow_id)
    assert (row.sender, row.sent_by, row.text) == ("olga", operator, "Mention the <migration> in the summary.")
    page = client.get(page_of(workflow_id)).content.decode()
    assert "<strong>pending</strong> by olga" in page and "Mention the &lt;migration&gt; in the summary." in page


def test_an_empty_steer_is_a_form_error_and_a_kind_without_steering_has_no_button(operator, requester,
                                                                                   waiting_release):
    client = logged_in(operator)
    response = client.post(steer_url(waiting_release.workflow_id), {"message": ""})
    assert response.status_code == 200 and "This field is required." in response.content.decode()
    gate = gate_wait(requester)
    assert f'href="{steer_url(gate.workflow_id)}"' not in client.get(page_of(gate.workflow_id)).content.decode()
    refused = client.post(steer_url(gate.workflow_id), {"message": "hello"}, follow=True)
    [(level, text)] = messages_of(refused)
    assert level == "error" and "whose model calls do not read steer messages" in text
    assert not SteerMessage.objects.exists()


def test_the_page_names_a_forks_original_and_an_originals_forks(operator, waiting_release):
    original = waiting_release.workflow_id
    fork = forks.workflow_fork(workflow_id=original, from_visit=2, user=operator)
    client = logged_in(operator)
    assert f'Forks: <a href="{page_of(fork.pk)}">workflow {fork.pk}</a> (from visit 2' in client.get(
        page_of(original)).content.decode()
    assert f'Forked from <a href="{page_of(original)}">workflow {original}</a>: reused its visits 1–2.' in \
        client.get(page_of(fork.pk)).content.decode()
