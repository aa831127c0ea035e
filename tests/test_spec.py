"""TreeSpec's operations beyond flatten and unflatten that optree's users reach for:
``TreeSpec.is_suffix`` and ``TreeSpec.transform``, checked against
optree on hypothesis trees of the containers both understand
(tests/support/peer_trees.py), on pytree_kit's own every kind
(``scripts.corpus.trees``), on a chain 100,000 deep, and for the errors they
raise. The suite runs once per engine.
"""

from __future__ import annotations

import pickle
from collections import OrderedDict, deque
from typing import Any

import pytest

import pytree_kit as pk
from scripts.corpus.trees import RULES, assert_same_tree
from scripts.corpus.trees import trees as every_kind
from tests.support.peer_trees import _as_dicts, _nodes_of, _optree, _same_tree, trees
from tests.support.shapes import DEPTH, deep_list, fresh_leaves

pytest.importorskip("hypothesis")
from hypothesis import given, settings
from hypothesis import strategies as st

SETTINGS = settings(deadline=None)


def _plain(*trees_: Any) -> bool:
    """No deque in the trees: optree's prefix order takes deques of any maxlen as one."""
    return not any(isinstance(t, deque) for tree in trees_ for t in _nodes_of(tree))


def _cut(tree: Any, data: Any) -> Any:
    """The tree with one of its containers replaced by a leaf (a prefix of it)."""
    pairs, _ = pk.flatten_with_path(tree)
    nodes = sorted({p[:i] for p, _ in pairs for i in range(len(p))}, key=len)
    return pk.tree_set(tree, data.draw(st.sampled_from(nodes)), 0) if nodes else tree


# --------------------------------------------------------------------------
# is_suffix


@SETTINGS
@given(trees(with_deque=True), trees(with_deque=True), st.data())
def test_is_suffix_matches_optree(a: Any, b: Any, data: Any) -> None:
    optree = _optree()
    cut = _cut(b, data)
    for x, y in ((a, b), (b, a), (cut, b), (b, cut), (a, a)):
        sx, sy = pk.structure(x), pk.structure(y)
        ox, oy = optree.tree_structure(x), optree.tree_structure(y)
        for strict in (False, True):
            mine = sx.is_suffix(sy, strict=strict)
            assert mine == sy.is_prefix(sx, strict=strict)
            theirs = ox.is_suffix(oy, strict=strict)
            # optree's prefix order is looser (docs/migration/optree.md); the
            # same on dicts alone, and with no deque
            assert theirs or not mine
            if _plain(x, y):
                dx, dy = pk.structure(_as_dicts(x)), pk.structure(_as_dicts(y))
                assert dx.is_suffix(dy, strict=strict) == theirs
        assert (sx > sy) == sx.is_suffix(sy, strict=True) and (sx >= sy) == sx.is_suffix(sy)
    assert pk.structure(b).is_suffix(pk.structure(cut))
    assert optree.tree_structure(b).is_suffix(optree.tree_structure(cut))


def test_is_suffix_cases_and_errors() -> None:
    leaf, pair = pk.TreeSpec.leaf(), pk.structure((0, 0))
    deeper = pk.structure(([0], {"a": 0}))
    assert deeper.is_suffix(pair) and deeper.is_suffix(pair, strict=True)
    assert pair.is_suffix(leaf) and not leaf.is_suffix(pair)
    assert pair.is_suffix(pair) and not pair.is_suffix(pair, strict=True)
    # any subtree, None too, may stand where a leaf is
    assert pk.structure(None).is_suffix(leaf) and not leaf.is_suffix(pk.structure(None))
    assert not pk.structure([0, 0]).is_suffix(pair)  # a list is no tuple
    with pytest.raises(TypeError, match="is_suffix expects a TreeSpec, got tuple"):
        pair.is_suffix((0, 0))  # type: ignore[arg-type]


# --------------------------------------------------------------------------
# transform


def _recorder(calls: list) -> tuple:
    """f_node and f_leaf that record what they see (as both libraries show it)."""

    def f_node(spec: Any) -> Any:
        calls.append(("node", spec.type, spec.num_children, spec.num_leaves, spec.num_nodes))
        return spec

    def f_leaf(spec: Any) -> Any:
        calls.append(("leaf", spec.num_leaves, spec.num_nodes))
        return spec

    return f_node, f_leaf


def _funcs(structure: Any) -> dict:
    """Transforms written alike for pytree_kit and optree."""

    def tuples_to_lists(spec: Any) -> Any:
        return structure([0] * spec.num_children) if spec.type is tuple else spec

    def dicts_to_ordered(spec: Any) -> Any:
        if spec.type is not dict:
            return spec
        return structure(OrderedDict((k, 0) for k in spec.entries()))

    def grow(spec: Any) -> Any:
        return structure({"x": 0, "y": (0, None)})

    def wrap(spec: Any) -> Any:  # a leaf becomes a list of one leaf
        return structure([0])

    return {
        "tuples_to_lists": (tuples_to_lists, None),
        "dicts_to_ordered": (dicts_to_ordered, None),
        "grow": (None, grow),
        "both": (tuples_to_lists, wrap),
    }


@SETTINGS
@given(trees(with_deque=True))
def test_transform_matches_optree(tree: Any) -> None:
    optree = _optree()
    spec, ospec = pk.structure(tree), optree.tree_structure(tree)
    # the identity, and what the functions are given, in the order they are called
    mine: list = []
    theirs: list = []
    same = spec.transform(*_recorder(mine))
    ospec.transform(*_recorder(theirs))
    assert mine == theirs
    assert same == spec and spec.transform() is spec
    leaves = fresh_leaves(spec.num_leaves)
    assert _same_tree(same.unflatten(leaves), ospec.unflatten(leaves), dict_order=True)
    # functions that change nodes and leaves
    ours, peers = _funcs(pk.structure), _funcs(optree.tree_structure)
    for name in ours:
        out = spec.transform(*ours[name])
        oout = ospec.transform(*peers[name])
        assert (out.num_leaves, out.num_nodes) == (oout.num_leaves, oout.num_nodes), name
        leaves = fresh_leaves(out.num_leaves)
        assert _same_tree(out.unflatten(leaves), oout.unflatten(leaves), dict_order=True), name


@SETTINGS
@given(every_kind())
def test_transform_identity_keeps_every_kind(tree: Any) -> None:
    leaves, spec = pk.flatten(tree, rules=RULES)
    for f_node, f_leaf in ((lambda n: n, None), (None, lambda x: x), (lambda n: n, lambda x: x)):
        same = spec.transform(f_node, f_leaf)
        assert same == spec and same._orders == spec._orders
        assert_same_tree(same.unflatten(leaves), tree)
    # each node given back as a copy of its one-level spec (an equal object)
    copied = spec.transform(lambda n: pickle.loads(pickle.dumps(n)))
    assert copied == spec and copied._orders == spec._orders
    # every leaf grown into a pair: compose
    pair = pk.structure((0, 0))
    assert spec.transform(f_leaf=lambda _: pair) == spec.compose(pair)


def test_transform_keeps_and_replaces_dict_orders() -> None:
    spec = pk.structure({"b": 1, "a": {"d": 2, "c": 3}})
    same = spec.transform(lambda n: n)
    assert list(same.unflatten([1, 2, 3])) == ["b", "a"]
    assert list(same.unflatten([1, 2, 3])["a"]) == ["d", "c"]
    # the node given back brings its own order: y before x, as optree does
    renamed = pk.structure({"b": 0, "a": 0}).transform(lambda n: pk.structure({"y": 0, "x": 0}))
    assert renamed.unflatten([1, 2]) == {"y": 2, "x": 1} and list(renamed.unflatten([1, 2])) == [
        "y",
        "x",
    ]


def test_transform_calls_children_first() -> None:
    spec = pk.structure({"b": [1, None], "a": (2,)})
    seen: list = []
    spec.transform(lambda n: seen.append(repr(n)) or n, lambda x: seen.append("*") or x)
    assert seen == [
        "*",
        "TreeSpec((*,))",
        "*",
        "TreeSpec(None)",
        "TreeSpec([*, *])",
        "TreeSpec({'a': *, 'b': *})",
    ]


def test_transform_errors_name_the_place() -> None:
    optree = _optree()
    spec = pk.structure({"a": [1, (2, 3)], "b": None})
    ospec = optree.tree_structure({"a": [1, (2, 3)], "b": None})
    with pytest.raises(
        TypeError,
        match=r"f_node returned int for the node TreeSpec\(\(\*, \*\)\) at tree\['a'\]\[1\]: "
        "it must return a TreeSpec",
    ):
        spec.transform(lambda n: 1 if n.type is tuple else n)
    with pytest.raises(TypeError, match=r"returns a PyTreeSpec"):
        ospec.transform(lambda n: 1 if n.type is tuple else n)
    with pytest.raises(TypeError, match=r"f_leaf returned str for the leaf at tree\['a'\]\[0\]"):
        spec.transform(f_leaf=lambda x: "*")
    # a node of another arity, or more than one level
    for bad, arity in (
        (lambda n: pk.structure([0]) if n.type is tuple else n, "2 children"),
        (lambda n: pk.structure([[0], 0]) if n.type is tuple else n, "2 children"),
        (lambda n: pk.structure([0, None]) if n.type is tuple else n, "2 children"),
        (lambda n: pk.TreeSpec.leaf() if n.type is type(None) else n, "0 children"),
    ):
        with pytest.raises(ValueError, match=f"it must return a one-level spec of {arity}") as e:
            spec.transform(bad)
        where = "tree['b']" if arity == "0 children" else "tree['a'][1]"
        assert f" at {where}: " in str(e.value)
    with pytest.raises(ValueError, match=r"same number of arity|one-level"):
        ospec.transform(lambda n: optree.tree_structure([0]) if n.type is tuple else n)


def test_transform_deep_chain() -> None:
    deep = deep_list()
    spec = pk.structure(deep)
    assert spec.transform(lambda n: n, lambda x: x) == spec
    tuples = spec.transform(lambda n: pk.structure((0,)))
    expected: Any = 0
    for _ in range(DEPTH):
        expected = (expected,)
    assert tuples == pk.structure(expected)
    grown = spec.transform(f_leaf=lambda x: pk.structure([0, 0]))
    assert grown.num_nodes == DEPTH + 3 and grown.num_leaves == 2
    with pytest.raises(ValueError, match=r"at tree(\[0\]){99999}: "):
        spec.transform(lambda n: pk.structure([0, 0]) if n.num_children == 1 else n)
