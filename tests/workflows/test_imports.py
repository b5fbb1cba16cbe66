"""The layout, locked: the kernel (``workflows`` but its features, interfaces and test kit)
imports no feature (``workflows.features``); nothing of ``workflows`` imports the project
(``agentops``: its settings and Celery app, the shipped kinds, providers, sandbox); no
import cycle holds any two product modules; no product module is over 600 lines; and SQL is
written by hand only under ``workflows.sql``. Imports
inside functions count: they run too, only later. The scan reads the source (``ast``), as the
lifecycle's scan does."""
from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PACKAGES = ("workflows", "agentops")
FEATURES = "workflows.features"
# What is not the kernel inside ``workflows``: the features, the interfaces that call them, the test kit.
NOT_KERNEL = (FEATURES, "workflows.api", "workflows.admin", "workflows.management", "workflows.testing")


def product_modules() -> dict[str, Path]:
    found = {}
    for package in PACKAGES:
        for path in (ROOT / package).rglob("*.py"):
            parts = path.relative_to(ROOT).with_suffix("").parts
            if "migrations" in parts or "tests" in parts:
                continue
            found[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    return found


MODULES = product_modules()


def owner(name: str) -> str | None:
    """The product module an imported name lives in (``a.b.c`` → ``a.b`` when ``c`` is a name in it)."""
    while name and name not in MODULES:
        name = name.rpartition(".")[0]
    return name or None


def imports_of(module: str) -> Iterator[tuple[int, str]]:
    """(line, module) for every product module ``module`` imports, at any depth of its code; an
    import of ``a.b.c`` runs ``a`` and ``a.b`` first, so from outside ``a`` those count too."""
    path = MODULES[module]
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        names: list[str] = []
        if isinstance(node, ast.ImportFrom):
            base = package
            for _ in range(node.level - 1):
                base = base.rpartition(".")[0]
            source = (f"{base}.{node.module}" if node.module else base) if node.level else node.module or ""
            submodules = [f"{source}.{alias.name}" for alias in node.names]
            named = [name for name in submodules if name in MODULES]
            names = named if len(named) == len(submodules) else [source, *named]
        elif isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        for name in names:
            if name.split(".")[0] not in PACKAGES or (target := owner(name)) is None:
                continue
            parts = target.split(".")
            for depth in range(1, len(parts) + 1):
                ancestor = ".".join(parts[:depth])
                if ancestor in MODULES and ancestor != module and not module.startswith(ancestor + "."):
                    yield node.lineno, ancestor


GRAPH = {module: {target for _, target in imports_of(module)} for module in MODULES}


def cycles() -> list[set[str]]:
    """The strongly connected components of more than one module (Tarjan's, iteratively)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[set[str]] = []
    for start in sorted(GRAPH):
        if start in index:
            continue
        work = [(start, iter(sorted(GRAPH[start])))]
        index[start] = low[start] = len(index)
        stack.append(start)
        on_stack.add(start)
        while work:
            node, edges = work[-1]
            for target in edges:
                if target not in index:
                    index[target] = low[target] = len(index)
                    stack.append(target)
                    on_stack.add(target)
                    work.append((target, iter(sorted(GRAPH[target]))))
                    break
                if target in on_stack:
                    low[node] = min(low[node], index[target])
            else:
                work.pop()
                if work:
                    low[work[-1][0]] = min(low[work[-1][0]], low[node])
                if low[node] == index[node]:
                    component = set()
                    while True:
                        member = stack.pop()
                        on_stack.discard(member)
                        component.add(member)
                        if member == node:
                            break
                    if len(component) > 1:
                        found.append(component)
    return found


def test_the_scan_sees_the_product() -> None:
    assert len(MODULES) > 150 and "workflows.engine" in MODULES and "agentops.celery" in MODULES
    assert "workflows.services.workflows" in GRAPH["workflows.features.forks.services"]  # a function-level import
    assert "agentops.providers.scripted" in GRAPH["agentops.agents.harness.script"]
    assert in_kernel("workflows.engine") and in_kernel("workflows.services.steps")
    assert not in_kernel("workflows.features.forks.services") and not in_kernel("workflows.api.endpoints")


def test_the_kernel_imports_nothing_of_the_project() -> None:
    found = [f"{MODULES[module].relative_to(ROOT)}:{line}: {target}"
             for module in sorted(MODULES) if module.startswith("workflows")
             for line, target in imports_of(module) if target.startswith("agentops")]
    assert not found, ("The kernel (workflows) imports the project (agentops); take what it needs into the kernel, "
                       "or let the project register it (as agentops.celery registers the doorbells' publisher):\n"
                       + "\n".join(found))


def in_kernel(module: str) -> bool:
    return module.startswith("workflows") and not any(module == top or module.startswith(top + ".")
                                                      for top in NOT_KERNEL)


def test_the_kernel_imports_no_feature() -> None:
    found = [f"{MODULES[module].relative_to(ROOT)}:{line}: {target}"
             for module in sorted(MODULES) if in_kernel(module)
             for line, target in imports_of(module) if target.startswith(FEATURES)]
    assert not found, ("A kernel module imports a feature (workflows.features); the feature calls the kernel, or "
                       "the kernel offers a hook the feature registers with:\n" + "\n".join(found))


def test_no_import_cycle() -> None:
    found = cycles()
    assert not found, ("An import cycle among product modules (imports inside functions count): move what both "
                       "need below them, or the function that needs both above them:\n"
                       + "\n".join(", ".join(sorted(component)) for component in found))


def test_no_product_module_is_over_600_lines() -> None:
    """The style guide's size for a module (400–500 lines), with room: past 600 it is two modules."""
    long = {name: n for name, path in MODULES.items() if (n := len(path.read_text().splitlines())) > 600}
    assert not long, f"split these: {long}"


SQL_PACKAGE = "workflows.sql"


def sql_by_hand(module: str) -> Iterator[tuple[int, str]]:
    """(line, what) for every cursor opened and every statement given as text in ``module``."""
    path = MODULES[module]
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if not isinstance(node, ast.Call) or not isinstance(node.func, ast.Attribute):
            continue
        if node.func.attr == "cursor":
            yield node.lineno, "a cursor"
        elif node.func.attr in ("execute", "executemany", "raw") and node.args and (
                isinstance(node.args[0], ast.JoinedStr)
                or isinstance(node.args[0], ast.Constant) and isinstance(node.args[0].value, str)):
            yield node.lineno, f"{node.func.attr}() of a statement's text"
        elif isinstance(node.func.value, ast.Name) and node.func.value.id == "RawSQL":
            yield node.lineno, "RawSQL"


def test_sql_is_written_by_hand_only_under_workflows_sql() -> None:
    found = [f"{MODULES[module].relative_to(ROOT)}:{line}: {what}" for module in sorted(MODULES)
             if module != SQL_PACKAGE and not module.startswith(SQL_PACKAGE + ".")
             for line, what in sql_by_hand(module)]
    assert not found, ("SQL written by hand outside workflows/sql/: say it with the ORM, or move the statement "
                       "into the package (where its tests are):\n" + "\n".join(found))


def test_the_sql_scan_sees_the_statements_in_the_package() -> None:
    seen = {module: list(sql_by_hand(module)) for module in MODULES if module.startswith(SQL_PACKAGE)}
    assert all(seen[module] for module in ("workflows.sql", "workflows.sql.server", "workflows.sql.workflow",
                                           "workflows.sql.slots", "workflows.sql.budgets", "workflows.sql.steering"))
