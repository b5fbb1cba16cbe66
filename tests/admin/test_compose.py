"""docker-compose.yml runs commands the project really has (nothing here runs Docker, so parse and check)."""
from __future__ import annotations

import re
import shlex
from pathlib import Path
from typing import Any

import pytest
import yaml

REPO = Path(__file__).resolve().parents[2]
PROJECT_SERVICES = {"migrate", "web", "worker", "worker-io", "beat", "flower", "deploy-target"}


@pytest.fixture(scope="module")
def compose() -> dict[str, Any]:
    return yaml.safe_load((REPO / "docker-compose.yml").read_text())


def project_services(compose: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """Services built from the project's Dockerfile."""
    return {name: spec for name, spec in compose["services"].items() if "build" in spec}


def argv_of(command: Any) -> list[str]:
    return list(command) if isinstance(command, list) else shlex.split(command)


def check_manage_py(argv: list[str]) -> None:
    """`python manage.py NAME ARGS`: NAME is a management command and ARGS parse with its own parser."""
    from django.core.management import get_commands, load_command_class

    assert argv[:2] == ["python", "manage.py"], argv
    name, args = argv[2], argv[3:]
    commands = get_commands()
    assert name in commands, f"manage.py has no command {name!r}"
    command = load_command_class(commands[name], name)
    command.create_parser("manage.py", name).parse_args(args)  # raises CommandError on a bad option


def check_celery(argv: list[str]) -> None:
    """`celery -A agentops SUB ARGS`: the app loads, SUB exists and ARGS parse (Flower's against its options)."""
    import click
    from celery.app.utils import find_app
    from celery.bin.base import CLIContext
    from celery.bin.celery import celery as celery_cli

    from agentops.celery import app

    assert argv[:3] == ["celery", "-A", "agentops"], f"every celery command must start `celery -A agentops`: {argv}"
    assert find_app("agentops") is app
    context = click.Context(celery_cli, info_name="celery", obj=CLIContext(app=app, no_color=True, workdir=None))
    sub = celery_cli.get_command(context, argv[3])
    if sub is None:
        raise click.UsageError(f"No such command {argv[3]!r}.")
    sub_context = sub.make_context(argv[3], argv[4:], parent=context)  # raises on an unknown option
    if argv[3] == "flower":
        from flower.options import options as flower_options

        for option in sub_context.params["tornado_argv"]:
            key = re.match(r"--([\w-]+)", option)
            assert key and key.group(1).replace("-", "_") in flower_options, f"Flower has no option {option!r}"


def check_gunicorn(argv: list[str]) -> None:
    """`gunicorn -c python:MODULE`: the options parse with gunicorn's own parser and the config module loads
    into a configuration gunicorn accepts (its worker class, its WSGI app)."""
    from gunicorn.app.wsgiapp import WSGIApplication

    assert argv[0] == "gunicorn", argv
    app = WSGIApplication.__new__(WSGIApplication)
    app.usage, app.callable, app.prog, app.cfg = None, None, "gunicorn", None
    app.load_default_config()
    parsed = app.cfg.parser().parse_args(argv[1:])  # SystemExit on an unknown option
    assert parsed.config and parsed.config.startswith("python:"), argv
    config = app.get_config_from_module_name(parsed.config.removeprefix("python:"))
    for key, value in config.items():
        if key in app.cfg.settings:
            app.cfg.set(key.lower(), value)  # raises on a value gunicorn refuses
        else:
            assert key.startswith("_") or callable(value) or key in {"settings"}, f"gunicorn has no setting {key!r}"
    assert app.cfg.worker_class_str == "gthread"
    assert app.cfg.wsgi_app == "agentops.wsgi:application"


def check_command(argv: list[str]) -> None:
    if argv[0] == "celery":
        check_celery(argv)
    elif argv[0] == "gunicorn":
        check_gunicorn(argv)
    else:
        check_manage_py(argv)


def test_the_stack_has_every_service_with_health_checks_and_a_database_volume(compose):
    assert {"postgres", "redis", "web", "worker", "beat", "flower"} <= set(compose["services"])
    assert set(project_services(compose)) == PROJECT_SERVICES
    for name, spec in compose["services"].items():
        if name == "migrate":
            # A one-shot job, never restarted: the others wait for it to complete, which is its health.
            assert spec["restart"] == "no" and "healthcheck" not in spec
            continue
        check = spec.get("healthcheck", {})
        assert check.get("test") and not check.get("disable"), f"service {name} has no health check"
        assert check["test"][0] in {"CMD", "CMD-SHELL"}, (name, check["test"])
    assert "pgdata:/var/lib/postgresql/data" in compose["services"]["postgres"]["volumes"]
    assert "pgdata" in compose["volumes"]
    for name in ("web", "worker", "beat"):
        assert compose["services"][name]["depends_on"]["postgres"]["condition"] == "service_healthy"
        assert compose["services"][name]["depends_on"]["migrate"]["condition"] == "service_completed_successfully"


def test_project_images_come_from_the_dockerfile(compose):
    assert (REPO / "Dockerfile").is_file()
    dockerfile = (REPO / "Dockerfile").read_text()
    for name, spec in project_services(compose).items():
        assert spec["build"] == ".", name
    assert re.search(r"^RUN pip install -e \.$", dockerfile, re.M)
    for path in ("agentops", "workflows", "tasks", "manage.py", "pyproject.toml"):
        assert path in dockerfile


@pytest.mark.parametrize("service", sorted(PROJECT_SERVICES))
def test_every_service_command_is_one_the_project_has(compose, service):
    check_command(argv_of(compose["services"][service]["command"]))


@pytest.mark.parametrize(("service", "name"), [("worker", "worker"), ("worker-io", "io")])
def test_each_worker_health_check_pings_its_own_worker(compose, service, name):
    test = compose["services"][service]["healthcheck"]["test"]
    assert test[0] == "CMD-SHELL"
    # $$ is compose's escape for a literal $, expanded by the container's shell.
    check_celery(shlex.split(test[1].replace("$$HOSTNAME", "worker-host")))
    assert f"-d {name}@$$HOSTNAME" in test[1] and f"-n {name}@%h" in " ".join(compose["services"][service]["command"])


def test_each_data_service_health_check_asks_the_server_itself(compose):
    assert compose["services"]["postgres"]["healthcheck"]["test"][1].startswith("pg_isready ")
    assert compose["services"]["redis"]["healthcheck"]["test"] == ["CMD", "redis-cli", "ping"]


@pytest.mark.parametrize(("service", "process"), [("web", "web"), ("beat", "beat")])
def test_web_and_beat_are_checked_by_the_healthcheck_command(compose, settings, service, process):
    """web: its login page answers as the public name sees it; beat: it ticks (manage.py healthcheck)."""
    test = compose["services"][service]["healthcheck"]["test"]
    assert test[0] == "CMD" and test[1:5] == ["python", "manage.py", "healthcheck", process]
    check_manage_py(test[1:])
    if process == "web":
        assert test[test.index("--url") + 1] == "http://127.0.0.1:8000"
        assert settings.AGENTOPS_WEB_BIND.endswith(":8000")
    else:
        # Beat writes its schedule's last runs every 3 minutes: the check must allow longer than that.
        assert int(test[test.index("--max-age-seconds") + 1]) > 180


def test_the_workers_consume_the_two_queues_the_settings_name(compose, settings):
    """Short work on prefork, the I/O queue on a threads pool with a bounded database pool."""
    short, io = (compose["services"][name] for name in ("worker", "worker-io"))
    assert short["command"][short["command"].index("-Q") + 1] == settings.CELERY_TASK_DEFAULT_QUEUE
    assert io["command"][io["command"].index("-Q") + 1] == settings.AGENTOPS_IO_QUEUE
    assert io["command"][io["command"].index("-P") + 1] == "threads"
    assert int(io["environment"]["AGENTOPS_DB_POOL_SIZE"]) > 0


def test_the_checks_catch_a_command_the_project_does_not_have():
    """The checks above would fail on a typo: guard against a test that passes on anything."""
    from django.core.management import CommandError

    with pytest.raises(AssertionError, match="no command 'runservr'"):
        check_manage_py(["python", "manage.py", "runservr"])
    with pytest.raises(CommandError):
        check_manage_py(["python", "manage.py", "deploy_target", "--prot", "8765"])
    with pytest.raises(Exception, match="No such command"):
        check_celery(["celery", "-A", "agentops", "wokrer"])
    with pytest.raises(Exception, match="--concurency"):
        check_celery(["celery", "-A", "agentops", "worker", "--concurency", "4"])
    with pytest.raises(SystemExit):
        check_gunicorn(["gunicorn", "--workrs", "2"])
    with pytest.raises(AssertionError, match="Flower has no option '--adress=0.0.0.0'"):
        check_celery(["celery", "-A", "agentops", "flower", "--adress=0.0.0.0"])


def test_environment_names_are_ones_the_settings_read(compose):
    """A misspelt variable would be ignored silently; every AGENTOPS_/DJANGO_/… name must be read in settings."""
    settings_text = (REPO / "agentops" / "settings.py").read_text()
    for name, spec in project_services(compose).items():
        for key in spec.get("environment", {}):
            if key.startswith("FLOWER_"):
                from flower.options import options as flower_options

                assert key.removeprefix("FLOWER_").lower() in flower_options, key
            else:
                assert f'"{key}"' in settings_text, f"service {name} sets {key}, which settings.py never reads"


# --- Isolated and private by default -----------------------------------------------------------

SANDBOX_OPTIONS = {"seccomp=unconfined", "apparmor=unconfined", "systempaths=unconfined", "no-new-privileges:true"}
VARIABLE = re.compile(r"\$\$|\$\{(?P<name>\w+)(?:(?P<op>:?[-?])(?P<arg>[^}]*))?\}")


class Unset(Exception):
    """A `${NAME:?message}` compose refuses to start without."""


def interpolated(value: str, env: dict[str, str]) -> str:
    """A value as compose interpolates it (`${X}`, `${X:-default}`, `${X-default}`, `${X:?err}`, `${X?err}`, `$$`)."""
    def one(match: re.Match[str]) -> str:
        if match.group(0) == "$$":
            return "$"
        name, op, arg = match.group("name"), match.group("op") or "", match.group("arg") or ""
        given = env.get(name)
        missing = given is None or (op.startswith(":") and given == "")
        if missing and op.endswith("?"):
            raise Unset(f"{name}: {arg}")
        return arg if missing and op.endswith("-") else (given or "")
    return VARIABLE.sub(one, value)


def runs_activities(spec: dict[str, Any]) -> bool:
    """A Celery worker: it runs activities, and so the commands models choose."""
    argv = argv_of(spec.get("command", []))
    return argv[:4] == ["celery", "-A", "agentops", "worker"]


def test_the_interpolation_reads_defaults_and_required_values_as_compose_does():
    """Guard for the checks below: a default, an empty value, a required one, an escape."""
    assert interpolated("${A:-bwrap}", {}) == interpolated("${A:-bwrap}", {"A": ""}) == "bwrap"
    assert interpolated("${A-bwrap}", {"A": ""}) == "" and interpolated("${A:-bwrap}", {"A": "none"}) == "none"
    assert interpolated("$${HOSTNAME} ${B}", {"B": "x"}) == "${HOSTNAME} x"
    with pytest.raises(Unset, match="A: set it"):
        interpolated("${A:?set it}", {"A": ""})
    assert interpolated("${A:?set it}", {"A": "ops:pw"}) == "ops:pw"


def test_the_image_installs_bubblewrap_and_runs_as_a_user_without_privileges():
    dockerfile = (REPO / "Dockerfile").read_text()
    installs = re.findall(r"apt-get install ([^\n\\]*)", dockerfile)
    assert any("bubblewrap" in line.split() for line in installs), installs
    users = re.findall(r"^USER (\S+)$", dockerfile, re.M)
    assert users and users[-1] not in {"root", "0"}, users


def test_every_worker_runs_commands_under_bubblewrap_or_not_at_all(compose):
    """AGENTOPS_SANDBOX=bwrap unless an operator says otherwise: a worker where bubblewrap cannot
    start refuses the command (SandboxUnavailable) instead of running it unisolated."""
    workers = {name: spec for name, spec in project_services(compose).items() if runs_activities(spec)}
    assert set(workers) == {"worker", "worker-io"}
    for name, spec in workers.items():
        assert interpolated(str(spec["environment"]["AGENTOPS_SANDBOX"]), {}) == "bwrap", name
        assert interpolated(str(spec["environment"]["AGENTOPS_SANDBOX"]), {"AGENTOPS_SANDBOX": "none"}) == "none"
    from agentops.sandbox import MODES

    assert "bwrap" in MODES


def test_the_workers_get_what_bubblewrap_needs_and_no_capability(compose):
    """The three relaxations bubblewrap needs (namespaces: seccomp; mount: AppArmor; its own /proc:
    the masked paths), no-new-privileges, every capability dropped, none added, not privileged."""
    for name, spec in project_services(compose).items():
        assert not spec.get("privileged"), name
        assert not spec.get("cap_add"), f"{name} adds capabilities {spec.get('cap_add')}"
        if runs_activities(spec):
            assert set(spec["security_opt"]) == SANDBOX_OPTIONS, name
            assert spec["cap_drop"] == ["ALL"], name
        else:
            assert "security_opt" not in spec, f"{name} runs no command for a user and keeps Docker's confinement"


def test_flower_listens_on_this_host_only_behind_credentials_with_no_default(compose):
    flower = compose["services"]["flower"]
    assert flower["ports"] == ["127.0.0.1:5555:5555"]
    auth = str(flower["environment"]["FLOWER_BASIC_AUTH"])
    with pytest.raises(Unset, match="FLOWER_BASIC_AUTH: set FLOWER_BASIC_AUTH=user:long-password"):
        interpolated(auth, {})
    with pytest.raises(Unset):
        interpolated(auth, {"FLOWER_BASIC_AUTH": ""})
    assert interpolated(auth, {"FLOWER_BASIC_AUTH": "ops:s3cret-long"}) == "ops:s3cret-long"
    assert re.fullmatch(r"\$\{FLOWER_BASIC_AUTH:\?[^}]+\}", auth), "no default, no other value around it"


def host_ip(port: Any, env: dict[str, str]) -> str | None:
    """The host address a `ports` entry binds to once interpolated, or None for all interfaces."""
    if isinstance(port, dict):  # the long syntax
        return interpolated(str(port.get("host_ip", "")), env) or None
    parts = interpolated(str(port), env).split(":")
    return ":".join(parts[:-2]) if len(parts) >= 3 else None


def published_ports(compose: dict[str, Any]) -> list[tuple[str, Any]]:
    return [(name, port) for name, spec in compose["services"].items() for port in spec.get("ports", [])]


def test_host_ip_reads_every_form_of_a_ports_entry():
    """Guard for the checks below: the short forms, the long one and a variable."""
    assert host_ip("8000:8000", {}) is None and host_ip(8000, {}) is None
    assert host_ip("127.0.0.1:8000:8000", {}) == "127.0.0.1"
    assert host_ip("${AGENTOPS_BIND:-127.0.0.1}:8000:8000", {"AGENTOPS_BIND": "0.0.0.0"}) == "0.0.0.0"
    assert host_ip({"target": 8000, "published": 8000}, {}) is None
    assert host_ip({"target": 8000, "host_ip": "127.0.0.1"}, {}) == "127.0.0.1"


def test_every_published_port_is_on_loopback_by_default(compose):
    """Nothing reaches the stack from the network as shipped: every port is the host's 127.0.0.1 unless
    AGENTOPS_BIND says otherwise (set or empty alike)."""
    assert published_ports(compose), "the stack publishes web's port"
    for name, port in published_ports(compose):
        for env in ({}, {"AGENTOPS_BIND": ""}):
            assert host_ip(port, env) == "127.0.0.1", (name, port, env)
            assert not str(port).startswith(("0.0.0.0", "[::]", "::")), (name, port)


def test_agentops_bind_publishes_web_for_a_proxy_and_flower_stays_on_loopback(compose):
    web = compose["services"]["web"]["ports"]
    assert web == ["${AGENTOPS_BIND:-127.0.0.1}:8000:8000"]
    assert host_ip(web[0], {"AGENTOPS_BIND": "10.0.0.5"}) == "10.0.0.5"
    for name, port in published_ports(compose):
        if name != "web":
            assert host_ip(port, {"AGENTOPS_BIND": "0.0.0.0"}) == "127.0.0.1", (name, port)


def test_the_secret_key_is_required_with_how_to_make_one_and_no_default_anywhere(compose):
    """compose refuses to start without DJANGO_SECRET_KEY, and its message says how to make one."""
    for name, spec in project_services(compose).items():
        key = str(spec["environment"]["DJANGO_SECRET_KEY"])
        assert re.fullmatch(r"\$\{DJANGO_SECRET_KEY:\?[^}]+\}", key), (name, key)
        with pytest.raises(Unset, match=r"DJANGO_SECRET_KEY: set DJANGO_SECRET_KEY.*secrets\.token_urlsafe\(50\)"):
            interpolated(key, {})
        with pytest.raises(Unset):
            interpolated(key, {"DJANGO_SECRET_KEY": ""})
        assert interpolated(key, {"DJANGO_SECRET_KEY": "k" * 50}) == "k" * 50
    text = (REPO / "docker-compose.yml").read_text() + (REPO / "Dockerfile").read_text()
    assert not re.search(r"\$\{DJANGO_SECRET_KEY:?-", text), "a default secret key"
    assert not re.search(r"insecure|change-me|changeme", text, re.I)
    assert "SECRET_KEY" not in (REPO / "Dockerfile").read_text()
    from django.conf import settings

    assert settings.SECRET_KEY not in text


def test_no_service_publishes_a_port_flower_would_share(compose):
    """Flower is the one service without its own login (the admin and the API have theirs): it alone
    must never be published beyond loopback, whatever port it is moved to."""
    for name, spec in compose["services"].items():
        for port in spec.get("ports", []):
            if str(port).rsplit(":", 1)[-1] == "5555":
                assert str(port).startswith("127.0.0.1:"), (name, port)


def test_the_operators_guide_names_each_container_option_and_the_flower_setup():
    guide = (REPO / "docs" / "operators.md").read_text()
    section = guide[guide.index("## docker compose"):guide.index("## Metrics")]
    for option in sorted(SANDBOX_OPTIONS) + ["cap_drop", "AGENTOPS_SANDBOX=bwrap", "127.0.0.1:5555", ".env",
                                             "FLOWER_BASIC_AUTH"]:
        assert option in section, option
    assert "change-me" not in section
