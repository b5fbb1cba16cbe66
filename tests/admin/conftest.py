"""Fixtures for the admin tests: staff users, waiting workflows, recorded doorbells and a logged-in client."""
from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from django.contrib.auth.models import Group, Permission, User
from django.test import Client

from agentops.agents.release.definition import Release
from tests.conftest import drive, open_approval, release_params
from workflows import engine, services
from workflows.models import Event, Wait, Workflow
from workflows.testing import registered

ROLE = "release-approvers"
GATE_KIND = "admin-test-gate"
# Markup in every text field: the queue must show it as text, never run it.
GATE_CANDIDATE = {
    "title": "Ship <b>notes</b>",
    "summary": "Adds NOTES.md <img src=x onerror=alert(1)>",
    "files": {"NOTES.md": "# Notes\n<script>alert('owned')</script>\n", "VERSION": "1.0\n"},
    "head": "0123456789abcdef0123456789abcdef01234567",
    "tests": {"passed": True, "exit_code": 0},
}
GATE_HASH = hashlib.sha256(json.dumps(GATE_CANDIDATE, sort_keys=True).encode()).hexdigest()


class AdminGate(engine.WorkflowDefinition):
    """Asks for one approval of a fixed candidate, then completes: an approval without git or tests."""

    kind = GATE_KIND
    start_node = "ASK"
    revalidate_node = "ASK"
    describe_candidate = Release.describe_candidate  # the candidate has the release agent's shape

    @engine.node("ASK")
    def ask(self, ctx: engine.NodeContext) -> engine.Decision:
        outcome = ctx.approval(candidate=GATE_CANDIDATE, candidate_hash=GATE_HASH, role=ROLE,
                               expires_in_seconds=3 * 3600, state_versions={})
        if outcome.approved:
            return engine.Goto("DONE")
        return engine.Fail(f"Rejected by {outcome.decided_by}: {outcome.comment or 'no comment'}")

    @engine.node("DONE")
    def done(self, ctx: engine.NodeContext) -> engine.Decision:
        return engine.Complete({"approved": True})


@pytest.fixture(autouse=True)
def admin_gate_registered() -> Iterator[None]:
    """Registered for these tests only: other tests list the known kinds in their messages."""
    with registered(AdminGate):
        yield


@pytest.fixture(autouse=True)
def doorbells_recorded(rung: list[tuple[str, int]]) -> list[tuple[str, int]]:
    """Every admin test records doorbells (also rung from the live server's thread) instead of publishing."""
    return rung


def make_staff(user: User, *perms: str) -> User:
    user.is_staff = True
    user.save(update_fields=["is_staff"])
    for perm in perms:
        app_label, codename = perm.split(".")
        user.user_permissions.add(Permission.objects.get(content_type__app_label=app_label, codename=codename))
    return User.objects.get(pk=user.pk)  # a fresh instance: permissions are cached per instance


@pytest.fixture
def staff_approver(approver: User) -> User:
    """alice: staff, in release-approvers, may view workflows and waits."""
    return make_staff(approver, "workflows.view_workflow", "workflows.view_wait")


@pytest.fixture
def staff_outsider(outsider: User) -> User:
    """oscar: staff who may view everything but is in no approver group."""
    return make_staff(outsider, "workflows.view_workflow", "workflows.view_wait")


@pytest.fixture
def operator(db: None) -> User:
    """olga: staff with workflows.change_workflow, the permission behind cancel, resume and change goal."""
    user = User.objects.create_user("olga", password="olga-password")
    return make_staff(user, "workflows.view_workflow", "workflows.change_workflow")


@pytest.fixture
def staff_requester(requester: User) -> User:
    """rita: staff and in release-approvers, but she launches the workflows under test."""
    requester.groups.add(Group.objects.get_or_create(name=ROLE)[0])
    return make_staff(requester, "workflows.view_workflow", "workflows.view_wait")


def gate_wait(user: User | None) -> Wait:
    """A fresh gate workflow launched by ``user``, waiting for approval."""
    workflow = services.workflow_launch(kind=GATE_KIND, goal="Open the gate for <release> 1.0", user=user)
    services.workflow_advance_if_runnable(workflow_id=workflow.pk)
    return open_approval(workflow.pk)


@pytest.fixture
def waiting_gate(requester: User) -> Wait:
    return gate_wait(requester)


def launch_release(repo: Path, user: User | None, goal: str = "Publish release notes for version 1.0") -> Workflow:
    return services.workflow_launch(kind="release", goal=goal, params=release_params(repo), user=user)


@pytest.fixture
def waiting_release(git_repo: Path, requester: User) -> Wait:
    """A release workflow launched by rita, waiting for approval of its candidate."""
    workflow = drive(launch_release(git_repo, requester).pk)
    assert (workflow.status, workflow.current_node) == ("waiting", "WAIT_FOR_APPROVAL")
    return open_approval(workflow.pk)


def logged_in(user: User, **kwargs: Any) -> Client:
    client = Client(**kwargs)
    client.force_login(user)
    return client


def state_of(wait: Wait) -> tuple[Any, ...]:
    """What a refused, forbidden or repeated decision must leave untouched."""
    wait.refresh_from_db()
    workflow = Workflow.objects.get(pk=wait.workflow_id)
    return (wait.status, wait.decided_at, wait.decision, wait.decided_by_id, workflow.status, workflow.updated_at,
            workflow.current_node, Event.objects.filter(workflow=workflow).count())


def messages_of(response: Any) -> list[tuple[str, str]]:
    return [(m.level_tag, m.message) for m in response.context["messages"]] if response.context else []


# --- Browser tests: pytest-playwright driving Debian's Chromium ------------------------

CHROMIUM = os.environ.get("CHROMIUM", "/usr/bin/chromium")
CHROMIUM_ARGS = ["--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage", "--no-first-run",
                 "--disable-background-networking", "--disable-component-update", "--disable-sync"]


@pytest.fixture(scope="session")
def browser_type_launch_args(browser_type_launch_args: dict[str, Any]) -> dict[str, Any]:
    """Debian's Chromium, never a Playwright download (`playwright install` cannot fetch here)."""
    return {**browser_type_launch_args, "executable_path": CHROMIUM, "args": CHROMIUM_ARGS}


# Playwright's sync API keeps an asyncio loop running in the main thread for as long as it is
# started, and Django then refuses ORM calls from that thread (SynchronousOnlyOperation). The
# plugin starts it once per session; these overrides start it once per module instead, with
# DJANGO_ALLOW_ASYNC_UNSAFE set only meanwhile, so the rest of the suite keeps Django's check.


@pytest.fixture(scope="module")
def _orm_beside_playwright() -> Iterator[None]:
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("DJANGO_ALLOW_ASYNC_UNSAFE", "true")
        yield


@pytest.fixture(scope="module")
def playwright(_orm_beside_playwright: None, _pw_api_request_contexts: Any) -> Iterator[Any]:
    from playwright.sync_api import sync_playwright

    if not os.path.exists(CHROMIUM):
        _no_browser(f"Chromium is not installed at {CHROMIUM}. `make test` installs Debian's chromium package "
                    "when it is missing (apt-get install -y chromium); or point CHROMIUM at a Chromium binary.")
    pw = sync_playwright().start()
    if _pw_api_request_contexts:
        _pw_api_request_contexts.instrument(pw)
    yield pw
    pw.stop()


@pytest.fixture(scope="module")
def browser_type(playwright: Any, browser_name: str) -> Any:
    return getattr(playwright, browser_name)


@pytest.fixture(scope="module")
def launch_browser(browser_type_launch_args: dict[str, Any], browser_type: Any) -> Any:
    return lambda **kwargs: browser_type.launch(**{**browser_type_launch_args, **kwargs})


@pytest.fixture(scope="module")
def browser(launch_browser: Any) -> Iterator[Any]:
    try:
        browser = launch_browser()
    except Exception as exc:  # the Playwright error names the binary and what it printed
        _no_browser(f"Chromium at {CHROMIUM} could not be launched: {str(exc).splitlines()[0]}")
    yield browser
    browser.close()


@pytest.fixture(scope="module")
def browser_context_args() -> dict[str, Any]:
    return {"viewport": {"width": 1280, "height": 900}}


def _no_browser(reason: str) -> None:
    """Skip the browser tests, unless AGENTOPS_REQUIRE_BROWSER says a missing browser is a failure."""
    if os.environ.get("AGENTOPS_REQUIRE_BROWSER"):
        pytest.fail(reason + " (AGENTOPS_REQUIRE_BROWSER is set)", pytrace=False)
    pytest.skip(reason)
