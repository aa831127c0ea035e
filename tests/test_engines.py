"""The C engine against the pure one (the executable specification).

Every test here runs both engines directly, in one process, on the same
input: the same leaves (by identity), equal specs with equal hashes and the
same JSON, each engine unflattening the other's specs, and on bad input the
same exception type with the same message. (The rest of the suite runs once
per engine: see the README's test command.)
"""

from __future__ import annotations

import collections
import contextlib
import dataclasses
import functools
import gc
import itertools
import os
import pickle
import random
import sys
import sysconfig
import types
from collections import OrderedDict, defaultdict, deque, namedtuple
from collections.abc import Callable, Iterator, Mapping
from typing import Any, ClassVar

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import pytree_kit as pk
from pytree_kit import _pure
from pytree_kit._kinds import LEAF_NODE, MAPPING, SEQUENCE
from scripts.corpus import hostile
from scripts.corpus.trees import (
    ALLOW,
    RULES,
    Batch,
    Encoded,
    Leaf,
    ModelOutput,
    Node,
    Opaque,
    assert_same_tree,
    trees,
)
from scripts.corpus.workload import BadRebuild

try:
    from pytree_kit import _speedups
except ImportError:  # pragma: no cover - exercised where the extension is not built
    _speedups = None

# runs the engines side by side, not through the public API: the same whichever
# engine that uses, so the pure-engine jobs leave it out (scripts/ci.py)
pytestmark = [
    pytest.mark.side_by_side,
    pytest.mark.skipif(_speedups is None, reason="the C engine is not built"),
]

PURE_ONLY = os.environ.get("PYTREE_KIT_PURE", "") not in ("", "0")
FREE_THREADED = bool(sysconfig.get_config_var("Py_GIL_DISABLED"))
# tests of what the C engine keeps across calls in its module (shared nodes)
_KEEPS = pytest.mark.skipif(
    _speedups is None or not _speedups.KEEP_ACROSS_CALLS,
    reason="this build keeps nothing across calls in its module (no GIL)",
)


def test_the_c_engine_is_built_and_active() -> None:
    """On CPython the package build compiles the extension and uses it."""
    assert _speedups is not None
    assert pk.ENGINE == ("python" if PURE_ONLY else "c")


def outcome(fn: Any, *args: Any) -> tuple:
    """("ok", result) or ("raise", exception type, message)."""
    try:
        return ("ok", fn(*args))
    except Exception as e:
        return ("raise", type(e), str(e))


def same_outcome(name: str, *args: Any) -> tuple:
    """Run ``name`` on both engines; assert the same kind of result or error."""
    a = outcome(getattr(_pure, name), *args)
    b = outcome(getattr(_speedups, name), *args)
    assert a[0] == b[0], f"{name}: pure {a}, C {b}"
    if a[0] == "raise":
        assert a[1:] == b[1:], f"{name}: pure raised {a[1:]}, C raised {b[1:]}"
    return a, b


def check_leaves_identical(x: list, y: list) -> None:
    assert len(x) == len(y)
    for i, (p, q) in enumerate(zip(x, y)):
        assert p is q, f"leaf {i}: {p!r} is not {q!r}"


def check_specs_equal(s1: pk.TreeSpec, s2: pk.TreeSpec, same_objects: bool = True) -> None:
    assert s1._nodes == s2._nodes
    assert s1._orders == s2._orders
    assert s1.num_leaves == s2.num_leaves
    assert s1 == s2 and not (s1 != s2)
    assert hash(s1) == hash(s2)
    # what a mapping or sequence node carries compares equal whatever it holds
    # (no part of the structure): the same insertion order and attributes
    assert _carried(s1, same_objects) == _carried(s2, same_objects)


def _carried(spec: pk.TreeSpec, same_objects: bool) -> list:
    """Each mapping or sequence node's Carried, as (order, ((name, how,
    value), ...)): a value kept by reference is the same object (its id), or,
    across a pickle, of the same type and repr."""
    out = []
    for node in spec._nodes:
        if node[0] in (MAPPING, SEQUENCE):
            c = node[3][-1]
            values = [id(v) if same_objects else (type(v), repr(v)) for _, _, v in c.state]
            out.append((c.order, tuple((n, how, v) for (n, how, _), v in zip(c.state, values))))
    return out


def check_engines_agree(
    tree: Any, is_leaf: Any = None, rules: Any = None, rebuilds_input: bool = True
) -> None:
    a, b = same_outcome("flatten", tree, is_leaf, rules)
    if a[0] == "raise":
        for name in ("leaves", "flatten_with_path"):
            same_outcome(name, tree, is_leaf, rules)
        return
    (l1, s1), (l2, s2) = a[1], b[1]
    check_leaves_identical(l1, l2)
    check_specs_equal(s1, s2)
    check_leaves_identical(
        _pure.leaves(tree, is_leaf, rules), _speedups.leaves(tree, is_leaf, rules)
    )
    p1, _ = _pure.flatten_with_path(tree, is_leaf, rules)
    p2, s3 = _speedups.flatten_with_path(tree, is_leaf, rules)
    assert [p for p, _ in p1] == [p for p, _ in p2]
    check_leaves_identical([x for _, x in p1], [x for _, x in p2])
    check_specs_equal(s1, s3)
    if _json_ok(s1):
        assert s1.to_json() == s2.to_json()
    # each engine rebuilds from the other's spec
    t_pure = _pure.unflatten(s2, l2)
    t_c = _speedups.unflatten(s1, l1)
    assert_same_tree(t_pure, t_c)
    # again: the second unflatten of a spec makes its recipe, the third follows it
    for _ in range(2):
        assert_same_tree(t_pure, _speedups.unflatten(s1, l1))
        assert_same_tree(t_pure, _speedups.unflatten(s2, l2))
    if is_leaf is None and rebuilds_input:
        assert_same_tree(tree, t_c)
    # flatten_up_to on the unchanged structure
    check_leaves_identical(_pure.flatten_up_to(s1, tree), _speedups.flatten_up_to(s2, tree))


def _json_ok(spec: pk.TreeSpec) -> bool:
    try:
        spec.to_json()
    except (TypeError, ValueError):
        return False
    return True


class _OwnSetter(dict):
    def __setitem__(self, key: Any, value: Any) -> None:
        dict.__setitem__(self, key, value)


class _Slots(dict):
    __slots__ = ("meta", "unset")


class _Data(collections.UserDict):
    @functools.cached_property
    def total(self) -> int:
        return len(self.data)


class _Keyed:
    """A key that is no str or int, orderable: its == and < are the caller's."""

    def __init__(self, k: int) -> None:
        self.k = k

    def __hash__(self) -> int:
        return hash(self.k)

    def __eq__(self, other: object) -> bool:
        return isinstance(other, _Keyed) and other.k == self.k

    def __lt__(self, other: Any) -> bool:
        return self.k < other.k


def _with(obj: Any, **attrs: Any) -> Any:
    for name, value in attrs.items():
        setattr(obj, name, value)
    return obj


def _mapping_cases() -> dict[str, Any]:
    """Instances of dict and UserDict subclasses, the mapping kind the C engine
    reads itself (_mapping_kind.c), and those it leaves to the pure engine."""
    leaf = object()
    items = {"b": 1, "a": [2, 3], "c": leaf}
    slots = _Slots(items)
    slots.meta = "m"
    data = _Data(items)
    _ = data.total  # a cached property's value, in the __dict__
    bare = Batch(items)
    bare.__dict__.update(items)  # every item also an attribute: mirrors
    tupled = Batch(t=(leaf, 1))
    tupled.t = (leaf, 1)  # a tuple beside its item: the same value by _same_value
    other = Batch(t=(leaf, 1))
    other.t = (leaf, 2)
    no_data = _Data()
    del no_data.data
    odd_data = _Data()
    odd_data.data = [1]
    return {
        "plain": Batch(items),
        "attributes": _with(Batch(items), tag="train", n=3),
        "many attributes": _with(Batch(items), **{f"a{i}": i for i in range(20)}),
        "in order": _with(Batch(a=1, b=2), tag=leaf),
        "empty": Batch(),
        "int keys": _with(Batch({3: "x", 1: "y", 2: "z"}), tag=1),
        "mixed keys": Batch({1: "x", "a": "y"}),
        "bool keys": Batch({True: 1, False: 2}),
        "orderable keys": Batch({_Keyed(2): 1, _Keyed(1): 2}),
        "mirrors": bare,
        "tuple mirror": tupled,
        "tuple beside": other,
        "slots": slots,
        "userdict": _with(Encoded(items), _encodings=[leaf], _n_sequences=1),
        "userdict cached": data,
        "userdict no data": no_data,
        "userdict odd data": odd_data,
        "own setter, no attributes": _OwnSetter(items),
        "own setter, attributes": _with(_OwnSetter(items), tag=1),
        "large": _with(Batch({f"k{i:03d}": i for i in reversed(range(200))}), tag=0),
        "nested": [Batch(x=Batch(y=1)), {"e": Encoded({"z": [Batch(q=2)]})}],
    }


@pytest.mark.parametrize("name", list(_mapping_cases()))
def test_mapping_subclasses_read_and_rebuilt_alike(name: str) -> None:
    """The C engine's own reading and rebuild of dict and UserDict subclasses
    (_mapping_kind.c) gives the pure engine's leaves, spec, carried
    attributes and order, rebuilt object and errors; it is asked twice, the
    second time from the kept class plan."""
    # (a cached property's value is no part of the rebuild: computed again)
    same = name != "userdict cached"
    for _ in range(2):
        tree = _mapping_cases()[name]
        check_engines_agree(tree, rebuilds_input=same)
        more = [tree] if name != "nested" else []
        check_engines_agree({"batch": tree, "more": more}, rebuilds_input=same)


@given(trees())
def test_generated_trees(tree: Any) -> None:
    check_engines_agree(tree, None, RULES)


@given(trees(), st.integers(0, 3))
def test_generated_trees_with_is_leaf(tree: Any, which: int) -> None:
    is_leaf = [
        lambda x: isinstance(x, list) and len(x) == 1,
        lambda x: isinstance(x, tuple),
        lambda x: x is None,
        lambda x: isinstance(x, dict) and len(x) > 1,
    ][which]
    check_engines_agree(tree, is_leaf, RULES)


@given(st.one_of(trees(), st.sampled_from([None, 3, "s", (), [], {}])), st.integers(0, 4))
def test_flatten_one_level(tree: Any, which: int) -> None:
    """The root's children (the same objects) and equal specs, or the same error."""
    is_leaf = [None, lambda x: isinstance(x, tuple), lambda x: x == 0, lambda x: 1 / 0, None][which]
    a, b = same_outcome("flatten_one_level", tree, is_leaf, RULES if which < 4 else None)
    if a[0] == "ok":
        if a[1] is None:
            assert b[1] is None
            return
        (c1, s1), (c2, s2) = a[1], b[1]
        assert type(c1) is type(c2) is list
        check_leaves_identical(c1, c2)
        check_specs_equal(s1, s2)
        assert_same_tree(_speedups.unflatten(s1, c1), _pure.unflatten(s2, c2))


@given(trees(), st.integers(0, 4), st.booleans())
def test_any_leaf(tree: Any, which: int, want: bool) -> None:
    """tree_any / tree_all's walk: the same answer, or the same error."""
    is_leaf = [None, lambda x: isinstance(x, tuple), lambda x: x == 0, lambda x: 1 / 0, None][which]
    a, b = same_outcome("any_leaf", tree, is_leaf, RULES if which < 4 else None, want)
    if a[0] == "ok":
        assert a[1] is b[1]


@given(trees(), trees())
def test_flatten_up_to_mismatches(a: Any, b: Any) -> None:
    """Any two trees: both engines accept or reject b against a's spec alike."""
    spec = _pure.flatten(a, None, RULES)[1]
    x, y = same_outcome("flatten_up_to", spec, b)
    if x[0] == "ok":
        check_leaves_identical(x[1], y[1])
    same_outcome("flatten_up_to", spec, b, "the first tree", "rest[0]")


@given(trees(), st.lists(trees(), max_size=3), st.booleans())
def test_flatten_up_to_columns_is_flatten_up_to_of_each_tree(
    a: Any, others: list, same_first: bool
) -> None:
    """Both engines' columns: the leaves of each tree, transposed, or the same
    error as flatten_up_to of the first tree that does not fit."""
    spec = _pure.flatten(a, None, RULES)[1]
    batch = [a, *others] if same_first else others
    x, y = same_outcome("flatten_up_to_columns", spec, batch)
    rows = [outcome(_pure.flatten_up_to, spec, t) for t in batch]
    bad = [r for r in rows if r[0] == "raise"]
    if bad:
        assert x[1:] == bad[0][1:]
        return
    assert len(x[1]) == len(y[1]) == spec.num_leaves
    for j, (cx, cy) in enumerate(zip(x[1], y[1])):
        check_leaves_identical(cx, cy)
        check_leaves_identical(cx, [r[1][j] for r in rows])
    same_outcome("flatten_up_to_columns", spec, iter(batch), "the first tree", "rest[0]")


class _DictNode:
    """A protocol class whose children are a dict (keys given by the caller)."""

    def __init__(self, items: dict, aux: Any = None) -> None:
        self.items, self.aux = items, aux

    def __tree_flatten__(self) -> tuple:
        return dict(self.items), self.aux

    @classmethod
    def __tree_unflatten__(cls, aux: Any, children: dict) -> Any:
        return cls(children, aux)


class _MutatingKey:
    """A key whose __eq__ empties the dict it is compared from."""

    victim: ClassVar[dict] = {}

    def __init__(self, name: str) -> None:
        self.name = name

    def __hash__(self) -> int:
        return hash(self.name)

    def __eq__(self, other: object) -> bool:
        _MutatingKey.victim.clear()
        return isinstance(other, _MutatingKey) and other.name == self.name


def test_dict_children_are_matched_as_the_pure_engine_matches_them() -> None:
    """flatten_up_to's shortcut for (dict, aux) results: equal keys that are
    not the same objects, other keys, counts and aux, unhashable aux, rules,
    and a key whose __eq__ changes the dict: both engines alike."""
    spec = _pure.flatten(_DictNode({"a": 1, "b": 2}, 7), None, None)[1]
    fresh = "".join(["a"])  # equal to "a", another object
    others = [
        _DictNode({"a": 3, "b": 4}, 7),
        _DictNode({fresh: 3, "b": 4}, 7),
        _DictNode({"b": 4, "a": 3}, 7),  # another insertion order: a mismatch
        _DictNode({"a": 3}, 7),
        _DictNode({"a": 3, "b": 4, "c": 5}, 7),
        _DictNode({"a": 3, "c": 4}, 7),
        _DictNode({"a": 3, "b": 4}, 8),
        _DictNode({"a": 3, "b": 4}, [1]),  # unhashable aux
    ]
    for other in others:
        x, _ = same_outcome("flatten_up_to", spec, other)
        same_outcome("flatten_up_to_columns", spec, [other, other])
        if other is others[0] or other is others[1]:
            assert x == ("ok", [3, 4])
    key_spec = _pure.flatten(_DictNode({_MutatingKey("k"): 1}), None, None)[1]
    results = []
    for impl in (_pure, _speedups):
        node = _DictNode({_MutatingKey("k"): 2})
        node.__tree_flatten__ = lambda node=node: (node.items, None)  # the dict itself
        _MutatingKey.victim = node.items
        results.append(outcome(impl.flatten_up_to, key_spec, node))
    assert results[0] == results[1] == ("ok", [2])
    rule = pk.Rule(lambda o: (dict(o.items), o.aux), lambda aux, ch: _DictNode(ch, aux))
    rules = {_DictNode: rule}
    rspec = _pure.flatten(_DictNode({"a": 1, "b": 2}, 7), None, rules)[1]
    for other in others[:7]:
        same_outcome("flatten_up_to", rspec, other)


def test_flatten_up_to_columns_holds_its_own_copy_of_the_trees() -> None:
    """A __tree_flatten__ that empties the caller's list cannot make the C
    engine read freed memory: it works on a tuple of its own."""
    trees_list: list = []

    class Shrinks:
        def __tree_flatten__(self) -> tuple:
            trees_list.clear()
            return (1,), None

        @classmethod
        def __tree_unflatten__(cls, aux: Any, children: Any) -> Any:
            return cls()

    trees_list.extend(Shrinks() for _ in range(50))
    spec = _pure.flatten(Shrinks(), None, None)[1]
    for impl in (_pure, _speedups):
        trees_list[:] = [Shrinks() for _ in range(50)]
        assert impl.flatten_up_to_columns(spec, trees_list) == [[1] * 50]
    with pytest.raises(TypeError):
        _speedups.flatten_up_to_columns(spec)
    with pytest.raises(ValueError, match="the spec has a list of 2, the tree has a tuple"):
        pk.structure([0, 0]).columns([[1, 2], (3, 4)])


@given(trees())
def test_specs_cross_engines_through_pickle_and_json(tree: Any) -> None:
    leaves, spec = _speedups.flatten(tree, None, RULES)
    again = pickle.loads(pickle.dumps(spec)) if _picklable(spec) else spec
    check_specs_equal(spec, again, same_objects=again is spec)
    assert_same_tree(_pure.unflatten(again, leaves), _speedups.unflatten(again, leaves))
    if _json_ok(spec):
        back = pk.TreeSpec.from_json(spec.to_json(), allow=ALLOW, rules=RULES)
        assert back == spec and hash(back) == hash(spec)
        assert_same_tree(
            _pure.unflatten(back, leaves), _speedups.unflatten(back, leaves), identical_leaves=False
        )


def _picklable(spec: pk.TreeSpec) -> bool:
    try:
        pickle.dumps(spec)
    except Exception:
        return False
    return True


@given(trees(), st.integers(-2, 2))
def test_unflatten_wrong_counts(tree: Any, delta: int) -> None:
    leaves, spec = _pure.flatten(tree, None, RULES)
    given_leaves = ([*leaves, 0, 0])[: max(0, len(leaves) + delta)]
    a, b = same_outcome("unflatten", spec, given_leaves)
    if a[0] == "ok":
        assert_same_tree(a[1], b[1])


def test_unflatten_takes_any_iterable() -> None:
    spec = _pure.flatten({"a": [0, 0], "b": (0,)}, None, None)[1]
    for leaves in (
        iter("xyz"),
        (c for c in "xyz"),
        range(3),
        deque("xyz"),
        {"x": 1, "y": 2, "z": 3}.values(),
    ):
        got = _speedups.unflatten(spec, leaves)
        assert got == _pure.unflatten(spec, list(got["a"]) + list(got["b"]))
    with pytest.raises(TypeError):
        _speedups.unflatten(spec, 3)


class _Mapping(Mapping):
    """A mapping that is not a dict."""

    def __init__(self, d: dict) -> None:
        self.d = d

    def __getitem__(self, k: Any) -> Any:
        return self.d[k]

    def __iter__(self) -> Any:
        return iter(self.d)

    def __len__(self) -> int:
        return len(self.d)


@pytest.mark.parametrize(
    ("value", "name", "items"),
    [
        ("xyz", "str", "characters"),
        (b"xyz", "bytes", "bytes"),
        (bytearray(b"xyz"), "bytearray", "bytes"),
        ({"x": 1, "y": 2, "z": 3}, "dict", "keys"),
        (OrderedDict(x=1, y=2, z=3), "OrderedDict", "keys"),
        (types.MappingProxyType({"x": 1, "y": 2, "z": 3}), "mappingproxy", "keys"),
        (_Mapping({"x": 1, "y": 2, "z": 3}), "_Mapping", "keys"),
    ],
)
def test_a_str_bytes_or_mapping_is_refused_as_leaves_or_trees(
    value: Any, name: str, items: str
) -> None:
    """Its characters, bytes or keys would be taken one by one: a TypeError
    naming what was passed, the same from both engines (every public way in:
    tests/test_errors.py)."""
    spec = _pure.flatten([0, 0, 0], None, None)[1]
    a, _ = same_outcome("unflatten", spec, value)
    assert a[1] is TypeError and a[2] == (
        f"unflatten: the leaves must be a list (or another iterable) of leaves, not {name}: "
        f"its {items} would each be taken as a leaf; to give the {name} as one leaf, pass [it]"
    )
    a, _ = same_outcome("flatten_up_to_columns", spec, value)
    assert a[1] is TypeError and a[2].startswith(
        f"TreeSpec.columns: the trees must be a list (or another iterable) of trees, not {name}: "
        f"its {items} would each be taken as a tree"
    )
    # given as one leaf it is taken whole
    assert same_outcome("unflatten", _pure.flatten([0], None, None)[1], [value])[0][1] == [value]


# -- hand-written bad input: same type, same message ----------------------


class NoUnflatten:
    def __tree_flatten__(self) -> Any:
        return (1,), None


class BadShape:
    def __init__(self, res: Any) -> None:
        self.res = res

    def __tree_flatten__(self) -> Any:
        return self.res

    @classmethod
    def __tree_unflatten__(cls, aux: Any, children: Any) -> Any:
        return cls((children, aux))


class Raises:
    def __tree_flatten__(self) -> Any:
        raise KeyError("boom")

    @classmethod
    def __tree_unflatten__(cls, aux: Any, children: Any) -> Any:
        return cls()


class BadHash:
    def __hash__(self) -> int:
        raise ValueError("no hash for you")


class BadLt:
    def __init__(self, v: int) -> None:
        self.v = v

    def __lt__(self, other: Any) -> bool:
        raise RuntimeError("no order")

    def __hash__(self) -> int:
        return self.v

    def __eq__(self, other: Any) -> bool:
        return isinstance(other, BadLt) and other.v == self.v


@dataclasses.dataclass
class StaticDC:
    x: Any
    s: Any = dataclasses.field(default=None, metadata={"static": True})


def _cyclic() -> list:
    a: list = [1, {"k": None}]
    a[1]["k"] = a
    return a


def _deep_cycle() -> list:
    root: list = []
    cur = root
    for _ in range(200):
        nxt: list = [0]
        cur.append(nxt)
        cur = nxt
    cur.append(root)
    return root


BAD_TREES = {
    "no __tree_unflatten__": [NoUnflatten()],
    "not a pair": {"a": BadShape([1, 2])},
    "a 3-tuple": {"a": (BadShape((1, 2, 3)),)},
    "children a set": [BadShape(({1}, None))],
    "children a string": [BadShape(("ab", None))],
    "unhashable aux": {"x": [BadShape(([1], []))]},
    "aux whose hash raises": [BadShape(([1], BadHash()))],
    "dict children, unhashable aux": [BadShape(({"a": 1}, {}))],
    "flatten raises": {"r": Raises()},
    "cycle": _cyclic(),
    "cycle 200 deep": _deep_cycle(),
    "unorderable keys": {BadLt(1): 1, BadLt(2): 2},
    "mixed keys": {1: "a", "b": 2, None: 3},
    "static unhashable": [StaticDC(1, [])],
    "defaultdict unhashable factory": defaultdict(BadHash().__class__, a=1),
    "defaultdict lambda": defaultdict(lambda: 0, b=1, a=2),
}


@pytest.mark.parametrize("name", list(BAD_TREES))
def test_bad_trees(name: str) -> None:
    tree = BAD_TREES[name]
    for fn in ("flatten", "leaves", "flatten_with_path"):
        same_outcome(fn, tree, None, None)


def test_rules_errors_match() -> None:
    class Thing:
        pass

    cases = [
        pk.Rule(lambda o: None, lambda a, c: Thing()),
        pk.Rule(lambda o: ((1,), []), lambda a, c: Thing()),
        pk.Rule(lambda o: ({1, 2}, None), lambda a, c: Thing()),
        pk.Rule(lambda o: 1 / 0, lambda a, c: Thing()),
        pk.Rule(lambda o: ({"k": 1}, "aux"), lambda a, c: Thing()),
    ]
    for rule in cases:
        for fn in ("flatten", "leaves", "flatten_with_path"):
            same_outcome(fn, {"t": [Thing()]}, None, {Thing: rule})


def test_is_leaf_errors_and_truthiness_match() -> None:
    class Falsy:
        def __bool__(self) -> bool:
            raise ZeroDivisionError("no truth")

    for is_leaf in (lambda x: 1 / 0, lambda x: Falsy(), lambda x: isinstance(x, int) or None):
        for fn in ("flatten", "leaves", "flatten_with_path"):
            same_outcome(fn, {"a": [1, (2, 3)]}, is_leaf, None)


def test_mutation_during_flatten_is_safe() -> None:
    """A callback that changes the tree while it is flattened: no crash, same result."""

    def tree_and_hook() -> tuple:
        inner = [1, 2, 3, 4]
        tree = {"a": inner, "b": [5, inner]}

        def is_leaf(x: Any) -> bool:
            if x == 2:
                inner.clear()
                tree.clear()
            return False

        return tree, is_leaf

    t1, h1 = tree_and_hook()
    t2, h2 = tree_and_hook()
    a = outcome(_pure.flatten, t1, h1, None)
    b = outcome(_speedups.flatten, t2, h2, None)
    assert a[0] == b[0] == "ok"
    assert a[1][0] == b[1][0]
    assert a[1][1] == b[1][1]

    class Grows:
        def __init__(self) -> None:
            self.kids: list = [1]

        def __tree_flatten__(self) -> Any:
            self.kids.append(len(self.kids))
            return self.kids, None

        @classmethod
        def __tree_unflatten__(cls, aux: Any, children: Any) -> Any:
            return cls()

    g1, g2 = Grows(), Grows()
    assert _pure.flatten([g1, g1], None, None)[0] == _speedups.flatten([g2, g2], None, None)[0]


def test_keys_whose_order_changes_during_sort() -> None:
    class Evil:
        def __init__(self, v: int, d: dict) -> None:
            self.v, self.d = v, d

        def __lt__(self, other: Any) -> bool:
            self.d.clear()  # empties the dict while its keys are sorted
            return self.v < other.v

        def __hash__(self) -> int:
            return self.v

        def __eq__(self, other: object) -> bool:  # specs of two make()s compare equal
            return type(other) is Evil and other.v == self.v

        def __repr__(self) -> str:
            return f"Evil({self.v})"

    def make() -> dict:
        d: dict = {}
        d[Evil(2, d)] = "b"
        d[Evil(1, d)] = "a"
        return d

    # With the GIL each engine reads the live dict, which the sort empties (a
    # KeyError); on a free-threaded build both read their copy of it (and give
    # its leaves and spec).
    for fn in ("flatten", "leaves", "flatten_with_path"):
        a = outcome(getattr(_pure, fn), make(), None, None)
        b = outcome(getattr(_speedups, fn), make(), None, None)
        assert a[0] == b[0] == ("ok" if FREE_THREADED else "raise") and a[1:2] == b[1:2]


def test_flatten_up_to_errors_match() -> None:
    P = namedtuple("P", "x y")
    spec_trees = [
        {"a": [1, 2], "b": (3,)},
        [P(1, 2), None],
        OrderedDict(a=1, b=2),
        deque([1, 2], maxlen=3),
        defaultdict(list, k=1),
        [StaticDC(1, "s")],
        [Node(1, 2)],
    ]
    others = [
        {"a": [1, 2, 3], "b": (3,)},
        {"a": [1, 2]},
        {"a": (1, 2), "b": (3,)},
        [P(1, 2), 0],
        [(1, 2), None],
        OrderedDict(b=2, a=1),
        deque([1, 2]),
        defaultdict(dict, k=1),
        [StaticDC(1, "t")],
        [Node(1, 2, "other")],
        [Node(1, 2)],
        "leaf",
        None,
    ]
    for t in spec_trees:
        spec = _pure.flatten(t, None, None)[1]
        for o in [*others, t]:
            same_outcome("flatten_up_to", spec, o)
            same_outcome("flatten_up_to", spec, o, "the first tree", "rest[1]")


@dataclasses.dataclass
class _Wide:
    """More fields than the C engine's inline buffer for a record's leaves (32)."""

    a0: Any = 0
    a1: Any = 1
    a2: Any = 2
    a3: Any = 3
    a4: Any = 4
    a5: Any = 5
    a6: Any = 6
    a7: Any = 7
    a8: Any = 8
    a9: Any = 9
    b0: Any = 10
    b1: Any = 11
    b2: Any = 12
    b3: Any = 13
    b4: Any = 14
    b5: Any = 15
    b6: Any = 16
    b7: Any = 17
    b8: Any = 18
    b9: Any = 19
    c0: Any = 20
    c1: Any = 21
    c2: Any = 22
    c3: Any = 23
    c4: Any = 24
    c5: Any = 25
    c6: Any = 26
    c7: Any = 27
    c8: Any = 28
    c9: Any = 29
    d0: Any = 30
    d1: Any = 31
    d2: Any = 32
    d3: Any = 33


@dataclasses.dataclass
class _Two:
    x: Any
    y: Any


def test_record_leaf_fields_taken_without_a_frame_match() -> None:
    """The C engine takes a record of leaves in one step; the results are the pure engine's."""
    w = _Wide()
    unset = _Two(1, 2)
    del unset.y
    me = _Two(1, 2)
    me.y = me  # a field that is the record itself: a cycle, named by its path
    for tree in (w, [w, _Wide(a0=[1, 2])], [_Two(1, 2), _Two("a", None)], unset, [unset, 3]):
        check_engines_agree(tree)
    same_outcome("flatten", me, None, None)
    same_outcome("leaves", [me], None, None)


# a float becomes a node with no children (leaves by type otherwise), and an Opaque
# a node of its items
_RUN_RULES = {**RULES, float: pk.Rule(lambda x: ((), x), lambda aux, ch: aux)}


@pytest.mark.thread_unsafe  # counts references other threads' calls share
def test_long_runs_of_leaves_match() -> None:
    """The C engine copies a run of children that are leaves in one step, with room
    reserved for the rest of the list; every way a run can start and end agrees."""
    leaf = Leaf(0)
    mixed = [*range(300), "s", 1.5, b"b", True, leaf, leaf, *range(200)]
    trees = [
        list(range(1000)),  # one run longer than the C engine's inline storage
        tuple(range(129)),
        mixed,  # the leaf type changes inside the run
        [[1], *range(150), [2, 3], *("x" for _ in range(150)), None, 4],
        {"a": list(range(500)), "b": (leaf,) * 300, "c": [*range(140), {"d": [5]}]},
        [list(range(i)) for i in range(0, 300, 7)],
        [Node(list(range(200)), [leaf] * 130), *range(10)],
        [Opaque([7, 8], 2), *range(200), deque([1, 2]), 2.5, *range(130)],
    ]
    for tree in trees:
        check_engines_agree(tree)
        check_engines_agree(tree, rules=_RUN_RULES)
    # refcounts of leaves taken in runs, through every operation
    before = sys.getrefcount(leaf)
    for _ in range(200):
        leaves, spec = _speedups.flatten(trees[2], None, None)
        _speedups.unflatten(spec, leaves)
        _speedups.flatten_up_to(spec, trees[2])
        _speedups.leaves(trees[4], None, None)
        del leaves, spec
    assert sys.getrefcount(leaf) == before
    # the leaf node is counted once for each leaf a spec holds (LEAF_NODE, or
    # on a free-threaded build this thread's own copy of it)
    node = _speedups.flatten([0], None, None)[1]._nodes[-1]
    assert node == LEAF_NODE and (node is LEAF_NODE) != FREE_THREADED
    before = sys.getrefcount(node)
    spec = _speedups.flatten(trees[0], None, None)[1]
    assert sys.getrefcount(node) == before + 1000
    del spec
    assert sys.getrefcount(node) == before
    # a spec whose leaves stop before the tree's list does
    spec = _speedups.flatten([*range(300), [1]], None, None)[1]
    same_outcome("flatten_up_to", spec, [*range(300), 7], "the spec", "the tree")
    same_outcome("flatten_up_to", spec, list(range(400)), "the spec", "the tree")


def test_dict_fast_paths_match_and_fall_back() -> None:
    """Dicts read by identity of keys, and specs whose orders or keys are not flatten's own."""
    tree = {"beta": {"zed": 1, "yes": 2}, "alpha": [{"kay": 3, "jay": 4}, {"jay": 5, "kay": 6}]}
    leaves, spec = _speedups.flatten(tree, None, None)
    check_engines_agree(tree)
    # keys equal to the spec's but other objects (as after JSON): lookups, same result
    copy = {
        "".join(list(k)): (
            {"".join(list(q)): v for q, v in d.items()} if isinstance(d, dict) else d
        )
        for k, d in tree.items()
    }
    assert all(k is not q for k in copy for q in tree)  # equal keys, other objects
    others: list[Any] = [
        copy,
        {"alpha": tree["alpha"], "beta": {"yes": 2, "zed": 1}},
        {"alpha": [], "beta": {}},
    ]
    for other in others:
        same_outcome("flatten_up_to", spec, other)
    again = pk.TreeSpec.from_json(spec.to_json())
    a, b = same_outcome("unflatten", again, leaves)
    assert_same_tree(a[1], b[1])
    assert list(b[1]) == ["beta", "alpha"] and list(b[1]["beta"]) == ["zed", "yes"]
    # orders not in flatten's form (descending, duplicated, a bool index): the general path;
    # and one more, ascending still, naming the last node, a leaf: passed over
    nodes, orders = spec._nodes, spec._orders
    assert len(orders) >= 2 and orders[-1][0] < len(nodes) - 1 and not nodes[-1][2]
    beyond = (*orders, (len(nodes) - 1, orders[0][1]))
    for bad in (tuple(reversed(orders)), orders + orders[-1:], ((True, orders[0][1]),), beyond):
        odd = pk.TreeSpec._make(nodes, bad, spec.num_leaves)
        a, b = same_outcome("unflatten", odd, leaves)
        if a[0] == "ok":
            assert_same_tree(a[1], b[1])
            assert [list(d) for d in _dicts(a[1])] == [list(d) for d in _dicts(b[1])]


class _Key(str):
    """A str subclass whose hash is its own, and can move."""

    h = 1

    def __hash__(self) -> int:
        return self.h

    def __eq__(self, other: object) -> bool:
        return str.__eq__(self, other)


def test_flatten_up_to_dicts_read_by_key_identity_match() -> None:
    """flatten_up_to takes a dict whose keys are the spec's own objects in any
    order (str or int), with None at the spec's None nodes, in one pass; every
    other case (a value where None was, None where a leaf was, equal keys that
    are other objects, keys of a subclass, too many keys to look for) agrees
    with the pure engine, leaves and errors."""

    def step(order: list[Any], **over: Any) -> dict:
        base: dict[Any, Any] = {
            "loss": Leaf(0),
            "aux": None,
            "logits": Leaf(1),
            "past": None,
            "metrics": {"acc": 0.5, "f1": None},
            "pair": (Leaf(2), None),
            7: Leaf(3),
        }
        base.update(over)
        return {k: base[k] for k in order}

    order = ["loss", "aux", "logits", "past", "metrics", "pair", 7]
    spec_tree = [step(order), step(order[::-1])]
    _, spec = _speedups.flatten(spec_tree, None, None)
    check_engines_agree(spec_tree)
    rev = order[::-1]
    others: list[Any] = [
        [step(rev), step(order)],  # the same key objects, in other orders
        [step(order, aux=Leaf(9)), step(order)],  # a value at a None node
        [step(order, loss=None), step(order)],  # None at a leaf node: a leaf
        [step(order, metrics={"f1": 0.1, "acc": None}), step(order)],
        [step(order, metrics={"f1": None, "acc": 0.2}), step(order)],
        [step(order, pair=(None, None)), step(order)],
        [step(order, pair=(Leaf(4), Leaf(5))), step(order)],
        [step(order, past=[]), step(order)],
        [{**step(order), "extra": 1}, step(order)],
        [{_Key("loss") if k == "loss" else k: v for k, v in step(order).items()}, step(order)],
        # equal keys, other objects: looked up
        [{("".join(k) if isinstance(k, str) else k): v for k, v in step(rev).items()}] * 2,
    ]
    for other in others:
        a, b = same_outcome("flatten_up_to", spec, other)
        if a[0] == "ok":
            check_leaves_identical(a[1], b[1])
        same_outcome("flatten_up_to_columns", spec, [other, spec_tree])
    # a key object of the spec's own whose hash moved: the dict no longer finds
    # it, so the tree does not match, though the same object is there
    moving = _Key("m")
    moved = {moving: Leaf(0), "b": Leaf(1)}
    _, mspec = _speedups.flatten(moved, None, None)
    moving.h = 2
    a, _ = same_outcome("flatten_up_to", mspec, moved)
    assert a[0] == "raise"
    # a large OrderedDict of leaves, its table read in place: the same, another
    # order of its own (move_to_end), a hole in its table (a key deleted and put back)
    od = OrderedDict((f"layer{i}.weight", Leaf(i)) for i in range(40))
    _, ospec = _speedups.flatten(od, None, None)
    moved_od = OrderedDict(od)
    moved_od.move_to_end("layer0.weight")
    holed = OrderedDict(od)
    holed["layer5.weight"] = holed.pop("layer5.weight")
    for other in (od, OrderedDict(od), moved_od, holed):
        a, b = same_outcome("flatten_up_to", ospec, other)
        if a[0] == "ok":
            check_leaves_identical(a[1], b[1])
    assert same_outcome("flatten_up_to", ospec, moved_od)[0][0] == "raise"
    # a dict of more keys than are looked for out of order, of int keys
    for n in (40, 100):
        big = {i: (None if i % 3 else Leaf(i)) for i in range(n)}
        _, bspec = _speedups.flatten(big, None, None)
        for other in (
            dict(reversed(big.items())),
            {i: (Leaf(i) if i == n - 1 else v) for i, v in big.items()},
        ):
            a, b = same_outcome("flatten_up_to", bspec, other)
            if a[0] == "ok":
                check_leaves_identical(a[1], b[1])


@settings(max_examples=60, deadline=None)
@given(
    n=st.sampled_from([7, 8, 9, 33, 100, 600, 1500]),
    ints=st.booleans(),
    seed=st.integers(0, 2**32 - 1),
)
def test_large_dicts_unflatten_in_their_insertion_order(n: int, ints: bool, seed: int) -> None:
    """Dicts of many keys in any insertion order (the C engine finds each key's
    place by its address, in a table on the C stack or, past 512 keys, the
    heap): the same dict, in the same order, on both engines; and the same
    when the spec's keys are other objects than its order's (after JSON)."""
    import random

    keys: list[Any] = [i * 7 - 50 for i in range(n)] if ints else [f"p.{i}.w" for i in range(n)]
    random.Random(seed).shuffle(keys)
    tree = {k: [Leaf(i)] if i % 3 == 0 else Leaf(i) for i, k in enumerate(keys)}
    for spec in (_pure.flatten(tree, None, None)[1], _speedups.flatten(tree, None, None)[1]):
        leaves = _pure.flatten(tree, None, None)[0]
        a, b = same_outcome("unflatten", spec, leaves)
        assert a[0] == "ok"
        assert_same_tree(a[1], b[1])
        assert list(a[1]) == list(b[1]) == keys
    if not ints:
        again = pk.TreeSpec.from_json(_pure.flatten(tree, None, None)[1].to_json())
        a, b = same_outcome("unflatten", again, leaves)
        assert list(a[1]) == list(b[1]) == keys


def test_large_dict_orders_that_are_not_a_permutation() -> None:
    """A hand-made order of a large dict node that names a key twice, or a key
    the node lacks, or is short: both engines give the same outcome."""
    keys = [f"k{i}" for i in range(40)]
    tree = {k: Leaf(i) for i, k in enumerate(reversed(keys))}
    leaves, spec = _pure.flatten(tree, None, None)
    ((index, order),) = spec._orders
    for bad in (
        (*order[:-1], order[0]),  # a key twice, one missing
        (*order[:-1], "nope"),  # a key the node lacks
        order[:-1],  # short
        (*order[:5], order[5][:1] + order[5][1:], *order[6:]),  # an equal key, another object
    ):
        odd = pk.TreeSpec._make(spec._nodes, ((index, bad),), spec.num_leaves)
        a, b = same_outcome("unflatten", odd, leaves)
        if a[0] == "ok":
            assert_same_tree(a[1], b[1])
            assert list(a[1]) == list(b[1])


def test_large_dict_node_whose_keys_are_not_sorted() -> None:
    """A hand-made spec whose large dict node keeps its keys unsorted (flatten
    never makes one): unflattened again and again, then the dicts it made
    flattened again; both engines agree, and flatten's keys come out sorted."""
    keys = [f"w{i:02d}" for i in range(40)]
    tree = {k: Leaf(i) for i, k in enumerate(reversed(keys))}
    leaves, spec = _pure.flatten(tree, None, None)
    ((index, order),) = spec._orders
    kind, t, arity, sorted_keys = spec._nodes[0]
    unsorted = tuple(reversed(sorted_keys))
    odd = pk.TreeSpec._make(
        ((kind, t, arity, unsorted), *spec._nodes[1:]), spec._orders, spec.num_leaves
    )
    for _ in range(3):
        a, b = same_outcome("unflatten", odd, leaves)
        assert a[0] == "ok" and list(a[1]) == list(b[1]) == list(order)
        check_engines_agree(b[1])
        assert _speedups.flatten(b[1], None, None)[1]._nodes[0][3] == sorted_keys


@pytest.mark.thread_unsafe  # counts references other threads' calls share
def test_dict_node_whose_key_cannot_be_hashed() -> None:
    """A dict node built with a key that raises: the same error, every leaf released."""
    leaf = Leaf(1)
    leaves, spec = _pure.flatten([{"a": leaf, "b": [leaf, leaf]}, leaf], None, None)
    nodes = list(spec._nodes)
    kind, t, arity, _keys = nodes[1]
    nodes[1] = (kind, t, arity, ("a", ["unhashable"]))
    bad = pk.TreeSpec._make(tuple(nodes), spec._orders, spec.num_leaves)
    before = sys.getrefcount(leaf)
    for _ in range(100):
        a, b = same_outcome("unflatten", bad, leaves)
        assert a[0] == "raise" and a[1] is TypeError
    assert sys.getrefcount(leaf) == before


_NEW_CALLS: list = []


@dataclasses.dataclass
class _OwnNew:
    x: Any

    def __new__(cls, *args: Any, **kwargs: Any) -> Any:
        _NEW_CALLS.append(cls)
        return super().__new__(cls)


class _Meta(type):
    pass


@dataclasses.dataclass
class _WithMeta(metaclass=_Meta):
    x: Any


@dataclasses.dataclass
class _Later:
    x: Any


@dataclasses.dataclass
class _OnDict(dict):
    x: Any


@pytest.mark.thread_unsafe  # logs calls in a list (or a class) the threads would share
def test_records_rebuilt_through_their_own_new() -> None:
    """unflatten calls t.__new__(t) on both engines: object's at once, anyone else's as given."""
    plain = [_Two(1, [2, 3]), _WithMeta(4), _OnDict(5), _Later(6)]
    for tree in (plain, [_OwnNew(7), _OwnNew([8])]):
        leaves, spec = _pure.flatten(tree, None, None)
        _NEW_CALLS.clear()
        a, b = same_outcome("unflatten", spec, leaves)
        assert_same_tree(a[1], b[1])
        assert _NEW_CALLS == ([_OwnNew] * 4 if tree is not plain else [])
        for x, y in zip(a[1], b[1]):
            assert type(x) is type(y) and vars(x) == vars(y)
    # a __new__ given to the class after it was made is seen by both engines
    leaves, spec = _pure.flatten([_Later(1)], None, None)
    _Later.__new__ = lambda cls: _NEW_CALLS.append(cls) or object.__new__(cls)  # type: ignore
    try:
        _NEW_CALLS.clear()
        a, b = same_outcome("unflatten", spec, leaves)
        assert _NEW_CALLS == [_Later, _Later] and b[1][0].x == 1
    finally:
        del _Later.__new__
    _NEW_CALLS.clear()
    assert _speedups.unflatten(spec, leaves)[0].x == 1 and _NEW_CALLS == []


# --------------------------------------------------------------------------
# Record fields read without getattr: slots at their offset and, on CPython 3.11,
# instance values at their index in the class's shared keys. Each case reads
# through the fast path where the class allows it and must still give exactly
# what getattr gives (the pure engine's reads).


_GA = {"x": "ga-x", "y": "ga-y"}  # what a __getattribute__ set on the class gives


def _fresh_classes() -> tuple[type, type]:
    """A dataclass and a slotted one, fields x and y=3: the module's _Plain and
    _Slotted, and fresh ones for the tests that change a class."""

    @dataclasses.dataclass
    class P:
        x: Any
        y: Any = 3

    @dataclasses.dataclass(slots=True)
    class S:
        x: Any
        y: Any = 3

    return P, S


_Plain, _Slotted = _fresh_classes()


class _DataDescr:
    """A data descriptor as a field's default (the class attribute)."""

    def __set_name__(self, owner: type, name: str) -> None:
        self.name = "_" + name

    def __get__(self, obj: Any, owner: Any = None) -> Any:
        return self if obj is None else getattr(obj, self.name, None)

    def __set__(self, obj: Any, value: Any) -> None:
        setattr(obj, self.name, value)


@dataclasses.dataclass
class _Described:
    x: Any = _DataDescr()
    y: Any = 4


class _Mark:
    """A default of a class that can still change."""


@dataclasses.dataclass
class _MarkedDefault:
    x: Any = _Mark()  # noqa: RUF009 - the point of the test


@dataclasses.dataclass
class _OwnGetattribute:
    x: Any
    y: Any

    def __getattribute__(self, name: str) -> Any:
        v = object.__getattribute__(self, name)
        return ("seen", v) if name == "x" else v


@dataclasses.dataclass
class _CachedRecord:
    x: Any

    @functools.cached_property
    def double(self) -> Any:
        return [self.x, self.x]


@dataclasses.dataclass(slots=True)
class _SlotsOnly:
    x: Any


class _SlotsBeyond(_SlotsOnly):
    __slots__ = ("note",)


@dataclasses.dataclass
class _Swap:
    y: Any
    x: Any


def check_reads_agree(tree: Any) -> None:
    """flatten, leaves, paths and flatten_up_to of both engines agree (trees whose
    reads transform a value do not round-trip, so no unflatten here)."""
    a, b = same_outcome("flatten", tree, None, None)
    la, lb = same_outcome("leaves", tree, None, None)
    pa, pb = same_outcome("flatten_with_path", tree, None, None)
    if a[0] == "raise":
        return
    check_leaves_identical(a[1][0], b[1][0])
    check_leaves_identical(la[1], lb[1])
    check_leaves_identical(a[1][0], la[1])
    check_specs_equal(a[1][1], b[1][1])
    assert [p for p, _ in pa[1][0]] == [p for p, _ in pb[1][0]]
    x, y = same_outcome("flatten_up_to", a[1][1], tree)
    check_leaves_identical(x[1], y[1])


def test_record_field_reads_take_the_fast_path_where_they_can() -> None:
    """Which fields the C engine reads without getattr (its codes; 0 is getattr),
    reading them as the specification says (``_pure._field_read``)."""

    def codes(cls: type, names: tuple) -> tuple:
        return _speedups._field_codes(cls, names, tuple(_pure._field_read(cls, n) for n in names))

    _Plain(0), _Described()  # a name enters the shared keys when an instance first sets it
    if _speedups.FAST_PATHS["split_values"]:
        assert all(c < 0 for c in codes(_Plain, ("x", "y")))
        assert codes(_Described, ("x", "y"))[0] == 0 and codes(_Described, ("x", "y"))[1] < 0
    # on for every validated version (split __dict__ values) unless built
    # without fast paths (tests/test_versions.py has every path)
    assert (
        _speedups.NO_FAST_PATHS
        or not _speedups.VALIDATED_PYTHON
        or _speedups.FAST_PATHS["split_values"]
    )
    assert all(c > 0 for c in codes(_Slotted, ("x", "y")))
    assert codes(_MarkedDefault, ("x",)) == (0,)  # its default's class may change
    assert codes(_OwnGetattribute, ("x", "y")) == (0, 0)
    assert codes(_Plain, ("nope",)) == (0,)


class _Grow:
    """A default whose lookup adds more attributes than a class's shared keys
    hold: the instance's __dict__ stops being split while its fields are read."""

    def __get__(self, obj: Any, owner: Any = None) -> Any:
        if obj is None:
            return self
        for i in range(40):
            setattr(obj, f"grown{i}", i)
        return "grown"


@dataclasses.dataclass
class _Grows:
    a: Any
    b: Any = _Grow()
    c: Any = None


def test_a_field_read_that_changes_the_instance_reads_the_rest_safely() -> None:
    """Field b is read by getattr, which runs code that moves the instance's
    values out of the array the fields before it were read from; field c is
    read after it, and must not be read from that old array (without the
    guard in record_read, an ASan build on 3.12 reports a heap-use-after-free
    here)."""

    def fresh() -> _Grows:
        g = _Grows([1], [2], [3])
        del g.b  # getattr finds the class's _Grow
        return g

    _Grows([0])  # the names are in the class's shared keys
    got = [outcome(eng.flatten, [fresh()], None, None) for eng in (_speedups, _pure)]
    assert got[0][0] == got[1][0], got
    if got[0][0] == "raise":
        assert got[0][1:] == got[1][1:]
    else:
        assert got[0][1][0] == got[1][1][0]  # equal leaves: each of its own instance
        assert got[0][1][1] == got[1][1][1]


def test_record_field_reads_match_getattr() -> None:
    """Every way an instance's fields can be found, or not, gives the pure engine's result."""
    _Plain(0), _Described(), _OwnGetattribute(0, 0)  # their names are in the shared keys
    deleted = _Plain([1], [2])
    del deleted.x  # unset: the field goes to the aux data
    defaulted = _Plain([1], [2])
    del defaulted.y  # getattr finds the class's default, 3
    slot_gone = _Slotted([1], [2])
    del slot_gone.y
    as_dict = _Plain([5], [6])
    vars(as_dict)  # the values move to a dict
    replaced = _Plain([5], [6])
    replaced.__dict__ = {"x": "from", "y": "new dict"}
    moved = _Plain("a", "b")
    moved.__class__ = _Swap  # type: ignore[assignment]
    extra = _Plain(1, 2)
    for i in range(40):  # more attributes than the shared keys hold
        setattr(extra, f"extra{i}", i)
    marked = _MarkedDefault()
    cached = _CachedRecord([1])
    cached.double  # noqa: B018 - computed: kept in its __dict__, and not state
    later = _Plain([1], [2])
    later.note = "state"
    swapped = _Plain([1], [2])  # a field deleted, another attribute: the same count
    del swapped.y
    swapped.z = 3
    slotted_extra = _SlotsBeyond([1])
    slotted_extra.note = "state"
    int_key = _Plain([1], [2])
    int_key.__dict__[5] = "a key that is not a name"  # its __dict__ is no longer split
    cases = [
        int_key,
        cached,
        _CachedRecord(2),
        later,
        swapped,
        slotted_extra,
        _SlotsBeyond([3]),
        _Plain([1], {"k": 2}),
        [_Plain(1), _Plain(None, ())],
        deleted,
        defaulted,
        [_Slotted([1]), _Slotted(1, 2)],
        slot_gone,
        _Described([7], 8),
        as_dict,
        replaced,
        moved,
        extra,
        _Wide(),
        marked,
    ]
    # a class's own __getattribute__: both engines refuse it, with one message
    a, _ = same_outcome("flatten", [_OwnGetattribute([1], 2)], None, None)
    assert a[0] == "raise" and "whose class defines __getattribute__" in a[2]
    # state outside the fields (a data descriptor's own storage, attributes
    # beyond the fields): both engines refuse it, with one message
    for odd, names in ((_Described([7], 8), "('_x')"), (extra, "('extra0', 'extra1',")):
        a, _ = same_outcome("flatten", [odd], None, None)
        assert a[0] == "raise" and f"keeps state outside its fields {names}" in a[2]
    for tree in cases:
        check_reads_agree(tree)
        check_reads_agree([tree, tree])
        try:
            spec = _pure.flatten(tree, None, None)[1]
        except TypeError:
            continue  # refused: the same error from both engines, checked above
        for other in cases:
            same_outcome("flatten_up_to", spec, other)
    # a default whose class becomes a data descriptor after the plan was made
    _Mark.__get__ = lambda self, obj, owner=None: "descr"  # type: ignore[attr-defined]
    _Mark.__set__ = lambda self, obj, value: None  # type: ignore[attr-defined]
    try:
        assert _speedups.leaves(marked, None, None) == ["descr"]
        check_reads_agree(marked)
    finally:
        del _Mark.__get__, _Mark.__set__  # type: ignore[attr-defined]


@dataclasses.dataclass
class _LazyBase:
    x: Any
    y: Any = 0


class _LazyY(_LazyBase):
    """Field y is a property whose getter writes to the instance (when adds)."""

    adds = "attr"  # "dict": through its __dict__ (which 3.11+ then makes); None: nothing

    @property  # type: ignore[override]
    def y(self) -> Any:
        if type(self).adds == "dict":
            self.__dict__.setdefault("_seen", 1)
        elif type(self).adds and not hasattr(self, "_seen"):
            object.__setattr__(self, "_seen", 1)  # inline on 3.11+
        return 5

    @y.setter
    def y(self, value: Any) -> None:
        pass


@pytest.mark.thread_unsafe  # logs calls in a list (or a class) the threads would share
@pytest.mark.parametrize("adds", ["attr", "dict"])
def test_state_a_field_getter_adds_while_it_is_read_is_seen_by_both_engines(adds: str) -> None:
    """A getter runs while the C engine reads the fields: it counts the
    instance's own state again afterwards, so both engines refuse what the
    getter added, with one message."""
    _LazyY.adds = adds
    for name in ("flatten", "leaves", "flatten_with_path"):
        got = [outcome(getattr(eng, name), [_LazyY([1])], None, None) for eng in (_pure, _speedups)]
        assert got[0] == got[1] and got[0][0] == "raise", got
        assert "keeps state outside its fields ('_seen')" in got[0][2]
    _LazyY.adds = None
    spec = _pure.flatten([_LazyY([1])], None, None)[1]
    _LazyY.adds = adds
    try:
        got = [outcome(eng.flatten_up_to, spec, [_LazyY([2])]) for eng in (_pure, _speedups)]
        assert got[0] == got[1] and "('_seen')" in got[0][2], got
    finally:
        _LazyY.adds = "attr"


@dataclasses.dataclass
class _FieldsFromInstance:
    """dataclasses.fields(obj) asks the instance, whose class answers with no fields."""

    x: Any

    def __getattribute__(self, name: str) -> Any:
        if name == "__dataclass_fields__":
            return {}
        return object.__getattribute__(self, name)


def test_dataclass_fields_are_asked_of_the_instance() -> None:
    """A class's own __getattribute__, even one that answers __dataclass_fields__
    (the pure engine asks the instance: dataclasses.fields(obj)), makes the record
    unfaithful: both engines refuse it, in the same words."""
    odd = _FieldsFromInstance([1])
    for tree in ([odd, 2], [odd, _OwnGetattribute([3], 4), {"k": odd}]):
        # its own __getattribute__ makes it unfaithful: refused, in the same words
        a, _ = same_outcome("leaves", tree, None, None)
        assert a[0] == "raise" and a[2].startswith("tree[0]: _FieldsFromInstance is a dataclass")


@pytest.mark.parametrize("change", ["property", "getattribute", "slot_default"])
def test_record_field_reads_follow_class_changes(change: str) -> None:
    """A class changed after its reads were worked out is read as it is now."""
    P, S = _fresh_classes()
    trees = [P([1], [2]), S([1], [2])]
    for t in trees:
        check_reads_agree(t)  # plans and reads made
    if change == "property":
        P.x = property(lambda self: "prop")  # type: ignore[attr-defined]
        S.y = property(lambda self: "prop")  # type: ignore[attr-defined]
    elif change == "getattribute":
        for cls in (P, S):
            cls.__getattribute__ = lambda self, name: (  # type: ignore[method-assign]
                _GA[name] if name in _GA else object.__getattribute__(self, name)
            )
    else:
        P.y = 10  # a default set on the class: instances' own values still win
    for t in trees:
        check_reads_agree(t)
        check_reads_agree([t, t])
    if change == "getattribute":  # the class changed under the plan: now refused
        a, _ = same_outcome("leaves", trees, None, None)
        assert a[0] == "raise" and "whose class defines __getattribute__" in a[2]
        return
    got = _speedups.leaves(trees, None, None)
    assert got == _pure.leaves(trees, None, None)
    if change == "property":
        assert got[0] == "prop" and got[3] == "prop"


@pytest.mark.parametrize("where", ["list", "dict", "record"])
def test_record_field_getattr_that_changes_the_tree(where: str) -> None:
    """Records read without getattr run no code, so the C engine keeps reading the
    caller's lists in place around them; a field read with getattr that empties
    the list being flattened must still give the pure engine's result (the list
    as it was when met)."""

    P, _ = _fresh_classes()
    outers: list = []
    sneakies = [P([1], [2]) for _ in range(6)]  # set before y becomes a property
    P.y = property(lambda self: outers[-1].clear() or "read")  # type: ignore[attr-defined]

    def make() -> Any:
        sneaky = sneakies.pop()
        outer: list = []
        outers.append(outer)
        plain = _Plain([3], [4])
        outer.extend([plain, _Plain([5]), sneaky, plain, [6, 7], _Plain(8)])
        if where == "dict":
            return {"a": outer, "b": [sneaky, outer]}
        if where == "record":
            return _Two(outer, _Two([sneaky], outer))
        return outer

    for fn in ("flatten", "leaves", "flatten_with_path"):
        a = outcome(getattr(_pure, fn), make(), None, None)
        b = outcome(getattr(_speedups, fn), make(), None, None)
        assert a[0] == b[0] == "ok"
        if fn == "leaves":
            assert a[1] == b[1] and len(a[1]) > 4
        else:
            assert a[1][0] == b[1][0] and a[1][1] == b[1][1]


@given(st.lists(st.sampled_from(["set", "del", "vars", "dict"]), max_size=6), st.booleans())
def test_record_field_reads_after_any_history(history: list, slotted: bool) -> None:
    """Fields set, deleted, moved to a dict or replaced in any order: both engines agree."""
    obj: Any = _Slotted(0, 1) if slotted else _Plain(0, 1)
    for i, step in enumerate(history):
        name = "xy"[i % 2]
        if step == "set":
            setattr(obj, name, [i])
        elif step == "del" and hasattr(obj, name) and (slotted or name in vars(obj)):
            delattr(obj, name)
        elif step == "vars" and not slotted:
            vars(obj)
        elif step == "dict" and not slotted:
            obj.__dict__ = dict(vars(obj))
        check_reads_agree(obj)
        check_reads_agree({"a": obj, "b": [obj]})


# --------------------------------------------------------------------------
# unflatten copies a dict whose keys it met before in the call from a template
# (CPython 3.11); every copy must be the dict that inserting gives.


class _Str(str):
    pass


def _untracked_pair() -> tuple:
    t = (1, "x")  # a constant: the same tuple each time
    if gc.is_tracked(t):
        gc.collect()  # the collector untracks a tuple of atoms (with torch loaded, ~0.1 s)
    assert not gc.is_tracked(t)
    return t


@contextlib.contextmanager
def _collector_off() -> Iterator[None]:
    """No automatic collection meanwhile (one would untrack a tuple of atoms in
    one result and not another); gc.collect() still runs."""
    was = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was:
            gc.enable()


def _same_dicts(a: Any, b: Any) -> None:
    """Dicts of a and b: same items in the same order, same size in memory,
    same GC tracking; leaves the same objects."""
    da, db = _dicts(a), _dicts(b)
    assert len(da) == len(db)
    for x, y in zip(da, db):
        assert type(x) is type(y)
        assert list(x) == list(y)
        assert gc.is_tracked(x) == gc.is_tracked(y), (x, gc.is_tracked(x))
        _same_size(x, y)


def _same_size(x: dict, y: dict) -> None:
    """y is as large in memory as x."""
    assert sys.getsizeof(x) == sys.getsizeof(y)


def test_dicts_copied_from_templates_match() -> None:
    """Repeated keys of every kind; values tracked, untracked and untracked tuples."""
    if _speedups.VALIDATED_PYTHON and not _speedups.NO_FAST_PATHS:
        assert _speedups.DICT_TABLES
    pair = _untracked_pair()
    leaf = Leaf(0)
    trees = [
        [{"a": i, "b": [i]} for i in range(5)],  # tracked values
        [{"x": i, "y": i + 1, "z": str(i)} for i in range(5)],  # atoms only: untracked
        [{"k": (leaf,)} for _ in range(4)],  # a new tuple: tracked
        [{1: "a", 2: leaf, -5: None} for _ in range(4)],  # int keys
        [{1: "a", "b": 2} for _ in range(3)],  # mixed keys: a general table
        [{_Str("s"): 1, "t": 2} for _ in range(3)],  # a str subclass: built as usual
        [{(1, 2): 1} for _ in range(3)],  # a tuple key of atoms (tracked while new)
        [{(1, (2,)): 1} for _ in range(3)],  # a tuple key holding a tuple: built as usual
        [{f"k{j}": j for j in range(40)} for _ in range(3)],  # a larger table
        [{"a": 1, "b": 2}, {"c": 3}] * 12,  # more key sets than template slots, alternating
        [{f"s{i}": i} for i in range(30)] * 2,  # 30 key sets, each twice
        {"child": {"child": {"child": {"v": 1}, "v": 2}, "v": 3}, "v": 4},
        # insertion orders other than key order
        [{"b": i, "a": [i], "c": str(i)} for i in range(5)],
        [{"b": 1, "a": 2}, {"a": 1, "b": 2}] * 6,  # the same keys, two orders in turn
        [{3: "x", 1: leaf, -2: None} for _ in range(4)],  # int keys
        [{"b": 1, 1: 2, "a": (leaf,)} for _ in range(3)],  # mixed keys: a general table
        [{f"k{j}": j for j in reversed(range(32))} for _ in range(3)],  # the most a template takes
        [{f"k{j}": j for j in reversed(range(33))} for _ in range(3)],  # one more
        [{"z": {"y": i, "x": i}, "a": i} for i in range(4)],  # nested, each level its own
    ]
    for tree, leaf_kind in itertools.product(trees, ("own", "pair", "mixed")):
        leaves, spec_c = _speedups.flatten(tree, None, None)
        if leaf_kind == "pair":  # leaves that are untracked tuples: the dicts stay untracked
            leaves = [pair] * len(leaves)
        elif leaf_kind == "mixed":
            leaves = [pair if i % 2 else [i] for i in range(len(leaves))]
        spec_p = _pure.flatten(tree, None, None)[1]
        specs = [spec_c, spec_p, pickle.loads(pickle.dumps(spec_c))]
        if _json_ok(spec_c):
            specs.append(pk.TreeSpec.from_json(spec_c.to_json()))
        for spec in specs:
            # (a key's own GC tracking counts too, and a pickled key tuple is a new one)
            want = _pure.unflatten(spec, leaves)
            got = _speedups.unflatten(spec, leaves)
            assert got == want
            check_leaves_identical(_pure.flatten_up_to(spec_p, got), leaves)
            _same_dicts(want, got)
            # each result is its own: changing one changes no other, nor a template
            again = _speedups.unflatten(spec, leaves)
            for d in _dicts(got):
                d["added"] = 1
                for j in range(20):
                    d[f"more{j}"] = j
                del d["added"]
            assert again == want
            _same_dicts(want, _speedups.unflatten(spec, leaves))


def test_dicts_of_one_keys_tuple_in_other_orders_match() -> None:
    """Dict nodes that share one keys tuple, each in its own insertion order
    or in key order, one after another (a spec made or edited by hand:
    flatten gives each order of the same keys its own keys tuple): each dict
    is in its own order, as the pure engine builds it, however many of one
    order come before."""
    a, b, c = "a", "b", "c"
    tree = [{c: 0, b: 1, a: 2}] * 3 + [{a: 0, b: 1, c: 2}] * 2
    leaves, spec = _speedups.flatten(tree, None, None)
    nodes = list(spec._nodes)
    ordered = [i for i, _ in spec._orders]
    dict_kind = nodes[ordered[0]][0]
    key_order = [i for i, nd in enumerate(nodes) if nd[0] == dict_kind and i not in ordered]
    assert len(ordered) == 3 and len(key_order) == 2
    # every dict node the first one: one keys tuple; its order only where orders name it
    for i in key_order:
        nodes[i] = nodes[ordered[0]]
    orders = spec._orders
    reversed_keys = (c, a, b)  # a third order, of the same keys tuple
    variants = [
        orders,
        ((ordered[0], orders[0][1]), (ordered[1], reversed_keys), (ordered[2], orders[0][1])),
        (),  # key order for every node
    ]
    for order_set in variants:
        made = pk.TreeSpec._make(tuple(nodes), order_set, spec.num_leaves)
        want = _pure.unflatten(made, leaves)
        for _ in range(3):  # templates noted, made, then kept
            got = _speedups.unflatten(made, leaves)
            assert got == want
            assert [list(d) for d in got] == [list(d) for d in want]


class _Float(float):
    pass


# keys whose hash and equality run no user code (templated, ordered at once),
# and keys next to them that are not (built as usual)
_PLAIN_ATOMS = st.one_of(
    st.integers(-3, 3),
    st.text("ab", max_size=2),
    st.floats(allow_nan=True, allow_infinity=True),
    st.sampled_from([0.0, -0.0, 0.5, 1.0, float("nan"), True, False, None]),
)
_DICT_KEYS = st.one_of(
    _PLAIN_ATOMS,
    st.tuples(_PLAIN_ATOMS, _PLAIN_ATOMS),
    st.tuples(_PLAIN_ATOMS, st.tuples(_PLAIN_ATOMS)),  # a tuple in a tuple: not plain
    st.builds(_Float, st.floats(-2, 2)),  # a float subclass: not plain
    st.tuples(_PLAIN_ATOMS, st.builds(_Str, st.text("ab", max_size=1))),
)


@settings(max_examples=150, deadline=None)
@given(
    st.lists(_DICT_KEYS, min_size=1, max_size=8),
    st.randoms(use_true_random=False),
    st.booleans(),
    st.sampled_from(["own", "pair", "atoms"]),
)
def test_dicts_of_float_tuple_and_none_keys_match(
    keys: list, rng: random.Random, untrack_keys: bool, leaf_kind: str
) -> None:
    """Dicts keyed by floats (NaN, -0.0 next to 0.0), bools, None and tuples of
    such, in a shuffled insertion order, each key set met four times in a call
    and again in later calls (templates from the second time, kept across
    calls): every dict is what the pure engine gives, in items, order, size
    and GC tracking (a tracked tuple key tracks its dict), with tuple keys
    tracked or already untracked by a collection."""
    pair = _untracked_pair() if leaf_kind == "pair" else None
    with _collector_off():
        # tuple keys made again now: tracked (hypothesis's may have met a collection)
        fresh = [tuple(list(k)) if type(k) is tuple else k for k in keys]
        d = dict.fromkeys(fresh, 0)
        order = list(d)
        rng.shuffle(order)
        tree = [{k: [i] if leaf_kind == "own" else i for k in order} for i in range(4)]
        tree.append({"inner": dict(tree[0]), "x": 1})
        if untrack_keys:
            # tuples of atoms among the keys (new, so in the youngest
            # generation: no collection has run since) are untracked
            gc.collect(0)
        leaves, spec = _speedups.flatten(tree, None, None)
        if pair is not None:
            leaves = [pair] * len(leaves)
        for _ in range(3):
            want = _pure.unflatten(spec, leaves)
            got = _speedups.unflatten(spec, leaves)
            assert_same_tree(want, got)
            _same_dicts(want, got)
            for w, g in zip(_dicts(want), _dicts(got)):
                assert all(a is b for a, b in zip(w, g))  # the keys themselves
                for k in g:  # each found by lookup, as an equal key finds it
                    assert g[k] == w[k]


def test_dicts_of_tuple_keys_tracked_as_inserting_gives() -> None:
    """A dict of untracked values is tracked for a tracked tuple key alone, and
    a template made while its key was tracked serves a later call after a
    collection untracked the key: its copies are then untracked. (A template
    made after the collection: test_dicts_of_float_tuple_and_none_keys_match
    with untrack_keys.)"""
    # (3.14 tracks every dict, and no tuple of atomic values: then only the
    # comparison with inserting is left to check)
    untracking = sys.version_info < (3, 14)
    with _collector_off():
        key = tuple([1, "y"])  # made now: tracked (a constant (1, "y") is not)
        assert gc.is_tracked(key) == untracking
        tree = [{key: i, 2.5: i} for i in range(3)]
        leaves, spec = _speedups.flatten(tree, None, None)
        for _ in range(2):
            got = _speedups.unflatten(spec, leaves)
            want = _pure.unflatten(spec, leaves)
            assert got == tree and [gc.is_tracked(d) for d in got] == [True] * 3
            assert [gc.is_tracked(d) for d in want] == [True] * 3
        gc.collect()
        assert not gc.is_tracked(key)
        for _ in range(2):
            got = _speedups.unflatten(spec, leaves)
            want = _pure.unflatten(spec, leaves)
            assert got == tree
            assert [gc.is_tracked(d) for d in got] == [gc.is_tracked(d) for d in want]
            assert all(gc.is_tracked(d) for d in got) != untracking


def _config_like(seed: int, n: int) -> dict:
    """n dicts each of its own keys and insertion order (none sorted), nested."""
    out: dict = {}
    for i in range(n):
        keys = [f"c{seed}_{i}_{j}" for j in range(2 + i % 5)][::-1]
        out[f"s{seed}_{i}"] = {k: ([j] if j % 2 else j) for j, k in enumerate(keys)}
    return out


# --------------------------------------------------------------------------
# unflatten makes a large tree's containers untracked by the collector and
# tracks them when it ends (CPython 3.10 and 3.11; at once elsewhere): each
# must end as tracked as the pure engine's, and callbacks that see them
# untracked must not break that.


class _Keeper:
    """A protocol class whose __tree_unflatten__ keeps its children and puts
    itself into its dict child: a cycle made while that dict is new."""

    def __init__(self, fields: dict) -> None:
        self.fields = fields

    def __tree_flatten__(self) -> tuple:
        return (self.fields,), None

    @classmethod
    def __tree_unflatten__(cls, aux: Any, children: tuple) -> _Keeper:
        obj = cls(children[0])
        children[0]["owner"] = obj  # inserting a tracked value tracks the dict
        del children[0]["owner"]
        children[0]["self"] = obj
        return obj


def test_large_trees_end_tracked_as_the_pure_engines() -> None:
    """Trees of 600 to 5,000 containers (past the engine's threshold for
    deferring): dicts from templates, lists and tuples, with leaves tracked,
    untracked and untracked tuples. Every container is tracked exactly when the
    pure engine's is, and the collector has each tracked one in its lists."""
    pair = _untracked_pair()
    leaf = Leaf(0)
    # what exists now is left out of the collections and gc.get_objects() below
    # (with torch and jax loaded each walked every object: ~10 s in all)
    gc.freeze()
    try:
        _check_large_trees_tracked(pair, leaf)
    finally:
        gc.unfreeze()


def _check_large_trees_tracked(pair: tuple, leaf: Any) -> None:
    trees = [
        [{"a": i, "b": [i], "c": (i, leaf)} for i in range(600)],
        [{"x": i, "y": str(i)} for i in range(1500)],  # atoms only: untracked dicts
        [{"x": i, "t": (i, leaf)} for i in range(600)],  # tracked only for its tuple
        [(i, [i]) for i in range(5000)],
        {f"k{i}": [{"v": i}, (i,)] for i in range(700)},
    ]
    for tree, leaf_kind in itertools.product(trees, ("own", "pair", "mixed")):
        leaves, spec = _speedups.flatten(tree, None, None)
        if leaf_kind == "pair":
            leaves = [pair] * len(leaves)
        elif leaf_kind == "mixed":
            leaves = [pair if i % 2 else [i] for i in range(len(leaves))]
        want = _pure.unflatten(spec, leaves)
        got = _speedups.unflatten(spec, leaves)
        assert got == want
        a, b = _containers(want), _containers(got)
        assert len(a) == len(b) >= 600
        # A collection untracks the tuples of atoms, then the dicts of atoms, that
        # it meets: after one, what stays tracked is what must be. (A free-threaded
        # build's collector meets them in heap order, a dict perhaps before its
        # tuple: a second collection untracks that dict.)
        gc.collect()
        if FREE_THREADED:
            gc.collect()
        assert [gc.is_tracked(x) for x in a] == [gc.is_tracked(y) for y in b]
        known = {id(o) for o in gc.get_objects()}
        assert all(id(y) in known for y in b if gc.is_tracked(y))
        _same_dicts(want, got)


def test_large_trees_callbacks_that_track_or_keep_children() -> None:
    """A callback that makes a new dict child tracked (by inserting into it)
    and a cycle through it: the call ends with every container tracked once,
    and the cycle is collected when the result is dropped."""
    import weakref

    tree = [_Keeper({"a": i, "b": [i]}) for i in range(800)]
    leaves, spec = _speedups.flatten(tree, None, None)
    got = _speedups.unflatten(spec, leaves)
    assert [type(x) for x in got] == [_Keeper] * 800
    assert all(x.fields["self"] is x and gc.is_tracked(x.fields) for x in got)
    refs = [weakref.ref(x) for x in got[::100]]
    del got
    gc.collect()
    assert all(r() is None for r in refs)


@pytest.mark.thread_unsafe  # counts references other threads' calls share
def test_large_trees_failing_midway_leak_nothing() -> None:
    """An error after 3,000 containers are made: the error is the pure
    engine's, and every container made is freed (the leaves' counts are back)."""
    leaf = Leaf(1)
    # (unflatten builds from the last node back: the dicts come before the error)
    tree = [BadRebuild(0), [{"a": leaf, "b": (leaf,)} for _ in range(1000)]]
    leaves, spec = _speedups.flatten(tree, None, None)
    before = sys.getrefcount(leaf)
    for _ in range(3):
        with pytest.raises(RuntimeError, match="rebuild refused"):
            _speedups.unflatten(spec, leaves)
    with pytest.raises(RuntimeError, match="rebuild refused"):
        _pure.unflatten(spec, leaves)
    gc.collect()
    assert sys.getrefcount(leaf) == before


def test_kept_templates_serve_later_calls_match() -> None:
    """Dicts whose keys come once per tree get their templates in later calls
    (kept across calls, CPython 3.11 to 3.13): each call's result is what the
    pure engine gives, each dict its own, from the same spec and from a new
    flatten each time."""
    tree = _config_like(0, 40)
    leaves, spec = _speedups.flatten(tree, None, None)
    want = _pure.unflatten(spec, leaves)
    results = []
    for _ in range(4):
        got = _speedups.unflatten(spec, leaves)
        assert got == want and list(got) == list(want)
        _same_dicts(want, got)
        again_leaves, again_spec = _speedups.flatten(tree, None, None)
        check_specs_equal(again_spec, spec)
        mapped = _speedups.unflatten(again_spec, again_leaves)
        _same_dicts(tree, mapped)
        results += [got, mapped]
    for d in _dicts(results[0]):
        d["added"] = 1
    for r in results[1:]:
        assert r == want
        _same_dicts(want, r)


@pytest.mark.thread_unsafe  # counts references other threads' calls share
@pytest.mark.parametrize("make_key", [lambda u: u, lambda u: (1, u), lambda u: (u,)])
def test_kept_templates_keep_no_key_of_a_user_type(make_key: Any) -> None:
    """A key that is not plain (an exact str, int or float, a bool, None, or a
    tuple of those) is never kept, nor a tuple that holds one: once the tree,
    its spec and the results are gone, the user object's count is what it was."""
    user = _Str("user")
    base = sys.getrefcount(user)
    key = make_key(user)
    tree = [{key: i, "t": [i]} for i in range(3)]
    leaves, spec = _speedups.flatten(tree, None, None)
    for _ in range(3):
        assert _speedups.unflatten(spec, leaves) == tree
    del tree, leaves, spec, key
    gc.collect()
    assert sys.getrefcount(user) == base


def test_kept_templates_are_bounded() -> None:
    """Templates are kept for a bounded number of key sets: rounds of new key
    sets, each unflattened twice, stop growing the memory held after the first
    rounds have filled every slot."""
    import tracemalloc

    def one_round(r: int) -> None:
        tree = [{f"r{r}_{i}_a": i, f"r{r}_{i}_b": i} for i in range(1500)]
        leaves, spec = _speedups.flatten(tree, None, None)
        _speedups.unflatten(spec, leaves)
        _speedups.unflatten(spec, leaves)

    tracemalloc.start()  # (before the slots fill: what they let go of is then traced too)
    try:
        for r in range(3):  # past the slots' count
            one_round(r)
        for i in range(8_000):  # flatten's memo of key orders, filled too
            _speedups.flatten({f"w{i}_a": 0, f"w{i}_b": 1}, None, None)
        gc.collect()
        start = tracemalloc.get_traced_memory()[0]
        for r in range(3, 9):
            one_round(r)
        gc.collect()
        grown = tracemalloc.get_traced_memory()[0] - start
    finally:
        tracemalloc.stop()
    # 6 rounds of 1,500 new key sets: unbounded keeping would hold over 1 MB.
    # What the slots hold moves with the entries each set lets go of (their
    # keys' lengths, their templates' tables): -27 to +87 KiB over 20 runs on
    # 3.12, so a tighter bound failed one run in five
    assert grown < 256 * 1024, grown


def test_kept_templates_rewritten_during_a_call_match() -> None:
    """A collection in the middle of unflatten (on CPython 3.11 an allocation
    may start one; the dict free list is kept empty so that making a dict
    allocates) whose callback unflattens 3,000 other key sets, more than there
    are slots, twice: the slots the call is using are noted again and given
    other templates under it; every result still matches."""
    forward = [{f"g{i}": i} for i in range(3000)]
    backward = forward[::-1]
    # each collection ends with the key sets backward and the next begins
    # forward: a slot's last key set in one is its first in the next, so a
    # template wrongly stored in its slot in between would be used
    churn = [(t, _speedups.flatten(t, None, None)) for t in (forward, backward)]
    busy: list = []
    wrong: list = []

    def collect(phase: str, info: dict) -> None:
        if phase != "start" or busy or not inside:
            return
        busy.append(1)
        try:
            for t, (leaves, spec) in churn:
                if _speedups.unflatten(spec, leaves) != t:
                    wrong.append(1)
            held.append([{} for _ in range(100)])  # the free list emptied again
        finally:
            busy.pop()

    trees = [
        [{"b": i, "a": [i], "c": str(i)} for i in range(6)],
        [{"k1": i, "k0": (i,)} for i in range(6)] + [{"k0": 1, "k1": 2}] * 3,
        _config_like(1, 12),
    ]
    specs = [_speedups.flatten(t, None, None) for t in trees]
    held: list = []
    inside: list = []  # collections in the calls under test only
    old = gc.get_threshold()
    gc.callbacks.append(collect)
    gc.set_threshold(1)
    try:
        for _ in range(40):
            for t, (leaves, spec) in zip(trees, specs):
                held.append([{} for _ in range(100)])
                inside.append(1)
                got = _speedups.unflatten(spec, leaves)
                inside.pop()
                # (GC tracking is not compared: collections untrack dicts as they go)
                assert got == t
                assert [list(d) for d in _dicts(got)] == [list(d) for d in _dicts(t)]
                for x, y in zip(_dicts(t), _dicts(got)):
                    _same_size(x, y)
    finally:
        gc.set_threshold(*old)
        gc.callbacks.remove(collect)
    assert not wrong


def _holed(d: dict, drop: Any) -> dict:
    """d with a key deleted after it was inserted: a hole in its table."""
    d = dict(d)
    d[drop] = "gone"
    del d[drop]
    return d


def test_dict_tables_read_directly_match() -> None:
    """flatten, leaves and flatten_up_to read a dict's table directly when it has no
    holes (CPython 3.11 to 3.13): tables with holes, int and mixed keys, re-inserted keys,
    insertion orders other than the sorted one, and large dicts."""
    big = {f"k{i:03d}": i for i in range(50)}
    reinserted = {"a": 1, "b": 2, "c": 3}
    reinserted["a"] = reinserted.pop("a")
    cases = [
        {"b": 1, "a": [2]},
        _holed({"b": 1, "a": [2]}, "z"),
        _holed({3: "x", 1: "y"}, 2),
        {3: "x", 1: "y", -7: [None]},
        {1: "x", "a": "y"},
        reinserted,
        big,
        _holed(big, "zzz"),
        dict(reversed(list(big.items()))),
        {"outer": [_holed({"y": 1, "x": 2}, "w"), {"x": 3, "y": 4}]},
    ]
    for tree in cases:
        check_engines_agree(tree)
        check_engines_agree([tree, tree, {"d": tree}])
    for a, b in itertools.product(cases, repeat=2):
        spec = _pure.flatten(a, None, None)[1]
        same_outcome("flatten_up_to", spec, b)
        same_outcome("flatten_up_to", spec, b, "the first tree", "rest[1]")


@pytest.mark.thread_unsafe  # counts references other threads' calls share
def test_large_dicts_rebuilt_again_match() -> None:
    """A large dict node with an insertion order, unflattened again and again
    (the C engine copies a template of its order from the second time on):
    each result equals the pure engine's in items, order, size in memory and GC
    tracking, is its own (changing one changes no other), with leaves of every
    kind; more orders than the engine remembers, in turn; no reference is
    kept or lost."""
    pair = _untracked_pair()
    orders = []
    for m in range(6):  # more than the engine's BIG_ORDERS
        keys: list[Any] = [f"layer.{i}.w{m}" for i in range(40 + m)]
        keys.reverse()
        orders.append(keys)
    orders.append([10**6 + i for i in range(50, 0, -1)])  # int keys, none of them cached
    trees = [{k: Leaf(i) for i, k in enumerate(keys)} for keys in orders]
    refs: list = []
    for round in range(4):
        if round == 2:
            gc.collect()
            refs = [[sys.getrefcount(k) for k in keys] for keys in orders]
        for tree in trees:
            leaves, spec = _speedups.flatten(tree, None, None)
            for kind in ("own", "pair", "atoms"):
                vals = {
                    "own": leaves,
                    "pair": [pair] * len(leaves),
                    "atoms": list(range(len(leaves))),
                }[kind]
                want = _pure.unflatten(spec, vals)
                got = _speedups.unflatten(spec, vals)
                assert got == want
                assert list(got) == list(want) == list(tree)
                _same_dicts(want, got)
                again = _speedups.unflatten(spec, vals)
                got["added"] = 1
                del got[next(iter(tree))]
                assert again == want and list(again) == list(tree)
                again = None
                got = want = None
            leaves = spec = None
    gc.collect()
    # what the engine remembers holds keys alive, but calls again take nothing more
    assert [[sys.getrefcount(k) for k in keys] for keys in orders] == refs


RecipePoint = namedtuple("RecipePoint", "x y")


def _recipe_trees() -> list[Any]:
    """Trees of every node the C engine's unflatten recipe treats its own way."""
    big = {f"layer.{i}.weight": Leaf(i) for i in range(40, 0, -1)}  # ordered, > 32 keys
    return [
        _chain_of_dicts(30),
        [{"b": Leaf(i), "a": [Leaf(i)], "c": (i,)} for i in range(20)],  # records
        {"z": big, "a": dict(sorted(big.items())), "m": OrderedDict(b=1, a=2)},
        {1: {"x": RecipePoint(1, [2]), "w": None}, 0: defaultdict(list, b=[1], a=2)},
        [Node([1, {"q": 2}], ({"p": 3},), "lbl"), ModelOutput(logits=1, loss=None)],
        {("t", 1): 1, (0,): 2, 2.5: 3, None: 4},  # keys a template takes, tuples too
        {"e": {}, "l": [], "t": (), "n": None, "one": [Leaf(0)]},
    ]


def test_unflatten_recipe_made_on_second_call_and_followed() -> None:
    """The C engine's unflatten notes a spec the first time, makes its recipe
    (kept in the spec, out of its value) the second time, and follows it from
    then on: each call's tree is the pure engine's, with the leaves given
    (by identity) and new containers every time."""
    for tree in _recipe_trees():
        leaves, spec = _speedups.flatten(tree, None, RULES)
        want = _pure.unflatten(spec, leaves)
        assert spec._recipe is None
        made = []
        for call in range(4):
            got = _speedups.unflatten(spec, leaves)
            assert_same_tree(want, got)
            made.append(got)
            if call == 0:
                assert spec._recipe is False
            else:
                assert type(spec._recipe).__name__ == "Recipe"
        # every call's containers are its own
        assert len({id(t) for t in made}) == 4
        # a recipe is no part of the spec's value
        again = _speedups.flatten(tree, None, RULES)[1]
        assert again == spec and hash(again) == hash(spec) and again._recipe is None
        copied = pickle.loads(pickle.dumps(spec))
        assert copied == spec and copied._recipe is None
        assert_same_tree(want, _speedups.unflatten(copied, leaves))
        if _json_ok(spec):
            assert spec.to_json() == again.to_json()


# operations on a dict, each applied to an unflattened dict and to a plain
# dict with the same items, which must agree: (name, key index, value)
_DICT_OPS = st.tuples(
    st.sampled_from(["set", "del", "pop", "popitem", "setdefault", "update", "copy", "clear"]),
    st.integers(0, 11),
    st.integers(0, 3),
)


def _dict_key(i: int) -> Any:
    """The template's keys (0-5), new str keys (6-9), an int key and a tuple key."""
    return ("y", "x", "w", "k3", "k4", "k5", "new0", "new1", "new2", "new3", 7, ("t", 1))[i]


@settings(max_examples=60, deadline=None)
@given(
    st.integers(1, 6),
    st.lists(st.tuples(st.integers(0, 3), _DICT_OPS), max_size=40),
)
def test_unflattened_dicts_of_a_recipe_behave_as_dicts(width: int, ops: list) -> None:
    """The dicts a spec's recipe makes (copies of a template's table where
    dict_tables is on) are dicts like any other: four of them, and one made
    again after the others were changed, agree with plain dicts under inserts
    of new str keys, other keys, deletes, pops, copies and clearing: items,
    order, lookup, size, equality, repr and pickling."""
    # What exists before the example stays out of its collection at the end
    # (with torch and jax loaded, a gc.collect() walking the whole heap took
    # ~1 s an example); the dicts made here are still walked.
    gc.freeze()
    try:
        _dicts_of_a_recipe(width, ops)
    finally:
        gc.unfreeze()


def _dicts_of_a_recipe(width: int, ops: list) -> None:
    names = [_dict_key(i) for i in range(width)]
    tree = [{k: [i, k] for i, k in enumerate(reversed(names))} for _ in range(4)]
    leaves, spec = _speedups.flatten(tree, None, None)
    for _ in range(2):
        _speedups.unflatten(spec, leaves)  # the second makes the recipe
    got = _speedups.unflatten(spec, leaves)
    assert type(spec._recipe).__name__ == "Recipe"
    models = [dict(d) for d in got]

    def agree() -> None:
        for d, m in zip(got, models):
            assert list(d.items()) == list(m.items()) and d == m and len(d) == len(m)
            assert all(d[k] is m[k] for k in m) and repr(d) == repr(m)
            assert pickle.loads(pickle.dumps(d)) == m
        # the C engine reads them (directly where it can) as the pure engine does
        check_engines_agree(got)

    for which, (op, ki, v) in ops:
        d, m, k = got[which], models[which], _dict_key(ki)
        if op == "set":
            d[k] = m[k] = v
        elif op == "del":
            if k in m:
                del d[k], m[k]
            else:
                with pytest.raises(KeyError):
                    del d[k]
        elif op == "pop":
            assert d.pop(k, None) == m.pop(k, None)
        elif op == "popitem":
            if m:
                assert d.popitem() == m.popitem()
        elif op == "setdefault":
            assert d.setdefault(k, v) == m.setdefault(k, v)
        elif op == "update":
            d.update({k: v, "new3": v})
            m.update({k: v, "new3": v})
        elif op == "copy":
            c = d.copy()
            c["copied"] = 1
            assert "copied" not in d and c == {**m, "copied": 1}
        elif op == "clear" and v == 0:
            d.clear()
            m.clear()
        agree()
    # a dict made after the others changed the shared table: as flattened
    again = _speedups.unflatten(spec, leaves)
    assert_same_tree(again, _pure.unflatten(spec, leaves))
    assert [list(d) for d in again] == [list(d) for d in tree]
    for d in again:
        assert "new0" not in d and d.get("copied") is None
    gc.collect()
    agree()


def test_instance_dicts_flatten_as_the_pure_engine_does() -> None:
    """Split tables CPython makes (a class's instance __dict__, and copies of
    it), in the shared table's order, in another, then after a delete and
    with a key added (which the shared table takes): flatten, leaves and
    flatten_up_to read them as the pure engine does (the C engine reads a
    split table in place where its order is its table's, on 3.10-3.12)."""

    class Obj:
        pass

    def check(d: dict) -> None:
        # (spec equality leaves insertion orders out: the rebuilt trees show them)
        for tree in (d, {"d": d, "list": [d, d]}):
            check_engines_agree(tree)

    made = []
    for order in ((0, 1, 2), (2, 0, 1), (0, 1), (1,)):
        o = Obj()
        for i in order:
            setattr(o, f"name{i}", [i])
        made += [vars(o), vars(o).copy()]
    made.append(dict(made[2]))  # an inserted dict beside them
    for d in made:
        check(d)
    changed = [made[0].copy(), made[1].copy()]
    del changed[0]["name1"]
    changed[1]["extra"] = (9,)
    for d in made + changed:
        check(d)


@pytest.mark.thread_unsafe  # counts references other threads' calls share
def test_unflatten_recipes_give_back_their_keys() -> None:
    """A recipe's templates hold the keys of its dicts while the recipe or a
    dict lives, and give them back when the last is gone; a dict that
    outlives its spec stays whole."""
    keys = ["".join(("key", str(i))) for i in range(3)]  # not interned: counts are exact
    tree = [{k: [i] for i, k in enumerate(keys)} for _ in range(5)]
    # the module's kept template for these keys, and flatten's memo, hold them
    leaves, spec = _speedups.flatten(tree, None, None)
    _speedups.unflatten(spec, leaves)
    del spec
    before = [sys.getrefcount(k) for k in keys]
    leaves, spec = _speedups.flatten(tree, None, None)
    for _ in range(3):
        got = _speedups.unflatten(spec, leaves)
    kept = got[2]
    del got, spec
    gc.collect()
    assert list(kept) == keys and [kept[k] for k in keys] == [[0], [1], [2]]
    kept["extra"] = 1  # the copy grows as any dict does
    assert list(kept) == [*keys, "extra"]
    del kept
    gc.collect()
    assert [sys.getrefcount(k) for k in keys] == before


def test_unflatten_recipe_follows_the_specs_own_nodes() -> None:
    """A recipe serves only the nodes and orders it was made from: a spec
    whose slots are set again (by object.__setattr__) is unflattened as its
    new nodes say, with a recipe made again."""
    a, b = {"y": [1, 2], "x": {"q": 3, "p": 4}}, [(1, 2), {"z": 3, "w": [4]}]
    la, sa = _speedups.flatten(a, None, None)
    lb, sb = _speedups.flatten(b, None, None)
    for _ in range(3):
        _speedups.unflatten(sa, la)
    for _ in range(3):
        object.__setattr__(sa, "_nodes", sb._nodes)
        object.__setattr__(sa, "_orders", sb._orders)
        assert_same_tree(_speedups.unflatten(sa, lb), _pure.unflatten(sb, lb))
    assert_same_tree(_speedups.unflatten(sb, lb), b)


def test_unflatten_recipe_in_a_cycle_is_collected() -> None:
    """A recipe holds its spec's nodes; a node's aux data that holds the spec
    makes a cycle through the recipe, which the collector frees."""
    import weakref

    class Holder:  # hashable by identity, and mutable
        spec: Any = None

    class Box:
        def __init__(self, x: Any, aux: Holder) -> None:
            self.x, self.aux = x, aux

        def __tree_flatten__(self) -> tuple:
            return (self.x,), self.aux

        @classmethod
        def __tree_unflatten__(cls, aux: Holder, children: tuple) -> Box:
            return cls(children[0], aux)

    aux = Holder()
    ref = weakref.ref(aux)
    leaves, spec = _speedups.flatten({"b": Box([1, 2], aux), "a": 3}, None, None)
    aux.spec = spec  # aux -> spec -> recipe -> nodes -> aux
    for _ in range(3):
        assert _speedups.unflatten(spec, leaves)["b"].x == [1, 2]
    assert type(spec._recipe).__name__ == "Recipe"
    del aux, leaves, spec
    gc.collect()
    assert ref() is None


def test_unflatten_recipe_with_callbacks_that_unflatten_and_change_the_leaves() -> None:
    """A __tree_unflatten__ that unflattens the very spec being followed
    (its recipe in use) and then empties the caller's list of leaves: on every
    call, recipe or not, the C engine gives the pure engine's tree or error."""
    state: dict = {}

    class Meddler:
        def __init__(self, x: Any) -> None:
            self.x = x

        def __tree_flatten__(self) -> tuple:
            return (self.x,), None

        @classmethod
        def __tree_unflatten__(cls, aux: Any, children: tuple) -> Meddler:
            if state.get("depth", 0) < 1:
                state["depth"] = 1
                try:
                    inner = state["engine"].unflatten(state["spec"], list(state["leaves"]))
                    state["inner"].append(inner)
                finally:
                    state["depth"] = 0
            if state.get("clear"):
                state["given"].clear()
            return cls(children[0])

        def __eq__(self, other: object) -> bool:
            return type(other) is Meddler and other.x == self.x

    tree = {"b": [Meddler({"y": 1, "x": [2]}), 3], "a": {"q": (4,), "p": 5}}
    leaves, spec = _speedups.flatten(tree, None, None)
    for clear in (False, True):
        for _ in range(3):
            outcomes = []
            for engine in (_pure, _speedups):
                given = list(leaves)
                state.update(
                    engine=engine, spec=spec, leaves=leaves, inner=[], clear=clear, given=given
                )
                outcomes.append((outcome(engine.unflatten, spec, given), len(state["inner"])))
            (p, pn), (c, cn) = outcomes
            assert pn == cn == 1
            assert p[0] == c[0]
            if p[0] == "ok":
                assert_same_tree(p[1], c[1], identical_leaves=False)
            else:
                assert p[1:] == c[1:]


def test_large_dict_orders_remembered_across_calls() -> None:
    """Dicts of more than 32 keys, flattened again and again (the C engine
    remembers a few large key orders by the identity of their keys, and reads
    a dict of the same keys in the same order without sorting): the same
    keys in another order, a key moved to the end, a key replaced by an equal
    other object, one key more, one fewer, values changed, more key sets than
    it remembers, and keys of other types; both engines agree each time."""
    names = [f"blocks.{i}.attn.weight" for i in range(40)]
    base = {k: Leaf(i) for i, k in enumerate(names)}
    moved = dict(base)
    moved[names[3]] = moved.pop(names[3])
    equal_key = {("".join(list(k)) if i == 7 else k): v for i, (k, v) in enumerate(base.items())}
    others = [{f"set{m}.{i}": i for i in range(35)} for m in range(6)]
    variants: list[Any] = [
        base,
        dict(base),  # the same key objects, in the same order
        {k: [v] for k, v in base.items()},  # other values
        dict(reversed(list(base.items()))),
        moved,
        equal_key,
        {**base, "zzz": 1},
        {k: v for k, v in base.items() if k != names[0]},
        dict(sorted(base.items())),  # in sorted order: no order in the spec
        {i * 3: Leaf(i) for i in range(50, 0, -1)},  # int keys
        {**{i: i for i in range(40)}, "s": 1},  # mixed keys: not remembered
        *others,
    ]
    for _ in range(3):
        for tree in variants:
            check_engines_agree(tree)
            check_engines_agree({"outer": [tree, tree]})
            a, b = same_outcome("iter_leaves", tree, None, None)
            assert a[0] == "ok" and list(a[1]) == list(b[1])


def test_large_dict_orders_replaced_by_a_collection_in_between() -> None:
    """The garbage collector runs user code (here a gc callback) at almost
    every allocation of a tracked object, and that code flattens and rebuilds
    other large dicts, replacing the orders the C engine remembers between
    (and, where an allocation starts a collection, during) its reads and
    builds of the first ones: every result is still what it should be."""
    keysets = [[f"m{m}.{i}" for i in range(60, 0, -1)] for m in range(8)]
    trees = [{k: Leaf(i) for i, k in enumerate(ks)} for ks in keysets]
    specs = [_speedups.flatten(t, None, None) for t in trees]
    busy = []

    def churn(phase: str, info: dict) -> None:
        if phase != "start" or busy:
            return
        busy.append(1)
        try:
            for t, (leaves, spec) in zip(trees[4:], specs[4:]):
                _speedups.flatten(t, None, None)
                _speedups.unflatten(spec, leaves)
        finally:
            busy.pop()

    old = gc.get_threshold()
    gc.callbacks.append(churn)
    gc.set_threshold(1)
    try:
        for _ in range(3):
            for t, (leaves, spec) in zip(trees[:4], specs[:4]):
                got = _speedups.flatten(t, None, None)
                check_leaves_identical(got[0], leaves)
                check_specs_equal(got[1], spec)
                check_leaves_identical(_speedups.flatten_up_to(spec, t), leaves)
                rebuilt = _speedups.unflatten(spec, leaves)
                assert rebuilt == t and list(rebuilt) == list(t)
    finally:
        gc.set_threshold(*old)
        gc.callbacks.remove(churn)


@pytest.mark.thread_unsafe  # counts references other threads' calls share
def test_dict_copies_keep_refcounts() -> None:
    keys = [f"key{i}" for i in range(3)]
    vals = [Leaf(i) for i in range(3)]
    tree = [dict(zip(keys, vals)) for _ in range(50)]
    leaves, spec = _speedups.flatten(tree, None, None)
    # warm calls: the template kept for these keys holds a reference to each,
    # and so does the spec's recipe (its templates)
    for _ in range(2):
        _speedups.unflatten(spec, leaves)
    before = [sys.getrefcount(x) for x in keys + vals]
    for _ in range(100):
        out = _speedups.unflatten(spec, leaves)
        del out
    assert [sys.getrefcount(x) for x in keys + vals] == before


def _containers(tree: Any) -> list:
    """Every dict, list and tuple in a tree of them, in pre-order."""
    out, todo = [], [tree]
    while todo:
        t = todo.pop()
        if isinstance(t, (dict, list, tuple)):
            out.append(t)
            todo.extend(reversed(list(t.values() if isinstance(t, dict) else t)))
    return out


def _dicts(tree: Any) -> list:
    """Every dict in a tree of dicts, lists and tuples, in pre-order."""
    return [t for t in _containers(tree) if isinstance(t, dict)]


def test_rule_specs_match_by_flatten_up_to() -> None:
    from scripts.corpus.trees import Opaque

    tree = {"o": Opaque([1, [2, 3]], 2)}
    spec = _pure.flatten(tree, None, RULES)[1]
    for o in (tree, {"o": Opaque([1, [2, 3]], 3)}, {"o": Opaque([1], 2)}, {"o": 5}):
        same_outcome("flatten_up_to", spec, o)


def test_depth_a_million() -> None:
    """No C recursion on user data: a million levels, every operation."""
    depth = 1_000_000
    tree: Any = 0
    for _ in range(depth):
        tree = [tree]
    leaves, spec = _speedups.flatten(tree, None, None)
    assert leaves == [0] and spec.num_nodes == depth + 1
    assert _speedups.leaves(tree, None, None) == [0]
    assert _speedups.flatten_up_to(spec, tree) == [0]
    back = _speedups.unflatten(spec, [1])
    assert _speedups.leaves(back, None, None) == [1]
    pairs, _ = _speedups.flatten_with_path(tree, None, None)
    assert len(pairs[0][0]) == depth
    del tree, back, pairs  # freeing a deep list is CPython's own (trashcan) business


@pytest.mark.thread_unsafe  # counts references other threads' calls share
def test_leaf_refcounts_unchanged() -> None:
    leaf = Leaf(1)
    tree = {"a": [leaf, (leaf, None)], "b": Node(leaf, [leaf])}
    before = sys.getrefcount(leaf)
    for _ in range(1000):
        leaves, spec = _speedups.flatten(tree, None, None)
        _speedups.unflatten(spec, leaves)
        _speedups.flatten_up_to(spec, tree)
        _speedups.flatten_with_path(tree, None, None)
        _speedups.leaves(tree, None, None)
        del leaves, spec
    assert sys.getrefcount(leaf) == before


@settings(max_examples=50)
@given(trees())
def test_no_reference_cycles_made(tree: Any) -> None:
    import gc

    # what exists now is left out of the collections below (with torch and jax
    # loaded, walking it takes ~0.1 s a collection, as a gc.collect() here
    # would, each example); a cycle made by the calls is among the new objects,
    # which gc.collect() still examines
    gc.freeze()
    gc.disable()
    try:
        leaves, spec = _speedups.flatten(tree, None, RULES)
        _speedups.unflatten(spec, leaves)
        _speedups.flatten_up_to(spec, tree)
        del leaves, spec
        assert gc.collect() == 0
    finally:
        gc.enable()
        gc.unfreeze()


# -- hostile input, fuzzed (scripts/corpus/hostile.py; scripts/fuzz_engines.py runs 100,000) --


@given(st.integers(0, 2**63))
def test_hostile_cases_agree(seed: int) -> None:
    """A tree of hostile objects: the same results, or the same exception and message."""
    assert hostile.run_case(_pure, seed) == hostile.run_case(_speedups, seed)


def test_hostile_seed_sweep() -> None:
    """A fixed range of seeds, so CI always covers the same few hundred cases."""
    for seed in range(400):
        assert hostile.run_case(_pure, seed) == hostile.run_case(_speedups, seed), seed


def test_hostile_cases_cover_every_outcome() -> None:
    """The generator reaches success and each kind of error, and every step."""
    firsts = set()
    steps = set()
    for seed in range(400):
        record = hostile.run_case(_pure, seed)
        first = record[0][1]
        firsts.add("ok" if first[0] == "ok" else first[1])
        steps.add(len(record))
    assert {"ok", "Boom", "TypeError", "ValueError"} <= firsts
    assert {4, 6} <= steps


def test_the_fuzz_catches_an_engine_that_differs() -> None:
    """The comparison can fail: an engine whose leaves() reverses is caught."""

    class Mutant:
        flatten = staticmethod(_pure.flatten)
        flatten_with_path = staticmethod(_pure.flatten_with_path)
        unflatten = staticmethod(_pure.unflatten)
        flatten_up_to = staticmethod(_pure.flatten_up_to)

        @staticmethod
        def leaves(tree: Any, is_leaf: Any, rules: Any) -> list:
            return _pure.leaves(tree, is_leaf, rules)[::-1]

    assert any(hostile.run_case(_pure, s) != hostile.run_case(Mutant, s) for s in range(50))


def test_endless_leaves_are_an_error_not_a_hang() -> None:
    import itertools

    spec = _pure.flatten([1, (2, 3)], None, None)[1]
    for leaves in (itertools.count(), iter(range(10**9)), (i for i in itertools.repeat(0))):
        a, b = same_outcome("unflatten", spec, leaves)
        assert a[0] == "raise" and a[2].endswith("but more than 3 were given")


KEY_POOL = ["a", "b", "k0", "k1", "zz", "é", "\U0001f600", 3, -1, 10**30]


@settings(max_examples=60, deadline=None)
@given(
    st.lists(
        st.tuples(
            st.booleans(),  # str keys or int keys
            st.permutations(range(5)),  # an insertion order
            st.integers(0, 5),  # how many keys
            st.sampled_from(["leaves", "nested"]),
        ),
        min_size=1,
        max_size=12,
    )
)
def test_dict_key_order_memo_across_calls(plan: list) -> None:
    """The C engine remembers the key order of the last small dicts it met, by
    key identity, across calls: dicts of the same keys in other insertion
    orders, of other keys in the same memo slot, and in between calls, must
    come out as the pure engine has them."""
    strs, ints = KEY_POOL[:7], [k for k in KEY_POOL if isinstance(k, int)] + [7, 8]
    for use_str, order, n, shape in plan:
        pool = strs if use_str else ints
        keys = [pool[i % len(pool)] for i in order[:n]]
        d = {k: [i] if shape == "nested" else i for i, k in enumerate(keys)}
        check_engines_agree(d)
        check_engines_agree([d, {"x": d}, d])


def test_dict_key_order_memo_survives_reentrant_calls() -> None:
    """A finalizer run by the GC in the middle of a flatten flattens other dicts
    (so the memo changes under the outer call): both calls stay exact."""
    seen: list = []

    class Reenter:
        def __init__(self) -> None:
            self.me = self  # a cycle: only the GC frees it

        def __del__(self) -> None:
            for keys in (("b", "a"), ("a", "b"), ("k1", "k0"), ("zz", "a", "b")):
                d = dict.fromkeys(keys, 0)
                seen.append(_speedups.flatten(d, None, None)[1] == _pure.flatten(d, None, None)[1])

    old = gc.get_threshold()
    gc.set_threshold(1, 1, 1)  # collect at almost every allocation
    try:
        for _ in range(200):
            Reenter()
            tree = [{"b": 1, "a": 2}, {"a": 3, "b": 4}, {"k1": 5, "k0": {"zz": 6, "a": 7}}]
            check_engines_agree(tree)
    finally:
        gc.set_threshold(*old)
        gc.collect()
    assert seen and all(seen)


@pytest.mark.thread_unsafe  # counts references other threads' calls share
def test_dict_key_order_memo_holds_a_bounded_number_of_references() -> None:
    key = "".join(["memo", "-key"])  # a str of its own, not interned
    before = sys.getrefcount(key)
    for i in range(1000):
        _speedups.flatten({key: i, "other": i}, None, None)
        _speedups.leaves([{key: i}, {"b": 1, key: 2}], None, None)
    # three key orders hold it: one keys tuple each (the node shares it; no
    # insertion-order tuple, since each order here is key order)
    assert sys.getrefcount(key) <= before + 3
    # other key orders, each met once, push it out of its sets: the memo holds
    # what it met last, not all it ever met
    for i in range(20_000):
        _speedups.leaves({f"k{i}": 0, f"j{i}": 1}, None, None)
    assert sys.getrefcount(key) == before


def _chain_of_dicts(depth: int, width: int = 3) -> Any:
    """Dicts of width keys inserted out of key order, each inside the last."""
    names = ("y", "x", "w", "v", "u")[:width]
    tree: Any = {k: [0] if k == "x" else 0 for k in names}
    for i in range(depth):
        inner = {"q": i, "p": (i, [i]), "o": [i]}
        tree = {k: [tree, inner] if k == "x" else i for k in names}
    return tree


def test_spare_children_tuples_survive_release_that_flattens() -> None:
    """The C engine keeps a popped frame's tuple of a dict's children for the
    next dict. Here a child's __tree_flatten__ empties its parent dict first,
    so that tuple holds the last references to the other children; their
    release when the frame ends runs __del__, which flattens deep chains of
    dicts (more frames of one size than the engine keeps tuples for) in the
    middle of that release. Every flatten, outer and inner, gives the pure
    engine's leaves and spec."""
    inner: list = []

    class Wiper:
        def __init__(self, parent: dict) -> None:
            self.parent = parent

        def __tree_flatten__(self) -> tuple:
            self.parent.clear()
            return (), "w"

        @classmethod
        def __tree_unflatten__(cls, aux: Any, children: tuple) -> Any:
            return cls({})

        def __eq__(self, other: object) -> bool:
            return type(other) is Wiper

    @dataclasses.dataclass(eq=False)
    class Dying:
        x: int

        def __del__(self) -> None:
            for depth in (3, 40):
                t = _chain_of_dicts(depth)
                got, want = _speedups.flatten(t, None, None), _pure.flatten(t, None, None)
                inner.append(got[0] == want[0] and got[1] == want[1])

    def make() -> dict:
        # three keys: the outer frame's tuple is of the size the inner chains
        # use, and its first child to go (after the Wiper) runs them
        d: dict = {}
        d["c"] = [Dying(1)]
        d["b"] = [Dying(2), {"e": Dying(3), "d": [Dying(4), _chain_of_dicts(5)]}]
        d["a"] = Wiper(d)
        return d

    for _ in range(20):
        l1, s1 = _pure.flatten(make(), None, None)
        inner.clear()
        l2, s2 = _speedups.flatten(make(), None, None)
        # the Dying objects went with the C engine's frames, inside the call
        assert len(inner) == 8 and all(inner)
        assert l1 == l2
        check_specs_equal(s1, s2)
        assert_same_tree(
            _speedups.unflatten(s2, l2), _pure.unflatten(s1, l1), identical_leaves=False
        )
        # the tuples kept meanwhile serve dicts of their own size and no other
        for width in (3, 4, 3, 2, 3):
            check_engines_agree(_chain_of_dicts(20, width))


_SPARES_IN_GC = """
import gc
from pytree_kit import _speedups

def chain(depth):
    tree = {"y": 0, "x": [0], "w": 0}
    for i in range(depth):
        tree = {"y": i, "x": [tree, {"q": i, "p": (i, [i]), "o": [i]}], "w": i}
    return tree

def scan():
    # reading every item of every tuple the collector tracks: a tuple with a
    # NULL item (a spare kept by the C engine, or one being emptied) crashes
    for o in gc.get_objects():
        if type(o) is tuple:
            list(o)

class Scanner:
    def __init__(self):
        self.me = self
    def __del__(self):
        scan()

for _ in range(30):
    d = {}
    d["c"] = [Scanner(), chain(20)]
    d["b"] = [Scanner()]
    d["a"] = 0
    _speedups.flatten(d, None, None)
    _speedups.flatten(chain(40), None, None)
    del d
    gc.collect()
    scan()
print("ok")
"""


def test_spare_tuples_are_out_of_the_collectors_reach() -> None:
    """The tuples the C engine keeps between frames hold NULL items; no
    Python code may reach them, not even gc.get_objects(), whether read
    between calls or by a finalizer in the middle of a flatten."""
    import subprocess

    r = subprocess.run(
        [sys.executable, "-c", _SPARES_IN_GC], capture_output=True, text=True, timeout=120
    )
    assert r.returncode == 0 and r.stdout.strip() == "ok", r.stderr[-2000:]


# run by test_engine_under_the_debug_allocator in a subprocess
_DEBUG_ALLOCATOR = """
import gc
from pytree_kit import _speedups, _pure
# dicts made from templates (str, int and mixed keys) and, where on, as
# split tables, each unflattened often enough to get a plan, then changed
trees = [
    [{"b": i, "a": [i], "c": (i,)} for i in range(6)],
    [{3: "x", 1: [1], -2: None} for _ in range(4)],
    [{"b": 1, 1: 2, "a": (3,)} for _ in range(3)],
    {"z": {f"k{j}": [j] for j in reversed(range(40))}, "a": [{"q": 1, "p": 2}] * 3},
]
for tree in trees:
    leaves, spec = _speedups.flatten(tree, None, None)
    for _ in range(4):
        got = _speedups.unflatten(spec, leaves)
    assert got == tree
    for d in (got if isinstance(got, list) else list(got.values())):
        if isinstance(d, dict):
            d["new"] = 1
            d.pop(next(iter(d)))
    assert _speedups.flatten(got, None, None)[1] == _pure.flatten(got, None, None)[1]
    del got
# a large dict of a remembered order, flattened while every allocation may
# collect: the free lists of small tuples emptied and kept so, so that each
# node tuple comes from the allocator
names = [f"blocks.{i}.attn.weight" for i in range(40)]
big = {k: [i] for i, k in reversed(list(enumerate(names)))}
for _ in range(3):
    _speedups.flatten(big, None, None)
drain = [tuple(range(n)) for n in range(1, 9) for _ in range(3000)]
kept = []
gc.set_threshold(1)
try:
    for _ in range(300):
        leaves, spec = _speedups.flatten(big, None, None)
        kept.append(spec)
        assert len(leaves) == 40
finally:
    gc.set_threshold(700, 10, 10)
print("ok")
"""


def test_engine_under_the_debug_allocator() -> None:
    """Under PYTHONMALLOC=debug (fresh memory filled with a pattern, each
    block checked on release against the API that allocated it): the dicts
    the C engine makes from templates and as split tables, changed and freed
    by CPython, and a large dict flattened while any allocation may collect.
    Caught: a list whose items were not yet set seen by the collector (3.10,
    3.11, a crash), and template tables allocated by PyObject_Malloc that
    CPython 3.13 frees with PyMem_Free (an abort on import)."""
    import subprocess

    env = dict(os.environ, PYTHONMALLOC="debug")
    r = subprocess.run(
        [sys.executable, "-X", "faulthandler", "-c", _DEBUG_ALLOCATOR],
        capture_output=True,
        text=True,
        timeout=300,
        env=env,
    )
    assert r.returncode == 0 and r.stdout.strip() == "ok", r.stderr[-3000:]


@_KEEPS
def test_spec_parts_are_shared_across_calls() -> None:
    """Flattening the same tree again gives a spec whose nodes and order
    pairs are the very objects of the last one (the C engine keeps tuple and
    list nodes, dict nodes and (position, order) pairs of plain keys), and
    equal to the pure engine's; the same order at two positions gets a pair
    of each."""
    d = {"b": 1, "a": 2}
    tree = [d, (d, [3, 4]), {"z": d}, d]
    _, s1 = _speedups.flatten(tree, None, None)
    _, s2 = _speedups.flatten(tree, None, None)
    check_specs_equal(s1, _pure.flatten(tree, None, None)[1])
    assert s1 == s2 and len(s1._nodes) == len(s2._nodes)
    assert all(x is y for x, y in zip(s1._nodes, s2._nodes))
    assert len(s1._orders) == 4 and all(x is y for x, y in zip(s1._orders, s2._orders))
    positions = [at for at, _ in s2._orders]
    assert positions == sorted(set(positions))
    assert all(s2._nodes[at][3] == ("a", "b") for at in positions)
    assert all(order == ("b", "a") for _, order in s2._orders)


def test_order_pairs_of_user_keys_are_not_kept() -> None:
    """A dict order of keys whose comparison is user code is not kept by the
    C engine across calls: once the tree and spec are gone, so is the key."""
    import weakref

    @functools.total_ordering
    class K:
        def __init__(self, v: int) -> None:
            self.v = v

        def __hash__(self) -> int:
            return hash(self.v)

        def __eq__(self, other: object) -> bool:
            return isinstance(other, K) and self.v == other.v

        def __lt__(self, other: K) -> bool:
            return self.v < other.v

    key = K(2)
    ref = weakref.ref(key)
    tree: Any = [{key: 1, K(1): 2}, {"y": 1, "x": 2}]
    del key
    for _ in range(3):
        spec = _speedups.flatten(tree, None, None)[1]
        assert len(spec._orders) == 2
    tree = spec = None
    gc.collect()
    assert ref() is None


def test_dict_key_order_memo_is_bounded_in_memory() -> None:
    """However many key orders are met, the memo holds at most its entries."""
    import tracemalloc

    def flood(tag: str) -> None:
        for i in range(6_000):
            keys = ["".join([tag, str(i), "-", str(j)]) for j in range(4)]
            _speedups.flatten(dict.fromkeys(keys[::-1], 0), None, None)

    tracemalloc.start()
    try:
        flood("a")  # fills the memo
        gc.collect()
        start = tracemalloc.get_traced_memory()[0]
        flood("b")  # replaces its entries: no growth
        gc.collect()
        grown = tracemalloc.get_traced_memory()[0] - start
    finally:
        tracemalloc.stop()
    assert grown < 64 * 1024, grown


def test_dict_key_order_memo_with_many_key_orders_matches() -> None:
    """Thousands of small dicts of keys from one pool, in many insertion
    orders, in one tree: entries are found, missed, replaced and found again
    within a call and across calls, and every spec stays the pure engine's."""
    rng = random.Random(5)
    pool = [f"key{i}" for i in range(14)] + ["é", "\U0001f600"]
    ints = [3, -1, 10**30, 7, 0, 12]
    tree = []
    for _ in range(3_000):
        keys = rng.sample(pool, rng.randint(1, 6)) if rng.random() < 0.8 else rng.sample(ints, 3)
        d = {k: rng.choice([1, [2], {"x": 3}]) for k in keys}
        tree.append(d)
    for _ in range(3):
        check_engines_agree(tree)
        check_engines_agree(tree[::-1])


def test_dict_key_order_memo_tells_apart_dicts_that_differ_in_one_key() -> None:
    """Dicts alike but for one key, in the first, a middle or the last place,
    each flattened in a call of its own (so each is remembered): thousands
    share a memo set, and none is taken for another."""
    variants = []
    for i in range(2_000):
        k = f"v{i:04d}"
        variants += [{"p": 0, "q": 1, k: 2}, {"p": 0, k: 1, "q": 2}, {k: 0, "p": 1, "q": 2}]
    for _ in range(2):
        for d in variants:
            (l1, s1), (l2, s2) = _pure.flatten(d, None, None), _speedups.flatten(d, None, None)
            assert l1 == l2 and s1._nodes == s2._nodes and s1._orders == s2._orders, d
            assert _speedups.leaves(d, None, None) == l1


def test_dict_key_order_memo_entry_gains_its_node_later() -> None:
    """leaves() remembers a dict's order without a node; a later flatten of the
    same keys finds the order, makes the node and writes it back."""
    for keys in (("b", "a", "c"), ("k0", "k1"), (2, 1, 3), ("z",)):
        d = dict.fromkeys(keys, 0)
        for op in ("leaves", "leaves", "flatten", "flatten", "flatten_with_path"):
            same = same_outcome(op, d, None, None)
            if op != "leaves":
                check_specs_equal(same[0][1][1], same[1][1][1])
        check_engines_agree([d, d, {"x": d}])


def test_dict_key_order_memo_stops_writing_after_misses_in_a_row() -> None:
    """A tree of dicts made with fresh key objects misses every time; after a
    few misses the call stops writing the memo, and every dict is still exact."""
    fresh = [{"".join(["k", str(j)]): j for j in (3, 1, 2, 0)} for _ in range(40)]
    same_keys = dict.fromkeys(("q", "p"), 1)
    tree = [*fresh, same_keys, same_keys, *fresh[:3], same_keys]
    check_engines_agree(tree)
    check_engines_agree(tree)


# -- the spec algebra (compose, is_prefix, paths) -------------------------------------


def _spec_pairs(a: Any, b: Any) -> list:
    """The specs of a and b, and a copy of each through pickle (equal nodes
    that are other objects: no identity to lean on)."""
    sa, sb = pk.structure(a, rules=RULES), pk.structure(b, rules=RULES)
    return [(sa, sb), (pickle.loads(pickle.dumps(sa)), sb), (sa, pickle.loads(pickle.dumps(sb)))]


@settings(max_examples=150, deadline=None)
@given(trees(), trees(), st.data())
def test_spec_algebra_matches(a: Any, b: Any, data: Any) -> None:
    for sa, sb in _spec_pairs(a, b):
        for nodes in (sa._nodes, sb._nodes):
            x, y = same_outcome("spec_paths", nodes)
            assert x == y
        x, y = same_outcome("spec_compose", sa._nodes, sa._orders, sb._nodes, sb._orders)
        assert x == y
        for mine, theirs in ((sa, sb), (sb, sa), (sa, sa)):
            x, y = same_outcome("spec_is_prefix", mine._nodes, theirs._nodes)
            assert x == y
        # a prefix made by cutting subtrees of b to leaves
        cut = pk.tree_map(lambda _: 0, b, is_leaf=lambda x: data.draw(st.booleans()), rules=RULES)
        sc = pk.structure(cut, rules=RULES)
        x, y = same_outcome("spec_is_prefix", sc._nodes, sb._nodes)
        assert x == y == ("ok", True)


def test_spec_paths_are_the_walks_paths() -> None:
    tree = {
        "o": OrderedDict([("z", 1), ("a", [2])]),
        "d": defaultdict(list, {"k": (3,)}),
        "t": os.stat_result(range(10)),
        "n": Node(4, [5]),
        "q": Opaque([6, 7], 1),
        "r": namedtuple("P", "x y")(8, deque([9])),
    }
    pairs, spec = _speedups.flatten_with_path(tree, None, RULES)
    assert _speedups.spec_paths(spec._nodes) == [p for p, _ in pairs]
    assert _pure.spec_paths(spec._nodes) == [p for p, _ in pairs]


def test_spec_algebra_on_malformed_nodes_raises() -> None:
    """Nodes only a hand-made pickle can hold: the C engine raises (as its
    unflatten does), and never reads past a tuple."""
    leaf = (0, None, 0, None)
    for name, args in (
        ("spec_paths", (("not a node",),)),
        ("spec_paths", ((4, None, 1, ()), leaf)),  # a dict node without its keys
        ("spec_is_prefix", ((leaf, (3, None, 1, None), leaf), (leaf,))),
        ("spec_is_prefix", (((3, None, 2, None), leaf, leaf), ((3, None, 2, None), leaf))),
        ("spec_compose", (((3, None, 1, None), leaf), ((7,),), (leaf,), ())),
        ("spec_compose", (((3, None, 1, None), leaf), (), (leaf,), ((0,),))),
    ):
        with pytest.raises((ValueError, IndexError, TypeError)):
            getattr(_speedups, name)(*args)


def test_keys_made_in_c_are_the_classes_own() -> None:
    """Path keys are made without calling their class (its __init__ only sets
    the slot): they must be what the class makes."""
    point = namedtuple("Point", "x y")
    pairs, _ = _speedups.flatten_with_path({"a": [point(1, 2)]}, None, None)
    path = pairs[0][0]
    assert path == (pk.DictKey("a"), pk.SequenceKey(0), pk.GetAttrKey("x"))
    for key in path:
        assert not hasattr(key, "__dict__")
        assert pickle.loads(pickle.dumps(key)) == key
        assert hash(key) == hash(type(key)(*[getattr(key, s) for s in type(key).__slots__]))
        with pytest.raises(AttributeError, match="immutable"):
            key.other = 1


class _OddKey(pk.DictKey):
    """A subclass whose own __str__ must be asked."""

    __slots__ = ()

    def __str__(self) -> str:
        return "<odd>"


class _Shouty:
    def __repr__(self) -> str:
        return "SHOUT"

    def __str__(self) -> str:
        return "shout"

    def __format__(self, spec: str) -> str:
        return "formatted"


_KEY_VALUES = st.one_of(
    st.text(max_size=4),
    st.integers(-(10**20), 10**20),
    st.booleans(),
    st.none(),
    st.floats(allow_nan=False),
    st.binary(max_size=3),
    st.tuples(st.integers(0, 3), st.text(max_size=2)),
    st.just(_Shouty()),
)
_KEYS = st.one_of(
    st.builds(pk.DictKey, _KEY_VALUES),
    st.builds(pk.SequenceKey, _KEY_VALUES),
    st.builds(pk.GetAttrKey, _KEY_VALUES),
    st.builds(_OddKey, _KEY_VALUES),
    _KEY_VALUES,  # not a key at all: str() of it
)


@settings(max_examples=300, deadline=None)
@given(st.lists(_KEYS, max_size=6), st.booleans())
def test_keystr_in_c_is_the_keys_own_str(path: list, as_tuple: bool) -> None:
    p = tuple(path) if as_tuple else path
    x, y = same_outcome("keystr", p)
    assert x == y == ("ok", "".join(map(str, p)))
    assert pk.keystr(p) == x[1]


def test_keystr_in_c_errors_match() -> None:
    class Bad:
        def __str__(self) -> Any:
            return 5

    class Raises:
        def __repr__(self) -> str:
            raise RuntimeError("no repr")

    for path in ([Bad()], [pk.DictKey(Raises())], 5, [pk.SequenceKey(10**5000)]):
        a, _ = same_outcome("keystr", path)
        assert a[0] == "raise"


def _odicts() -> list:
    """OrderedDicts the C engine reads itself (keys all exact str or all exact
    int, in their dict's order) and ones it leaves to the pure engine."""
    big = OrderedDict((f"layer{i // 2}.{('weight', 'bias')[i % 2]}", Leaf(i)) for i in range(300))
    moved = OrderedDict((k, Leaf(i)) for i, k in enumerate("zyxw"))
    moved.move_to_end("z")  # its own order is no longer its dict's
    moved_first = OrderedDict((k, i) for i, k in enumerate("abc"))
    moved_first.move_to_end("c", last=False)
    readded = OrderedDict((k, i) for i, k in enumerate("abc"))
    del readded["a"]
    readded["a"] = "again"  # at the end of both orders
    popped = OrderedDict((i, str(i)) for i in range(40, 0, -1))
    popped.popitem(last=False)
    return [
        OrderedDict(),
        OrderedDict(b=1, a=[2, (3,)]),
        OrderedDict((i, Leaf(i)) for i in (5, -1, 2**70, 0)),
        big,
        moved,
        moved_first,
        readded,
        popped,
        OrderedDict([("s", 1), (2, "int"), (None, 3)]),  # mixed keys
        OrderedDict([(_Str("sub"), 1), ("plain", 2)]),  # a str subclass
        OrderedDict([(True, 1), (2, 2)]),  # bool is not an exact int
        {"outer": [OrderedDict(a=OrderedDict(b=1)), (big,)]},
    ]


@pytest.mark.thread_unsafe  # counts references other threads' calls share
def test_ordered_dicts() -> None:
    """Exact OrderedDicts, read in C where their keys and order allow, else by
    the pure engine: the same leaves, specs, paths, rebuilt dicts (items,
    order, size in memory) and flatten_up_to results on both engines; a
    reordered or re-keyed OrderedDict against a spec is judged alike."""
    for tree in _odicts():
        leaves = [x for x in _pure.leaves(tree, None, None) if type(x) is Leaf]
        counts = [sys.getrefcount(x) for x in leaves]
        check_engines_agree(tree)
        spec = _speedups.flatten(tree, None, None)[1]
        all_leaves = _pure.leaves(tree, None, None)
        _same_dicts(_pure.unflatten(spec, all_leaves), _speedups.unflatten(spec, all_leaves))
        del all_leaves
        assert [sys.getrefcount(x) for x in leaves] == counts
    for od in _odicts()[1:8]:
        spec = _speedups.flatten(od, None, None)[1]
        keys = list(od)
        others = [
            OrderedDict((k, od[k]) for k in reversed(keys)),  # another order
            OrderedDict(("".join(k) if isinstance(k, str) else k, od[k]) for k in keys),  # equal
            dict(od),  # not an OrderedDict
            OrderedDict((k, od[k]) for k in keys[1:]),  # a key fewer
        ]
        moved = OrderedDict(od)
        if keys:
            moved.move_to_end(keys[0])
        for other in [*others, moved]:
            x, y = same_outcome("flatten_up_to", spec, other)
            if x[0] == "ok":
                check_leaves_identical(x[1], y[1])


def test_ordered_dicts_that_dicts_own_methods_changed() -> None:
    """OrderedDicts whose dict dict's own methods changed around their list of
    keys (which the C engine reads for their order, where it can): the same
    answers or errors on both engines, alone and against a spec."""
    added = OrderedDict(a=1, b=2)
    dict.__setitem__(added, "c", 3)
    added_to_empty = OrderedDict()
    dict.__setitem__(added_to_empty, "c", 3)
    deleted = OrderedDict(a=1, b=2)
    dict.__delitem__(deleted, "a")
    emptied = OrderedDict(a=1)
    dict.__delitem__(emptied, "a")
    back = OrderedDict(a=1, b=2)
    dict.__delitem__(back, "a")
    dict.__setitem__(back, "a", 5)
    spec = _pure.flatten(OrderedDict(a=1, b=2), None, None)[1]
    for od in (added, added_to_empty, deleted, emptied, back):
        for tree in (od, [od, {"k": od}]):
            check_engines_agree(tree)
        x, y = same_outcome("flatten_up_to", spec, od)
        if x[0] == "ok":
            check_leaves_identical(x[1], y[1])


def test_ordered_dict_reads_run_no_python_code() -> None:
    """Keys whose hash or == is Python code leave the OrderedDict to the pure
    engine, which meets them in its own order (the same answers either way)."""
    calls: list = []

    class Key:
        def __init__(self, k: str) -> None:
            self.k = k

        def __hash__(self) -> int:
            calls.append("hash")
            return hash(self.k)

        def __eq__(self, other: object) -> bool:
            calls.append("eq")
            return isinstance(other, Key) and other.k == self.k

        def __lt__(self, other: Key) -> bool:
            return self.k < other.k

    od = OrderedDict((Key(k), i) for i, k in enumerate("bca"))
    a, b = same_outcome("flatten", od, None, None)
    assert a[0] == "ok" and a[1][0] == b[1][0] == [0, 1, 2]
    calls.clear()
    _pure.flatten(od, None, None)
    pure_calls = list(calls)
    calls.clear()
    _speedups.flatten(od, None, None)
    assert calls == pure_calls


class _RaisingKey:
    """A dict key whose == raises (its hash matches "k")."""

    def __hash__(self) -> int:
        return hash("k")

    def __eq__(self, other: object) -> bool:
        raise ZeroDivisionError("no equality here")


@given(trees(), st.data())
def test_path_get(tree: Any, data: Any) -> None:
    """tree_get's reading of builtin containers: the node reached and the
    keys read, on real paths, their prefixes and paths gone wrong."""
    DictKey, GetAttrKey, SequenceKey = pk.DictKey, pk.GetAttrKey, pk.SequenceKey
    pairs, _ = _pure.flatten_with_path(tree, None, RULES)
    paths = [p for p, _ in pairs] or [()]
    path = data.draw(st.sampled_from(paths))
    path = path[: data.draw(st.integers(0, len(path)))]
    wrong = data.draw(
        st.sampled_from(
            [
                None,
                DictKey("absent"),
                DictKey([1]),  # unhashable
                DictKey(_RaisingKey()),
                SequenceKey(10**30),
                SequenceKey(-1),
                SequenceKey(True),
                SequenceKey(0),
                SequenceKey("0"),
                GetAttrKey("x"),
                "not a key",
            ]
        )
    )
    if wrong is not None:
        path = (*path, wrong)
    a, b = same_outcome("path_get", tree, path)
    if a[0] == "ok":
        assert a[1][0] is b[1][0] and a[1][1] == b[1][1]


def test_path_get_raises_what_a_key_raises() -> None:
    """A key's own == that raises is raised (a missing or unhashable key only
    stops the reading); the C engine takes a tuple path only."""
    key = pk.DictKey(_RaisingKey())
    for tree, path in (({"k": 1}, (key,)), ([{"k": 2}], (pk.SequenceKey(0), key))):
        a, _ = same_outcome("path_get", tree, path)
        assert a[0] == "raise" and a[1] is ZeroDivisionError
    a, _ = same_outcome("path_get", {"j": 1}, (key,))  # no key of that hash: no ==
    assert a == ("ok", ({"j": 1}, 0))
    tree = {1: [["a", "b"], ("c", "d")], "s": {}}
    S, D = pk.SequenceKey, pk.DictKey
    for path, done in [
        ((D(1), S(1), S(0)), 3),
        ((D(True), S(0), S(1)), 3),  # True == 1 as a dict key, as Python has it
        ((D(1), S(True)), 1),  # a bool is no position
        ((D(1), S(1.0)), 1),
        ((D(1), S(2**70)), 1),
        ((D(1), S(-1)), 1),
        ((D(1), S(0), pk.GetAttrKey("x")), 2),
        ((D("s"), D("t")), 1),
        ((S(0),), 0),
    ]:
        a, b = same_outcome("path_get", tree, path)
        assert a[0] == "ok" and a[1][1] == done and a[1][0] is b[1][0], path
    with pytest.raises(TypeError, match="path_get"):
        _speedups.path_get({}, [pk.DictKey("k")])


@dataclasses.dataclass
class _DictOut(dict):
    """A dataclass that is a plain dict, kept in step as ModelOutput is; its
    first field has no default, so deleting it leaves it unset."""

    first: Any
    second: Any = None
    third: Any = None

    def __post_init__(self) -> None:
        for f in dataclasses.fields(self):
            if getattr(self, f.name) is not None:
                self[f.name] = getattr(self, f.name)

    def __setitem__(self, key: Any, value: Any) -> None:
        super().__setitem__(key, value)
        super().__setattr__(key, value)


class _OwnKeys(ModelOutput):
    """Its own keys and iteration, in reverse: neither engine reads the dict
    view through them."""

    def keys(self) -> Any:
        return list(reversed(OrderedDict.keys(self)))

    def __iter__(self) -> Any:
        return iter(self.keys())


_EDITS = [
    "set a field's entry to its value",
    "set a field's entry to another value",
    "delete an entry",
    "move the first entry to the end",
    "add an entry that is no field",
    "add an int key",
    "add a field's name as a str subclass",
    "add a field's name as an equal str",
    "delete a field",
    "keep state outside the fields",
]


def _edited(cls: type, values: list, edits: list) -> Any:
    out = cls.__new__(cls)
    base = OrderedDict if issubclass(cls, OrderedDict) else dict
    for f, v in zip(dataclasses.fields(cls), values):
        object.__setattr__(out, f.name, v)
        if v is not None:
            base.__setitem__(out, f.name, v)
    names = [f.name for f in dataclasses.fields(cls)]
    for edit, i in edits:
        name = names[i % len(names)]
        keys = list(base.keys(out))
        if edit == 0 and hasattr(out, name):
            base.__setitem__(out, name, getattr(out, name))
        elif edit == 1:
            base.__setitem__(out, name, Leaf(100 + i))
        elif edit == 2 and keys:
            base.__delitem__(out, keys[i % len(keys)])
        elif edit == 3 and keys and base is OrderedDict:
            OrderedDict.move_to_end(out, keys[0])
        elif edit == 4:
            base.__setitem__(out, "extra", Leaf(7))
        elif edit == 5:
            base.__setitem__(out, i, Leaf(8))
        elif edit in (6, 7) and name in keys and hasattr(out, name):
            value = base.__getitem__(out, name)
            base.__delitem__(out, name)
            key = _Str(name) if edit == 6 else "".join(list(name))
            base.__setitem__(out, key, value)
        elif edit == 8 and name in vars(out):
            object.__delattr__(out, name)
        elif edit == 9:
            object.__setattr__(out, "outside", 1)
    return out


@settings(max_examples=300)
@given(
    st.sampled_from([ModelOutput, _DictOut, _OwnKeys]),
    st.lists(st.sampled_from(["leaf", "none", "tuple"]), min_size=3, max_size=3),
    st.lists(st.tuples(st.integers(0, len(_EDITS) - 1), st.integers(0, 5)), max_size=3),
    st.lists(st.tuples(st.integers(0, len(_EDITS) - 1), st.integers(0, 5)), max_size=2),
)
def test_records_that_are_dicts(cls: type, shapes: list, edits: list, other_edits: list) -> None:
    """Dataclasses that are dicts (transformers' ModelOutput, read in C): the
    same leaves, specs and errors on both engines whatever the dict view holds
    (entries that are and are not the fields' values, keys that are no
    field's, equal and subclassed names, an OrderedDict reordered, a field
    unset, state outside the fields); and flatten_up_to of one against the
    other's spec judged alike."""
    made = {"leaf": lambda i: Leaf(i), "none": lambda i: None, "tuple": lambda i: (Leaf(i), None)}
    values = [made[s](i) for i, s in enumerate(shapes)]
    out = _edited(cls, values, edits)
    for tree in (out, [out, {"k": out}]):
        check_engines_agree(tree)
    a, _ = same_outcome("flatten", out, None, None)
    if a[0] == "ok":
        leaves, spec = a[1]
        _same_view(_pure.unflatten(spec, leaves), _speedups.unflatten(spec, leaves))
    other = _edited(cls, values, other_edits)
    a, _ = same_outcome("flatten", other, None, None)
    if a[0] == "ok":
        x, y = same_outcome("flatten_up_to", a[1][1], out)
        if x[0] == "ok":
            check_leaves_identical(x[1], y[1])


def test_records_that_are_dicts_are_read_in_c() -> None:
    """A ModelOutput is read and rebuilt without Python code: no call into
    the pure engine's reading or rebuilding of records, nor into the class's
    own keys, __iter__, __setitem__ or __setattr__ (with version tags, no
    call at all: the class's plan is remembered)."""
    out = _OwnKeys(logits=Leaf(1), hidden=(Leaf(2),))
    calls: list = []

    def profile(frame: Any, event: str, arg: Any) -> None:
        if event == "call":
            calls.append(frame.f_code.co_name)

    _speedups.flatten(out, None, None)  # the class's plan is made
    sys.setprofile(profile)
    try:
        leaves, spec = _speedups.flatten([out, out], None, None)
        _speedups.leaves(out, None, None)
        _speedups.flatten_up_to(spec, [out, out])
        again = _speedups.unflatten(spec, leaves)
    finally:
        sys.setprofile(None)
    python = {"classify", "_record_fields", "_set_fields", "build"}
    own = {"keys", "__iter__", "__setitem__", "__setattr__"}
    assert not set(calls) & (python | own), calls
    if _speedups.FAST_PATHS["type_version_tags"]:
        assert calls == []
    assert leaves == [out.logits, out.hidden[0]] * 2
    _same_view(again[0], out)


def _same_view(a: Any, b: Any) -> None:
    """Records that are dicts a and b: the same entries, in the same order
    (read through the base class), and the same attributes; each entry the
    attribute of its name itself in both, or in neither."""
    assert type(a) is type(b)
    base = OrderedDict if isinstance(a, OrderedDict) else dict
    ka, kb = list(base.keys(a)), list(base.keys(b))
    assert ka == kb and [type(k) for k in ka] == [type(k) for k in kb]
    assert list(vars(a)) == list(vars(b))
    for k in vars(a):
        assert_same_tree(vars(a)[k], vars(b)[k])
    for k in ka:
        va, vb = base.__getitem__(a, k), base.__getitem__(b, k)
        assert_same_tree(va, vb)
        assert (va is vars(a).get(k)) == (vb is vars(b).get(k))


def test_records_that_are_dicts_rebuilt_from_edited_specs() -> None:
    """unflatten of a dict record's node as no flatten makes it (hand-made or
    edited: keys that are no field's, equal but not identical names,
    repeated names, keys that are not str, static fields beside the view)
    gives what the pure engine gives, or the same error."""
    out = _DictOut(Leaf(1), Leaf(2), None)
    leaves, spec = _pure.flatten(out, None, None)
    (kind, t, arity, (names, static, absent, keys)), *rest = spec._nodes
    equal = "".join(["fir", "st"])  # "first", not the same object
    for aux in [
        (names, static, absent, ("second", "first")),
        (names, static, absent, (equal, "second")),
        (names, static, absent, ("first", "nope")),
        (names, static, absent, (1, "first")),
        (names, static, absent, (_Str("first"),)),
        (names, static, absent, ()),
        (("first", "first", "third"), static, absent, ("first",)),
        (("first", equal, "third"), static, absent, ("first",)),
        (names, (("fourth", 5),), absent, ("first",)),
        (names, (("first", 5),), absent, ("first",)),  # the static value is the entry's
        (names, static, absent, ["first"]),
        (names, static, absent, tuple(f"k{i}" for i in range(40))),
    ]:
        edited = pk.TreeSpec._make(((kind, t, arity, aux), *rest), spec._orders, spec.num_leaves)
        x, y = same_outcome("unflatten", edited, leaves)
        if x[0] == "ok":
            _same_view(x[1], y[1])


@pytest.mark.parametrize("cls", [ModelOutput, _DictOut])
def test_records_that_are_dicts_against_specs_of_other_keys(cls: type) -> None:
    """flatten_up_to of a dict record against the spec of one with as many
    entries, in another order or with another field's: a mismatch on both
    engines (the C engine compares the keys in place); the same keys, the same
    objects or equal strs: the leaves."""
    values = [Leaf(0), Leaf(1), None]  # the third field has no entry

    def edited(*edits: tuple) -> Any:
        return _edited(cls, values, list(edits))

    first, second, third = (f.name for f in dataclasses.fields(cls))
    for engine in (_pure, _speedups):  # the specs of either
        spec = engine.flatten(edited(), None, None)[1]
        both = engine.flatten([edited(), {"k": edited()}], None, None)[1]
        _check_other_keys(edited, spec, both, (first, second, third), values)


def _check_other_keys(
    edited: Callable, spec: pk.TreeSpec, both: pk.TreeSpec, names: tuple, values: list
) -> None:
    first, second, third = names
    moved = edited((2, 0), (0, 0))  # the first entry deleted and set again
    other = edited((2, 0), (0, 2))  # the first entry gone, the third's set
    renamed = edited((7, 0), (7, 1))  # equal strs for keys, in the same order
    assert list(moved) == [second, first] and list(other) == [second, third]
    assert list(renamed) == [first, second] and next(iter(renamed)) is not first
    for tree in (moved, other):
        for s_, t in ((spec, tree), (both, [edited(), {"k": tree}])):
            a, _ = same_outcome("flatten_up_to", s_, t)
            assert a[0] == "raise" and "structure mismatch" in a[2]
    for s_, t in ((spec, edited()), (spec, renamed), (both, [renamed, {"k": edited()}])):
        a, b = same_outcome("flatten_up_to", s_, t)
        assert a[0] == "ok"
        check_leaves_identical(a[1], b[1])
        assert b[1] == values[:2] * (len(b[1]) // 2)


def test_record_that_is_a_dict_against_a_spec_without_its_view() -> None:
    """A spec whose node for a dict record has no dict keys (as no flatten
    makes; a hand-made or edited one) does not match it, on either engine."""
    out = ModelOutput(logits=Leaf(1), loss=Leaf(2), hidden=Leaf(3))  # only leaves below
    spec = _pure.flatten([out], None, None)[1]
    nodes = list(spec._nodes)
    i = next(i for i, n in enumerate(nodes) if n[1] is ModelOutput)
    kind, t, arity, aux = nodes[i]
    nodes[i] = (kind, t, arity, (*aux[:3], None))
    edited = pk.TreeSpec._make(tuple(nodes), spec._orders, spec.num_leaves)
    a, _ = same_outcome("flatten_up_to", edited, [out])
    assert a[0] == "raise"


class _Bare:
    """What _NewNotADict.__new__ makes: an object with a __dict__, no dict."""


@dataclasses.dataclass
class _NewNotADict(_DictOut):
    def __new__(cls, *args: Any, **kwargs: Any) -> Any:
        return _Bare()


def test_record_that_is_a_dict_whose_new_makes_no_dict() -> None:
    """A dict record whose __new__ gives something that is no dict: its
    fields are set, and its dict view is refused as dict.__setitem__ refuses
    it, on both engines."""
    leaves, spec = _pure.flatten(_DictOut(Leaf(1), Leaf(2)), None, None)
    (kind, _, arity, aux), *rest = spec._nodes
    edited = pk.TreeSpec._make(((kind, _NewNotADict, arity, aux), *rest), spec._orders, 2)
    a, _ = same_outcome("unflatten", edited, leaves)
    assert a[0] == "raise" and a[1] is TypeError


def test_large_dict_nodes_whose_keys_are_not_their_arity() -> None:
    """flatten_up_to against a large dict node whose keys are not as many as
    its arity, or not a tuple (hand-made specs): judged alike on both
    engines."""
    for od in (False, True):
        d = {f"k{i:03}": Leaf(i) for i in range(40)}
        tree = OrderedDict(d) if od else d
        _speedups.flatten(tree, None, None)  # its order remembered
        leaves, spec = _pure.flatten(tree, None, None)
        kind, t, arity, keys = spec._nodes[0]
        # (an OrderedDict node whose arity is one short of its keys is left
        # out: the engines already differed on it before these fast paths,
        # IndexError against ValueError, as the nodes run out)
        cases = [(kind, t, arity, keys[:-1]), (kind, t, arity, list(keys))]
        if not od:
            cases.append((kind, t, arity - 1, keys))
        for node in cases:
            nodes = (node, *spec._nodes[1 : 1 + node[2]])
            edited = pk.TreeSpec._make(nodes, spec._orders, node[2])
            x, y = same_outcome("flatten_up_to", edited, tree)
            if x[0] == "ok":
                check_leaves_identical(x[1], y[1])


def test_leaf_iterators_take_weak_references_on_both_engines() -> None:
    """tree_iter's iterator, fresh, part read, done, or failed, takes a weak
    reference on each engine (the pure one's is a generator), and the
    reference dies with it, its callback called once."""
    import weakref

    def boom(x: Any) -> bool:
        raise ValueError("no")

    for impl in (_pure, _speedups):
        for read, is_leaf in ((0, None), (1, None), (9, None), (1, boom)):
            it = impl.iter_leaves({"a": [1, 2], "b": (3,)}, is_leaf, None)
            with contextlib.suppress(ValueError):
                for _ in range(read):
                    next(it, None)
            died: list = []
            ref = weakref.ref(it, died.append)
            assert ref() is it
            del it
            gc.collect()
            assert ref() is None and died == [ref], (impl.NAME, read)


_PATH_PREDICATES: list[Callable[[tuple, Any], Any]] = [
    lambda p, x: len(p) == 1,
    lambda p, x: bool(p) and type(p[-1]) is pk.SequenceKey and p[-1].idx % 2 == 1,
    lambda p, x: isinstance(x, (list, tuple)) and len(p) >= 2,
    lambda p, x: pk.keystr(p).endswith("[0]") and isinstance(x, dict),
    lambda p, x: 1 / 0 if len(p) == 2 else False,
]


@given(trees(), st.integers(0, len(_PATH_PREDICATES) - 1))
def test_is_leaf_takes_path(tree: Any, which: int) -> None:
    """is_leaf(path, value): both engines ask it about the same values, in the
    same order, with equal paths, and give the same pairs and equal specs (or
    the same error)."""
    ask = _PATH_PREDICATES[which]
    asked: dict[str, list] = {"pure": [], "c": []}

    def recording(engine: str) -> Callable[[tuple, Any], Any]:
        def is_leaf(path: tuple, x: Any) -> Any:
            assert type(path) is tuple
            asked[engine].append((path, id(x)))
            return ask(path, x)

        return is_leaf

    a = outcome(_pure.flatten_with_path, tree, recording("pure"), RULES, True)
    b = outcome(_speedups.flatten_with_path, tree, recording("c"), RULES, True)
    assert asked["pure"] == asked["c"] and asked["c"]
    assert a[0] == b[0], (a, b)
    if a[0] == "raise":
        assert a[1:] == b[1:]
        return
    (p1, s1), (p2, s2) = a[1], b[1]
    assert [p for p, _ in p1] == [p for p, _ in p2]
    check_leaves_identical([x for _, x in p1], [x for _, x in p2])
    check_specs_equal(s1, s2)
    # each leaf's path is the path is_leaf was given for it, and a leaf that
    # is a container is one is_leaf chose
    given_paths = {(p, i) for p, i in asked["c"]}
    for path, leaf in p2:
        assert (path, id(leaf)) in given_paths or not isinstance(leaf, (list, tuple, dict))
    assert_same_tree(
        _pure.unflatten(s2, [x for _, x in p2]), _speedups.unflatten(s1, [x for _, x in p1])
    )
    # no is_leaf: the flag changes nothing; a false flag: is_leaf(value)
    for engine in (_pure, _speedups):
        assert (
            engine.flatten_with_path(tree, None, RULES, True)[1]
            == engine.flatten(tree, None, RULES)[1]
        )
        one = engine.flatten_with_path(tree, lambda x: isinstance(x, tuple), RULES, False)
        assert one[1] == engine.flatten(tree, lambda x: isinstance(x, tuple), RULES)[1]
