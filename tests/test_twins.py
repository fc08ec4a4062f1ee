"""The twin rule beyond the Backend Protocol (tests/test_loop.py): torch_impl/ and jax_impl/ hold the same files, and
the mirrored modules expose the same public functions and classes, with the same parameters in the same order (a
class: the same public methods, each with the same parameters). Read from the source (ast), so neither framework is
imported; that neither package imports the other is tests/test_layout.py's."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SIDES = ("torch_impl", "jax_impl")
MIRRORED = ("train", "inference", "parallel", "pipeline", "techniques")
# A file only one side needs, with why.
ONLY_ONE_SIDE = {
    # JAX's SPMD meshes and named axes (data parallel's, the pipeline's): torch's replicas and stages are processes
    # (torch.distributed), with no mesh to lay arrays out on
    "jax_impl/mesh.py",
}


def _parameters(function: ast.FunctionDef | ast.AsyncFunctionDef) -> list[str]:
    arguments = function.args
    names = [a.arg for a in arguments.posonlyargs + arguments.args + arguments.kwonlyargs]
    if arguments.vararg:
        names.append("*" + arguments.vararg.arg)
    if arguments.kwarg:
        names.append("**" + arguments.kwarg.arg)
    return names


def public_surface(path: Path) -> dict[str, object]:
    """Each public module-level function's parameter names; each public class's public methods' parameter names."""
    surface: dict[str, object] = {}
    for node in ast.parse(path.read_text()).body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)) and node.name.startswith("_"):
            continue
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            surface[node.name] = _parameters(node)
        elif isinstance(node, ast.ClassDef):
            surface[node.name] = {member.name: _parameters(member) for member in node.body
                                  if isinstance(member, (ast.FunctionDef, ast.AsyncFunctionDef))
                                  and not member.name.startswith("_")}
    return surface


def differences(torch_path: Path, jax_path: Path) -> list[str]:
    torch_side, jax_side = public_surface(torch_path), public_surface(jax_path)
    found = []
    for name in sorted(set(torch_side) | set(jax_side)):
        if name not in jax_side:
            found.append(f"{name}: only in torch")
        elif name not in torch_side:
            found.append(f"{name}: only in jax")
        elif torch_side[name] != jax_side[name]:
            found.append(f"{name}: torch {torch_side[name]} != jax {jax_side[name]}")
    return found


@pytest.mark.parametrize("module", MIRRORED)
def test_mirrored_modules_have_the_same_public_names_and_signatures(module):
    found = differences(ROOT / "torch_impl" / f"{module}.py", ROOT / "jax_impl" / f"{module}.py")
    assert not found, f"{module}.py differs between the twins:\n" + "\n".join(found)


def test_both_sides_hold_the_same_files():
    files = {side: {p.relative_to(ROOT / side).as_posix() for p in (ROOT / side).rglob("*.py")} for side in SIDES}
    only = {f"{side}/{name}" for side in SIDES for name in files[side] - files[SIDES[1 - SIDES.index(side)]]}
    assert only == ONLY_ONE_SIDE, f"unexpected: {sorted(only - ONLY_ONE_SIDE)}; gone: {sorted(ONLY_ONE_SIDE - only)}"


def test_the_check_sees_a_difference(tmp_path):
    """The comparison itself: a renamed parameter, a missing function, a method only one side has."""
    (tmp_path / "a.py").write_text("def f(config, model): ...\ndef g(): ...\nclass C:\n    def m(self, x): ...\n")
    (tmp_path / "b.py").write_text("def f(config, module): ...\nclass C:\n    def m(self, x): ...\n"
                                   "    def n(self): ...\ndef _private(x): ...\n")
    assert differences(tmp_path / "a.py", tmp_path / "b.py") == [
        "C: torch {'m': ['self', 'x']} != jax {'m': ['self', 'x'], 'n': ['self']}",
        "f: torch ['config', 'model'] != jax ['config', 'module']",
        "g: only in torch",
    ]

