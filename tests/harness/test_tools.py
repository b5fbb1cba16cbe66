"""H6: the harness tool layer itself (the same for the scripted provider and for Claude), with real
files, real git and real processes."""
from __future__ import annotations

import json
import os
import time
from pathlib import Path

import psutil
import pytest

from agentops.agents.harness import gitops, tools
from agentops.agents.harness.session import Limits, SessionInput, briefing

SOURCE = "".join(f"line {n}\n" for n in range(1, 11))


@pytest.fixture
def session(tmp_path: Path, settings) -> tools.Session:
    settings.AGENTOPS_SANDBOX_GRACE_SECONDS = 1.0
    root = (tmp_path / "ws").resolve()
    gitops.ensure_repo(root)
    (root / "app.py").write_text(SOURCE)
    return tools.Session(root=root, operation_id="op", feature="F01", service_dir=tmp_path / "services")


def test_every_tool_has_a_schema_for_claude():
    names = [t["name"] for t in tools.TOOLS]
    assert {"read_file", "str_replace", "insert", "run_command", "service_start", "service_stop", "service_logs",
            "propose_feature_change", "request_pass", "end_session"} <= set(names)
    assert all(t["input_schema"]["type"] == "object" and set(t["input_schema"]["required"]) <=
               set(t["input_schema"]["properties"]) for t in tools.TOOLS)


def test_read_file_numbers_lines_and_reads_a_range(session):
    ok, out = tools.call(session, "read_file", {"path": "app.py", "start_line": 3, "end_line": 4})
    assert ok and out.splitlines() == ["[app.py: lines 3-4 of 10; read on with start_line=5]", "    3\tline 3",
                                       "    4\tline 4"]
    ok, out = tools.call(session, "read_file", {"path": "app.py", "start_line": 9})
    assert ok and out.splitlines()[0] == "[app.py: lines 9-10 of 10]"


def test_str_replace_changes_exactly_one_occurrence_or_refuses(session):
    ok, out = tools.call(session, "str_replace", {"path": "app.py", "old_str": "line", "new_str": "row"})
    assert not ok and "occurs 10 times" in out
    ok, out = tools.call(session, "str_replace", {"path": "app.py", "old_str": "line 3\n", "new_str": "third\n"})
    assert ok and (session.root / "app.py").read_text().splitlines()[2] == "third"
    ok, out = tools.call(session, "str_replace", {"path": "app.py", "old_str": "absent", "new_str": "x"})
    assert not ok and "occurs 0 times" in out
    assert session.touched == ["app.py"]


def test_insert_puts_text_after_a_line_and_checks_the_line(session):
    ok, _ = tools.call(session, "insert", {"path": "app.py", "insert_line": 0, "text": "# header"})
    assert ok and (session.root / "app.py").read_text().startswith("# header\nline 1\n")
    ok, out = tools.call(session, "insert", {"path": "app.py", "insert_line": 99, "text": "x"})
    assert not ok and "between 0 and 11" in out


def test_edits_to_harness_owned_files_are_refused_for_every_edit_tool(session):
    (session.root / "features.json").write_text("[]\n")
    for name, args in [("str_replace", {"old_str": "[]", "new_str": "[1]"}), ("insert", {"insert_line": 0,
                                                                                         "text": "x"})]:
        ok, out = tools.call(session, name, {"path": "features.json", **args})
        assert not ok and "owned by the harness" in out
    assert (session.root / "features.json").read_text() == "[]\n"


def test_a_silent_command_hits_the_soft_timeout_and_a_busy_one_the_hard_one(session):
    started = time.monotonic()
    ok, out = tools.call(session, "run_command", {"command": "sh -c 'echo begun; sleep 60'", "idle_seconds": 1})
    assert not ok and "printed nothing for 1 s (soft timeout)" in out and "begun" in out
    assert time.monotonic() - started < 15
    ok, out = tools.call(session, "run_command", {
        "command": "python -c \"import time\nwhile True: print('.', flush=True); time.sleep(0.2)\"",
        "timeout_seconds": 2, "idle_seconds": 1})
    assert not ok and out.startswith("command timed out after 2 s")


FETCH = "python -c \"import urllib.request; print(urllib.request.urlopen('http://127.0.0.1:{port}/app.py').read().decode())\""


def test_a_service_gets_a_port_serves_on_loopback_and_is_stopped_with_its_group(session):
    """The session's commands reach its service on loopback (under bubblewrap: in the session's own network)."""
    ok, out = tools.call(session, "service_start", {"name": "web",
                                                    "command": "python -m http.server {port} --bind 127.0.0.1"})
    assert ok and "listening on 127.0.0.1:" in out, out
    service = session.services["web"]
    ok, fetched = tools.call(session, "run_command", {"command": FETCH.format(port=service.port)})
    assert ok and fetched.split("\n", 1)[1].strip() == SOURCE.strip(), fetched
    ok, logs = tools.call(session, "service_logs", {"name": "web"})
    assert ok and "GET /app.py" in logs
    pid = service.proc.pid
    assert tools.call(session, "service_stop", {"name": "web"})[0]
    assert not psutil.pid_exists(pid) or psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
    assert not list((session.service_dir / "records").iterdir())


def test_services_still_running_at_the_end_of_a_session_are_stopped(session):
    ok, _ = tools.call(session, "service_start", {"name": "web", "command": "python -m http.server {port}"})
    service = session.services["web"]
    assert ok and session.close() == ["web"]
    assert service.proc.poll() is not None and session.network is None
    ok, out = tools.call(session, "run_command", {"command": FETCH.format(port=service.port)})
    assert not ok and "Connection refused" in out


def test_services_a_dead_attempt_left_are_stopped_from_the_engines_records(session, tmp_path):
    """A worker killed with its session leaves a service behind: the next attempt stops its group."""
    ok, _ = tools.call(session, "service_start", {"name": "web", "command": "python -m http.server {port}"})
    pid = session.services["web"].proc.pid
    session.services.clear()  # as when the worker that owned it died
    assert ok and tools.stop_leftover_services(session.service_dir) == [pid]
    deadline = time.monotonic() + 5
    while psutil.pid_exists(pid) and psutil.Process(pid).status() != psutil.STATUS_ZOMBIE \
            and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not psutil.pid_exists(pid) or psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
    os.waitpid(pid, 0)


def test_a_service_that_exits_at_once_is_reported(session):
    ok, out = tools.call(session, "service_start", {"name": "bad", "command": "python -c 'raise SystemExit(4)'"})
    assert not ok and "exited with 4 before listening" in out and not session.services


def test_commands_are_refused_when_the_required_isolation_is_missing(session, settings):
    settings.AGENTOPS_SANDBOX = "none"
    session.require_isolation = "bwrap"
    for name, args in [("run_command", {"command": "true"}), ("service_start", {"name": "web",
                                                                                 "command": "true"})]:
        ok, out = tools.call(session, name, args)
        assert not ok and "requires bubblewrap isolation" in out
    assert [r["tool"] for r in session.refused] == ["run_command", "service_start"]


def test_a_proposal_is_kept_for_a_person_and_the_workspace_is_untouched(session):
    ok, out = tools.call(session, "propose_feature_change", {"features_json": "not json", "reason": "r"})
    assert not ok and "not JSON" in out
    ok, out = tools.call(session, "propose_feature_change", {"features_json": "[]", "reason": "r",
                                                             "checks": {"../x.py": "pass"}})
    assert not ok and "under checks/" in out
    ok, _ = tools.call(session, "propose_feature_change", {"features_json": json.dumps([{"id": "F09"}]),
                                                           "reason": "split F01", "checks": {"checks/c.py": "x"}})
    assert ok and session.proposal == {"features_json": '[{"id": "F09"}]', "checks": {"checks/c.py": "x"},
                                       "reason": "split F01"}
    assert not (session.root / "checks").exists()


def test_the_briefing_carries_the_deadline_git_log_patterns_and_bounded_progress_rows():
    rows = [{"session": n, "feature": "F01", "attempt": n, "status": "failing", "outcome": "end_session",
             "summary": "s" * 1000, "files": ["app.py"], "learnings": "l", "next_step": "n"} for n in range(1, 30)]
    text = briefing(SessionInput(goal="g", workspace="/w", feature={"id": "F01", "description": "d", "check": "c"},
                                 attempt=2, session=3, base_sha="b" * 40, protected_sha="p", memory=rows,
                                 limits=Limits(max_seconds=600), patterns=[f"pattern {n}" for n in range(15)]),
                    None, deadline="2026-12-01T12:00:00+00:00", git_log="abc123 F01: add")
    assert "<deadline>2026-12-01T12:00:00+00:00 (in 600 s; at most 40 turns" in text
    assert "<git_log>abc123 F01: add</git_log>" in text
    assert "- pattern 5\n" in text and "- pattern 4\n" not in text  # the last ten
    assert text.count("session ") == 5 and "session 29 F01#29" in text and len(text) <= 10_000


def test_a_long_output_keeps_its_start_and_its_end(session):
    """Beyond the cap the model sees the first lines (where errors of a build often start) and the
    last ones, and how much was left out between them."""
    ok, out = tools.call(session, "run_command", {
        "command": "python -c \"[print(f'line {n:06d}') for n in range(20000)]\""})
    assert ok and out.startswith("exit 0 (sandbox: ")
    body = out.split("\n", 1)[1]
    assert body.startswith("line 000000\nline 000001\n") and body.rstrip().endswith("line 019999")
    assert "bytes of output left out" in body and len(body) < tools.MAX_OUTPUT_CHARS + 200


def test_a_service_started_after_another_stopped_never_takes_a_running_ones_port(session):
    for name in ("a", "b"):
        assert tools.call(session, "service_start", {"name": name, "command": "python -m http.server {port}"})[0]
    assert tools.call(session, "service_stop", {"name": "a"})[0]
    assert tools.call(session, "service_start", {"name": "c", "command": "python -m http.server {port}"})[0]
    assert session.services["c"].port != session.services["b"].port
    assert session.services["c"].proc.poll() is None  # it bound its port: nothing else held it
    session.close()


def test_writes_that_would_pass_the_workspaces_disk_bound_are_refused(session, settings):
    settings.AGENTOPS_SANDBOX_WORKSPACE_MB = 1
    (session.root / "data.bin").write_bytes(os.urandom(1024 * 1024))
    for name, args in [("write_file", {"path": "new.txt", "content": "x" * 10_000}),
                       ("str_replace", {"path": "app.py", "old_str": "line 3\n", "new_str": "x" * 10_000})]:
        ok, out = tools.call(session, name, args)
        assert not ok and "AGENTOPS_SANDBOX_WORKSPACE_MB" in out, (name, out)
    assert not (session.root / "new.txt").exists() and (session.root / "app.py").read_text() == SOURCE
