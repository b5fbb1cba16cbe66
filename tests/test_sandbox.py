"""The sandbox of commands run for users: no secret in, no secret out, no network, nothing left running."""
from __future__ import annotations

import json
import os
import socket
import threading
import time
import uuid
from pathlib import Path
from typing import Any

import psutil
import pytest

from agentops import sandbox
from agentops.agents.autonomous.activities import run_tool
from agentops.providers.scripted import ScriptedProvider
from agentops.sandbox import limits
from tests.conftest import drive, make_git_repo, release_params
from workflows import services
from workflows.models import Activity, Event
from workflows.provider import ModelResponse, Usage

CANARY = f"sk-canary-{uuid.uuid4().hex}"
WORKER_SECRETS = {
    "ANTHROPIC_API_KEY": CANARY,
    "DATABASE_URL": "postgres://agentops:db-canary-pw@db.internal:5432/agentops",
    "CELERY_BROKER_URL": "redis://:broker-canary-pw@redis.internal:6379/0",
    "DJANGO_SECRET_KEY": "django-canary-secret-key",
    "DJANGO_SETTINGS_MODULE": "agentops.settings",
    "AGENTOPS_CANARY_SETTING": "agentops-canary-setting",
    "GITHUB_TOKEN": "ghp-canary-token",
}
SECRET_VALUES = [CANARY, "db-canary-pw", "broker-canary-pw", "django-canary-secret-key", "ghp-canary-token"]
NAMES_NO_COMMAND_MAY_SEE = ["ANTHROPIC_API_KEY", "DATABASE_URL", "CELERY_", "DJANGO_", "AGENTOPS_", "GITHUB_TOKEN"]
BWRAP_WORKS, BWRAP_DETAIL = sandbox.bwrap_works()
needs_bwrap = pytest.mark.skipif(not BWRAP_WORKS, reason=f"bubblewrap does not run here: {BWRAP_DETAIL}")


@pytest.fixture(params=["none", pytest.param("bwrap", marks=needs_bwrap)])
def isolation(request: pytest.FixtureRequest, settings: Any) -> str:
    settings.AGENTOPS_SANDBOX = request.param
    settings.AGENTOPS_SANDBOX_GRACE_SECONDS = 1.0
    return str(request.param)


@pytest.fixture
def worker_secrets(monkeypatch: pytest.MonkeyPatch) -> None:
    """The worker process holds the secrets production workers hold."""
    for name, value in WORKER_SECRETS.items():
        monkeypatch.setenv(name, value)


@pytest.fixture
def workspace(tmp_path: Path) -> Path:
    root = tmp_path / "wf-1"
    root.mkdir()
    return root.resolve()


def command(root: Path, text: str, timeout: int = 30) -> tuple[bool, str]:
    return run_tool(root, "run_command", {"command": text, "timeout_seconds": timeout})


def test_run_command_sees_none_of_the_workers_environment(worker_secrets, isolation, workspace):
    """The canary: the worker holds the API key, database and broker passwords; `env` shows none of them."""
    ok, output = command(workspace, "env")

    assert ok, output
    assert f"(sandbox: {isolation})" in output
    assert f"HOME={workspace}" in output and "LANG=C.UTF-8" in output
    names = {line.split("=", 1)[0] for line in output.splitlines()[1:] if "=" in line}
    assert names <= {"PATH", "HOME", "TMPDIR", "LANG", "LC_ALL", "TERM", "PYTHONDONTWRITEBYTECODE", "PWD", "SHLVL",
                     "_"}, names
    for name in NAMES_NO_COMMAND_MAY_SEE:
        assert name not in output
    for value in SECRET_VALUES:
        assert value not in output
    ok, output = command(workspace, "printenv ANTHROPIC_API_KEY")
    assert not ok and output.startswith("exit 1")


def test_a_secret_in_a_commands_output_is_redacted(worker_secrets, isolation, workspace):
    """A secret that reached the workspace some other way (a committed .env) comes back as [redacted]."""
    (workspace / ".env").write_text(f"ANTHROPIC_API_KEY={CANARY}\nDB=db-canary-pw\n")

    ok, output = command(workspace, "cat .env")
    ok_read, read = run_tool(workspace, "read_file", {"path": ".env"})
    ok_echo, echoed = command(workspace, f"echo the key is {CANARY}.")

    assert ok and ok_read and ok_echo
    assert "ANTHROPIC_API_KEY=[redacted]\nDB=[redacted]" in output
    assert read == "ANTHROPIC_API_KEY=[redacted]\nDB=[redacted]\n"
    assert "the key is [redacted]." in echoed
    assert not any(value in output + read + echoed for value in SECRET_VALUES)


def test_redaction_covers_settings_and_passwords_in_addresses(worker_secrets, settings, monkeypatch):
    """The settings' own secrets are hidden too, and a password in any address, decoded or not."""
    settings.SECRET_KEY = "settings-secret-key-value"
    text = f"a settings-secret-key-value b {CANARY} c"
    assert sandbox.redact(text) == "a [redacted] b [redacted] c"
    monkeypatch.setenv("REPLICA_URL", "postgres://u:p%40ss%20word%2Fcanary@h/db")
    assert sandbox.redact("postgres://u:p%40ss%20word%2Fcanary@h/db") == "postgres://u:[redacted]@h/db"
    assert sandbox.redact("password: p@ss word/canary") == "password: [redacted]"
    assert sandbox.redact("short secrets are left: abc") == "short secrets are left: abc"


def test_output_cut_inside_a_secret_shows_no_part_of_it(worker_secrets, workspace):
    """Bounded output keeps the tail; a cut that falls inside a secret leaves none of its characters."""
    done = sandbox.run(["echo", f"{CANARY}-after"], workspace=workspace, timeout_seconds=10,
                       max_output_bytes=len(CANARY) - 3 + len("-after\n"))
    assert done.output.endswith("\n[redacted]-after\n"), done.output
    assert CANARY[3:] not in done.output and CANARY[-6:] not in done.output


@needs_bwrap
def test_under_bwrap_a_command_cannot_reach_the_network(settings, workspace):
    """A listener on the worker's loopback: reachable without the sandbox, unreachable under bwrap."""
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(8)
    port = listener.getsockname()[1]
    probe = (f"python3 -c \"import socket; socket.create_connection(('127.0.0.1', {port}), timeout=3); "
             "print('connected')\"")
    try:
        settings.AGENTOPS_SANDBOX = "none"
        ok_plain, plain = command(workspace, probe)
        settings.AGENTOPS_SANDBOX = "bwrap"
        ok_boxed, boxed = command(workspace, probe)
    finally:
        listener.close()

    assert ok_plain and "connected" in plain, plain
    assert not ok_boxed and "connected" not in boxed.replace("Connection", ""), boxed
    assert "(sandbox: bwrap)" in boxed


@needs_bwrap
def test_under_bwrap_the_system_is_read_only_and_the_workspace_writable(settings, workspace, tmp_path):
    settings.AGENTOPS_SANDBOX = "bwrap"
    (tmp_path / "next-to-workspace.txt").write_text("not for commands")

    ok, listing = command(workspace, f"ls {tmp_path}")
    ok_write, _ = command(workspace, "sh -c 'echo made > made.txt'")
    ok_usr, usr = command(workspace, "touch /usr/agentops-sandbox-probe")

    assert ok and "next-to-workspace.txt" not in listing and "wf-1" in listing
    assert ok_write and (workspace / "made.txt").read_text() == "made\n"
    assert not ok_usr and "Read-only file system" in usr
    assert not Path("/usr/agentops-sandbox-probe").exists()


SPAWNS_A_GRANDCHILD = (
    "python3 -c \"import subprocess, time; subprocess.Popen(['sleep', '{marker}']); "
    "print('started', flush=True); time.sleep(300)\""
)


def sleepers(marker: str) -> list[psutil.Process]:
    found = []
    for proc in psutil.process_iter(["cmdline"]):
        if proc.info["cmdline"] and proc.info["cmdline"][-1] == marker:
            found.append(proc)
    return found


def test_a_command_past_its_timeout_is_killed_with_its_children(isolation, workspace):
    """The command and the grandchild it started are gone when run_command returns."""
    marker = f"{300 + uuid.uuid4().int % 1000}.{os.getpid()}"
    seen: list[int] = []

    def watch() -> None:
        for _ in range(100):
            seen.extend(p.pid for p in sleepers(marker))
            if seen:
                return
            time.sleep(0.05)

    watcher = threading.Thread(target=watch)
    watcher.start()
    started = time.monotonic()
    ok, output = command(workspace, SPAWNS_A_GRANDCHILD.format(marker=marker), timeout=2)
    watcher.join()

    assert seen, "the grandchild never ran"
    assert not ok and output.startswith(f"command timed out after 2 s and was stopped (sandbox: {isolation})")
    assert "started" in output
    assert time.monotonic() - started < 10
    assert not [p for p in sleepers(marker) if p.status() != psutil.STATUS_ZOMBIE]


def test_a_timed_out_command_gets_sigterm_and_a_grace_before_sigkill(isolation, workspace):
    """SIGTERM first: a command that cleans up on it gets to finish its cleanup."""
    done = sandbox.run(["python3", "-c", "import signal, sys, time\ndef bye(*_):\n"
                        "    print('cleaning up', flush=True); time.sleep(0.3); print('bye'); sys.exit(3)\n"
                        "signal.signal(signal.SIGTERM, bye)\nprint('waiting', flush=True)\ntime.sleep(300)"],
                       workspace=workspace, timeout_seconds=1)
    assert done.timed_out and done.isolation == isolation
    assert done.output.split() == ["waiting", "cleaning", "up", "bye"]
    assert done.exit_code == 3


def test_a_silent_command_is_stopped_at_the_idle_timeout_with_its_output_so_far(isolation, workspace):
    """No output for ``idle_timeout_seconds``: the group is stopped long before the hard timeout,
    the partial output is returned and the stop is told apart from a hard timeout."""
    marker = f"{300 + uuid.uuid4().int % 1000}.{os.getpid()}"
    started = time.monotonic()
    done = sandbox.run(["sh", "-c", f"echo started; sleep {marker} & wait"], workspace=workspace,
                       timeout_seconds=60, idle_timeout_seconds=1)
    assert (done.idle_timed_out, done.timed_out, done.output.split()) == (True, False, ["started"])
    assert time.monotonic() - started < 10
    assert not [p for p in sleepers(marker) if p.status() != psutil.STATUS_ZOMBIE]


def test_a_command_that_keeps_printing_is_not_idle(isolation, workspace):
    done = sandbox.run(["python3", "-c", "import time\nfor i in range(6):\n    print(i, flush=True); time.sleep(0.4)"],
                       workspace=workspace, timeout_seconds=30, idle_timeout_seconds=1)
    assert (done.exit_code, done.idle_timed_out, done.output.split()) == (0, False, [str(i) for i in range(6)])


def test_nothing_a_finished_command_started_outlives_it(isolation, workspace):
    """A background process left behind (holding the output pipe) goes when the command ends."""
    marker = f"{300 + uuid.uuid4().int % 1000}.{os.getpid()}"
    started = time.monotonic()
    done = sandbox.run(["sh", "-c", f"sleep {marker} & echo left it running"], workspace=workspace, timeout_seconds=30)
    assert (done.exit_code, done.timed_out, done.output) == (0, False, "left it running\n")
    assert time.monotonic() - started < 10
    assert not [p for p in sleepers(marker) if p.status() != psutil.STATUS_ZOMBIE]


@needs_bwrap
def test_under_bwrap_a_grandchild_in_its_own_session_is_killed_too(settings, workspace):
    """setsid leaves the process group, not bwrap's PID namespace."""
    settings.AGENTOPS_SANDBOX = "bwrap"
    marker = f"{300 + uuid.uuid4().int % 1000}.{os.getpid()}"
    done = sandbox.run(["sh", "-c", f"setsid sleep {marker} > /dev/null 2>&1 & sleep 0.5; echo done"],
                       workspace=workspace, timeout_seconds=30)
    assert done.output == "done\n"
    time.sleep(0.2)
    assert not [p for p in sleepers(marker) if p.status() != psutil.STATUS_ZOMBIE]


def test_output_is_bounded(isolation, workspace):
    done = sandbox.run(["python3", "-c", "print('x' * 3_000_000); print('the end')"], workspace=workspace,
                       timeout_seconds=30, max_output_bytes=10_000)
    assert done.exit_code == 0 and done.cut_bytes > 2_900_000
    assert done.output.startswith("[… ") and done.output.endswith("the end\n") and len(done.output) < 10_100


def test_a_missing_command_is_reported_not_run(isolation, workspace):
    assert command(workspace, "no-such-command-here --help") == (False, "command 'no-such-command-here' not found")


def test_bwrap_mode_refuses_to_run_without_bubblewrap(settings, workspace, monkeypatch):
    """AGENTOPS_SANDBOX=bwrap on a worker where bubblewrap does not run: the command is not run at all."""
    settings.AGENTOPS_SANDBOX = "bwrap"
    monkeypatch.setattr(sandbox, "bwrap_works", lambda: (False, "bwrap is not installed (apt-get install bubblewrap)"))

    with pytest.raises(sandbox.SandboxUnavailable, match="AGENTOPS_SANDBOX=bwrap but bwrap is not installed"):
        sandbox.run(["touch", "made.txt"], workspace=workspace, timeout_seconds=5)
    assert not (workspace / "made.txt").exists()
    settings.AGENTOPS_SANDBOX = "auto"
    assert sandbox.run(["touch", "made.txt"], workspace=workspace, timeout_seconds=5).isolation == "none"


# --- end to end: the autonomous agent and the release agent -------------------------------------

def leaky_turns(seen_by_model: list[str]) -> Any:
    """A model that asks for the worker's secrets every way it can, then reports."""
    calls = [("run_command", {"command": "printenv"}), ("run_command", {"command": "printenv ANTHROPIC_API_KEY"}),
             ("run_command", {"command": "cat .env"}), ("read_file", {"path": ".env"})]

    def turn(self: ScriptedProvider, prompt: str, messages: list[dict[str, Any]], system: str) -> ModelResponse:
        seen_by_model.append(json.dumps(messages))
        done = sum(1 for m in messages if m["role"] == "user" and isinstance(m.get("content"), list))
        usage = Usage(input_tokens=10, output_tokens=10)
        if done >= len(calls):
            return ModelResponse(text="looked around", stop_reason="end_turn", usage=usage)
        name, args = calls[done]
        return ModelResponse(text="", stop_reason="tool_use", usage=usage,
                             tool_calls=[{"id": f"toolu_{done}", "name": name, "input": args}])
    return turn


@pytest.mark.django_db
def test_a_model_asking_for_secrets_gets_nothing_anywhere(worker_secrets, settings, tmp_path, monkeypatch):
    """Events, checkpoints and the conversation sent back to the model carry no secret of the worker;
    each tool.called note records the isolation the command ran under."""
    settings.AGENTOPS_WORKSPACE_DIR = tmp_path / "workspaces"
    settings.AGENTOPS_CHECKPOINT_SECONDS = 0
    seen_by_model: list[str] = []
    monkeypatch.setattr(ScriptedProvider, "_execute_turn", leaky_turns(seen_by_model))
    workflow = services.workflow_launch(kind="autonomous", goal="Look for credentials")
    root = Path(settings.AGENTOPS_WORKSPACE_DIR) / f"wf-{workflow.pk}"
    root.mkdir(parents=True)
    (root / ".env").write_text(f"ANTHROPIC_API_KEY={CANARY}\n")

    workflow = drive(workflow.pk)

    assert workflow.status == "completed", workflow.reason
    notes = Event.objects.filter(workflow=workflow, kind="tool.called").order_by("seq")
    assert len(notes) == 12
    expected = sandbox.isolation()
    assert [n.data.get("isolation") for n in notes[:4]] == [expected, expected, expected, None]
    stored = json.dumps([list(Event.objects.filter(workflow=workflow).values("data")),
                         list(Activity.objects.filter(workflow=workflow).values("checkpoint", "result"))], default=str)
    assert "[redacted]" in stored and "[redacted]" in "".join(seen_by_model)
    for value in SECRET_VALUES:
        assert value not in stored
        assert not any(value in text for text in seen_by_model)
    assert "DJANGO_SETTINGS_MODULE" not in stored


ENV_PRINTING_TESTS = """\
import os
names = sorted(os.environ)
print("ENV:", " ".join(names))
leaked = [n for n in names if n.startswith(("DJANGO_", "AGENTOPS_", "CELERY_", "ANTHROPIC_", "DATABASE_"))]
raise SystemExit(f"leaked: {leaked}" if leaked else 0)
"""


@pytest.mark.django_db
def test_release_tests_see_none_of_agentops_variables(worker_secrets, tmp_path, deploy_target, requester):
    """A repository whose tests print their environment: no DJANGO_SETTINGS_MODULE, no secret, and the
    candidate passes; the report records the isolation."""
    repo = make_git_repo(tmp_path / "env-printer", test_script=ENV_PRINTING_TESTS)
    workflow = drive(services.workflow_launch(kind="release", goal="Ship", params=release_params(repo),
                                              user=requester).pk)

    assert (workflow.status, workflow.current_node) == ("waiting", "WAIT_FOR_APPROVAL"), workflow.reason
    tests = workflow.state["tests"]
    assert tests["passed"] and tests["isolation"] == sandbox.isolation()
    names = set(tests["output_tail"].split("ENV:")[1].split())
    expected = {"HOME", "LANG", "LC_ALL", "PATH", "PYTHONDONTWRITEBYTECODE", "TERM", "TMPDIR"}
    assert names - {"PWD"} == expected, tests["output_tail"]


PYTEST_SUITE = """\
import os, sys


def test_runs_without_agentops_settings():
    assert "DJANGO_SETTINGS_MODULE" not in os.environ
    assert "django.conf" not in sys.modules or not __import__("django.conf").conf.settings.configured


def test_home_and_tmp_are_the_sandboxes(tmp_path):
    assert os.environ["HOME"] == os.getcwd()
    assert str(tmp_path).startswith(os.environ["TMPDIR"])
"""


@pytest.mark.django_db
def test_a_pytest_suite_passes_in_the_release_sandbox_as_it_does_on_its_own(tmp_path, deploy_target, requester):
    """The repository's own pytest run (the worker's Python, pytest-django installed) is not taken over
    by agentops' settings, which would fail a plain library's suite (`six`'s, for one)."""
    repo = make_git_repo(tmp_path / "lib", test_script="")
    (repo / "test_lib.py").write_text(PYTEST_SUITE)
    from tests.conftest import git_commit

    git_commit(repo, "test_lib.py", PYTEST_SUITE)
    params = release_params(repo, test_command="python -m pytest -q -p no:cacheprovider test_lib.py")
    workflow = drive(services.workflow_launch(kind="release", goal="Ship", params=params, user=requester).pk)

    assert (workflow.status, workflow.current_node) == ("waiting", "WAIT_FOR_APPROVAL"), workflow.reason
    assert "2 passed" in workflow.state["tests"]["output_tail"]


def test_the_head_of_a_cut_output_is_kept_when_asked(isolation, workspace):
    done = sandbox.run(["python3", "-c", "print('first'); print('x' * 50000); print('last')"], workspace=workspace,
                       timeout_seconds=30, max_output_bytes=1000, keep_head_bytes=6)
    assert (done.head, done.output.rstrip()[-4:]) == ("first\n", "last") and done.cut_bytes > 49000
    assert sandbox.run(["echo", "short"], workspace=workspace, timeout_seconds=30, keep_head_bytes=6).head == ""


# --- a workspace's disk use ---------------------------------------------------------------------

def test_disk_use_counts_each_file_once_and_follows_no_link(workspace, tmp_path):
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "big").write_bytes(os.urandom(2 * 1024 * 1024))
    (workspace / "a").write_bytes(os.urandom(1024 * 1024))
    os.link(workspace / "a", workspace / "a-again")
    (workspace / "out").symlink_to(outside)
    used = limits.disk_use_bytes(workspace)
    assert 1024 * 1024 <= used < 1024 * 1024 + 64 * 1024, used


def test_a_command_that_fills_the_workspace_is_stopped(isolation, settings, workspace):
    """Many files, none of them large (RLIMIT_FSIZE does not see them): past the workspace's bound
    the command is stopped and told why."""
    settings.AGENTOPS_SANDBOX_WORKSPACE_MB = 8
    flood = ("python3 -c \"import os, time\nfor n in range(400):\n    open(f'f{n}', 'wb').write(os.urandom(1 << 20))\n"
             "    time.sleep(0.02)\"")
    ok, output = command(workspace, flood)
    assert not ok and output.startswith("command stopped: the command took the workspace past its disk limit (8 MB"), \
        output
    written = sum(1 for p in workspace.iterdir() if p.name.startswith("f"))
    assert written < 400, written


def test_a_workspace_already_over_its_bound_may_run_commands_that_do_not_grow_it(isolation, settings, workspace):
    settings.AGENTOPS_SANDBOX_WORKSPACE_MB = 1
    (workspace / "data").write_bytes(os.urandom(3 * 1024 * 1024))
    ok, output = command(workspace, "sh -c 'sleep 2.5; wc -c data'")
    assert ok and "3145728 data" in output, output


def test_a_write_tool_that_would_pass_the_bound_is_refused(settings, workspace):
    settings.AGENTOPS_SANDBOX_WORKSPACE_MB = 1
    (workspace / "data").write_bytes(os.urandom(900 * 1024))
    ok, output = run_tool(workspace, "write_file", {"path": "more.txt", "content": "x" * 150_000})
    assert not ok and "of its 1 MB (AGENTOPS_SANDBOX_WORKSPACE_MB)" in output, output
    assert not (workspace / "more.txt").exists()
    assert run_tool(workspace, "write_file", {"path": "small.txt", "content": "fits"})[0]
