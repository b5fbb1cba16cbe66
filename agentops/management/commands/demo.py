"""`manage.py demo`: run a release agent (or, with ``--kind harness``, the harness's todo demo) end to
end with its own worker, beat and deploy target."""
from __future__ import annotations

import json
import os
import secrets
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from django.conf import settings
from django.contrib.auth.models import Group, Permission, User
from django.core.management.base import BaseCommand, CommandError, CommandParser

from agentops import sandbox
from workflows import services, statestore, telemetry
from workflows.management.verbs.common import console_for
from workflows.management.verbs.detail import render_detail
from workflows.models import Event, Wait, Workflow
from workflows.selectors import workflow_detail

GIT = ["git", "-c", "user.name=agentops demo", "-c", "user.email=demo@agentops.local"]


DEMO_HARNESS_KILL = [{"point": "harness.after_tool", "action": "sigkill_self",
                      "when": {"tool": "write_file", "feature": "F03", "feature_attempt": 2, "attempt": 1}}]

class Command(BaseCommand):
    help = ("Start a worker, beat and the deploy target, launch a release agent on a demo repository, "
            "approve it as a demo approver and follow it to its final state.")

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("--goal", default="Publish release notes for version 1.0")
        parser.add_argument("--timeout", type=float, default=None,
                            help="seconds to wait for the final state (default 180; 1800 with --approve-in-admin)")
        parser.add_argument("--approve-in-admin", action="store_true",
                            help="do not approve automatically: serve the admin and wait for you to approve there")
        parser.add_argument("--web-port", type=int, default=8000, help="admin port with --approve-in-admin")
        parser.add_argument("--kind", choices=("release", "harness"), default="release",
                            help="release (default), or harness: the todo demo of docs/harness.md, its feature "
                                 "list approved and its pause resumed by the demo approver")
        parser.add_argument("--reviewer", action="store_true",
                            help="with --kind harness: launch with reviewer=true, a reviewer child workflow "
                                 "reviewing each accepted feature (docs/harness.md, \"Reviewer\")")

    def handle(self, *args: Any, **options: Any) -> None:
        self.console = console_for(self.stdout)
        var = Path(settings.VAR_DIR)
        (var / "demo").mkdir(parents=True, exist_ok=True)
        if options["kind"] == "harness":
            self.run_harness(var / "demo", timeout=options["timeout"] or 900.0, reviewer=options["reviewer"])
            return
        repo = demo_repository(var / "demo" / "repo")
        requester, approver = demo_users()
        port = free_port()
        env = {**os.environ, "AGENTOPS_DEPLOY_TARGET_URL": f"http://127.0.0.1:{port}"}
        spans = spans_file(var / "demo", env)
        children = start_children(var / "demo", port, env)
        in_admin = options["approve_in_admin"]
        if in_admin:
            children.append(start_web(var / "demo", options["web_port"], env))
        try:
            self.console.print(f"[bold]agentops demo[/]: database {settings.DATABASES['default']['NAME']}, "
                               f"broker {settings.CELERY_BROKER_URL}, provider {settings.AGENTOPS_MODEL_PROVIDER} "
                               "(offline, deterministic)")
            self.say_isolation()
            workflow = services.workflow_launch(
                kind="release", goal=options["goal"], user=requester,
                params={"repo": str(repo), "test_command": f"{sys.executable} check.py"},
            )
            self.console.print(f"Launched release workflow {workflow.pk} as {requester.username}.")
            if in_admin:
                # Plain write: rich would wrap the URL and the password at the console width.
                self.stdout.write(f"Approve it in the admin: http://127.0.0.1:{options['web_port']}"
                                  f"/admin/workflows/wait/approvals/ as {approver.username}, "
                                  f"password {admin_password(approver)}")
            timeout = options["timeout"] or (1800.0 if in_admin else 180.0)
            final = self.follow(workflow.pk, approver, deadline=time.monotonic() + timeout, auto_approve=not in_admin)
            if spans is not None:
                self.print_trace(spans, final)
        finally:
            stop_children(children)
        self.console.print(render_detail(workflow_detail(final, events=12)))
        if final.status != Workflow.Status.COMPLETED:
            raise CommandError(f"The demo workflow ended {final.status}: {final.reason or 'timed out'}. "
                               f"Logs are in {var / 'demo'}.")
        deployment = (final.result or {}).get("deployment_id")
        self.console.print(f"[bold green]Workflow {final.pk} completed[/]: deployment {deployment}. "
                           f"Inspect it with `manage.py agent show {final.pk}`.")

    def follow(self, workflow_id: int, approver: User, *, deadline: float, auto_approve: bool = True) -> Workflow:
        """Print events as they happen; approve the first open approval as the demo approver."""
        seen = 0
        while time.monotonic() < deadline:
            for event in Event.objects.filter(workflow_id=workflow_id, seq__gt=seen).order_by("seq"):
                seen = event.seq
                self.console.print(f"  {event.created_at:%H:%M:%S}  {event.kind:<28} {describe(event.data)}")
            workflow = Workflow.objects.get(pk=workflow_id)
            if workflow.is_terminal:
                return workflow
            wait = workflow.waits.filter(kind=Wait.Kind.APPROVAL, status=Wait.Status.OPEN).first()
            if wait is not None and auto_approve:
                self.console.print(f"  [bold]Approving[/] candidate {wait.candidate_hash[:12]}… "
                                   f"({wait.candidate['title']}) as {approver.username}")
                services.wait_approve(wait_id=wait.pk, user=approver, candidate_hash=wait.candidate_hash,
                                      comment="approved by the demo")
            time.sleep(0.5)
        return Workflow.objects.get(pk=workflow_id)


    def print_trace(self, path: Path, workflow: Workflow) -> None:
        """The workflow's trace as a tree of spans, from the console exporter's lines of every process."""
        trace_id = f"0x{telemetry.workflow_ids(workflow.pk)[0]:032x}"
        deadline = time.monotonic() + 10
        while True:  # the root span is exported just after the final transition commits
            found = [s for s in map(json.loads, path.read_text().splitlines()) if s["context"]["trace_id"] == trace_id]
            if any(s["parent_id"] is None for s in found) or time.monotonic() > deadline:
                break
            time.sleep(0.2)
        children: dict[str | None, list[dict[str, Any]]] = {}
        for span in sorted(found, key=lambda s: s["start_time"]):
            children.setdefault(span["parent_id"], []).append(span)
        self.console.print(f"[bold]Trace {trace_id}[/] of workflow {workflow.pk}: {len(found)} spans "
                           f"(OTEL_TRACES_EXPORTER=console; every span's JSON is in {path})")
        roots = children.get(None, []) + [s for p, group in children.items() if p is not None
                                          and p not in {x["context"]["span_id"] for x in found} for s in group]

        def show(span: dict[str, Any], depth: int) -> None:
            shown = " ".join(f"{k}={v}" for k, v in span["attributes"].items() if k.startswith("gen_ai.usage") or k in (
                "gen_ai.system", "agentops.cost_usd", "agentops.attempt", "agentops.node.to", "gen_ai.tool.name"))
            self.console.print(f"  {'  ' * depth}{span['name']}  {shown}", highlight=False)
            for child in children.get(span["context"]["span_id"], []):
                show(child, depth + 1)

        for root in roots:
            show(root, 0)

    def say_isolation(self) -> None:
        """Once, visibly: what the demo's commands run in (its workers see the same machine)."""
        try:
            level = sandbox.isolation()
        except sandbox.SandboxUnavailable as exc:
            self.console.print(f"[bold red]Sandbox[/]: {exc}")
            return
        if level == "bwrap":
            self.console.print("Sandbox: bubblewrap (each command isolated from this machine).")
        else:
            why = "AGENTOPS_SANDBOX=none" if settings.AGENTOPS_SANDBOX == "none" else "bubblewrap does not run here"
            self.console.print(f"Sandbox: none ({why}). The demo's commands are the project's "
                               "own, from the offline scripted model; a real model's would be refused until "
                               "bubblewrap is installed (apt-get install bubblewrap).")

    def run_harness(self, logs: Path, *, timeout: float, reviewer: bool = False) -> None:
        """The harness's todo demo (scripted provider): launch, approve the feature list, resume the
        pause its feature budget makes, and print the board's progress to ``completed``."""
        requester, _ = demo_users()
        approver, _ = User.objects.get_or_create(username="demo-harness-approver")
        approver.groups.add(Group.objects.get_or_create(name="harness-approvers")[0])
        workspace = logs / f"harness-{time.strftime('%Y%m%d-%H%M%S')}"
        # The schedule's crash: the worker's pool process SIGKILLs itself in F03's second session,
        # after a write (a fault point armed for the demo only); a short session lease lets the
        # next attempt take over within seconds and save the half-work to wip/F03/2.
        env = {**os.environ, "AGENTOPS_TESTING_FAULTS": json.dumps(DEMO_HARNESS_KILL),
               "AGENTOPS_FAULT_LOG": str(logs / "faults.log"), "AGENTOPS_HARNESS_SESSION_LEASE_SECONDS": "15"}
        children = start_children(logs, free_port(), env)
        try:
            self.console.print(f"[bold]agentops harness demo[/]: database {settings.DATABASES['default']['NAME']}, "
                               f"broker {settings.CELERY_BROKER_URL}, provider {settings.AGENTOPS_MODEL_PROVIDER}, "
                               f"workspace {workspace}")
            self.say_isolation()
            self.console.print("The worker's pool process will SIGKILL itself once, in F03's second session: "
                               "watch the next attempt save its half-work to wip/F03/2.")
            workflow = services.workflow_launch(kind="harness", goal="Build the todo CLI of the demo", user=requester,
                                                params={"workspace": str(workspace), "max_attempts": 2,
                                                        **({"reviewer": True} if reviewer else {})})
            started = time.monotonic()
            final = self.follow_harness(workflow.pk, approver, deadline=started + timeout)
        finally:
            stop_children(children)
        if final.status != Workflow.Status.COMPLETED:
            raise CommandError(f"The harness demo ended {final.status}: {final.reason or 'timed out'}. Logs are in "
                               f"{logs}; `manage.py agent show {final.pk}`.")
        checks = Event.objects.filter(workflow_id=final.pk, kind="harness.check_ran").count()
        reviews = Workflow.objects.filter(parent_id=final.pk, kind="reviewer", status=Workflow.Status.COMPLETED)
        if reviewer:
            last = statestore.state_of(final).get("reviews", [])
            self.console.print(f"{reviews.count()} reviews by reviewer child workflows (`manage.py agent show "
                               f"{final.pk}` lists them); the last ones' verdicts: "
                               + "; ".join(f"{r['feature']}: {r.get('verdict')}" for r in last))
        self.console.print(f"[bold green]Workflow {final.pk} completed[/]: "
                           f"{(final.result or {}).get('features_passing')}/{(final.result or {}).get('features')} "
                           f"features passing after {final.state.get('sessions')} sessions and {checks} check runs "
                           f"in {time.monotonic() - started:.0f} s. Inspect it with `manage.py agent show {final.pk}`.")

    def follow_harness(self, workflow_id: int, approver: User, *, deadline: float) -> Workflow:
        """One line per change of the board, session or status, and per guard that fired; approve
        open approvals and resume a pause for a person as the demo approver."""
        last, seen = "", 0
        while time.monotonic() < deadline:
            workflow = Workflow.objects.get(pk=workflow_id)
            state = statestore.state_of(workflow)
            features = state.get("features", [])
            lease = state.get("lease") or {}
            passing = sum(f.get("status") == "passing" for f in features)
            line = (f"{passing}/{len(features) or '?'} features passing; session {workflow.state.get('sessions', 0)}"
                    f" on {lease.get('feature', '-')}#{lease.get('attempt', '-')}; {workflow.status} at "
                    f"{workflow.current_node}")
            if line != last:
                self.console.print(f"  {time.strftime('%H:%M:%S')}  {line}")
                last = line
            for event in Event.objects.filter(workflow_id=workflow_id, seq__gt=seen).order_by("seq"):
                seen = event.seq
                red_smoke = event.kind == "harness.smoke_ran" and not event.data.get("passed")
                if event.kind in HARNESS_EVENTS or red_smoke:
                    self.console.print(f"  {event.created_at:%H:%M:%S}    {event.kind:<26} {describe(event.data)}")
            if workflow.is_terminal:
                return workflow
            wait = workflow.waits.filter(kind=Wait.Kind.APPROVAL, status=Wait.Status.OPEN).first()
            if wait is not None:
                self.console.print(f"  [bold]Approving[/] the feature list {wait.candidate_hash[:12]}… as "
                                   f"{approver.username}")
                services.wait_approve(wait_id=wait.pk, user=approver, candidate_hash=wait.candidate_hash,
                                      comment="approved by the demo")
            if workflow.status == Workflow.Status.PAUSED and workflow.pause_cause == Workflow.PauseCause.DEFINITION:
                self.console.print(f"  [bold]Paused[/]: {workflow.reason}\n  [bold]Resuming[/] as {approver.username}")
                services.workflow_resume(workflow_id=workflow_id, user=approver)
            time.sleep(0.5)
        return Workflow.objects.get(pk=workflow_id)


# The guards of the harness demo, printed as they fire.
HARNESS_EVENTS = ("harness.tamper_reverted", "harness.tool_refused", "harness.wip_saved", "harness.loop_breaker",
                  "harness.budget_exhausted", "harness.services_stopped", "harness.isolation_probed",
                  "workflow.paused", "workflow.woken", "child.started", "child.finished")


def describe(data: dict[str, Any]) -> str:
    keys = ("node", "name", "operation_id", "child", "child_kind", "status", "attempt", "by", "reason",
            "candidate_hash", "feature", "breaker",
            "level", "what", "ref", "paths", "names", "cause", "consequence")
    return " ".join(f"{k}={str(data[k])[:40]}" for k in keys if data.get(k) not in (None, ""))


def demo_repository(path: Path) -> Path:
    if (path / ".git").is_dir():
        return path
    path.mkdir(parents=True, exist_ok=True)
    (path / "check.py").write_text("print('all 1 checks passed')\n")
    (path / "README.md").write_text("# demo service\n\nA repository the agentops demo releases.\n")
    subprocess.run(["git", "init", "-q", str(path)], check=True)
    subprocess.run([*GIT, "-C", str(path), "add", "."], check=True)
    subprocess.run([*GIT, "-C", str(path), "commit", "-qm", "initial commit"], check=True)
    return path


def demo_users() -> tuple[User, User]:
    group, _ = Group.objects.get_or_create(name="release-approvers")
    requester, _ = User.objects.get_or_create(username="demo-requester")
    approver, _ = User.objects.get_or_create(username="demo-approver")
    approver.groups.add(group)
    return requester, approver


def admin_password(approver: User) -> str:
    """Make the demo approver an admin user (staff, may view workflows) with a fresh random password."""
    password = secrets.token_urlsafe(12)
    approver.is_staff = True
    approver.set_password(password)
    approver.save(update_fields=["is_staff", "password"])
    approver.user_permissions.add(*Permission.objects.filter(
        content_type__app_label="workflows", codename__in=["view_workflow", "view_wait", "view_activity"]))
    return password


def start_web(logs: Path, port: int, env: dict[str, str]) -> subprocess.Popen[bytes]:
    argv = [sys.executable, str(Path(settings.BASE_DIR) / "manage.py"), "runserver", f"127.0.0.1:{port}", "--noreload"]
    with open(logs / "web.log", "ab") as log:
        return subprocess.Popen(argv, env=env, cwd=settings.BASE_DIR, stdout=log, stderr=subprocess.STDOUT,
                                start_new_session=True)


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def spans_file(logs: Path, env: dict[str, str]) -> Path | None:
    """With OTEL_TRACES_EXPORTER=console, this process and its children write their spans to one
    file (one JSON line each), which the demo prints as a tree at the end."""
    if "console" not in settings.AGENTOPS_OTEL_TRACES_EXPORTER:
        return None
    path = logs / "spans.jsonl"
    path.write_text("")
    env["AGENTOPS_OTEL_CONSOLE_PATH"] = settings.AGENTOPS_OTEL_CONSOLE_PATH = str(path)
    telemetry.configure(None)
    return path


def start_children(logs: Path, port: int, env: dict[str, str]) -> list[subprocess.Popen[bytes]]:
    manage = [sys.executable, str(Path(settings.BASE_DIR) / "manage.py")]
    celery = [sys.executable, "-m", "celery", "-A", "agentops"]
    commands = {
        "deploy-target": [*manage, "deploy_target", "--port", str(port), "--state", str(logs / "deploy-target.json")],
        "worker": [*celery, "worker", "-c", "2", "-n", "demo@%h", "-l", "INFO"],
        "beat": [*celery, "beat", "-l", "INFO", "-s", str(logs / "celerybeat-schedule"), "--pidfile="],
    }
    children = []
    for name, argv in commands.items():
        with open(logs / f"{name}.log", "ab") as log:
            children.append(subprocess.Popen(argv, env=env, cwd=settings.BASE_DIR, stdout=log,
                                             stderr=subprocess.STDOUT, start_new_session=True))
    return children


def stop_children(children: list[subprocess.Popen[bytes]]) -> None:
    for child in children:
        if child.poll() is None:
            os.killpg(child.pid, signal.SIGTERM)
    for child in children:
        try:
            child.wait(timeout=15)
        except subprocess.TimeoutExpired:
            os.killpg(child.pid, signal.SIGKILL)
            child.wait()
