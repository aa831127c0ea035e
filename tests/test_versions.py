"""What each supported Python gets: the engine, why, and the C engine's fast paths.

The fast paths that read CPython's own layouts are compiled only for the
versions they were validated on and checked on import (the gates are in
pytree_kit/_core.h, the reads and their checks in pytree_kit/_fast_*.c, a file each).
These tests pin down which are on for each version, so that a path that
silently turns off (as the class memo did on 3.13, when CPython stopped
setting Py_TPFLAGS_VALID_VERSION_TAG) fails here rather than only showing up
as a slower benchmark. A build with PYTREE_KIT_NO_FAST_PATHS=1 has
none, and runs the same suite.
"""

from __future__ import annotations

import dataclasses
import os
import re
import subprocess
import sys
import sysconfig
import textwrap
from pathlib import Path
from typing import Any

import pytest

import pytree_kit as pk
from pytree_kit import _engine

ROOT = Path(__file__).resolve().parent.parent
C = pk.ENGINE == "c"
needs_c = pytest.mark.skipif(not C, reason="the C engine is not active")


def expected_fast_paths() -> dict[str, bool]:
    """The fast paths that must be on here (in the C engine's build)."""
    from pytree_kit import _speedups

    v = sys.version_info[:2]
    on = bool(_speedups.VALIDATED_PYTHON) and not _speedups.NO_FAST_PATHS
    # a free-threaded build reads no caller's layout; 3.13t copies its own
    # templates' tables (dict_tables), which no other thread sees being made
    free_threaded = bool(sysconfig.get_config_var("Py_GIL_DISABLED"))
    tables_ft = free_threaded and v == (3, 13) and not _speedups.NO_FAST_PATHS
    return {
        "type_version_tags": on and v <= (3, 11),  # 3.12 on: PyUnstable_Type_AssignVersionTag
        "dict_reads": on,
        "dict_tables": on or tables_ft,
        "split_values": on,  # 3.11: for an instance whose __dict__ was made
        "odict_links": on,
    }


def plans_kept_across_calls() -> bool:
    """Whether the C engine keeps class plans from one call to the next here:
    from 3.12 through the public PyUnstable_Type_AssignVersionTag, on 3.10 and
    3.11 through the type_version_tags fast path."""

    return sys.version_info >= (3, 12) or expected_fast_paths()["type_version_tags"]


@needs_c
def test_class_plans_are_kept_across_calls_where_tags_are_read() -> None:
    from pytree_kit import _speedups

    assert bool(_speedups.PLANS_KEPT) == plans_kept_across_calls()
    assert pk.engine_info()["plans_kept"] == plans_kept_across_calls()


@needs_c
def test_fast_paths_are_on_where_they_were_validated() -> None:
    from pytree_kit import _speedups

    assert _speedups.FAST_PATHS == expected_fast_paths()
    assert pk.engine_info()["fast_paths"] == expected_fast_paths()
    assert bool(_speedups.DICT_TABLES) == expected_fast_paths()["dict_tables"]


def _docs_fast_path_table() -> tuple[list[str], dict[str, set[str]]]:
    """docs/reliability.md's table of fast paths: its versions, and for each
    version the paths marked on (✓)."""
    lines = (ROOT / "docs" / "reliability.md").read_text(encoding="utf-8").splitlines()
    (head,) = [
        i for i, line in enumerate(lines) if line.startswith("| fast path | what it reads |")
    ]
    versions = [c.strip() for c in lines[head].strip("|").split("|")][2:]
    versions = versions[: next(i for i, c in enumerate(versions) if not c.startswith("3."))]
    on: dict[str, set[str]] = {v: set() for v in versions}
    rows = []
    for line in lines[head + 2 :]:
        if not line.startswith("| `"):
            break
        cells = [c.strip() for c in line.strip("|").split("|")]
        rows.append(cells[0].strip("`"))
        for v, cell in zip(versions, cells[2 : 2 + len(versions)]):
            assert cell in ("", "✓"), (rows[-1], v, cell)
            if cell:
                on[v].add(rows[-1])
    on["rows"] = set(rows)
    return versions, on


@needs_c
def test_the_docs_table_of_fast_paths_says_what_this_python_has(ci: Any) -> None:
    """docs/reliability.md has a column per supported Python, a row per fast
    path, and this Python's column marks those on here (none from 3.14)."""
    from pytree_kit import _speedups

    versions, on = _docs_fast_path_table()
    assert tuple(versions) == ci.VERSIONS
    assert on["rows"] == set(expected_fast_paths())
    if _speedups.NO_FAST_PATHS:
        pytest.skip("a build without the fast paths: the table is of the release build")
    if sysconfig.get_config_var("Py_GIL_DISABLED"):
        # the columns are of the builds with the GIL; the free-threaded ones
        # are named in the line below the table that starts with their version
        here = "{}.{}t".format(*sys.version_info[:2])
        text = (ROOT / "docs" / "reliability.md").read_text(encoding="utf-8")
        (line,) = [x for x in text.splitlines() if x.startswith(f"On {here}")]
        named = set(re.findall(r"`([a-z_]+)`", line)) & on["rows"]
        assert named == {name for name, yes in expected_fast_paths().items() if yes}
        assert named == {name for name, yes in _speedups.FAST_PATHS.items() if yes}
        return
    here = "{}.{}".format(*sys.version_info[:2])
    assert on[here] == {name for name, yes in expected_fast_paths().items() if yes}


@needs_c
def test_the_engine_and_python_agree_on_the_validated_versions() -> None:
    from pytree_kit import _speedups

    assert pk.engine_info()["validated_python"] == bool(_speedups.VALIDATED_PYTHON)
    assert _engine.VALIDATED_PYTHONS == ((3, 10), (3, 15))


@needs_c
def test_no_fast_paths_build_is_what_the_environment_asked_for() -> None:
    # the CI job that builds with PYTREE_KIT_NO_FAST_PATHS=1 sets it for the run too
    from pytree_kit import _speedups

    asked = os.environ.get("PYTREE_KIT_NO_FAST_PATHS", "") not in ("", "0")
    assert bool(_speedups.NO_FAST_PATHS) == asked
    assert pk.engine_info()["no_fast_paths"] == asked


@dataclasses.dataclass
class _Memo:
    a: object
    b: object


@needs_c
def test_a_class_met_again_unchanged_is_not_read_again() -> None:
    from pytree_kit import _speedups

    tree = [_Memo(1, {"x": _Memo(2, 3)}), _Memo(4, 5)]
    pk.flatten(tree)
    before = _speedups._plans_made()
    leaves, spec = pk.flatten(tree)
    again = _speedups._plans_made() - before
    if plans_kept_across_calls():
        assert again == 0
    else:  # the one class is worked out again in each call, once for its 3 instances
        assert again == 1
    assert leaves == [1, 2, 3, 4, 5]
    # a changed class is read again, and what changed is seen
    _Memo.__tree_flatten__ = lambda self: ([self.a], None)  # type: ignore[attr-defined]
    _Memo.__tree_unflatten__ = classmethod(lambda cls, aux, ch: cls(ch[0], None))  # type: ignore[attr-defined]
    try:
        before = _speedups._plans_made()
        assert pk.leaves(tree) == [1, 4]  # each one's first field only
        assert _speedups._plans_made() > before
    finally:
        del _Memo.__tree_flatten__, _Memo.__tree_unflatten__  # type: ignore[attr-defined]
    assert pk.leaves(tree) == [1, 2, 3, 4, 5]


def test_engine_info_tells_the_truth() -> None:
    info = pk.engine_info()
    assert info["engine"] == pk.ENGINE
    assert info["python"] == ".".join(map(str, sys.version_info[:3]))
    assert info["pytree_kit"] == pk.__version__
    if C:
        from pytree_kit import _speedups

        assert info["extension"] == _speedups.__file__
        assert info["reason"].startswith("the C extension is built and imported")
    else:
        assert info["extension"] is None
        assert not any(info["fast_paths"].values())
    if os.environ.get("PYTREE_KIT_PURE", "") not in ("", "0"):
        assert info["engine"] == "python" and "PYTREE_KIT_PURE" in info["reason"]


def _info_in_child(code: str = "", **env: str) -> dict:
    script = textwrap.dedent(code) + "import pytree_kit as pk\nprint(repr(pk.engine_info()))\n"
    full = {k: v for k, v in os.environ.items() if k != "PYTREE_KIT_PURE"}
    full.update(env)
    out = subprocess.run(
        [sys.executable, "-c", script], env=full, capture_output=True, text=True, timeout=120
    )
    assert out.returncode == 0, out.stderr
    return eval(out.stdout)  # a dict of str, bool, None


def test_engine_info_says_why_the_pure_engine_runs() -> None:
    info = _info_in_child(PYTREE_KIT_PURE="1")
    assert info["engine"] == "python" and info["reason"] == "PYTREE_KIT_PURE=1 is set"
    assert info["extension"] is None


_BLOCKER = """
    import sys
    class Blocker:
        def find_spec(self, name, path=None, target=None):
            if name == "pytree_kit._speedups":
                raise {error}
    sys.meta_path.insert(0, Blocker())
"""


def test_engine_info_says_when_the_extension_is_missing() -> None:
    # what a user gets when the install could not compile the C engine
    missing = "ModuleNotFoundError('No module named x', name='pytree_kit._speedups')"
    info = _info_in_child(_BLOCKER.format(error=missing))
    assert info["engine"] == "python"
    assert (
        info["reason"]
        == "the C extension is not installed (it was not built: no C compiler at install time, or not CPython)"
    )


def test_engine_info_says_why_an_extension_did_not_load() -> None:
    broken = "ImportError('undefined symbol: PyFoo')"
    info = _info_in_child(_BLOCKER.format(error=broken))
    assert info["engine"] == "python"
    assert info["reason"] == "the C extension could not be imported (undefined symbol: PyFoo)"


# An extension module pytree_kit._speedups whose init raises, as the C engine's
# did on 3.14 before it knew dict's __getattribute__ was object's there
_RAISING_INIT = r"""
#include <Python.h>
PyMODINIT_FUNC
PyInit__speedups(void)
{
    PyErr_SetString(PyExc_RuntimeError, "dict has no __getattribute__");
    return NULL;
}
"""

# runs in a child, the package first on sys.path: it imports pytree_kit with
# every warning recorded, and says what it got
_IMPORT_AND_REPORT = """
    import sys, warnings
    sys.path.insert(0, {where!r})
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        import pytree_kit as pk
    print(repr({{
        "file": pk.__file__,
        "engine": pk.ENGINE,
        "reason": pk.engine_info()["reason"],
        "leaves": pk.leaves({{"a": [1, (2, None)], "b": 3}}),
        "warnings": [(w.category.__name__, str(w.message)) for w in caught],
    }}))
"""


def _import_in_child(code: str) -> dict:
    full = {k: v for k, v in os.environ.items() if k != "PYTREE_KIT_PURE"}
    out = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code)],
        env=full,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert out.returncode == 0, out.stderr
    return eval(out.stdout)  # a dict of str, list, tuple


def _assert_fell_back(got: dict, error: str) -> None:
    assert got["engine"] == "python"
    assert error in got["reason"], got["reason"]
    assert got["leaves"] == [1, 2, 3]
    warned = [m for c, m in got["warnings"] if c == "RuntimeWarning" and error in m]
    assert len(warned) == 1, got["warnings"]
    assert "pure-Python engine" in warned[0]


def test_an_extension_whose_init_raises_leaves_the_pure_engine(tmp_path) -> None:
    """A real extension module _speedups whose init raises RuntimeError, in a
    copy of the package: the import succeeds, on the pure engine, with a
    RuntimeWarning naming the error, which engine_info() records."""
    import shutil
    import sysconfig

    cc = (sysconfig.get_config_var("CC") or "cc").split()
    if shutil.which(cc[0]) is None:
        pytest.skip(f"no C compiler ({cc[0]})")
    package = Path(pk.__file__).resolve().parent
    copy = tmp_path / "pytree_kit"
    shutil.copytree(package, copy, ignore=shutil.ignore_patterns("*.so", "*.pyd", "__pycache__"))
    source = tmp_path / "raising.c"
    source.write_text(_RAISING_INIT)
    ext = copy / ("_speedups" + sysconfig.get_config_var("EXT_SUFFIX"))
    include = sysconfig.get_path("include")
    made = subprocess.run(
        [*cc, "-shared", "-fPIC", f"-I{include}", str(source), "-o", str(ext)],
        capture_output=True,
        text=True,
    )
    if made.returncode != 0:
        pytest.skip(f"the test extension does not build here: {made.stderr[-500:]}")
    got = _import_in_child(_IMPORT_AND_REPORT.format(where=str(tmp_path)))
    assert Path(got["file"]).resolve().parent == copy.resolve()
    _assert_fell_back(got, "RuntimeError: dict has no __getattribute__")


_RAISING_LOADER = """
    import importlib.abc, importlib.util, sys
    class Raising(importlib.abc.MetaPathFinder, importlib.abc.Loader):
        def find_spec(self, name, path=None, target=None):
            if name == "pytree_kit._speedups":
                return importlib.util.spec_from_loader(name, self)
        def create_module(self, spec):
            return None
        def exec_module(self, module):
            raise {error}
    sys.meta_path.insert(0, Raising())
"""


@pytest.mark.parametrize(
    "error, named",
    [
        (
            "RuntimeError('dict has no __getattribute__')",
            "RuntimeError: dict has no __getattribute__",
        ),
        ("SystemError('a new Python')", "SystemError: a new Python"),
        ("ImportError('undefined symbol: PyFoo')", "undefined symbol: PyFoo"),
    ],
)
def test_any_error_loading_the_extension_leaves_the_pure_engine(error: str, named: str) -> None:
    code = _RAISING_LOADER.format(error=error) + _IMPORT_AND_REPORT.format(where="")
    got = _import_in_child(code)
    _assert_fell_back(got, named)


def test_a_missing_extension_is_no_warning() -> None:
    """The pure install (no compiler at install time) said so when installed;
    importing it warns of nothing."""
    missing = "ModuleNotFoundError('No module named x', name='pytree_kit._speedups')"
    code = _BLOCKER.format(error=missing) + _IMPORT_AND_REPORT.format(where="")
    got = _import_in_child(code)
    assert got["engine"] == "python" and got["warnings"] == []


@needs_c
def test_engine_info_with_pure_0_asks_for_the_c_engine() -> None:
    info = _info_in_child(PYTREE_KIT_PURE="0")
    assert info["engine"] == "c" and info["reason"].endswith("(PYTREE_KIT_PURE=0)")


def test_the_c_kinds_are_those_of_kinds_py() -> None:
    """The C engine's kinds enum (pytree_kit/_speedups.h) names the same
    numbers as _kinds.py, every kind and no other."""
    import re
    from pathlib import Path

    from pytree_kit import _kinds

    header = (Path(__file__).resolve().parents[1] / "pytree_kit" / "_speedups.h").read_text()
    body = re.search(r"enum \{([^}]*K_LEAF[^}]*)\}", header)
    assert body is not None
    in_c = {m[0]: int(m[1]) for m in re.findall(r"K_(\w+) = (\d+)", body.group(1))}
    assert in_c.pop("COUNT") == len(_kinds.KIND_NAMES)
    in_py = {name.upper(): getattr(_kinds, name.upper()) for name in _kinds.KIND_NAMES}
    assert in_c == in_py


def _classes_in_one_set_of_plans() -> tuple[list, int]:
    """One more new dataclass than a set of the engine's remembered plans
    holds, all going in the same set, and how many that set holds."""
    from pytree_kit import _speedups

    if not plans_kept_across_calls():
        pytest.skip("no version tags: every class is read in each call")
    by_set: dict = {}
    kept = []  # every class made stays alive, so no address is reused here
    while True:
        cls = dataclasses.make_dataclass(f"C{len(kept)}", ["a"])
        kept.append(cls)
        where, ways = _speedups._plan_set(cls)
        group = by_set.setdefault(where, [])
        group.append(cls)
        if len(group) == ways + 1:
            return group, ways


@needs_c
def test_classes_that_share_a_set_of_remembered_plans_keep_theirs() -> None:
    """Classes whose plans go in one set of the engine's memory (up to its
    ways) are not read again when a tree of all of them is met again; one
    more class than the set holds makes one of them be read again."""
    from pytree_kit import _speedups

    group, ways = _classes_in_one_set_of_plans()
    tree = [cls(i) for i, cls in enumerate(group[:ways])]
    pk.leaves(tree)
    before = _speedups._plans_made()
    assert pk.leaves(tree) == list(range(ways))
    assert _speedups._plans_made() == before
    more = [*tree, group[ways](ways)]
    pk.leaves(more)
    before = _speedups._plans_made()
    assert pk.leaves(more) == list(range(ways + 1))
    assert _speedups._plans_made() > before


@needs_c
def test_a_stale_remembered_plan_rewritten_in_place_evicts_no_class_of_the_tree() -> None:
    """A class whose remembered plan is stale (the class changed since, or
    an old class freed at the same address) has it rewritten in place; that
    must not leave another class of the same tree out of the set. (The set
    once replaced its entries in turn, and the turn did not skip the entry
    rewritten in place: the class after it took that entry, and the tree's
    classes made each other's plans again on every call. The full suite met
    this on 3.12 and 3.13, where an earlier test's freed class shared an
    address with a new one.)"""
    from pytree_kit import _speedups

    group, ways = _classes_in_one_set_of_plans()
    stale, other = group[ways - 2], group[ways]
    pk.leaves([stale(0), other(0)])  # their plans, one after the other
    stale.changed = True  # a new version tag: its remembered plan is stale
    tree = [cls(i) for i, cls in enumerate(group[:ways])]
    assert pk.leaves(tree) == list(range(ways))
    before = _speedups._plans_made()
    assert pk.leaves(tree) == list(range(ways))
    assert _speedups._plans_made() == before
