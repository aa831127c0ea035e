"""Workloads and detectors for the leak and reference-cycle checks.

Used by ``tests/test_leaks.py`` (a fast subset, run once per engine) and by
``scripts/leaks.py`` (a million calls per operation).

- :func:`kind_cases`: one small tree per node kind the engines know, each with
  the ``is_leaf`` and ``rules`` it needs; :func:`combined_cases`: two trees that
  between them hold every kind (one with ``rules``, one with ``is_leaf``).
- :func:`op_calls`: the operations (flatten, unflatten, tree_map, ...) on one
  case, as zero-argument callables; :func:`error_calls`: calls that each raise
  inside the engine and are caught (and checked).
- :func:`measure`: RSS, tracemalloc and leaf refcounts around many calls;
  :func:`gc_check`: reference cycles made by the calls, with the GC disabled.
- :func:`injected_leaks`: calls that leak on purpose, to show the detectors fail.

Every object a call works on is made here, before any measurement, and the
calls themselves make no cycles of their own (classes and functions are
module-level), so a cycle found by :func:`gc_check` was made by the library.
"""

from __future__ import annotations

import array
import ctypes
import dataclasses
import gc
import itertools
import os
import sys
import time
import tracemalloc
import types
from collections import Counter, OrderedDict, defaultdict, deque
from typing import Any, Callable, Iterable, Optional, Sequence

import pytree_kit as pk
import pytree_kit.testing as pkt
from pytree_kit._kinds import check_rules
from scripts.corpus.trees import (
    RULES,
    AttrsCls,
    AttrsStatic,
    ChildDC,
    Counts,
    FrozenDC,
    InitFalseDC,
    Items,
    KwDC,
    ModelOutput,
    Node,
    Opaque,
    Ordered,
    Rows,
    SlotsDC,
    _batch,
    _encoded,
    _mirrored,
    _row,
    _slot_dict,
)
from scripts.corpus.trees import Record as ProtoRecord

Leaf = pkt.Leaf
Call = Callable[[], object]

OPS = (
    "flatten",
    "unflatten",
    "tree_map",
    "flatten_with_path",
    "leaves",
    "flatten_up_to",
    "tree_map_with_path",
    "columns",
    "tree_iter",
)
ERRORS = "errors"

# -- classes used only by the workload (module level: defining a class makes cycles) --


class BadRebuild:
    """A protocol class that flattens but whose ``__tree_unflatten__`` raises."""

    def __init__(self, x: Any) -> None:
        self.x = x

    def __tree_flatten__(self) -> tuple:
        return (self.x,), None

    @classmethod
    def __tree_unflatten__(cls, aux: Any, children: tuple) -> BadRebuild:
        raise RuntimeError("rebuild refused")


class Boom:
    """A protocol class whose ``__tree_flatten__`` raises."""

    def __tree_flatten__(self) -> tuple:
        raise RuntimeError("boom")

    @classmethod
    def __tree_unflatten__(cls, aux: Any, children: tuple) -> Boom:  # pragma: no cover
        return cls()


class UnhashableAux:
    """A protocol class whose aux data is a list."""

    def __init__(self, x: Any) -> None:
        self.x = x

    def __tree_flatten__(self) -> tuple:
        return (self.x,), [1]

    @classmethod
    def __tree_unflatten__(cls, aux: Any, children: tuple) -> UnhashableAux:  # pragma: no cover
        return cls(children[0])


class HalfProtocol:
    """``__tree_flatten__`` without ``__tree_unflatten__``."""

    def __tree_flatten__(self) -> tuple:  # pragma: no cover - never called
        return (), None


class FlakyNode:
    """A protocol class whose ``__tree_flatten__`` raises when ``fail`` is set."""

    def __init__(self, x: Any, fail: bool) -> None:
        self.x, self.fail = x, fail

    def __tree_flatten__(self) -> tuple:
        if self.fail:
            raise RuntimeError("flaky")
        return (self.x,), None

    @classmethod
    def __tree_unflatten__(cls, aux: Any, children: tuple) -> FlakyNode:
        return cls(children[0], False)


class BadKey:
    """A dict key whose comparison raises (so the dict keeps insertion order)."""

    def __init__(self, n: int) -> None:
        self.n = n

    def __hash__(self) -> int:
        return self.n

    def __lt__(self, other: object) -> bool:
        raise RuntimeError("no order")


class UnhashableFactory:
    """A defaultdict factory that cannot be hashed (so it cannot go in a spec)."""

    __hash__ = None  # type: ignore[assignment]

    def __call__(self) -> list:  # pragma: no cover
        return []


def _bad_shape(o: Opaque) -> Any:
    return [o.items, o.scale, 0]  # not a (children, aux) pair


def _bad_children(o: Opaque) -> tuple:
    return 5, None  # children neither a list, a tuple nor a dict


def _refuse_rebuild(aux: Any, children: tuple) -> Opaque:
    raise RuntimeError("rule rebuild refused")


BAD_REBUILD_RULES = {Opaque: pk.Rule(RULES[Opaque].flatten, _refuse_rebuild)}
BAD_SHAPE_RULES = {Opaque: pk.Rule(_bad_shape, RULES[Opaque].unflatten)}
BAD_CHILDREN_RULES = {Opaque: pk.Rule(_bad_children, RULES[Opaque].unflatten)}

STOP = "stop here"


def is_stop(x: Any) -> bool:
    """The workload's ``is_leaf``: stops at ``(STOP, anything)`` tuples."""
    return type(x) is tuple and len(x) == 2 and x[0] is STOP


def raising_is_leaf(x: Any) -> bool:
    raise RuntimeError("is_leaf refused")


def raising_fn(x: Any, *rest: Any) -> Any:
    raise RuntimeError("fn refused")


def raising_leaves(n: int) -> Iterable[Any]:
    """Leaves for unflatten that run out with an error."""
    yield from range(n)
    raise RuntimeError("leaves refused")


def first(x: Any, *rest: Any) -> Any:
    return x


def path_first(path: tuple, x: Any, *rest: Any) -> Any:
    return x


# -- trees --------------------------------------------------------------------


@dataclasses.dataclass
class Case:
    """A tree and the arguments every operation on it takes."""

    kind: str
    tree: Any
    is_leaf: Any = None
    rules: Any = None


def _leaves(n: int, start: itertools.count) -> list:
    return [Leaf(next(start)) for _ in range(n)]


def kind_cases() -> list[Case]:
    """One small tree per node kind (fresh objects on every call); leaves are
    :class:`pytree_kit.testing.Leaf` objects, so their refcounts are meaningful."""
    c = itertools.count()

    def L() -> Leaf:
        return Leaf(next(c))

    ts_hidden = {"tm_zone": "UTC", "tm_gmtoff": 0}
    stat_hidden = {"st_atime": 1.5, "st_mtime_ns": 8, "st_blksize": 4096}
    deep: Any = L()
    for _ in range(20):  # deeper than the C engine's inline stack (16 frames)
        deep = [deep]
    return [
        Case("leaf", L()),
        Case("dict_sorted", {"a": L(), "b": L()}),
        Case("dict_unsorted", {"b": L(), "c": L(), "a": L()}),
        Case("dict_unorderable_keys", {1: L(), "s": L(), (2,): L()}),
        Case("dict_keys_compare_raises", {BadKey(2): L(), BadKey(1): L()}),
        Case("list", [L(), L(), []]),
        Case("tuple", (L(), (L(),), ())),
        Case("none", [None, L(), {"n": None}]),
        Case("namedtuple", [pkt.Point(L(), L()), pkt.Pair(L(), L())]),
        Case("struct_time", time.struct_time(_leaves(9, c), ts_hidden)),
        Case("os_stat_result", os.stat_result(tuple(_leaves(10, c)), stat_hidden)),
        Case("os_stat_real", os.stat(".")),
        Case("dataclass", [pkt.Record(L(), L()), ChildDC(L(), L(), L())]),
        Case("dataclass_slots_kw_initfalse", [SlotsDC(L(), L()), KwDC(x=L()), InitFalseDC(L())]),
        Case("dataclass_static", [FrozenDC(L(), "u"), pkt.Tagged(L(), "y")]),
        Case("dataclass_dict", ModelOutput(logits=L(), loss=L())),
        Case("attrs", [AttrsCls(L(), L()), AttrsStatic(L(), 2)]),
        Case("ordereddict", OrderedDict([("b", L()), ("a", L())])),
        Case("defaultdict", defaultdict(list, {"y": L(), "x": L()})),
        Case("deque_maxlen", deque([L(), L()], maxlen=5)),
        Case(
            "mapping",
            [
                _batch(L(), L(), L()),
                Ordered(b=L(), a=L()),
                Counts(list, {"x": L()}),
                _encoded(L(), L(), L()),
                _mirrored(L(), L()),
                _slot_dict(L(), L()),
            ],
        ),
        Case("sequence", [_row(L(), L(), L()), Items([L()]), Rows([L(), L()])]),
        Case("protocol_dict", ProtoRecord(b=L(), a=[L()])),
        Case("protocol_tuple", Node(L(), Node(L(), None, "m"))),
        Case("rule", Opaque([L(), {"k": L()}], 2), rules=RULES),
        Case("is_leaf", {"stopped": (STOP, [L(), L()]), "x": [L()]}, is_leaf=is_stop),
        Case("deep_20", deep),
    ]


def combined_cases() -> list[Case]:
    """Two trees that between them hold every kind of :func:`kind_cases`:
    all kinds but ``is_leaf`` (with ``rules``), and all but ``rule`` (with
    ``is_leaf``), so both engine paths, with and without them, are taken."""
    with_rules = {c.kind: c.tree for c in kind_cases() if c.is_leaf is None}
    with_is_leaf = {c.kind: c.tree for c in kind_cases() if c.rules is None}
    return [
        Case("all_kinds+rules", with_rules, rules=RULES),
        Case("all_kinds+is_leaf", with_is_leaf, is_leaf=is_stop),
    ]


# -- the API, public or one engine's directly ----------------------------------


@dataclasses.dataclass(frozen=True)
class Api:
    """The operations, with the public API's signatures."""

    name: str
    flatten: Callable[..., Any]
    unflatten: Callable[..., Any]
    leaves: Callable[..., Any]
    flatten_with_path: Callable[..., Any]
    flatten_up_to: Callable[[pk.TreeSpec, Any], Any]
    columns: Callable[[pk.TreeSpec, Any], Any]
    tree_map: Callable[..., Any]
    tree_map_with_path: Callable[..., Any]
    tree_iter: Callable[..., Any]
    #: (tree, want, is_leaf=, rules=) -> whether some leaf's truth is want
    any_leaf: Callable[..., Any]
    #: (tree, is_leaf=, rules=) -> (children, spec) of the root
    one_level: Callable[..., Any]


def _public_any_leaf(tree: Any, want: bool, **kw: Any) -> bool:
    return pk.tree_any(tree, **kw) if want else not pk.tree_all(tree, **kw)


def public_api() -> Api:
    """The public functions of ``pytree_kit`` (whichever engine is active)."""
    return Api(
        name=f"public({pk.ENGINE})",
        flatten=pk.flatten,
        unflatten=pk.unflatten,
        leaves=pk.leaves,
        flatten_with_path=pk.flatten_with_path,
        flatten_up_to=pk.TreeSpec.flatten_up_to,
        columns=pk.TreeSpec.columns,
        tree_map=pk.tree_map,
        tree_map_with_path=pk.tree_map_with_path,
        tree_iter=pk.tree_iter,
        any_leaf=_public_any_leaf,
        one_level=pk.flatten_one_level,
    )


def direct_api(engine: Any) -> Api:
    """One engine module (``_speedups`` or ``_pure``) called directly; tree_map
    is rebuilt from its functions the way ``pytree_kit.api`` does it."""

    def flatten(tree: Any, *, is_leaf: Any = None, rules: Any = None) -> Any:
        return engine.flatten(tree, is_leaf, check_rules(rules))

    def leaves(tree: Any, *, is_leaf: Any = None, rules: Any = None) -> Any:
        return engine.leaves(tree, is_leaf, check_rules(rules))

    def flatten_with_path(tree: Any, *, is_leaf: Any = None, rules: Any = None) -> Any:
        return engine.flatten_with_path(tree, is_leaf, check_rules(rules))

    def flatten_up_to(spec: pk.TreeSpec, tree: Any) -> Any:
        return engine.flatten_up_to(spec, tree)

    def columns(spec: pk.TreeSpec, trees: Any) -> Any:
        return engine.flatten_up_to_columns(spec, trees)

    def rest_leaves(spec: pk.TreeSpec, rest: tuple) -> list:
        return [
            engine.flatten_up_to(spec, r, "the first tree", f"rest[{i}]")
            for i, r in enumerate(rest)
        ]

    def tree_map(
        fn: Callable[..., Any], tree: Any, *rest: Any, is_leaf: Any = None, rules: Any = None
    ) -> Any:
        xs, spec = engine.flatten(tree, is_leaf, check_rules(rules))
        return engine.unflatten(spec, list(map(fn, xs, *rest_leaves(spec, rest))))

    def tree_map_with_path(
        fn: Callable[..., Any], tree: Any, *rest: Any, is_leaf: Any = None, rules: Any = None
    ) -> Any:
        pairs, spec = engine.flatten_with_path(tree, is_leaf, check_rules(rules))
        others = rest_leaves(spec, rest)
        paths = [p for p, _ in pairs]
        xs = [x for _, x in pairs]
        return engine.unflatten(spec, list(map(fn, paths, xs, *others)))

    def tree_iter(tree: Any, *, is_leaf: Any = None, rules: Any = None) -> Any:
        return engine.iter_leaves(tree, is_leaf, check_rules(rules))

    def any_leaf(tree: Any, want: bool, *, is_leaf: Any = None, rules: Any = None) -> bool:
        return engine.any_leaf(tree, is_leaf, check_rules(rules), want)  # type: ignore[no-any-return]

    def one_level(tree: Any, *, is_leaf: Any = None, rules: Any = None) -> Any:
        return engine.flatten_one_level(tree, is_leaf, check_rules(rules))

    return Api(
        name=f"direct({engine.NAME})",
        flatten=flatten,
        unflatten=engine.unflatten,
        leaves=leaves,
        flatten_with_path=flatten_with_path,
        flatten_up_to=flatten_up_to,
        columns=columns,
        tree_map=tree_map,
        tree_map_with_path=tree_map_with_path,
        tree_iter=tree_iter,
        any_leaf=any_leaf,
        one_level=one_level,
    )


# -- operations ----------------------------------------------------------------


def op_calls(api: Api, case: Case) -> dict[str, Call]:
    """Each operation of :data:`OPS` on ``case``, as a zero-argument callable.
    ``tree_map`` maps over two copies of the tree (so it also matches the
    second one with ``flatten_up_to``); ``tree_map_with_path`` over one."""
    tree = case.tree
    kw = {"is_leaf": case.is_leaf, "rules": case.rules}
    leaves, spec = api.flatten(tree, **kw)
    flatten, unflatten, leaves_ = api.flatten, api.unflatten, api.leaves
    with_path, up_to, columns = api.flatten_with_path, api.flatten_up_to, api.columns
    tree_map, tree_map_with_path = api.tree_map, api.tree_map_with_path
    iter_, any_leaf, one_level = api.tree_iter, api.any_leaf, api.one_level

    def do_flatten() -> object:
        return flatten(tree, **kw), None if spec.is_leaf() else one_level(tree, **kw)

    def do_unflatten() -> object:
        return unflatten(spec, leaves)

    def do_tree_map() -> object:
        return tree_map(first, tree, tree, **kw)

    def do_flatten_with_path() -> object:
        return with_path(tree, **kw)

    def do_leaves() -> object:
        return leaves_(tree, **kw)

    def do_flatten_up_to() -> object:
        return up_to(spec, tree)

    def do_tree_map_with_path() -> object:
        return tree_map_with_path(path_first, tree, **kw)

    def do_columns() -> object:
        return columns(spec, (tree, tree))

    def do_tree_iter() -> object:
        # to the end, and abandoned after the first leaf (its walk still held);
        # tree_any / tree_all's walk, stopped wherever a leaf decides
        it = iter_(tree, **kw)
        next(it, None)
        return list(iter_(tree, **kw)), any_leaf(tree, True, **kw), any_leaf(tree, False, **kw)

    calls: dict[str, Call] = {
        "flatten": do_flatten,
        "unflatten": do_unflatten,
        "tree_map": do_tree_map,
        "flatten_with_path": do_flatten_with_path,
        "leaves": do_leaves,
        "flatten_up_to": do_flatten_up_to,
        "tree_map_with_path": do_tree_map_with_path,
        "columns": do_columns,
        "tree_iter": do_tree_iter,
    }
    assert tuple(calls) == OPS
    return calls


def expecting(fn: Call, exc: type[BaseException], match: str) -> Call:
    """A call that runs ``fn``, which must raise ``exc`` with ``match`` in its message."""

    def call() -> None:
        try:
            fn()
        except exc as e:
            if match not in str(e):
                raise AssertionError(f"{exc.__name__} without {match!r}: {e}") from None
            return
        raise AssertionError(f"no {exc.__name__} ({match!r})")

    return call


def error_calls(api: Api, base: Optional[Case] = None) -> dict[str, Call]:
    """Calls that each raise inside the engine (or in user code it calls) and
    are caught; each checks the exception type and a piece of its message.
    ``base`` (default: the first combined case) is a big tree used to put the
    errors deep inside a traversal, after every kind has been visited."""
    if base is None:
        base = combined_cases()[0]
    c = itertools.count(10_000)

    def L() -> Leaf:
        return Leaf(next(c))

    big, big_kw = base.tree, {"is_leaf": base.is_leaf, "rules": base.rules}
    big_leaves, big_spec = api.flatten(big, **big_kw)

    cyc_list: list = [L()]
    cyc_list.append(cyc_list)
    cyc_dc = pkt.Record(L(), None)
    cyc_dc.b = [cyc_dc]
    cyc_dict: dict = {"x": L()}
    cyc_dict["y"] = (cyc_dict,)
    cyc_deque: deque = deque([L()])
    cyc_deque.append(cyc_deque)
    cyc_node = Node(L(), None)
    cyc_node.right = [cyc_node]
    cyc_deep: list = [L()]
    cyc_deep.append([[cyc_deep]])
    deep_cycle = {"a": big, "z": [cyc_deep]}  # "a" < "z": every kind first

    bad_rebuild = [L(), BadRebuild(L())]
    bad_rebuild_leaves, bad_rebuild_spec = api.flatten(bad_rebuild)
    rule_rebuild = {"o": Opaque([L(), L()], 1)}
    rule_rebuild_leaves, rule_rebuild_spec = api.flatten(rule_rebuild, rules=BAD_REBUILD_RULES)
    d_spec = api.flatten({"a": L(), "b": L()})[1]
    d_other = {"a": L(), "c": L()}
    static_spec = api.flatten(FrozenDC(L(), "t"))[1]
    static_other = FrozenDC(L(), "u")
    node_spec = api.flatten(Node(L(), L(), "n"))[1]
    node_other = Node(L(), L(), "m")
    rule_spec = api.flatten(Opaque([L()], 2), rules=RULES)[1]
    rule_other = Opaque([L()], 3)
    list_spec = api.flatten([L(), L()])[1]
    list_other = [L()]
    ts_spec = api.flatten(time.struct_time(_leaves(9, c), {"tm_zone": "UTC"}))[1]
    # a structseq's values outside its sequence are not structure: another
    # tm_zone matches; a plain tuple of its fields does not
    ts_other = tuple(_leaves(9, c))
    mismatch_big = {"a": big, "z": [L()]}
    mismatch_big_other = {"a": big, "z": (L(),)}
    mismatch_big_spec = api.flatten(mismatch_big, **big_kw)[1]
    boom = {"a": big, "z": Boom()}
    unhashable = {"a": big, "z": UnhashableAux(L())}
    unhashable_static = [FrozenDC(L(), [1])]  # type: ignore[arg-type]
    half = [L(), HalfProtocol()]
    mo_bad = ModelOutput(logits=L())
    OrderedDict.__setitem__(mo_bad, "logits", L())  # dict view differs from the field
    dd_bad: Any = defaultdict(UnhashableFactory(), {"k": L()})  # type: ignore[arg-type]
    opaque = [Opaque([L(), L()], 1)]
    opaque_none = [Opaque(None, 2)]  # the rule's flatten raises: list(None)
    flaky_spec = api.flatten([FlakyNode(L(), False)])[1]
    flaky_other = [FlakyNode(L(), True)]
    list_boom = [Boom()]  # a mismatch whose description classifies a raising object
    flatten, unflatten, leaves = api.flatten, api.unflatten, api.leaves
    with_path, up_to = api.flatten_with_path, api.flatten_up_to
    tree_map, tree_map_with_path = api.tree_map, api.tree_map_with_path
    iter_, any_ = api.tree_iter, api.any_leaf
    too_few, too_many = big_leaves[:-1], [*big_leaves, L()]

    def e(fn: Call, exc: type[BaseException], match: str) -> Call:
        return expecting(fn, exc, match)

    calls = {
        "cycle_list/flatten": e(lambda: flatten(cyc_list), ValueError, "cycle"),
        "cycle_dataclass/leaves": e(lambda: leaves(cyc_dc), ValueError, "cycle"),
        "cycle_dict/flatten_with_path": e(lambda: with_path(cyc_dict), ValueError, "cycle"),
        "cycle_deque/tree_map": e(lambda: tree_map(first, cyc_deque), ValueError, "cycle"),
        "cycle_protocol/tree_map_with_path": e(
            lambda: tree_map_with_path(path_first, cyc_node), ValueError, "cycle"
        ),
        "cycle_deep/flatten": e(lambda: flatten(deep_cycle, **big_kw), ValueError, "cycle"),
        "cycle_deep/flatten_with_path": e(
            lambda: with_path(deep_cycle, **big_kw), ValueError, "cycle"
        ),
        "unflatten_too_few": e(lambda: unflatten(big_spec, too_few), ValueError, "were given"),
        "unflatten_too_many": e(lambda: unflatten(big_spec, too_many), ValueError, "were given"),
        "unflatten_not_iterable": e(lambda: unflatten(big_spec, 5), TypeError, "iterable"),
        "unflatten_leaves_raise": e(
            lambda: unflatten(big_spec, raising_leaves(len(big_leaves))), RuntimeError, "refused"
        ),
        "unflatten_rebuild_raises": e(
            lambda: unflatten(bad_rebuild_spec, bad_rebuild_leaves), RuntimeError, "refused"
        ),
        "unflatten_rule_raises": e(
            lambda: unflatten(rule_rebuild_spec, rule_rebuild_leaves), RuntimeError, "refused"
        ),
        "bad_rules": e(lambda: flatten(opaque, rules=5), TypeError, "rules must be"),
        "up_to/dict_keys": e(lambda: up_to(d_spec, d_other), ValueError, "mismatch"),
        "up_to/static_field": e(lambda: up_to(static_spec, static_other), ValueError, "mismatch"),
        "up_to/protocol_aux": e(lambda: up_to(node_spec, node_other), ValueError, "mismatch"),
        "up_to/rule_aux": e(lambda: up_to(rule_spec, rule_other), ValueError, "mismatch"),
        "up_to/list_length": e(lambda: up_to(list_spec, list_other), ValueError, "mismatch"),
        "up_to/structseq_vs_tuple": e(lambda: up_to(ts_spec, ts_other), ValueError, "mismatch"),
        "up_to/deep": e(
            lambda: up_to(mismatch_big_spec, mismatch_big_other), ValueError, "mismatch"
        ),
        "up_to/tree_flatten_raises": e(
            lambda: up_to(flaky_spec, flaky_other), RuntimeError, "flaky"
        ),
        "columns/second_tree": e(
            lambda: api.columns(list_spec, [list_other, list_other]), ValueError, "mismatch"
        ),
        "columns/deep": e(
            lambda: api.columns(mismatch_big_spec, [mismatch_big_other]), ValueError, "mismatch"
        ),
        "columns/not_iterable": e(lambda: api.columns(list_spec, 5), TypeError, "iterable"),
        "up_to/rule_raises": e(lambda: up_to(rule_spec, opaque_none[0]), TypeError, "iterable"),
        "up_to/describe_raises": e(lambda: up_to(list_spec, list_boom[0]), ValueError, "mismatch"),
        "tree_map/fn_raises": e(lambda: tree_map(raising_fn, big, **big_kw), RuntimeError, "fn"),
        "tree_map/rest_mismatch": e(
            lambda: tree_map(first, mismatch_big, mismatch_big_other, **big_kw),
            ValueError,
            "rest[0]",
        ),
        "tree_flatten_raises": e(lambda: flatten(boom, **big_kw), RuntimeError, "boom"),
        "rule_raises": e(lambda: flatten(opaque_none, rules=RULES), TypeError, "iterable"),
        "rule_bad_shape": e(lambda: flatten(opaque, rules=BAD_SHAPE_RULES), TypeError, "pair"),
        "rule_bad_children": e(
            lambda: leaves(opaque, rules=BAD_CHILDREN_RULES), TypeError, "children"
        ),
        "unhashable_aux": e(lambda: flatten(unhashable, **big_kw), TypeError, "hashable"),
        "unhashable_static": e(lambda: flatten(unhashable_static), TypeError, "hashable"),
        "unhashable_factory": e(lambda: flatten(dd_bad), TypeError, "hashable"),
        "no_tree_unflatten": e(lambda: flatten(half), TypeError, "__tree_unflatten__"),
        "dataclass_dict_mismatch": e(lambda: flatten(mo_bad), TypeError, "cannot be rebuilt"),
        "is_leaf_raises": e(
            lambda: leaves(big, is_leaf=raising_is_leaf), RuntimeError, "is_leaf refused"
        ),
        # raised by a next() deep in the walk, with the leaves before it returned
        "tree_iter/cycle_deep": e(lambda: list(iter_(deep_cycle, **big_kw)), ValueError, "cycle"),
        "tree_iter/tree_flatten_raises": e(
            lambda: list(iter_(boom, **big_kw)), RuntimeError, "boom"
        ),
        "tree_iter/is_leaf_raises": e(
            lambda: list(iter_(big, is_leaf=raising_is_leaf)), RuntimeError, "is_leaf refused"
        ),
        # tree_all's walk past every (true) leaf to the error
        "any_leaf/cycle": e(lambda: any_([1, cyc_list], False), ValueError, "cycle"),
        "any_leaf/tree_flatten_raises": e(
            lambda: any_([0, "", Boom()], True), RuntimeError, "boom"
        ),
    }
    return calls


def _tuple_of_atoms(k: Any) -> bool:
    atoms = (int, float, str, bool, type(None))
    return type(k) is tuple and all(type(x) in atoms for x in k)


def tracked_objects(roots: Iterable[Any]) -> list:
    """Every container and leaf object reachable from ``roots`` (not ints, strings
    and other values whose refcounts the interpreter shares), to compare
    refcounts before and after; cycles in the trees are fine. Functions are
    not tracked, but what their closures hold is (the error calls' trees)."""
    out: list = []
    seen: set = set()
    todo = list(roots)
    skip = (int, float, str, bytes, bool, type(None), type, types.ModuleType)  # and (): shared
    while todo:
        obj = todo.pop()
        if id(obj) in seen or isinstance(obj, skip) or (type(obj) is tuple and not obj):
            continue
        if isinstance(obj, types.FunctionType):
            seen.add(id(obj))
            for cell in obj.__closure__ or ():
                try:
                    todo.append(cell.cell_contents)
                except ValueError:  # an empty cell
                    pass
            continue
        seen.add(id(obj))
        out.append(obj)
        if isinstance(obj, pk.TreeSpec):
            # not its nodes: they share tuples with the C engine's bounded cache of
            # class fields, whose refcounts move as slots are reused
            continue
        if isinstance(obj, dict):
            # not a key that is a tuple of atoms: the C engine's bounded cache of
            # dict templates holds such keys (as it holds str and int ones), and
            # its count moves as slots are reused (a leak of one is still traced)
            todo.extend(k for k in obj.keys() if not _tuple_of_atoms(k))
            todo.extend(obj.values())
        elif isinstance(obj, (list, tuple, deque)):
            todo.extend(obj)
            if isinstance(obj, tuple) and hasattr(type(obj), "n_fields"):
                reduced: Any = obj.__reduce__()
                todo.extend(reduced[1][1].values())  # a structseq's hidden fields
        if hasattr(obj, "__dict__"):
            todo.extend(vars(obj).values())
        for name in getattr(type(obj), "__slots__", ()):
            if hasattr(obj, name):
                todo.append(getattr(obj, name))
    return out


# -- measurement -----------------------------------------------------------------

#: Limits, and why. A leak of one object per call grows tracemalloc's traced
#: size by at least 16 bytes a call: 320 KiB in 20,000 calls, 16 MB in 10^6.
#: A leak of one object every 1,000 calls still gives 16 KiB per 10^6 calls.
#: What may legitimately remain is a handful of objects kept by free lists
#: and caches filled after tracing starts (measured: at most a few hundred
#: bytes), hence 4 KiB in all and 1 KiB between the first and the last chunk
#: (a leak grows steadily; noise does not). RSS moves in pages and arenas
#: (pymalloc allocates 256 KiB arenas, malloc trims lazily), so it is only a
#: coarse check: 1 MiB after the warm-up, which a leak of one small object
#: per call exceeds within ~20,000 calls.
TRACE_LIMIT = 4096
TRACE_GROWTH_LIMIT = 1024
RSS_LIMIT = 1 << 20


def rss_bytes() -> int:
    """The resident set size now (Linux: /proc/self/statm; else peak RSS)."""
    try:
        with open("/proc/self/statm", "rb") as f:
            return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except OSError:  # pragma: no cover - not Linux
        import resource

        peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
        return peak if sys.platform == "darwin" else peak * 1024


def run_calls(calls: Sequence[Call], n: int) -> None:
    """``n`` calls in all, going round ``calls``."""
    if len(calls) == 1:
        call = calls[0]
        for _ in range(n):
            call()
        return
    rounds, rest = divmod(n, len(calls))
    for _ in range(rounds):
        for call in calls:
            call()
    for call in calls[:rest]:
        call()


@dataclasses.dataclass
class Result:
    """What :func:`measure` found for one operation."""

    op: str
    calls: int
    seconds: float = 0.0
    rss_chunks: list = dataclasses.field(default_factory=list)  # bytes, [0] after warm-up
    trace_calls: int = 0
    trace_seconds: float = 0.0
    trace_chunks: list = dataclasses.field(default_factory=list)  # bytes, [0] at start
    ref_delta: int = 0  # sum of |refcount after - before| over the tracked objects
    ref_changed: list = dataclasses.field(default_factory=list)  # (repr, before, after)
    failures: list = dataclasses.field(default_factory=list)

    @property
    def us_per_call(self) -> float:
        return self.seconds / self.calls * 1e6 if self.calls else 0.0

    @property
    def trace_us_per_call(self) -> float:
        return self.trace_seconds / self.trace_calls * 1e6 if self.trace_calls else 0.0

    @property
    def rss_delta(self) -> int:
        return self.rss_chunks[-1] - self.rss_chunks[0] if self.rss_chunks else 0

    @property
    def trace_delta(self) -> int:
        return self.trace_chunks[-1] - self.trace_chunks[0] if self.trace_chunks else 0

    @property
    def trace_growth(self) -> int:
        """Traced size at the last chunk's end minus at the first chunk's end."""
        return self.trace_chunks[-1] - self.trace_chunks[1] if len(self.trace_chunks) > 2 else 0

    @property
    def passed(self) -> bool:
        return not self.failures


def _timed_chunks(calls: Sequence[Call], n: int, chunks: int, probe: Callable[[], int]) -> tuple:
    """Time ``n`` calls in ``chunks``; ``probe()`` after a full collection at the
    start and at each chunk's end. The collection empties the interpreter's free
    lists (tuples, lists, dicts, floats, frames...), which otherwise fill after
    tracing starts and hold up to ~600 KiB of traced memory, and frees garbage
    in cycles, which :func:`gc_check` looks for separately. The values go in
    an array: a list would keep the int objects, 32 traced bytes a chunk."""
    sizes = [n // chunks + (1 if i < n % chunks else 0) for i in range(chunks)]
    values = array.array("q", bytes(8 * (chunks + 1)))
    gc.collect()
    values[0] = probe()
    elapsed = 0.0
    for i, size in enumerate(sizes):
        t0 = time.perf_counter()
        run_calls(calls, size)
        elapsed += time.perf_counter() - t0
        gc.collect()
        values[i + 1] = probe()
    return elapsed, values.tolist()


def _traced() -> int:
    return tracemalloc.get_traced_memory()[0]


def measure(
    op: str,
    calls: Sequence[Call],
    n: int,
    tracked: Sequence[Any],
    *,
    chunks: int = 10,
    warmup: Optional[int] = None,
    trace_n: Optional[int] = None,
    rss_limit: Optional[int] = RSS_LIMIT,
    trace_limit: int = TRACE_LIMIT,
    trace_growth_limit: int = TRACE_GROWTH_LIMIT,
) -> Result:
    """Warm up (1% of ``n``, at least 1,000 calls), then ``n`` calls in
    ``chunks`` with RSS read at each chunk's end, then ``trace_n`` (default
    ``n``; 0 to skip) calls with tracemalloc started after the warm-up.
    Refcounts of ``tracked`` are compared from before the warm-up to the end.
    ``rss_limit=None`` records RSS without judging it.

    The objects alive beforehand are frozen (``gc.freeze``) meanwhile, so the
    full collections before each reading only scan what the calls made: with
    torch and jax imported, one would otherwise take ~0.1 s."""
    gc.collect()
    gc.freeze()
    try:
        before = [sys.getrefcount(o) for o in tracked]
        res = Result(op, n)
        run_calls(calls, max(n // 100, 1000) if warmup is None else warmup)
        if n:
            res.seconds, res.rss_chunks = _timed_chunks(calls, n, chunks, rss_bytes)
        trace_n = n if trace_n is None else trace_n
        if trace_n:
            if tracemalloc.is_tracing():  # pragma: no cover
                raise RuntimeError("tracemalloc is already tracing")
            tracemalloc.start()
            try:
                res.trace_calls = trace_n
                res.trace_seconds, res.trace_chunks = _timed_chunks(calls, trace_n, chunks, _traced)
            finally:
                tracemalloc.stop()
        gc.collect()
        after = [sys.getrefcount(o) for o in tracked]
    finally:
        gc.unfreeze()
    for o, b, a in zip(tracked, before, after):
        if a != b:
            res.ref_delta += abs(a - b)
            if len(res.ref_changed) < 5:
                res.ref_changed.append((_short(o), b, a))
    if n and rss_limit is not None and res.rss_delta > rss_limit:
        res.failures.append(f"RSS grew {res.rss_delta / 1024:.0f} KiB > {rss_limit // 1024} KiB")
    if trace_n and res.trace_delta > trace_limit:
        res.failures.append(f"tracemalloc grew {res.trace_delta} B > {trace_limit} B")
    if trace_n and res.trace_growth > trace_growth_limit:
        res.failures.append(
            f"tracemalloc grew {res.trace_growth} B across chunks > {trace_growth_limit} B"
        )
    if res.ref_delta:
        res.failures.append(f"refcounts changed by {res.ref_delta}: {res.ref_changed}")
    return res


# -- reference cycles -------------------------------------------------------------


@dataclasses.dataclass
class Finding:
    """Garbage in cycles left by one call."""

    op: str
    kind: str
    objects: int
    types: str
    cycle: str


def _short(obj: Any) -> str:
    t = type(obj)
    if isinstance(obj, types.FrameType):
        code = obj.f_code
        return f"frame {code.co_name} ({os.path.basename(code.co_filename)}:{obj.f_lineno})"
    if isinstance(obj, types.TracebackType):
        f = obj.tb_frame.f_code
        return f"traceback ({f.co_name}:{obj.tb_lineno})"
    if isinstance(obj, BaseException):
        return f"{t.__name__}({str(obj)[:60]!r})"
    if isinstance(obj, (types.FunctionType, types.MethodType)):
        return f"{t.__name__} {obj.__qualname__}"
    if isinstance(obj, dict):
        return f"{t.__name__} keys={list(obj)[:5]!r}"
    if isinstance(obj, (list, tuple)):
        return f"{t.__name__} of {len(obj)} {_repr(obj)}"
    if isinstance(obj, types.CellType):
        return "cell"
    return f"{t.__module__}.{t.__qualname__}"


def _repr(obj: Any) -> str:
    try:
        text = repr(obj)
    except Exception:  # a cycle's objects may be half-built
        text = "?"
    return text if len(text) <= 60 else text[:57] + "..."


def _find_cycle(garbage: list) -> list:
    """One cycle among ``garbage`` (a list of objects), as a list of objects."""
    ids = {id(o) for o in garbage}
    end = object()
    for start in garbage:
        # depth-first search for a path of garbage objects from start back to start
        path = [start]
        iters = [iter(gc.get_referents(start))]
        seen = {id(start)}
        while iters:
            nxt = next(iters[-1], end)
            if nxt is end:
                iters.pop()
                path.pop()
            elif nxt is start:
                return path
            elif id(nxt) in ids and id(nxt) not in seen:
                seen.add(id(nxt))
                path.append(nxt)
                iters.append(iter(gc.get_referents(nxt)))
    return []


def describe_garbage(garbage: list) -> tuple[str, str]:
    """(counts by type, one cycle rendered as ``a -> b -> ... -> a``)."""
    counts = Counter(type(o).__name__ for o in garbage)
    cycle = _find_cycle(garbage)
    text = " -> ".join(_short(o) for o in cycle)
    if cycle:
        text += f" -> {_short(cycle[0])}"
    return ", ".join(f"{n} {t}" for t, n in counts.most_common(8)), text


def _garbage_of(call: Call, repeat: int) -> list:
    """The objects in cycles that ``repeat`` calls leave (GC disabled meanwhile)."""
    gc.collect()
    gc.freeze()
    old = gc.get_debug()
    gc.disable()
    try:
        for _ in range(repeat):
            call()
        gc.set_debug(gc.DEBUG_SAVEALL)
        gc.collect()
        garbage = list(gc.garbage)
        gc.garbage.clear()
    finally:
        gc.set_debug(old)
        gc.enable()
        gc.unfreeze()
    return garbage


def cycles_made(calls: Iterable[Call], repeat: int = 1) -> int:
    """``gc.collect()`` after ``repeat`` rounds of ``calls`` with the GC disabled.

    The objects alive before are frozen (``gc.freeze``) meanwhile, so the
    collection scans only what the calls made (and is fast); a cycle of new
    objects is found all the same, since nothing old refers to garbage."""
    calls = list(calls)
    gc.collect()
    gc.freeze()
    gc.disable()
    try:
        for _ in range(repeat):
            for call in calls:
                call()
        return gc.collect()
    finally:
        gc.enable()
        gc.unfreeze()


def gc_check(
    groups: dict[str, dict[str, Call]], repeat: int = 2, warm: bool = True
) -> tuple[dict[str, int], list[Finding]]:
    """For each group (an operation) of calls (one per kind): run them all with
    the GC disabled, then ``gc.collect()`` (which must be 0); where it is not,
    find the kinds responsible, with what their garbage holds. Every call is
    made once before (``warm``), so one-time caches are not counted."""
    counts: dict[str, int] = {}
    findings: list[Finding] = []
    for op, by_kind in groups.items():
        if warm:
            for call in by_kind.values():
                call()
        counts[op] = n = cycles_made(by_kind.values(), repeat)
        if not n:
            continue
        for kind, call in by_kind.items():
            garbage = _garbage_of(call, 1)
            if garbage:
                type_counts, cycle = describe_garbage(garbage)
                findings.append(Finding(op, kind, len(garbage), type_counts, cycle))
                del garbage
    return counts, findings


def leak_calls(api: Api, cases: Optional[list[Case]] = None) -> dict[str, list[Call]]:
    """For each operation, and for the error calls: the calls a leak run goes
    round, one per kind (default: :func:`kind_cases`) or error."""
    if cases is None:
        cases = kind_cases()
    by_case = [op_calls(api, case) for case in cases]
    out = {op: [calls[op] for calls in by_case] for op in OPS}
    out[ERRORS] = list(error_calls(api).values())
    return out


def gc_groups(api: Api, cases: Optional[list[Case]] = None) -> dict[str, dict[str, Call]]:
    """Every operation on every kind (and the combined trees), and the error calls."""
    if cases is None:
        cases = kind_cases() + combined_cases()
    by_case = {case.kind: op_calls(api, case) for case in cases}
    groups = {op: {kind: calls[op] for kind, calls in by_case.items()} for op in OPS}
    groups[ERRORS] = error_calls(api)
    return groups


# -- injected leaks, to show that the detectors can fail ----------------------------

SINK: list = []


def injected_leaks(tree_leaf: Any) -> dict[str, Call]:
    """Calls that leak on purpose: ``memory`` keeps a new object per call,
    ``refcount`` increfs ``tree_leaf`` per call (a refcount leak that allocates
    nothing), ``cycle`` leaves a self-referencing list per call, and
    ``exception_cycle`` an exception held by a frame of its own traceback.
    :func:`undo_injected` restores them."""
    incref = ctypes.pythonapi.Py_IncRef
    incref.argtypes = [ctypes.py_object]
    incref.restype = None
    leaf_obj = ctypes.py_object(tree_leaf)

    def memory() -> None:
        SINK.append(bytearray(64))

    def refcount() -> None:
        incref(leaf_obj)

    def cycle() -> None:
        x: list = []
        x.append(x)

    def exception_cycle() -> None:
        try:
            raise ValueError("kept")
        except ValueError as e:
            kept = e  # noqa: F841 - frame -> exception -> traceback -> frame

    return {
        "memory": memory,
        "refcount": refcount,
        "cycle": cycle,
        "exception_cycle": exception_cycle,
    }


def undo_injected(tree_leaf: Any, increfs: int) -> None:
    """Drop what :func:`injected_leaks` kept: the sink, and ``increfs`` references."""
    SINK.clear()
    decref = ctypes.pythonapi.Py_DecRef
    decref.argtypes = [ctypes.py_object]
    decref.restype = None
    obj = ctypes.py_object(tree_leaf)
    for _ in range(increfs):
        decref(obj)


def self_test(n: int = 20_000, check_rss: bool = True) -> list[str]:
    """Run the injected leaks through the detectors; the lines returned say
    what each detector found, and start with ``FAIL`` where one missed its
    leak (or where a clean control call was flagged)."""
    leaf = Leaf(-1)
    holder = [leaf]
    leaks = injected_leaks(leaf)
    rss_limit = RSS_LIMIT if check_rss else None
    out = []

    def line(ok: bool, text: str) -> None:
        out.append(("ok   " if ok else "FAIL ") + text)

    try:
        mem = measure("memory", [leaks["memory"]], n, [leaf], trace_n=n, rss_limit=rss_limit)
    finally:
        undo_injected(leaf, 0)
    want = ["tracemalloc grew", "across chunks"] + (["RSS grew"] if check_rss else [])
    caught = [w for w in want if any(w in f for f in mem.failures)]
    line(
        caught == want,
        f"memory leak ({n} calls): RSS +{mem.rss_delta // 1024} KiB, "
        f"tracemalloc +{mem.trace_delta} B; flagged: {caught}",
    )
    warm = max(n // 100, 1000)
    ref = measure("refcount", [leaks["refcount"]], n, holder, trace_n=0, rss_limit=rss_limit)
    undo_injected(leaf, n + warm)
    line(
        ref.ref_delta == n + warm and any("refcounts" in f for f in ref.failures),
        f"refcount leak ({n} calls + {warm} warm-up): refcount delta {ref.ref_delta}",
    )
    counts, findings = gc_check(
        {"inject": {"cycle": leaks["cycle"], "exception_cycle": leaks["exception_cycle"]}},
        warm=False,
    )
    by_kind = {f.kind: f for f in findings}
    cyc = by_kind.get("cycle")
    line(
        counts["inject"] > 0 and cyc is not None and "list" in cyc.cycle,
        f"list cycle: gc.collect() = {counts['inject']}; found: {cyc.cycle if cyc else None}",
    )
    exc = by_kind.get("exception_cycle")
    line(
        exc is not None and "traceback" in exc.cycle and "frame" in exc.cycle,
        f"exception cycle: found: {exc.cycle if exc else None}",
    )
    case = kind_cases()[1]
    clean = measure(
        "control",
        [op_calls(public_api(), case)["flatten"]],
        n,
        tracked_objects([case.tree]),
        trace_n=n,
        rss_limit=rss_limit,
    )
    line(clean.passed, f"control (flatten, no leak): {clean.failures or 'nothing flagged'}")
    del holder
    return out
