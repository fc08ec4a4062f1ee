"""The layout's promises, read from the source (no import runs): common/ knows no framework and no driver and holds
nothing only the driver uses, neither framework package imports the other, experiments/ has no import cycles, and
nothing but the command table imports experiments.commands."""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("common", "torch_impl", "jax_impl", "experiments")


def _module_name(path: Path) -> str:
    parts = path.relative_to(ROOT).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _imports(path: Path, top_level_only: bool) -> set[str]:
    tree = ast.parse(path.read_text())
    nodes = tree.body if top_level_only else list(ast.walk(tree))
    if top_level_only:  # imports under `if TYPE_CHECKING:` never run
        nodes = [n for n in nodes if not isinstance(n, ast.If)]
    names: set[str] = set()
    for node in nodes:
        if isinstance(node, ast.Import):
            names |= {alias.name for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names.add(node.module)
            names |= {f"{node.module}.{alias.name}" for alias in node.names}
    return names


def _modules(package: str) -> dict[str, Path]:
    return {_module_name(p): p for p in (ROOT / package).rglob("*.py")}


def _roots(names: set[str]) -> set[str]:
    return {name.split(".")[0] for name in names}


def test_common_imports_no_framework_and_no_driver():
    for name, path in _modules("common").items():
        assert not _roots(_imports(path, top_level_only=False)) & {"torch", "jax", "flax", "optax", "torch_impl",
                                                                      "jax_impl", "experiments"}, name


def test_common_holds_only_what_more_than_the_driver_uses():
    """A common/ module imported by experiments/ alone (or by nothing) belongs under experiments/ (a package's
    __init__ runs with any of its modules, so it is left out)."""
    importers: dict[str, set[str]] = {name: set() for name, path in _modules("common").items()
                                      if path.name != "__init__.py"}
    for package in PACKAGES:
        for name, path in _modules(package).items():
            for imported in _imports(path, top_level_only=False) & set(importers) - {name}:
                importers[imported].add(package)
    driver_only = sorted(name for name, packages in importers.items() if packages <= {"experiments"})
    assert not driver_only, f"used by experiments/ alone (or unused): {driver_only}"


def test_the_framework_packages_never_import_each_other():
    for package, other in (("torch_impl", "jax_impl"), ("jax_impl", "torch_impl")):
        for name, path in _modules(package).items():
            assert other not in _roots(_imports(path, top_level_only=False)), name
            assert "experiments" not in _roots(_imports(path, top_level_only=False)), name


def test_experiments_has_no_import_cycle_and_only_main_imports_commands():
    modules = _modules("experiments")
    # every import, function-local ones included: a cycle hidden inside a function is still a cycle
    graph = {name: {m for m in _imports(path, top_level_only=False) if m in modules and m != name}
             for name, path in modules.items()}
    for name, targets in graph.items():
        if not name.startswith(("experiments.__main__", "experiments.commands")):
            assert not any(t.startswith("experiments.commands") for t in targets), name
    state: dict[str, str] = {}

    def visit(node: str, trail: list[str]) -> None:
        if state.get(node) == "done":
            return
        assert state.get(node) != "open", "import cycle: " + " -> ".join([*trail, node])
        state[node] = "open"
        for target in graph[node]:
            visit(target, [*trail, node])
        state[node] = "done"

    for node in graph:
        visit(node, [])
