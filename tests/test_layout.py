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


def _imports(path: Path, type_checking: bool = True) -> set[str]:
    """Every module ``path`` imports, function-local imports included (a dependency hidden inside a function is
    still one); ``type_checking=False`` leaves out those under ``if TYPE_CHECKING:``, which never run."""
    names: set[str] = set()
    for node in _walk(ast.parse(path.read_text()), type_checking):
        if isinstance(node, ast.Import):
            names |= {alias.name for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names.add(node.module)
            names |= {f"{node.module}.{alias.name}" for alias in node.names}
    return names


def _walk(node: ast.AST, type_checking: bool) -> list[ast.AST]:
    if not type_checking and isinstance(node, ast.If) and ast.unparse(node.test) == "TYPE_CHECKING":
        return []
    return [node] + [n for child in ast.iter_child_nodes(node) for n in _walk(child, type_checking)]


def _modules(package: str) -> dict[str, Path]:
    return {_module_name(p): p for p in (ROOT / package).rglob("*.py")}


def _roots(names: set[str]) -> set[str]:
    return {name.split(".")[0] for name in names}


def test_common_imports_no_framework_and_no_driver():
    for name, path in _modules("common").items():
        assert not _roots(_imports(path)) & {"torch", "jax", "flax", "optax", "torch_impl",
                                                                      "jax_impl", "experiments"}, name


def test_common_holds_only_what_more_than_the_driver_uses():
    """A common/ module imported by experiments/ alone (or by nothing) belongs under experiments/ (a package's
    __init__ runs with any of its modules, so it is left out)."""
    importers: dict[str, set[str]] = {name: set() for name, path in _modules("common").items()
                                      if path.name != "__init__.py"}
    for package in PACKAGES:
        for name, path in _modules(package).items():
            for imported in _imports(path) & set(importers) - {name}:
                importers[imported].add(package)
    driver_only = sorted(name for name, packages in importers.items() if packages <= {"experiments"})
    assert not driver_only, f"used by experiments/ alone (or unused): {driver_only}"


def test_the_framework_packages_never_import_each_other():
    for package, other in (("torch_impl", "jax_impl"), ("jax_impl", "torch_impl")):
        for name, path in _modules(package).items():
            assert other not in _roots(_imports(path)), name
            assert "experiments" not in _roots(_imports(path)), name


def _graph(package: str) -> dict[str, set[str]]:
    """Module -> the modules of ``package`` it imports when it runs (a module's own packages left out: Python runs a
    package's __init__ before any module in it, so that is no cycle)."""
    modules = _modules(package)
    return {name: {m for m in _imports(path, type_checking=False) if m in modules and not name.startswith(m + ".")}
            - {name} for name, path in modules.items()}


def _assert_acyclic(graph: dict[str, set[str]]) -> None:
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


def test_experiments_has_no_import_cycle_and_only_main_imports_commands():
    graph = _graph("experiments")
    for name, targets in graph.items():
        if not name.startswith(("experiments.__main__", "experiments.commands")):
            assert not any(t.startswith("experiments.commands") for t in targets), name
    _assert_acyclic(graph)


def test_common_has_no_import_cycle_and_workloads_only_read_a_configs_fields():
    """config.py validates through workloads.py; workloads.py reads the fields of the config it is handed and calls
    nothing back in config.py (a RunConfig property or method), so the two never call each other in a cycle."""
    _assert_acyclic(_graph("common"))
    config = ast.parse((ROOT / "common" / "config.py").read_text())
    run_config = next(n for n in config.body if isinstance(n, ast.ClassDef) and n.name == "RunConfig")
    names = {n.target.id for n in run_config.body if isinstance(n, ast.AnnAssign) and isinstance(n.target, ast.Name)}
    read = {n.attr for n in ast.walk(ast.parse((ROOT / "common" / "workloads.py").read_text()))
            if isinstance(n, ast.Attribute) and isinstance(n.value, ast.Name) and n.value.id == "config"}
    assert read <= names, f"workloads.py calls back into RunConfig: {sorted(read - names)}"
