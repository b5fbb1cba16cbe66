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


def check_command(argv: list[str]) -> None:
    if argv[0] == "celery":
        check_celery(argv)
    else:
        check_manage_py(argv)


def test_the_stack_has_every_service_with_health_checks_and_a_database_volume(compose):
    assert {"postgres", "redis", "web", "worker", "beat", "flower"} <= set(compose["services"])
    assert set(project_services(compose)) == PROJECT_SERVICES
    for name, spec in compose["services"].items():
        if name != "migrate":  # a one-shot job; the others wait for it to complete
            assert spec.get("healthcheck", {}).get("test"), f"service {name} has no health check"
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
