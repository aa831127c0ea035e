"""What the C engine keeps from one call to the next: the tables of
``pytree_kit/_memo.c`` in the module's state (multi-phase init), and the
class plans it asks ``_pure.class_plan`` for.

Nothing kept may change a result: a call after ``_memo_clear()``, in a module
imported afresh, or in a subinterpreter (which gets the pure engine) gives
what the first call gave.
"""

from __future__ import annotations

import collections
import dataclasses
import functools
import importlib
import re
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any, NamedTuple

import pytest

import pytree_kit as pk
from pytree_kit import _pure

C = pk.ENGINE == "c"
needs_c = pytest.mark.skipif(not C, reason="the C engine is not active")
ROOT = Path(__file__).resolve().parents[1]


@dataclasses.dataclass
class _Rec:
    a: Any
    b: Any = None


class _Pair(NamedTuple):
    x: Any
    y: Any


def _trees() -> list:
    """Trees that fill every table: class plans, small dicts' orders (keys not
    inserted sorted), a large dict's order, order pairs, dict templates."""
    big = {f"k{i:03d}": i for i in reversed(range(40))}
    return [
        {"b": [_Rec(1, 2), _Rec(3)], "a": _Pair(4, {"y": 5, "x": 6})},
        [{"z": i, "y": [i, i], "x": None} for i in range(5)],
        big,
        collections.OrderedDict(big),
    ]


def _fresh_results(module: Any) -> list:
    out = []
    for tree in _trees():
        leaves, spec = module.flatten(tree, None, None)
        out.append((leaves, spec, module.unflatten(spec, leaves), module.leaves(tree, None, None)))
    return out


def _same(a: list, b: list) -> None:
    for (l1, s1, t1, v1), (l2, s2, t2, v2) in zip(a, b):
        assert l1 == l2 and v1 == v2
        assert s1 == s2 and hash(s1) == hash(s2) and s1.to_json() == s2.to_json()
        assert t1 == t2 and type(t1) is type(t2)
        if isinstance(t1, dict):
            assert list(t1) == list(t2)  # the insertion order rebuilt


@needs_c
def test_clearing_the_tables_changes_no_result_and_plans_are_made_again() -> None:
    from pytree_kit import _speedups

    first = _fresh_results(_speedups)
    again = _fresh_results(_speedups)  # from the tables
    _same(first, again)
    before = _speedups._plans_made()
    _speedups._memo_clear()
    cleared = _fresh_results(_speedups)
    _same(first, cleared)
    assert _speedups._plans_made() > before  # the class plans went with the rest
    # the pure engine, the specification, agrees with all of them
    _same(first, _fresh_results(_pure))


@needs_c
def test_a_module_imported_afresh_has_a_state_of_its_own() -> None:
    from pytree_kit import _speedups as first_module

    first = _fresh_results(first_module)
    del sys.modules["pytree_kit._speedups"]
    try:
        second_module = importlib.import_module("pytree_kit._speedups")
        assert second_module is not first_module
        before = second_module._plans_made()
        _same(first, _fresh_results(second_module))
        _same(first, _fresh_results(first_module))  # the first one still works
        second_module._memo_clear()  # clears its own tables only
        _same(first, _fresh_results(first_module))
        _same(first, _fresh_results(second_module))
        assert second_module._plans_made() >= before
    finally:
        sys.modules["pytree_kit._speedups"] = first_module


@pytest.mark.skipif(sys.version_info < (3, 13), reason="_interpreters is 3.13's")
@pytest.mark.skipif(not C, reason="the C engine is not active")
def test_a_subinterpreter_gets_the_pure_engine_and_the_main_one_keeps_the_c_engine() -> None:
    """The engine's constants are the main interpreter's objects: a
    subinterpreter refuses the extension (Py_mod_multiple_interpreters), and
    pytree_kit goes on there with the pure engine, saying why."""
    code = textwrap.dedent(
        """
        import _interpreters
        import pytree_kit as pk
        assert pk.ENGINE == "c"
        sub = _interpreters.create()
        script = '''
        import warnings
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            import pytree_kit as pk
        assert pk.ENGINE == "python", pk.engine_info()
        assert any("subinterpreter" in str(w.message) for w in caught), caught
        assert pk.unflatten(*pk.flatten({"b": [1, 2], "a": None})[::-1]) == {"b": [1, 2], "a": None}
        '''
        failed = _interpreters.run_string(sub, script)
        assert failed is None, failed
        _interpreters.destroy(sub)
        assert pk.ENGINE == "c" and pk.leaves({"a": [1]}) == [1]
        print("ok")
        """
    )
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=300, cwd=ROOT
    )
    assert done.returncode == 0 and done.stdout.strip() == "ok", done.stderr


def test_the_c_engines_plan_codes_are_the_specifications() -> None:
    """``_core.h``'s PLAN_* enum has the numbers of ``_pure.PLAN_*``."""
    header = (ROOT / "pytree_kit" / "_core.h").read_text()
    body = re.search(r"enum \{\s*(PLAN_LEAF[^}]*)\}", header)
    assert body is not None
    in_c = {m[0]: int(m[1]) for m in re.findall(r"(PLAN_\w+) = (\d+)", body.group(1))}
    in_py = {name: getattr(_pure, name) for name in dir(_pure) if name.startswith("PLAN_")}
    assert in_c == in_py and len(in_c) == 8


class _Meta(type):
    def __getattr__(cls, name: str) -> Any:  # computes class attributes
        if name == "__tree_flatten__":
            return None
        raise AttributeError(name)


class _Computed(metaclass=_Meta):
    pass


class _Descriptor:
    def __get__(self, obj: Any, owner: Any = None) -> Any:
        return lambda self: ([1], None)


class _ByDescriptor:
    __tree_flatten__ = _Descriptor()


@dataclasses.dataclass
class _Static:
    a: Any
    k: str = dataclasses.field(default="x", metadata={"static": True})


@dataclasses.dataclass(slots=True)
class _Slotted:
    a: Any
    b: Any


@dataclasses.dataclass
class _Property:
    a: Any

    @property
    def b(self) -> int:
        return 1


def test_class_plan_says_what_classify_decides_for_the_class() -> None:
    """The plan of each kind of class, and ``PLAN_PYTHON`` wherever the class's
    answer could change without a new version tag (a metaclass that computes
    attributes, a descriptor of the caller's) or needs the instance."""
    plan = _pure.class_plan
    assert plan(int) == (_pure.PLAN_LEAF,)
    assert plan(_Pair) == (_pure.PLAN_NAMEDTUPLE, ("x", "y"))
    assert plan(type("N", (tuple,), {"_fields": "x"})) == (_pure.PLAN_TUPLE_LEAF,)
    assert plan(_Rec) == (_pure.PLAN_DATACLASS, ("a", "b"), (True, True), ())
    kind, names, reads, other = plan(_Slotted)
    assert (kind, names, other) == (_pure.PLAN_DATACLASS, ("a", "b"), ())
    assert [type(r).__name__ for r in reads] == ["member_descriptor"] * 2
    assert plan(_Property) == (_pure.PLAN_DATACLASS, ("a",), (True,), ())
    subclasses = (type("T", (tuple,), {}), type("L", (list,), {}), collections.OrderedDict)
    for python in (_Computed, _ByDescriptor, _Static, collections.deque, type(sys.version_info),
                   *subclasses, type("O", (collections.OrderedDict,), {})):  # fmt: skip
        assert plan(python) == (_pure.PLAN_PYTHON,), python
    # dict and UserDict subclasses: what the class decides of the mapping kind
    assert plan(type("D", (dict,), {})) == (_pure.PLAN_MAPPING, "dict", False, (), True,
                                            frozenset(), ())  # fmt: skip
    own_setitem = lambda self, k, v: dict.__setitem__(self, k, v)  # noqa: E731
    slotted = type("S", (dict,), {"__slots__": ("n",), "__setitem__": own_setitem})
    kind, base, user, slots, has_dict, cached, setters = plan(slotted)
    assert (kind, base, user, [n for n, _ in slots], has_dict, setters) == (
        _pure.PLAN_MAPPING, "dict", False, ["n"], False, ("__setitem__",))  # fmt: skip
    assert plan(collections.UserDict)[:3] == (_pure.PLAN_MAPPING, "UserDict", True)

    class Cached(collections.UserDict):
        @functools.cached_property
        def total(self) -> int:
            return 0

    assert plan(Cached)[5] == frozenset({"total"})
