"""The C engine's files: the map in _core.h, the unit _speedups.c includes,
setup.py's sources, and a map at the top of every C file.

The engine is one compilation unit: _speedups.c #includes its parts, in the
order _core.h's map lists them, and setup.py lists the parts as depends (so
that an sdist carries them and a change to one rebuilds the extension) and
never as sources (compiled on their own, each would be a second copy of the
engine). These tests keep the map, the includes and the build in step.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

pytestmark = pytest.mark.once  # about the repository's files, not an engine

ROOT = Path(__file__).resolve().parents[1]
PKG = ROOT / "pytree_kit"


def mapped_parts() -> list[str]:
    """The parts _core.h's map names, in its order (its lines '  _name.c  ...')."""
    text = (PKG / "_core.h").read_text()
    block = text[: text.index("*/")]
    return re.findall(r"^ \*   (_\w+\.c)\s", block, re.MULTILINE)


def included_parts() -> list[str]:
    text = (PKG / "_speedups.c").read_text()
    return re.findall(r'^#include "(_\w+\.c)"', text, re.MULTILINE)


def extension_lists() -> tuple[list[str], list[str]]:
    """setup.py's Extension(sources=[...], depends=[...]), as file names."""
    tree = ast.parse((ROOT / "setup.py").read_text())
    for node in ast.walk(tree):
        if isinstance(node, ast.Call) and getattr(node.func, "id", None) == "Extension":
            found = {
                k.arg: ast.literal_eval(k.value)
                for k in node.keywords
                if k.arg in ("sources", "depends")
            }
            return (
                [Path(p).name for p in found["sources"]],
                [Path(p).name for p in found["depends"]],
            )
    raise AssertionError("setup.py has no Extension(...)")


def test_speedups_includes_the_mapped_parts_in_order():
    mapped = mapped_parts()
    assert len(mapped) >= 7, mapped
    # the map ends with _speedups.c itself, which includes the rest
    assert mapped[-1] == "_speedups.c"
    assert included_parts() == mapped[:-1]


def test_every_part_exists_and_no_c_file_is_unaccounted_for():
    sources, depends = extension_lists()
    parts = included_parts()
    for name in parts:
        assert (PKG / name).is_file(), name
        assert name in depends, f"setup.py's depends lacks {name}"
        assert name not in sources, f"{name} is #included by _speedups.c: not a source of its own"
    on_disk = {p.name for p in PKG.glob("*.c")}
    assert on_disk == set(sources) | set(parts), on_disk ^ (set(sources) | set(parts))
    for header in PKG.glob("*.h"):
        assert header.name in depends, f"setup.py's depends lacks {header.name}"


@pytest.mark.parametrize("path", sorted(PKG.glob("*.[ch]")), ids=lambda p: p.name)
def test_every_c_file_opens_with_its_map(path):
    """A comment of a few lines first, saying what the file does; an engine
    part's also says what it calls."""
    text = path.read_text()
    assert text.startswith("/* "), path.name
    first = text[: text.index("*/")]
    assert len(first.splitlines()) >= 3, f"{path.name}: a one-line opening is not a map"
    if path.name in included_parts():
        assert first.startswith(f"/* {path.name}: "), path.name
        assert "\n * Calls: " in first, f"{path.name}'s map does not say what it calls"
