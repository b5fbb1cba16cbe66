"""Schedules over HTTP: the same service as `agent schedule`, its permissions, the
one error shape for bad values, nothing written on a refusal."""
from __future__ import annotations

import pytest
from django.contrib.auth.models import User
from django_celery_beat.models import PeriodicTask

from tests.api.conftest import grant, token_for
from tests.conftest import release_params
from workflows.models import Schedule, Workflow

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture
def scheduler_token(db: None) -> str:
    """sam: may add, change and remove schedules, and see them."""
    user = grant(User.objects.create_user("sam"), "add_schedule", "change_schedule", "delete_schedule",
                 "view_schedule")
    return token_for(user.username)


def test_add_list_pause_resume_trigger_and_remove(http, scheduler_token, git_repo):
    body = {"name": "nightly", "kind": "release", "goal": "Check tonight's release", "cron": "0 3 * * *",
            "params": {k: str(v) for k, v in release_params(git_repo).items()}, "overlap": "skip"}
    added = http.post("/schedules", body, token=scheduler_token)
    assert added.status == 201, added.body
    assert (added.body["when"], added.body["created_by"], added.body["launched"]) == ("cron 0 3 * * *", "sam", 0)
    assert [s["name"] for s in http.get("/schedules", token=scheduler_token).body["items"]] == ["nightly"]
    assert http.post("/schedules/nightly/pause", token=scheduler_token).body["paused"] is True
    assert http.post("/schedules/nightly/resume", token=scheduler_token).body["paused"] is False
    fired = http.post("/schedules/nightly/trigger", token=scheduler_token)
    assert fired.status == 200 and fired.body["outcome"] == "launched" and fired.body["triggered_by"] == "sam"
    assert Workflow.objects.get(pk=fired.body["workflow_id"]).launched_by.username == "sam"
    task = Schedule.objects.get().periodic_task_id
    removed = http.request("DELETE", "/schedules/nightly", token=scheduler_token)
    assert removed.status == 200 and not Schedule.objects.exists() and not PeriodicTask.objects.filter(pk=task).exists()
    assert http.post("/schedules/nightly/pause", token=scheduler_token).status == 404


@pytest.mark.parametrize("change, status, said", [
    ({"every": "6h"}, 400, "either --cron"),
    ({"cron": "", "every": "soon"}, 400, "every"),
    ({"kind": "nope"}, 400, "Unknown workflow kind"),
    ({"overlap": "queue"}, 400, "overlap"),
    ({"name": "night ly"}, 400, "name"),
    ({"surprise": 1}, 400, "surprise"),
])
def test_bad_values_get_the_error_shape_and_write_nothing(http, scheduler_token, git_repo, change, status, said):
    body = {"name": "nightly", "kind": "release", "goal": "Check", "cron": "0 3 * * *",
            "params": {k: str(v) for k, v in release_params(git_repo).items()}, **change}
    answer = http.post("/schedules", body, token=scheduler_token)
    assert answer.status == status and set(answer.body) == {"error"} and said in answer.body["error"], answer.body
    assert not Schedule.objects.exists()


def test_a_token_without_the_permission_is_refused(http, requester_token):
    answer = http.post("/schedules", {"name": "n", "kind": "release", "goal": "g", "every": "1h"},
                       token=requester_token)
    assert answer.status == 403 and "workflows.add_schedule" in answer.body["error"]
    assert http.get("/schedules", token=requester_token).status == 403


@pytest.mark.parametrize("overlap, status, outcome", [("skip", 409, None), ("buffer_one", 200, "buffered")])
def test_a_trigger_behind_a_live_run_is_refused_or_buffered(http, scheduler_token, git_repo, overlap, status,
                                                            outcome):
    body = {"name": "nightly", "kind": "release", "goal": "Check tonight's release", "cron": "0 3 * * *",
            "params": {k: str(v) for k, v in release_params(git_repo).items()}, "overlap": overlap}
    assert http.post("/schedules", body, token=scheduler_token).status == 201
    live = http.post("/schedules/nightly/trigger", token=scheduler_token).body["workflow_id"]
    answer = http.post("/schedules/nightly/trigger", token=scheduler_token)
    assert answer.status == status, answer.body
    if outcome is None:
        assert set(answer.body) == {"error"} and f"workflow {live}" in answer.body["error"]
        assert Schedule.objects.get().occurrences.count() == 1  # nothing written
    else:
        assert answer.body["outcome"] == outcome and answer.body["workflow_id"] is None
        listed = http.get("/schedules", token=scheduler_token).body["items"][0]
        assert listed["buffered_at"] == answer.body["at"]
