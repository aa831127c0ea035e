"""pytree_kit against its peers: jax.tree_util, optree, torch.utils._pytree, dm-tree.

Part 1 is differential: on random trees of the containers every peer knows,
pytree_kit must give the same leaves (the same objects, in the same order),
the same node and leaf counts, the same ``tree_map`` result and the same
path strings.

Part 2 backs the comparison table of docs/index.md: one test per cell, named
``test_claim_<row>_<library>``, asserting what each library does here (the
versions pinned in constraints.txt).
"""

from __future__ import annotations

import dataclasses
import subprocess
import sys
import textwrap
from collections import OrderedDict, defaultdict, deque
from typing import Any

import pytest

import pytree_kit as pk

pytest.importorskip("hypothesis")
from hypothesis import given, settings
from hypothesis import strategies as st

from tests.support.peer_trees import (
    _NAMEDTUPLES,
    Pair,
    _as_dicts,
    _dmtree,
    _jtu,
    _nodes_of,
    _optree,
    _same_objects,
    _same_tree,
    _torch_pytree,
    _wrap,
    trees,
)

# The peers, imported lazily, and the random trees every peer knows:
# tests/support/peer_trees.py


# --------------------------------------------------------------------------
# Part 1: differential tests

SETTINGS = settings(max_examples=200, deadline=None)


@SETTINGS
@given(trees())
def test_leaves_order_matches_jax_and_optree(tree: Any) -> None:
    jtu, optree = _jtu(), _optree()
    mine = pk.leaves(tree)
    assert len({id(x) for x in mine}) == len(mine)  # leaves are distinct objects
    assert _same_objects(mine, jtu.tree_leaves(tree))
    assert _same_objects(mine, optree.tree_leaves(tree))
    leaves, spec = pk.flatten(tree)
    assert _same_objects(leaves, mine)
    assert spec.num_leaves == len(mine)


@SETTINGS
@given(trees(with_deque=True))
def test_leaves_order_matches_optree_with_deques(tree: Any) -> None:
    # jax treats a deque as a leaf, optree as a node: compare deques with optree only.
    optree = _optree()
    assert _same_objects(pk.leaves(tree), optree.tree_leaves(tree))
    spec, ospec = pk.structure(tree), optree.tree_structure(tree)
    assert (spec.num_leaves, spec.num_nodes) == (ospec.num_leaves, ospec.num_nodes)
    assert _same_tree(pk.tree_map(_wrap, tree), optree.tree_map(_wrap, tree), dict_order=True)


@SETTINGS
@given(trees())
def test_counts_match_jax_and_optree(tree: Any) -> None:
    jtu, optree = _jtu(), _optree()
    spec = pk.structure(tree)
    jdef = jtu.tree_structure(tree)
    odef = optree.tree_structure(tree)
    assert spec.num_leaves == jdef.num_leaves == odef.num_leaves
    assert spec.num_nodes == jdef.num_nodes == odef.num_nodes


@SETTINGS
@given(trees())
def test_tree_map_matches_jax_and_optree(tree: Any) -> None:
    jtu, optree = _jtu(), _optree()
    mine = pk.tree_map(_wrap, tree)
    # jax rebuilds dicts in sorted key order; pytree_kit and optree in insertion order.
    assert _same_tree(mine, jtu.tree_map(_wrap, tree), dict_order=False)
    assert _same_tree(mine, optree.tree_map(_wrap, tree), dict_order=True)
    assert _same_tree(mine, tree_map_reference(_wrap, tree), dict_order=True)
    # and unflatten(flatten(t)) rebuilds t itself, insertion order included
    leaves, spec = pk.flatten(tree)
    assert _same_tree(pk.unflatten(spec, leaves), tree, dict_order=True)


def tree_map_reference(fn: Any, tree: Any) -> Any:
    """A plain recursive tree_map over the containers the strategy makes."""
    t = type(tree)
    if tree is None:
        return None
    if t is list:
        return [tree_map_reference(fn, x) for x in tree]
    if t is tuple:
        return tuple(tree_map_reference(fn, x) for x in tree)
    if t in _NAMEDTUPLES:
        return t(*[tree_map_reference(fn, x) for x in tree])
    if t is deque:
        return deque([tree_map_reference(fn, x) for x in tree], tree.maxlen)
    if t is dict or t is OrderedDict:
        return t((k, tree_map_reference(fn, v)) for k, v in tree.items())
    if t is defaultdict:
        return defaultdict(
            tree.default_factory, {k: tree_map_reference(fn, v) for k, v in tree.items()}
        )
    return fn(tree)


@SETTINGS
@given(trees())
def test_paths_match_jax_keystr(tree: Any) -> None:
    # jax renders DictKey as ['a'] / [1], SequenceKey as [0] and GetAttrKey (the
    # namedtuple fields) as .x, exactly as pytree_kit does, for every kind the
    # strategy makes (dict, OrderedDict, defaultdict, list, tuple, namedtuple):
    # no restriction was needed.
    jtu = _jtu()
    pairs, _ = pk.flatten_with_path(tree)
    jpairs, _ = jtu.tree_flatten_with_path(tree)
    assert _same_objects([x for _, x in pairs], [x for _, x in jpairs])
    assert [pk.keystr(p) for p, _ in pairs] == [jtu.keystr(p) for p, _ in jpairs]


@SETTINGS
@given(trees(with_deque=True))
def test_paths_match_optree_accessors(tree: Any) -> None:
    optree = _optree()
    pairs, _ = pk.flatten_with_path(tree)
    accessors = optree.tree_accessors(tree)
    assert [pk.keystr(p) for p, _ in pairs] == [a.codify("") for a in accessors]
    for (_, leaf), accessor in zip(pairs, accessors):
        assert accessor(tree) is leaf


@SETTINGS
@given(
    trees(),
    st.sampled_from([{}, {"simple": True}, {"separator": "/"}, {"simple": True, "separator": "."}]),
)
def test_spec_paths_and_keystr_options_match_jax(tree: Any, options: dict) -> None:
    jtu = _jtu()
    jpairs, _ = jtu.tree_flatten_with_path(tree)
    mine = [pk.keystr(p, **options) for p in pk.structure(tree).paths()]
    assert mine == [jtu.keystr(p, **options) for p, _ in jpairs]


@SETTINGS
@given(trees(with_deque=True))
def test_len_and_is_leaf_match_optree(tree: Any) -> None:
    """``len(spec)`` and ``spec.is_leaf(strict=...)`` as optree's spec has them;
    the spec stays true with no leaves (optree's is false then)."""
    optree = _optree()
    spec, ospec = pk.structure(tree), optree.tree_structure(tree)
    assert len(spec) == len(ospec) == spec.num_leaves
    assert spec.is_leaf() == ospec.is_leaf()
    for strict in (True, False):
        assert spec.is_leaf(strict=strict) == ospec.is_leaf(strict=strict), strict
    assert bool(spec) is True


def test_len_and_is_leaf_on_the_edge_cases_match_optree() -> None:
    optree = _optree()
    for tree in (1, None, [], (), {}, [None], [[]], {"a": ()}, (1,), OrderedDict()):
        spec, ospec = pk.structure(tree), optree.tree_structure(tree)
        assert len(spec) == len(ospec), tree
        assert [spec.is_leaf(strict=s) for s in (True, False)] == [
            ospec.is_leaf(strict=s) for s in (True, False)
        ], tree


@SETTINGS
@given(trees(with_deque=True))
def test_flatten_one_level_and_num_children_match_optree(tree: Any) -> None:
    optree = _optree()
    spec, ospec = pk.structure(tree), optree.tree_structure(tree)
    assert spec.num_children == ospec.num_children
    if spec.is_leaf():
        return
    children, one = pk.flatten_one_level(tree)
    ochildren, _, entries, _ = optree.tree_flatten_one_level(tree)
    assert _same_objects(children, list(ochildren))
    named = [
        k.key if isinstance(k, pk.DictKey) else k.idx
        for (k,) in one.paths()
        if not isinstance(k, pk.GetAttrKey)
    ]
    if named:  # a namedtuple's entries are positions in optree, names here
        assert named == list(entries)


@SETTINGS
@given(trees(with_deque=True), trees(with_deque=True), st.data())
def test_is_prefix_and_compose_match_optree(a: Any, b: Any, data: Any) -> None:
    optree = _optree()
    # b's structure with one of its containers cut to a leaf is a prefix of it
    pairs, _ = pk.flatten_with_path(b)
    nodes = sorted({p[:i] for p, _ in pairs for i in range(len(p))}, key=len)
    cut = pk.tree_set(b, data.draw(st.sampled_from(nodes)), 0) if nodes else b
    # optree's prefix order is looser than its ==: it takes a dict, an
    # OrderedDict and a defaultdict with the same keys as one node, and deques
    # of any maxlen; here <= agrees with == (docs/migration/optree.md). So a
    # prefix here is one in optree, and where the trees hold only dicts and
    # no deques, the answers are the same.
    plain = not any(isinstance(t, deque) for t in _nodes_of(a) + _nodes_of(b))
    for x, y in ((a, b), (b, a), (cut, b), (b, cut), (a, a)):
        sx, sy = pk.structure(x), pk.structure(y)
        ox, oy = optree.tree_structure(x), optree.tree_structure(y)
        for strict in (False, True):
            mine, theirs = sx.is_prefix(sy, strict=strict), ox.is_prefix(oy, strict=strict)
            assert theirs or not mine
            if plain:
                dx, dy = pk.structure(_as_dicts(x)), pk.structure(_as_dicts(y))
                assert dx.is_prefix(dy, strict=strict) == theirs
        assert (sx < sy) == sx.is_prefix(sy, strict=True) and (sx <= sy) == sx.is_prefix(sy)
    assert pk.structure(cut) <= pk.structure(b) and optree.tree_structure(
        cut
    ) <= optree.tree_structure(b)
    sa, sb = pk.structure(a), pk.structure(b)
    if sa.num_leaves * sb.num_leaves < 100:
        composed, ocomposed = (
            sa.compose(sb),
            optree.tree_structure(a).compose(optree.tree_structure(b)),
        )
        assert (composed.num_leaves, composed.num_nodes) == (
            ocomposed.num_leaves,
            ocomposed.num_nodes,
        )
        leaves = [object() for _ in range(composed.num_leaves)]
        assert _same_tree(composed.unflatten(leaves), ocomposed.unflatten(leaves), dict_order=True)


class OptreeSpan:
    """A class written to optree's convention: tree_flatten returns
    (children, metadata, entries); optree's register_pytree_node_class gives
    it __tree_flatten__, which pytree_kit reads with no registration."""

    def __init__(self, lo: Any, hi: Any, unit: str = "s") -> None:
        self.lo, self.hi, self.unit = lo, hi, unit

    def tree_flatten(self) -> tuple:
        return (self.lo, self.hi), self.unit, ("lo", 1)

    @classmethod
    def tree_unflatten(cls, unit: Any, children: tuple) -> OptreeSpan:
        return cls(children[0], children[1], unit)


_SPAN_NAMESPACE = "pytree_kit-tests"


def _optree_with_span() -> Any:
    optree = _optree()
    if not hasattr(OptreeSpan, "__tree_flatten__"):
        optree.register_pytree_node_class(OptreeSpan, namespace=_SPAN_NAMESPACE)
    return optree


def _raw_path(tree: Any, path: tuple) -> tuple:
    """Our path as optree's raw entries: a namedtuple field is its index."""
    out, obj = [], tree
    for key in path:
        if isinstance(key, pk.GetAttrKey) and isinstance(obj, tuple):
            out.append(type(obj)._fields.index(key.name))
        else:
            out.append(key.key if isinstance(key, pk.DictKey) else key.idx)
        obj = pk.tree_get(obj, (key,))
    return tuple(out)


@SETTINGS
@given(trees(with_deque=True), trees(with_deque=True), trees())
def test_entries_protocol_matches_optree(a: Any, b: Any, c: Any) -> None:
    optree = _optree_with_span()

    def fn(*args: Any, **kwargs: Any) -> Any:
        return args, kwargs

    tree = [
        OptreeSpan(a, {"k": OptreeSpan(b, None, "ms")}),
        optree.functools.partial(fn, c, x=[a]),
    ]
    opaths, oleaves, ospec = optree.tree_flatten_with_path(tree, namespace=_SPAN_NAMESPACE)
    pairs, spec = pk.flatten_with_path(tree)
    assert _same_objects([x for _, x in pairs], oleaves)
    assert [_raw_path(tree, p) for p, _ in pairs] == opaths
    assert spec.paths() == [p for p, _ in pairs]
    fresh = [object() for _ in oleaves]
    mine, theirs = spec.unflatten(fresh), optree.tree_unflatten(ospec, fresh)
    assert pk.leaves(mine) == optree.tree_leaves(theirs, namespace=_SPAN_NAMESPACE)
    assert pk.structure(mine) == spec == pk.structure(theirs)
    assert mine[1]() == theirs[1]()
    assert spec.flatten_up_to(theirs) == fresh


# --------------------------------------------------------------------------
# Part 2: docs/index.md's comparison table, one test per cell


@dataclasses.dataclass
class DC:
    x: Any
    y: Any


def _dc() -> DC:
    return DC(101, 102)


def _attrs_obj() -> Any:
    attrs = pytest.importorskip("attrs")

    @attrs.define
    class AT:
        x: Any
        y: Any

    return AT(201, 202)


# -- unregistered_dataclass: pytree_kit a node; every peer one leaf ----------


def test_claim_unregistered_dataclass_pytree_kit() -> None:
    obj = _dc()
    leaves, spec = pk.flatten(obj)
    assert leaves == [101, 102]
    rebuilt = pk.unflatten(spec, [1, 2])
    assert type(rebuilt) is DC and (rebuilt.x, rebuilt.y) == (1, 2)


def test_claim_unregistered_dataclass_jax() -> None:
    obj = _dc()
    assert _same_objects(_jtu().tree_leaves(obj), [obj])


def test_claim_unregistered_dataclass_optree() -> None:
    obj = _dc()
    assert _same_objects(_optree().tree_leaves(obj), [obj])


def test_claim_unregistered_dataclass_torch() -> None:
    obj = _dc()
    assert _same_objects(_torch_pytree().tree_leaves(obj), [obj])


def test_claim_unregistered_dataclass_dmtree() -> None:
    obj = _dc()
    assert _same_objects(_dmtree().flatten(obj), [obj])


# -- attrs_class: pytree_kit and dm-tree a node; jax, optree, torch one leaf --


def test_claim_attrs_class_pytree_kit() -> None:
    obj = _attrs_obj()
    leaves, spec = pk.flatten(obj)
    assert leaves == [201, 202]
    rebuilt = pk.unflatten(spec, [1, 2])
    assert type(rebuilt) is type(obj) and (rebuilt.x, rebuilt.y) == (1, 2)


def test_claim_attrs_class_jax() -> None:
    obj = _attrs_obj()
    assert _same_objects(_jtu().tree_leaves(obj), [obj])


def test_claim_attrs_class_optree() -> None:
    obj = _attrs_obj()
    assert _same_objects(_optree().tree_leaves(obj), [obj])


def test_claim_attrs_class_torch() -> None:
    obj = _attrs_obj()
    assert _same_objects(_torch_pytree().tree_leaves(obj), [obj])


def test_claim_attrs_class_dmtree() -> None:
    # dm-tree knows attrs classes (not dataclasses): their fields are children.
    dmtree = _dmtree()
    obj = _attrs_obj()
    assert dmtree.flatten(obj) == [201, 202]
    rebuilt = dmtree.unflatten_as(obj, [1, 2])
    assert type(rebuilt) is type(obj) and (rebuilt.x, rebuilt.y) == (1, 2)


# -- depth_10000: pytree_kit works (also at 100,000); every peer raises -------


def _nested(depth: int, leaf: Any = 0) -> list:
    t: Any = leaf
    for _ in range(depth):
        t = [t]
    return t


def _depth_and_leaf(tree: Any) -> tuple[int, Any]:
    depth = 0
    while type(tree) is list:
        assert len(tree) == 1
        tree = tree[0]
        depth += 1
    return depth, tree


def _raised(fn: Any, *args: Any) -> BaseException:
    try:
        fn(*args)
    except BaseException as e:  # a peer's failure, whatever it is
        if isinstance(e, (KeyboardInterrupt, SystemExit)):
            raise
        return e
    pytest.fail(f"{fn!r} did not raise")


def test_claim_depth_10000_pytree_kit() -> None:
    tree = _nested(10_000, "bottom")
    leaves, spec = pk.flatten(tree)
    assert leaves == ["bottom"]
    assert spec.num_leaves == 1 and spec.num_nodes == 10_001
    assert pk.leaves(tree) == ["bottom"]


def test_claim_depth_100000_pytree_kit() -> None:
    assert sys.getrecursionlimit() <= 10_000  # the default limit is in force
    depth = 100_000
    tree = _nested(depth, 7)
    leaves, spec = pk.flatten(tree)
    assert leaves == [7]
    assert spec.num_nodes == depth + 1
    assert _depth_and_leaf(pk.unflatten(spec, [8])) == (depth, 8)
    assert _depth_and_leaf(pk.tree_map(lambda x: x * 3, tree)) == (depth, 21)
    assert pk.leaves(tree) == [7]
    pairs, _ = pk.flatten_with_path(tree)
    assert len(pairs) == 1 and len(pairs[0][0]) == depth


# From 3.14 CPython's recursion check for C code measures the C stack instead
# of counting calls: the C peers go deeper there (10,000 works, 100,000 fails
# as 10,000 does on 3.10-3.13).
DEEP_FOR_C_PEERS = 10_000 if sys.version_info < (3, 14) else 100_000


def test_claim_depth_10000_jax() -> None:
    # jax's C++ flatten hits the recursion limit (near depth 1,100; from 3.14,
    # the C stack) and nanobind surfaces it as a SystemError whose cause is the
    # RecursionError.
    jtu = _jtu()
    tree = _nested(DEEP_FOR_C_PEERS)
    for fn in (jtu.tree_leaves, jtu.tree_flatten):
        e = _raised(fn, tree)
        assert type(e) is SystemError
        assert isinstance(e.__cause__, RecursionError)
    assert jtu.tree_leaves([[1]]) == [1]  # the interpreter is still usable
    if sys.version_info >= (3, 14):
        assert len(jtu.tree_leaves(_nested(10_000))) == 1


def test_claim_depth_10000_optree() -> None:
    optree = _optree()
    tree = _nested(10_000)
    for fn in (optree.tree_leaves, optree.tree_flatten):
        assert isinstance(_raised(fn, tree), RecursionError)


def test_claim_depth_10000_torch() -> None:
    tp = _torch_pytree()
    tree = _nested(10_000)
    for fn in (tp.tree_leaves, tp.tree_flatten):
        assert isinstance(_raised(fn, tree), RecursionError)


def test_claim_depth_10000_dmtree() -> None:
    dmtree = _dmtree()
    assert isinstance(_raised(dmtree.flatten, _nested(DEEP_FOR_C_PEERS)), RecursionError)
    if sys.version_info >= (3, 14):
        assert len(dmtree.flatten(_nested(10_000))) == 1


# -- self_referencing_dict: pytree_kit ValueError at tree['a']; peers recurse --


def _self_dict() -> dict:
    d: dict = {}
    d["a"] = d
    return d


def test_claim_self_referencing_dict_pytree_kit() -> None:
    for fn in (pk.flatten, pk.leaves, pk.structure, pk.flatten_with_path):
        with pytest.raises(ValueError, match=r"^tree\['a'\]: cycle") as info:
            fn(_self_dict())
        assert "tree['a']" in str(info.value)
    with pytest.raises(ValueError, match=r"tree\['a'\]"):
        pk.tree_map(lambda x: x, _self_dict())


def test_claim_self_referencing_dict_jax() -> None:
    # Run in a child interpreter: the report was that this can break jax's.
    pytest.importorskip("jax")
    code = textwrap.dedent(
        """
        import jax
        d = {}
        d["a"] = d
        try:
            jax.tree_util.tree_leaves(d)
        except BaseException as e:
            print("RAISED", type(e).__name__, type(e.__cause__).__name__)
        else:
            print("SUCCEEDED")
        # afterwards the interpreter still works, jax included
        print("AFTER", jax.tree_util.tree_leaves({"x": [1, 2]}))
        """
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-2000:]
    lines = proc.stdout.split("\n")
    assert "RAISED SystemError RecursionError" in lines, proc.stdout
    assert "AFTER [1, 2]" in lines, proc.stdout


def test_claim_self_referencing_dict_with_two_keys_breaks_the_jax_interpreter() -> None:
    # With two keys jax sorts them, and the recursion failure inside its comparator
    # leaves the interpreter unusable: afterwards even a shallow call or a write to
    # stdout fails. pytree_kit raises ValueError naming the path and carries on.
    # From 3.14 (the C stack's recursion check) jax's comparator fails cleanly:
    # ValueError from the RecursionError, and the interpreter carries on.
    pytest.importorskip("jax")
    template = textwrap.dedent(
        """
        import sys, jax, pytree_kit as pk
        d = {"x": 1}
        d["self"] = d
        try:
            pk.leaves(d)
        except ValueError as e:
            print("PK", str(e).split(":")[0], flush=True)
        def depth(n):
            return 0 if n == 0 else 1 + depth(n - 1)
        if CALL_JAX:
            try:
                jax.tree_util.tree_leaves(d)
            except BaseException:
                pass
        depth(20)
        print("AFTER ok", flush=True)
        """
    )
    runs = {}
    for call_jax in (False, True):
        code = template.replace("CALL_JAX", str(call_jax))
        proc = subprocess.run(
            [sys.executable, "-c", code], capture_output=True, text=True, timeout=120
        )
        runs[call_jax] = proc.stdout.splitlines()
    assert runs[False] == ["PK tree['self']", "AFTER ok"], runs
    if sys.version_info < (3, 14):
        assert runs[True][0] == "PK tree['self']" and "AFTER ok" not in runs[True], runs
    else:
        assert runs[True] == ["PK tree['self']", "AFTER ok"], runs


def test_claim_self_referencing_dict_optree() -> None:
    optree = _optree()
    assert isinstance(_raised(optree.tree_leaves, _self_dict()), RecursionError)


def test_claim_self_referencing_dict_torch() -> None:
    tp = _torch_pytree()
    assert isinstance(_raised(tp.tree_leaves, _self_dict()), RecursionError)


def test_claim_self_referencing_dict_dmtree() -> None:
    dmtree = _dmtree()
    assert isinstance(_raised(dmtree.flatten, _self_dict()), RecursionError)


# -- mixed_key_dict: pytree_kit, optree, torch work; jax ValueError; dm-tree TypeError


def _mixed() -> dict:
    return {1: "a", "b": 2}


def test_claim_mixed_key_dict_pytree_kit() -> None:
    leaves, spec = pk.flatten(_mixed())
    assert leaves == ["a", 2]  # insertion order: the keys cannot be sorted
    rebuilt = pk.unflatten(spec, ["A", 20])
    assert rebuilt == {1: "A", "b": 20} and list(rebuilt) == [1, "b"]


def test_claim_mixed_key_dict_jax() -> None:
    with pytest.raises(ValueError, match="sorting pytree dictionary keys"):
        _jtu().tree_leaves(_mixed())


def test_claim_mixed_key_dict_optree() -> None:
    optree = _optree()
    leaves, spec = optree.tree_flatten(_mixed())
    assert leaves == ["a", 2]
    rebuilt = optree.tree_unflatten(spec, ["A", 20])
    assert rebuilt == {1: "A", "b": 20} and list(rebuilt) == [1, "b"]


def test_claim_mixed_key_dict_torch() -> None:
    tp = _torch_pytree()
    leaves, spec = tp.tree_flatten(_mixed())
    assert leaves == ["a", 2]
    rebuilt = tp.tree_unflatten(["A", 20], spec)
    assert rebuilt == {1: "A", "b": 20} and list(rebuilt) == [1, "b"]


def test_claim_mixed_key_dict_dmtree() -> None:
    with pytest.raises(TypeError):
        _dmtree().flatten(_mixed())


# -- none_value: None is a node with no leaf (pytree_kit, jax, optree), a leaf (torch, dm-tree)


def test_claim_none_value_pytree_kit() -> None:
    leaves, spec = pk.flatten([None, 1])
    assert leaves == [1]
    assert pk.unflatten(spec, [5]) == [None, 5]


def test_claim_none_value_jax() -> None:
    assert _jtu().tree_leaves([None, 1]) == [1]


def test_claim_none_value_optree() -> None:
    assert _optree().tree_leaves([None, 1]) == [1]


def test_claim_none_value_torch() -> None:
    assert _torch_pytree().tree_leaves([None, 1]) == [None, 1]


def test_claim_none_value_dmtree() -> None:
    assert _dmtree().flatten([None, 1]) == [None, 1]


# -- dict_rebuild_order: insertion order kept by all but jax (sorted) ----------


def _ba() -> dict:
    return {"b": 1, "a": 2}


def test_claim_dict_rebuild_order_pytree_kit() -> None:
    leaves, spec = pk.flatten(_ba())
    assert leaves == [2, 1]  # leaves in sorted key order
    assert list(pk.unflatten(spec, leaves)) == ["b", "a"]


def test_claim_dict_rebuild_order_jax() -> None:
    jtu = _jtu()
    leaves, treedef = jtu.tree_flatten(_ba())
    assert leaves == [2, 1]
    assert list(jtu.tree_unflatten(treedef, leaves)) == ["a", "b"]


def test_claim_dict_rebuild_order_optree() -> None:
    optree = _optree()
    leaves, treespec = optree.tree_flatten(_ba())
    assert leaves == [2, 1]
    assert list(optree.tree_unflatten(treespec, leaves)) == ["b", "a"]


def test_claim_dict_rebuild_order_torch() -> None:
    tp = _torch_pytree()
    leaves, spec = tp.tree_flatten(_ba())
    assert leaves == [1, 2]  # torch does not sort: leaves in insertion order
    assert list(tp.tree_unflatten(leaves, spec)) == ["b", "a"]


def test_claim_dict_rebuild_order_dmtree() -> None:
    dmtree = _dmtree()
    structure = _ba()
    leaves = dmtree.flatten(structure)
    assert leaves == [2, 1]
    # unflatten_as takes its key order from the structure it is given
    assert list(dmtree.unflatten_as(structure, leaves)) == ["b", "a"]


# -- namedtuple: a node everywhere --------------------------------------------


def test_claim_namedtuple_pytree_kit() -> None:
    leaves, spec = pk.flatten(Pair(1, 2))
    assert leaves == [1, 2]
    assert pk.unflatten(spec, [3, 4]) == Pair(3, 4)
    assert type(pk.unflatten(spec, [3, 4])) is Pair


def test_claim_namedtuple_jax() -> None:
    jtu = _jtu()
    leaves, treedef = jtu.tree_flatten(Pair(1, 2))
    assert leaves == [1, 2]
    assert type(jtu.tree_unflatten(treedef, [3, 4])) is Pair


def test_claim_namedtuple_optree() -> None:
    optree = _optree()
    leaves, treespec = optree.tree_flatten(Pair(1, 2))
    assert leaves == [1, 2]
    assert type(optree.tree_unflatten(treespec, [3, 4])) is Pair


def test_claim_namedtuple_torch() -> None:
    tp = _torch_pytree()
    leaves, spec = tp.tree_flatten(Pair(1, 2))
    assert leaves == [1, 2]
    assert type(tp.tree_unflatten([3, 4], spec)) is Pair


def test_claim_namedtuple_dmtree() -> None:
    dmtree = _dmtree()
    assert dmtree.flatten(Pair(1, 2)) == [1, 2]
    rebuilt = dmtree.unflatten_as(Pair(0, 0), [3, 4])
    assert type(rebuilt) is Pair and rebuilt == Pair(3, 4)


# -- registration: the peers change behaviour globally when a type is registered;
# pytree_kit has nothing to register (see tests/test_kinds.py)


def test_claim_registration_jax_is_global() -> None:
    jax = pytest.importorskip("jax")
    import dataclasses as dc

    @dc.dataclass
    class Local:
        x: int
        y: int

    assert jax.tree_util.tree_leaves(Local(1, 2)) == [Local(1, 2)]
    jax.tree_util.register_dataclass(Local, data_fields=["x", "y"], meta_fields=[])
    assert jax.tree_util.tree_leaves(Local(1, 2)) == [1, 2]  # every caller now sees it


def test_claim_registration_optree_is_global_per_namespace() -> None:
    optree = _optree()
    import dataclasses as dc

    @dc.dataclass
    class Local:
        x: int
        y: int

    optree.register_pytree_node(
        Local, lambda d: ((d.x, d.y), None), lambda a, c: Local(*c), namespace="claims"
    )
    assert optree.tree_leaves(Local(1, 2)) == [Local(1, 2)]
    assert optree.tree_leaves(Local(1, 2), namespace="claims") == [1, 2]


def test_claim_registration_torch_is_global() -> None:
    tp = _torch_pytree()
    import dataclasses as dc

    @dc.dataclass
    class Local:
        x: int
        y: int

    assert tp.tree_leaves(Local(1, 2)) == [Local(1, 2)]
    tp.register_pytree_node(Local, lambda d: ([d.x, d.y], None), lambda c, a: Local(*c))
    assert tp.tree_leaves(Local(1, 2)) == [1, 2]


def test_claim_registration_dmtree_has_none() -> None:
    dmtree = _dmtree()
    assert not [n for n in dir(dmtree) if "regist" in n.lower()]
