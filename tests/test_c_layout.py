"""The C engine's files: the map in _core.h, the unit _one_unit.c, setup.py's
sources, a map at the top of every C file, and each part compiled alone.

The engine's parts each compile on their own against _core.h (which
declares all they share) and in any order; _one_unit.c #includes every part
as one compilation unit, setup.py's default build (PYTREE_KIT_C_UNITS=one),
or setup.py compiles them as objects of their own (=separate, =lto). setup.py
lists every part as a depends (so that an sdist carries them and a change to
one rebuilds the extension). These tests keep the map, the unit and the
build in step, and compile each part alone with this Python's headers.
"""

from __future__ import annotations

import ast
import re
import shutil
import subprocess
import sys
import sysconfig
from pathlib import Path

import pytest

# About the repository's files: once, in one job; but each part is compiled
# alone with every Python's headers (the fast paths' gates differ by version).
once = pytest.mark.once

# compiles the C engine's files: the same whichever engine the public API uses,
# so the pure-engine jobs leave it out (scripts/ci.py)
pytestmark = pytest.mark.side_by_side

ROOT = Path(__file__).resolve().parents[1]
PKG = ROOT / "pytree_kit"


def mapped_parts() -> list[str]:
    """The parts _core.h's map names, in its order (its lines '  _name.c  ...')."""
    text = (PKG / "_core.h").read_text()
    block = text[: text.index("*/")]
    return re.findall(r"^ \*   (_\w+\.c)\s", block, re.MULTILINE)


def included_parts() -> list[str]:
    """The parts _one_unit.c #includes, in its order."""
    text = (PKG / "_one_unit.c").read_text()
    return re.findall(r'^#include "(_\w+\.c)"', text, re.MULTILINE)


def setup_constant(name: str) -> list[str]:
    """A list of names setup.py assigns at its top level (ENGINE_PARTS, ...)."""
    tree = ast.parse((ROOT / "setup.py").read_text())
    for node in tree.body:
        if isinstance(node, ast.Assign) and getattr(node.targets[0], "id", None) == name:
            return list(ast.literal_eval(node.value))
    raise AssertionError(f"setup.py has no {name} = [...]")


def depends() -> list[str]:
    """setup.py's Extension(depends=[...]), as file names (parts by their
    ENGINE_PARTS names)."""
    tree = ast.parse((ROOT / "setup.py").read_text())
    for node in ast.walk(tree):
        if isinstance(node, ast.Call) and getattr(node.func, "id", None) == "Extension":
            for k in node.keywords:
                if k.arg == "depends":
                    listed = [e for e in k.value.elts if isinstance(e, ast.Constant)]
                    return [Path(e.value).name for e in listed] + [
                        f"{n}.c" for n in setup_constant("ENGINE_PARTS")
                    ]
    raise AssertionError("setup.py has no Extension(depends=...)")


@once
def test_the_unit_includes_every_mapped_part_and_only_those():
    mapped = mapped_parts()
    assert len(mapped) >= 8, mapped
    assert mapped[-1] == "_speedups.c"  # the module, last in the map
    assert sorted(included_parts()) == sorted(mapped)
    assert [f"{n}.c" for n in setup_constant("ENGINE_PARTS")] == mapped


@once
def test_every_part_exists_and_no_c_file_is_unaccounted_for():
    parts = included_parts()
    others = [f"{n}.c" for n in setup_constant("OTHER_SOURCES")]
    for name in parts:
        assert (PKG / name).is_file(), name
        assert name in depends(), f"setup.py's depends lacks {name}"
    on_disk = {p.name for p in PKG.glob("*.c")}
    assert on_disk == {*parts, *others, "_one_unit.c"}, on_disk
    for header in PKG.glob("*.h"):
        assert header.name in depends(), f"setup.py's depends lacks {header.name}"


def _compiler() -> list[str]:
    cc = sysconfig.get_config_var("CC") or ""
    if not cc or shutil.which(cc.split()[0]) is None:
        pytest.skip("no C compiler")
    return cc.split()


#: whether this Python is a free-threaded build (its headers define Py_GIL_DISABLED)
FREE_THREADED = bool(sysconfig.get_config_var("Py_GIL_DISABLED"))


@pytest.mark.parametrize("gil_disabled", [False, True], ids=["headers", "free-threaded"])
@pytest.mark.parametrize("part", [*mapped_parts(), "_one_unit.c"])
def test_each_part_compiles_alone(part: str, gil_disabled: bool, tmp_path: Path) -> None:
    """A part compiled on its own, against _core.h and nothing of another
    part, with every warning an error; _one_unit.c with the parts in the
    opposite order too (no part depends on the order of the others).

    ``free-threaded``: the same with ``Py_GIL_DISABLED`` defined, as a
    free-threaded build of this version compiles it (its object layouts,
    critical sections, ``PyMutex``, ``Py_mod_gil``), from 3.13 on, so that a
    misuse of the free-threaded API fails on a Python that has no such build
    here (3.14t, 3.15t); on a free-threaded build, its own headers do that."""
    if gil_disabled and (sys.version_info < (3, 13) or FREE_THREADED):
        pytest.skip("free-threaded builds are from 3.13; this one's headers define it already")
    flags = ["-c", "-fPIC", "-O1", "-Wall", "-Werror", f"-I{sysconfig.get_paths()['include']}"]
    if gil_disabled:
        flags.append("-DPy_GIL_DISABLED=1")
    source = PKG / part
    if part == "_one_unit.c":
        source = tmp_path / "reversed.c"
        source.write_text(
            "#define PK_ONE_UNIT 1\n"
            + "".join(f'#include "{p}"\n' for p in reversed(included_parts()))
        )
        flags.append(f"-I{PKG}")
    done = subprocess.run(
        [*_compiler(), *flags, str(source), "-o", str(tmp_path / "part.o")],
        capture_output=True,
        text=True,
    )
    assert done.returncode == 0, done.stderr[-3000:]


@once
@pytest.mark.parametrize("path", sorted(PKG.glob("*.[ch]")), ids=lambda p: p.name)
def test_every_c_file_opens_with_its_map(path):
    """A comment of a few lines first, saying what the file does; an engine
    part's also says what it calls."""
    text = path.read_text()
    assert text.startswith("/* "), path.name
    first = text[: text.index("*/")]
    assert len(first.splitlines()) >= 3, f"{path.name}: a one-line opening is not a map"
    if path.name in included_parts() and path.name != "_speedups.c":
        assert first.startswith(f"/* {path.name}: "), path.name
        assert "\n * Calls: " in first, f"{path.name}'s map does not say what it calls"
