"""The documentation matches the code it describes."""
from __future__ import annotations

import ast
import importlib
import inspect
import os
import re
import subprocess
import sys
import textwrap
from dataclasses import dataclass
from io import StringIO
from pathlib import Path

import pytest
from django.core.management import call_command

DOCS = Path(__file__).resolve().parents[1] / "docs"


MACHINES = ["Workflow", "Wait", "Timer", "Commitment", "Activity", "ActivityAttempt", "WebhookDelivery",
            "UsageEntry"]


@pytest.mark.parametrize("model", MACHINES)
def test_state_machine_graphs_in_the_docs_match_the_transitions(model: str) -> None:
    """docs/state-machines.md shows every transition the model declares (line order aside)."""
    out = StringIO()
    call_command("graph_transitions", f"workflows.{model}", stdout=out)
    page = (DOCS / "state-machines.md").read_text()
    block = re.search(rf"## {model}\n\n```dot\n(.*?)```", page, re.S)
    assert block is not None, f"docs/state-machines.md has no section for {model}; run `make docs`"
    assert sorted(block.group(1).split("\n")) == sorted(out.getvalue().split("\n")), "run `make docs`"


# --- docs/authoring.md: every snippet runs -------------------------------------------------------

AUTHORING = DOCS / "authoring.md"
REPO_ROOT = DOCS.parent
FENCE = re.compile(r"^```(?P<lang>[a-z]*)\n(?P<body>.*?)^```", re.S | re.M)
FILE_HEADER = re.compile(r"^# (?P<path>[\w./-]+\.(?:py|toml|json))\n")


@dataclass
class Snippets:
    files: dict[str, str]  # "followup/kind.py": its text (blocks whose first line names a file)
    runnable: list[str]  # the other python blocks, run in order against the written project
    signatures: list[tuple[str, str]]  # (dotted name, the documented def)
    excerpts: list[tuple[str, str]]  # (repository file, the lines quoted from it)
    shell: list[str]


def authoring_snippets() -> Snippets:
    found = Snippets({}, [], [], [], [])
    for block in FENCE.finditer(AUTHORING.read_text()):
        lang, body = block.group("lang"), block.group("body")
        if lang == "sh":
            found.shell.append(body)
        elif lang not in ("python", "toml"):
            continue
        elif body.startswith("# signature: "):
            name, _, definition = body.removeprefix("# signature: ").partition("\n")
            found.signatures.append((name.strip(), definition))
        elif body.startswith("# excerpt of "):
            path, _, quoted = body.removeprefix("# excerpt of ").partition("\n")
            found.excerpts.append((path.strip(), quoted))
        elif (header := FILE_HEADER.match(body)) is not None:
            found.files[header.group("path")] = body
        else:
            assert lang == "python", f"a {lang} block that is no file of the example: {body[:80]!r}"
            found.runnable.append(body)
    return found


def written_project(root: Path, snippets: Snippets) -> Path:
    """The example's files, and one test per other snippet (in page order), in ``root/followup``."""
    project = root / "followup"
    for path, text in snippets.files.items():
        (project / path).parent.mkdir(parents=True, exist_ok=True)
        (project / path).write_text(text)
    tests = ["import pytest\n"] + [f"def test_snippet_{n}():\n" + textwrap.indent(code, "    ")
                                   for n, code in enumerate(snippets.runnable, 1)]
    (project / "tests" / "test_doc_snippets.py").write_text("\n\n".join(tests))
    return project


def plain_shell(**extra: str) -> dict[str, str]:
    """A shell without agentops's settings: no broker, database, kinds or test settings of ours."""
    drop = ("CELERY_", "DATABASE_URL", "AGENTOPS_", "DJANGO_", "PYTEST_")
    return {**{k: v for k, v in os.environ.items() if not k.startswith(drop)}, **extra}


def install_example(root: Path) -> tuple[Path, dict[str, str]]:
    """The page's example written to a blank folder and pip-installed into a folder of its own;
    the project's folder and the environment of a plain shell that imports it (and agentops)."""
    project = written_project(root, authoring_snippets())
    site = root / "site"
    subprocess.run([sys.executable, "-m", "pip", "install", "--quiet", "--no-deps", "--no-build-isolation",
                    "--target", str(site),
                    str(project)], check=True, timeout=300, capture_output=True)
    env = plain_shell(PYTHONPATH=f"{site}{os.pathsep}{REPO_ROOT}", AGENTOPS_VAR_DIR=str(root / "var"))
    return project, env


@pytest.fixture(scope="module")
def installed_example(tmp_path_factory) -> tuple[Path, dict[str, str]]:
    return install_example(tmp_path_factory.mktemp("authoring"))


def test_the_authoring_page_s_kind_installs_and_its_tests_and_every_snippet_pass(installed_example):
    """Section 1's files, installed; its tests and every other snippet, run from a plain shell."""
    project, env = installed_example
    done = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider",
                           "--ignore=tests/test_on_workers.py"], cwd=project, env=env, capture_output=True,
                          text=True, timeout=300)
    snippets = authoring_snippets()
    expected = 2 + len(snippets.runnable)
    assert done.returncode == 0 and f"{expected} passed" in done.stdout, done.stdout[-4000:] + done.stderr[-2000:]
    kinds = subprocess.run([sys.executable, "-c", "import django; django.setup(); from workflows import registry; "
                            "print(registry.definition_kinds())"], cwd=project.parent, capture_output=True,
                           text=True, env={**env, "DJANGO_SETTINGS_MODULE": "agentops.settings"}, timeout=120)
    assert "'followup'" in kinds.stdout, kinds.stderr  # registered by its entry point alone


@pytest.mark.parametrize("name", [name for name, _ in authoring_snippets().signatures])
def test_the_signatures_on_the_authoring_page_are_the_code_s(name: str) -> None:
    """Each documented signature has the function's keyword parameters, kinds and literal defaults."""
    documented = dict(authoring_snippets().signatures)[name]
    module, _, attr = name.rpartition(".")
    try:
        target = getattr(importlib.import_module(module), attr)
    except ModuleNotFoundError:
        owner_module, _, owner = module.rpartition(".")
        target = getattr(getattr(importlib.import_module(owner_module), owner), attr)
    fn = ast.parse(documented).body[0]
    assert isinstance(fn, ast.FunctionDef)
    doc_args = fn.args
    real = inspect.signature(target).parameters
    named = [*doc_args.args, *doc_args.kwonlyargs]
    defaults = dict(zip([a.arg for a in doc_args.args][::-1], doc_args.defaults[::-1], strict=False))
    defaults.update({a.arg: d for a, d in zip(doc_args.kwonlyargs, doc_args.kw_defaults, strict=True) if d})
    assert [a.arg for a in named] == [p for p, v in real.items() if v.kind != v.POSITIONAL_ONLY]
    assert [a.arg for a in doc_args.kwonlyargs] == [p for p, v in real.items() if v.kind == v.KEYWORD_ONLY]
    for arg, node in defaults.items():
        assert ast.literal_eval(node) == real[arg].default, f"{name}: default of {arg}"
    assert len(doc_args.posonlyargs) == len([v for v in real.values() if v.kind == v.POSITIONAL_ONLY])


def test_the_excerpts_on_the_authoring_page_are_in_their_files() -> None:
    for path, quoted in authoring_snippets().excerpts:
        lines = {line.strip() for line in (REPO_ROOT / path).read_text().splitlines()}
        missing = [line for line in quoted.splitlines() if line.strip() and line.strip() not in lines]
        assert not missing, f"docs/authoring.md quotes lines {path} does not have: {missing}"


def test_the_commands_on_the_authoring_page_exist_and_list_every_shipped_kind(settings) -> None:
    """Every `agent VERB` the page runs is a verb of the command; a module list keeps the shipped kinds."""
    from workflows.management.commands.agent import Command

    parser = Command().create_parser("manage.py", "agent")
    verbs = next(a for a in parser._actions if a.dest == "verb").choices
    shell = "\n".join(authoring_snippets().shell)
    used = set(re.findall(r"manage\.py agent ([a-z-]+)", shell))
    assert used and used <= set(verbs), used - set(verbs)
    for listed in re.findall(r"AGENTOPS_AGENT_MODULES=(\S+)", AUTHORING.read_text()):
        shipped = ["agentops.agents.release", "agentops.agents.autonomous", "agentops.agents.harness"]
        assert set(shipped) <= set(listed.strip("`").split(",")), f"a module list drops a shipped kind: {listed}"


@pytest.mark.parametrize("model", ["Activity", "ActivityAttempt"])
def test_the_lifecycle_tables_in_the_docs_match_the_transitions(model: str) -> None:
    """docs/state-machines.md lists each declared transition of the lifecycle's models, as declared."""
    from workflows.services.lifecycle import docs_section

    page = (DOCS / "state-machines.md").read_text()
    assert f"## {model}\n\n```dot\n" in page
    section = page.split(f"## {model}\n\n```dot\n", 1)[1].split("```\n", 1)[1].split("\n## ", 1)[0]
    assert section == docs_section(model), "run `make docs`"
