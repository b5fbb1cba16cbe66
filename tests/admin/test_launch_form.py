"""The admin's launch form (typed inputs from one declaration): one field per launch
parameter a kind declares, with its description and default; a launch refused by the kind's
declaration is shown on the form and writes nothing."""
from __future__ import annotations

import pytest
from django.contrib.auth.models import Permission, User
from django.urls import reverse

from tests.admin.conftest import logged_in, make_staff
from tests.conftest import release_params
from workflows.models import Workflow

pytestmark = pytest.mark.django_db
URL = reverse("admin:workflows_workflow_launch")


@pytest.fixture
def launcher(db: None) -> User:
    user = User.objects.create_user("lena", password="lena-password")
    return make_staff(user, "workflows.view_workflow", "workflows.add_workflow")


def test_the_form_has_a_field_per_declared_parameter_and_launches(launcher, git_repo):
    page = logged_in(launcher).get(URL, {"kind": "release"}).content.decode()
    for name in ("repo", "test_command"):
        assert f'name="param_{name}"' in page
    assert "release" in page and "harness" in page and "autonomous" in page  # the kinds to choose from
    params = {f"param_{k}": v for k, v in release_params(git_repo).items()}
    answer = logged_in(launcher).post(URL, {"kind": "release", "goal": "Publish the notes", **params})
    workflow = Workflow.objects.get()
    assert answer.status_code == 302 and answer["Location"].startswith(
        reverse("admin:workflows_workflow_change", args=[workflow.pk]) + "?outcome=")
    assert (workflow.kind, workflow.launched_by, workflow.params["repo"]) == ("release", launcher, str(git_repo))


def test_a_value_the_declaration_refuses_is_shown_and_nothing_is_launched(launcher):
    answer = logged_in(launcher).post(URL, {"kind": "autonomous", "goal": "Do it", "param_max_rounds": "-1"})
    assert answer.status_code == 200 and "between 0" in answer.content.decode()
    assert not Workflow.objects.exists()


def test_without_the_add_permission_the_form_is_refused(staff_outsider):
    answer = logged_in(staff_outsider).get(URL)
    assert answer.status_code == 403 and "workflows.add_workflow" in answer.content.decode()
    assert 'Launch an agent' not in logged_in(staff_outsider).get(
        reverse("admin:workflows_workflow_changelist")).content.decode()


def test_the_api_lists_each_kind_with_its_parameters_schema(launcher):
    from django.test import Client

    from tests.api.conftest import token_for

    client = Client(HTTP_AUTHORIZATION=f"Bearer {token_for(launcher.username)}")
    kinds = {k["kind"]: k for k in client.get("/api/kinds").json()["items"]}
    assert {"release", "autonomous", "harness"} <= set(kinds)
    assert "max_rounds" in kinds["autonomous"]["params_schema"]["properties"]
    document = client.get("/api/openapi.json").json()
    assert document["components"]["schemas"]["LaunchParams_autonomous"]["properties"]["max_rounds"] == \
        kinds["autonomous"]["params_schema"]["properties"]["max_rounds"]
    assert Permission.objects.filter(codename="add_workflow").exists()
