"""A workflow's tree is visible: the admin's page links parent and children, `agent show` lists
them, the API's workflow read has their ids."""
from __future__ import annotations

from io import StringIO

import pytest
from django.core.management import call_command
from django.urls import reverse

import tests.child_kinds  # noqa: F401  (registers the kinds)
from tests.api.conftest import grant, token_for
from tests.conftest import drive
from workflows import services
from workflows.models import Workflow

pytestmark = [pytest.mark.django_db, pytest.mark.usefixtures("rung")]


@pytest.fixture
def tree() -> tuple[Workflow, list[Workflow]]:
    parent = services.workflow_launch(kind="test-fanout", goal="Square two", params={"ns": [1, 2],
                                                                                    "budget_usd": "0.25"})
    drive(parent.pk)
    return parent, list(Workflow.objects.filter(parent=parent).order_by("pk"))


def test_the_admin_page_links_the_parent_and_its_children(client, staff_outsider, tree) -> None:
    parent, kids = tree
    client.force_login(staff_outsider)
    page = client.get(reverse("admin:workflows_workflow_change", args=[parent.pk])).content.decode()
    for kid in kids:
        assert f'href="{reverse("admin:workflows_workflow_change", args=[kid.pk])}"' in page
        assert kid.parent_wait.operation_id in page
    child_page = client.get(reverse("admin:workflows_workflow_change", args=[kids[0].pk])).content.decode()
    assert f'<a href="{reverse("admin:workflows_workflow_change", args=[parent.pk])}">workflow {parent.pk}</a>' \
        in child_page


def test_agent_show_lists_children_and_a_child_names_its_parent(tree) -> None:
    parent, kids = tree
    out = StringIO()
    call_command("agent", "show", str(parent.pk), stdout=out)
    text = out.getvalue()
    assert "Children" in text and all(kid.parent_wait.operation_id in text for kid in kids)
    out = StringIO()
    call_command("agent", "show", str(kids[1].pk), stdout=out)
    assert f"Parent: workflow {parent.pk} (test-fanout), as its child {kids[1].parent_wait.operation_id}" \
        in out.getvalue()


def test_the_api_workflow_read_has_parent_and_children_ids(client, outsider, tree) -> None:
    parent, kids = tree
    grant(outsider, "view_workflow")
    auth = {"HTTP_AUTHORIZATION": f"Bearer {token_for(outsider.username)}"}
    body = client.get(f"/api/workflows/{parent.pk}", **auth).json()
    assert body["parent"] is None
    assert [(c["id"], c["kind"], c["budget_total_usd"]) for c in body["children"]] == [
        (k.pk, "test-square", "0.2500") for k in kids]
    child = client.get(f"/api/workflows/{kids[0].pk}", **auth).json()
    assert (child["parent"]["id"], child["children"]) == (parent.pk, [])
