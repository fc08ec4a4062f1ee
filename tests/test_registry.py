"""What differs by family lives in the family's description and each framework's registry, read from the source:
no file of torch_impl/ or jax_impl/ tests for a family by name (a dict key of the registry is a lookup, not a test),
the ViT and the text encoder are one description and one builder per framework with no block of six lines repeated
among them, and a registry builds what is registered and names what is not."""

from __future__ import annotations

import ast
import io
import keyword
import tokenize
from dataclasses import dataclass
from pathlib import Path

import pytest

from common.errors import UnknownFamily
from common.model_options import ModelOptions
from common.registry import Registry
from common.workloads import WORKLOADS

ROOT = Path(__file__).resolve().parents[1]
FRAMEWORKS = ("torch_impl", "jax_impl")
WINDOW = 6  # lines: the "block of six or more lines"


def family_tests(source: str, families: set[str]) -> list[str]:
    """Each place ``source`` names a family or reads ``.family``, as 'line: code', but for the keys of the registry
    (the dict literal handed to ``Registry``)."""
    tree = ast.parse(source)
    registry_keys = {id(key) for node in ast.walk(tree) if isinstance(node, ast.Call)
                     and isinstance(node.func, ast.Name) and node.func.id == "Registry"
                     for arg in node.args if isinstance(arg, ast.Dict) for key in arg.keys}
    found = []
    for node in ast.walk(tree):
        named = isinstance(node, ast.Constant) and node.value in families and id(node) not in registry_keys
        if named or (isinstance(node, ast.Attribute) and node.attr == "family"):
            found.append(f"{node.lineno}: {ast.get_source_segment(source, node)}")
    return found


def test_the_finder_finds_a_family_test_and_passes_a_registry_key():
    families = {"vit", "text"}
    assert family_tests('if arch.family == "vit":\n    pass\n', families) == ['1: arch.family', '1: "vit"']
    assert family_tests('x = "text" if masked else "images"\n', families) == ['1: "text"']
    assert family_tests('MODELS = Registry("torch", {"vit": f, "text": f})\n', families) == []


@pytest.mark.parametrize("package", FRAMEWORKS)
def test_no_family_name_is_tested_in_a_framework_package(package):
    families = set(WORKLOADS)
    found = {str(path.relative_to(ROOT)): hits for path in sorted((ROOT / package).rglob("*.py"))
             if (hits := family_tests(path.read_text(), families))}
    assert not found, f"a family tested by name (make it a property of the description): {found}"


def _shapes(path: Path) -> list[tuple[int, tuple[str, ...]]]:
    """(first line, shape) of each logical line of code: a name is N, a string S, a number 0, keywords and operators
    themselves; comments, blank lines and imports left out. Two blocks of the same shape are the same code with other
    names or values."""
    shapes, current, start = [], [], 0
    for tok in tokenize.generate_tokens(io.StringIO(path.read_text()).readline):
        if tok.type == tokenize.NEWLINE:
            if current and current[0] not in ("import", "from"):
                shapes.append((start, tuple(current)))
            current = []
        elif tok.type in (tokenize.COMMENT, tokenize.NL, tokenize.INDENT, tokenize.DEDENT, tokenize.ENDMARKER):
            continue
        else:
            start = start if current else tok.start[0]
            if tok.type == tokenize.NAME and not keyword.iskeyword(tok.string):
                current.append("N")
            else:
                current.append({tokenize.STRING: "S", tokenize.NUMBER: "0"}.get(tok.type, tok.string))
    return shapes


def repeated_blocks(paths: list[Path], root: Path = ROOT, window: int = WINDOW) -> list[tuple[str, str]]:
    """Pairs of places ('file:line') where ``window`` consecutive lines of code have the same shape."""
    first: dict[tuple[tuple[str, ...], ...], str] = {}
    pairs = []
    for path in paths:
        shapes = _shapes(path)
        for index in range(len(shapes) - window + 1):
            block = tuple(shape for _, shape in shapes[index:index + window])
            place = f"{path.relative_to(root)}:{shapes[index][0]}"
            if block in first:
                pairs.append((first[block], place))
            else:
                first[block] = place
    return pairs


def test_the_repeat_finder_finds_a_renamed_block(tmp_path):
    block = "def f(a, b):\n    c = a + 1\n    d = b * 2\n    e = c - d\n    g = e ** 2\n    return g\n"
    renamed = block.replace("f(", "h(").replace("a", "x").replace("1", "7")
    (tmp_path / "one.py").write_text(block + "\n\n" + renamed)
    (tmp_path / "two.py").write_text(block.replace("+", "-"))
    assert repeated_blocks([tmp_path / "one.py"], tmp_path) == [("one.py:1", "one.py:9")]
    assert repeated_blocks([tmp_path / "two.py"], tmp_path) == []


@pytest.mark.parametrize("package", ("common", *FRAMEWORKS))
def test_the_vit_and_the_text_encoder_repeat_no_block(package):
    """Every encoder file of a package (its description, its builder, and any file the text encoder had apart):
    no block of six lines of the same shape stands twice among them."""
    names = ("arch_encoder.py", "arch_vit.py", "arch_text.py", "transformer.py", "text.py")
    paths = [path for name in names if (path := ROOT / package / name).exists()]
    assert paths, f"no encoder file in {package}"
    assert repeated_blocks(paths) == []


@dataclass(frozen=True)
class Described:
    name: str = "tiny"
    family: str = "planted"


def test_a_registry_builds_the_registered_family_and_names_an_unknown_one():
    registry = Registry("torch", {"planted": lambda arch, options: (arch.name, options.attention)})
    assert registry.build(Described(), ModelOptions(attention="naive")) == ("tiny", "naive")
    with pytest.raises(UnknownFamily, match="no torch model is registered for the family 'other' .*known: planted"):
        registry.build(Described(family="other"), ModelOptions())
    registry.register("other", lambda arch, options: arch.family)
    assert registry.build(Described(family="other"), ModelOptions()) == "other"
