"""The package's imports flow one way: scores -> suites -> data -> model -> training;
model -> planning -> evaluation; the critic's networks below planning, its training above
training; the command line (and its configs) on top. No cycle, and no
Hydra below the command line."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[1] / "trajectory_transformer"

# What each part of the library may import of the package (besides itself).
ALLOWED = {
    "threads": set(),  # imported first of all, before torch loads
    "scores": set(),
    "progress": set(),  # the loops' progress lines
    "suites": {"scores"},
    "data": {"suites", "scores"},
    "model": {"data"},
    "checkpoint": {"data", "model"},
    "training": {"data", "model", "progress"},
    "critic": {"data", "model", "checkpoint", "training", "progress"},
    "planning": {"data", "model", "checkpoint", "critic"},
    "evaluation": {"data", "model", "planning", "scores", "progress"},
    "diagnostics": {"data", "model", "checkpoint", "planning", "evaluation"},
    "viz": {"data", "model", "checkpoint", "planning", "evaluation", "diagnostics", "comparison"},
    "comparison": {"checkpoint", "critic"},
}
COMMAND_LINE = {"cli", "__init__"}


def module_name(path: Path) -> str:
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def imports_of(path: Path, modules: set[str] = frozenset()) -> set[str]:
    """Modules imported anywhere in `path` except under `if TYPE_CHECKING:`; `from package
    import submodule` counts as the submodule alone when it is one of `modules`."""
    tree = ast.parse(path.read_text())
    skipped = {
        id(child)
        for node in ast.walk(tree)
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test)
        for statement in node.body
        for child in ast.walk(statement)
    }
    found = set()
    for node in ast.walk(tree):
        if id(node) in skipped:
            continue
        if isinstance(node, ast.Import):
            found |= {alias.name for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names = {f"{node.module}.{alias.name}" for alias in node.names}
            found |= names & modules or {node.module}
    return found


def graph() -> dict[str, set[str]]:
    modules = {module_name(p): p for p in PACKAGE.rglob("*.py")}
    return {
        name: {m for m in imports_of(path, set(modules)) if m in modules and m != name}
        for name, path in modules.items()
    }


def part(module: str) -> str:
    return module.split(".")[1] if module.count(".") else "__init__"


@pytest.mark.parametrize("layer", sorted(ALLOWED))
def test_each_part_imports_only_the_parts_below_it(layer: str) -> None:
    wrong = {
        f"{module} imports {imported}"
        for module, imported_modules in graph().items()
        if part(module) == layer
        for imported in imported_modules
        if part(imported) not in ALLOWED[layer] | {layer}
    }
    assert not wrong, sorted(wrong)


def test_the_import_graph_has_no_cycle() -> None:
    edges = graph()
    done: set[str] = set()

    def visit(module: str, path: list[str]) -> None:
        if module in path:
            cycle = [*path[path.index(module) :], module]
            pytest.fail("import cycle: " + " -> ".join(cycle))
        if module in done:
            return
        for imported in edges[module]:
            visit(imported, [*path, module])
        done.add(module)

    for module in edges:
        visit(module, [])


def test_the_library_imports_no_hydra() -> None:
    hydra = {
        f"{module_name(path)}: {name}"
        for path in PACKAGE.rglob("*.py")
        if part(module_name(path)) not in COMMAND_LINE
        for name in imports_of(path)
        if name.split(".")[0] in ("hydra", "omegaconf")
    }
    assert not hydra, sorted(hydra)


def test_every_module_belongs_to_a_known_part() -> None:
    assert {part(m) for m in graph()} <= set(ALLOWED) | COMMAND_LINE
