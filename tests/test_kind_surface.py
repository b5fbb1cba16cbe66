"""The surface kind authors write against, locked: ``agentops.kind`` (a definition and its
activities), ``agentops.kind.presentation`` (its admin panels) and ``agentops.kind.testing`` (its
tests). A name added here is a promise; a name removed breaks someone's kind. And the shipped kinds
and the examples import nothing else of the kernel, so the surface is known to be enough."""
from __future__ import annotations

import ast
import importlib
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]

SURFACE = {
    "agentops.kind": [
        "ActivityContext", "ActivityFailed", "AdminPanel", "BudgetExhausted", "CandidateView", "ChildHandle",
        "ChildOutcome", "CompensationInput", "Complete", "Decision", "DefinitionError", "EMPTY_QUERY", "Fail",
        "FirstOutcome", "Goto",
        "InvalidInput", "LaunchParams", "MODEL_CALL_LEASE", "ModelResponse", "NodeContext", "Permanent",
        "ROLE_MAX_LENGTH", "RetryPolicy", "Retryable", "Schedule", "Throttled", "TransitionRefused", "Usage",
        "WaitOutcome", "WaitRefused",
        "WorkflowDefinition", "activity", "annotate", "candidate_as_json", "cost_usd", "declare_schedules",
        "hash_of_candidate", "keep_alive",
        "metered_complete", "node", "now", "progress_validate", "provider_for", "register_definition", "resolve",
        "schedule_ensure", "schedule_remove", "state_at", "state_of", "tool_span",
    ],
    "agentops.kind.presentation": [
        "Activity", "Checkpoint", "ProgressSample", "Reading", "TimeChart", "UsageEntry", "Wait", "Workflow",
        "duration", "page_links", "time_chart", "usd", "when",
    ],
    "agentops.kind.testing": [
        "ActivityEnvironment", "Child", "Clock", "Commitment", "Crashed", "Divergence", "Doorbell", "Doorbells",
        "Event", "FAULT_POINTS", "FakeLease", "FakeLedger", "FakeModel", "Faults", "LeaseLost", "Reply", "Throttle",
        "WorkflowRun", "approve", "cancel", "cut_off", "deployed", "drive", "events", "launch", "registered",
        "reject", "replay", "resume", "set_budget", "signal", "supersede",
    ],
}
# The fixtures a package's conftest gets from ``pytest_plugins = ["agentops.kind.pytest_plugin"]``.
PLUGIN_FIXTURES = ["clock", "doorbells", "drive", "faults", "workers", "workers_broker_url"]
# Where kinds live: the shipped ones and the worked example of docs/authoring.md.
KIND_SOURCES = [*sorted((ROOT / "agentops" / "agents").rglob("*.py")), *sorted((ROOT / "examples").rglob("*.py"))]
# The example's tests, written as its author would: the kit's surface, and nothing of the project's tests.
EXAMPLE_TESTS = sorted((ROOT / "tests" / "examples").rglob("test_*.py"))
# The shipped kinds' own tests and their helpers: the kit's surface too.
SHIPPED_KIND_TESTS = [*sorted((ROOT / "tests" / "harness").rglob("*.py")),
                      *(ROOT / "tests" / "workflows" / name for name in ("test_autonomous.py", "test_release_flow.py"))]


@pytest.mark.parametrize("module", sorted(SURFACE))
def test_the_surface_exports_exactly_its_locked_names(module: str) -> None:
    imported = importlib.import_module(module)
    assert sorted(imported.__all__) == sorted(SURFACE[module]), (
        f"{module}.__all__ changed: a kind author's import may break. Lock the new list here on purpose.")
    missing = [name for name in imported.__all__ if not hasattr(imported, name)]
    assert not missing, f"{module} lists names it does not define: {missing}"


def test_the_test_kit_s_plugin_gives_exactly_its_locked_fixtures() -> None:
    plugin = ROOT / "agentops" / "kind" / "pytest_plugin.py"
    fixtures = [node.name for node in ast.parse(plugin.read_text()).body if isinstance(node, ast.FunctionDef)
                and any(ast.unparse(d) == "pytest.fixture" for d in node.decorator_list)]
    assert sorted(fixtures) == PLUGIN_FIXTURES, "the plugin's fixtures changed: a package's tests may break"


def kernel_imports(path: Path) -> list[str]:
    """Every import of ``workflows`` in the file, at module level or inside a function."""
    found = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            if node.module == "workflows" or node.module.startswith("workflows."):
                found.append(f"{path.relative_to(ROOT)}:{node.lineno}: from {node.module} import ...")
        elif isinstance(node, ast.Import):
            found += [f"{path.relative_to(ROOT)}:{node.lineno}: import {alias.name}" for alias in node.names
                      if alias.name == "workflows" or alias.name.startswith("workflows.")]
    return found


def test_shipped_kinds_and_examples_import_the_kernel_only_through_the_surface() -> None:
    assert len(KIND_SOURCES) > 20  # the scan sees the kinds
    found = [line for path in KIND_SOURCES for line in kernel_imports(path)]
    assert not found, "import these through agentops.kind instead:\n" + "\n".join(found)


def test_what_kinds_import_of_the_surface_is_on_it() -> None:
    """A kind that imports a name the surface does not list would pass only while the kernel keeps it."""
    unknown = []
    for path in KIND_SOURCES:
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.ImportFrom) and node.module in SURFACE:
                unknown += [f"{path.relative_to(ROOT)}: {node.module}.{alias.name}" for alias in node.names
                            if alias.name not in SURFACE[node.module]]
    assert not unknown, unknown


def test_the_examples_tests_use_only_the_kit_s_surface() -> None:
    """What a kind author's tests can import: the surface, the kind itself, Django and pytest; not the
    kernel, and not this project's own test helpers."""
    assert EXAMPLE_TESTS
    found = [line for path in EXAMPLE_TESTS for line in kernel_imports(path)]
    for path in EXAMPLE_TESTS:
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.ImportFrom) and node.module and node.module.split(".")[0] == "tests":
                found.append(f"{path.relative_to(ROOT)}:{node.lineno}: from {node.module} import ...")
            if isinstance(node, ast.ImportFrom) and node.module in SURFACE:
                found += [f"{path.relative_to(ROOT)}: {node.module}.{alias.name} is not on the surface"
                          for alias in node.names if alias.name not in SURFACE[node.module]]
    assert not found, "\n".join(found)


def test_the_shipped_kinds_own_tests_reach_the_kernel_only_through_the_surface() -> None:
    assert len(SHIPPED_KIND_TESTS) > 10
    found = [line for path in SHIPPED_KIND_TESTS for line in kernel_imports(path)]
    for path in SHIPPED_KIND_TESTS:
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.ImportFrom) and node.module in SURFACE:
                found += [f"{path.relative_to(ROOT)}: {node.module}.{alias.name} is not on the surface"
                          for alias in node.names if alias.name not in SURFACE[node.module]
                          and f"{node.module}.{alias.name}" not in SURFACE]  # a module of it: agentops.kind.testing
    assert not found, "\n".join(found)
