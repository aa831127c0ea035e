"""pytree_kit._reduce: tree_map_only, tree_any / tree_all (and _only), tree_reduce /
sum / max / min. On every kind of node, on whichever engine runs, and against
optree and torch where they have the function."""

from __future__ import annotations

import functools
import operator
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import pytree_kit as pk
from scripts.corpus.trees import RULES, Opaque, assert_same_tree, snapshot, trees
from tests.support.peer_trees import _same_tree
from tests.support.peer_trees import trees as peer_trees
from tests.support.shapes import Tag

SETTINGS = settings(max_examples=150, deadline=None)


# -- on every kind of node -----------------------------------------------------------


@SETTINGS
@given(trees())
def test_reductions_are_those_of_the_leaves(tree: Any) -> None:
    before = snapshot(tree)
    leaves = pk.leaves(tree, rules=RULES)
    assert pk.tree_any(tree, rules=RULES) == any(leaves)
    assert pk.tree_all(tree, rules=RULES) == all(leaves)
    ints = [x for x in leaves if isinstance(x, int)]
    assert pk.tree_sum(pk.tree_map_only(object, lambda x: 1, tree, rules=RULES), rules=RULES) == (
        len(leaves)
    )
    assert pk.tree_any_only(int, lambda x: x > 2, tree, rules=RULES) == any(x > 2 for x in ints)
    assert pk.tree_all_only(int, lambda x: x > 2, tree, rules=RULES) == all(x > 2 for x in ints)
    counted = pk.tree_reduce(lambda n, _: n + 1, tree, 0, rules=RULES)
    assert counted == len(leaves)
    assert pk.tree_max(tree, key=id, default=None, rules=RULES) is max(leaves, key=id, default=None)
    assert pk.tree_min(tree, key=id, default=None, rules=RULES) is min(leaves, key=id, default=None)
    assert snapshot(tree) == before


@SETTINGS
@given(trees())
def test_tree_map_only_maps_the_chosen_leaves_and_keeps_the_rest(tree: Any) -> None:
    before = snapshot(tree)
    leaves, spec = pk.flatten(tree, rules=RULES)
    out = pk.tree_map_only((int, str), lambda x: Tag(x), tree, rules=RULES)
    got, out_spec = pk.flatten(out, rules=RULES)
    assert out_spec == spec
    for x, y in zip(leaves, got):
        if isinstance(x, (int, str)):
            assert y == Tag(x)
        else:
            assert y is x
    # a union and a predicate choose the same leaves as the tuple
    assert_same_tree(
        pk.tree_map_only(int | str, lambda x: Tag(x), tree, rules=RULES), out, "tree", False
    )
    by_pred = pk.tree_map_only(
        lambda x: isinstance(x, (int, str)), lambda x: Tag(x), tree, rules=RULES
    )
    assert_same_tree(by_pred, out, "tree", False)
    assert snapshot(tree) == before


# -- examples and errors ----------------------------------------------------------------


def test_empty_trees_and_the_reductions_errors() -> None:
    with pytest.raises(TypeError, match="reduce\\(\\) of empty iterable with no initial value"):
        pk.tree_reduce(operator.add, {"a": [None]})
    with pytest.raises(ValueError, match="empty"):
        pk.tree_max({})
    with pytest.raises(ValueError, match="empty"):
        pk.tree_min([])
    assert pk.tree_any({}) is False and pk.tree_all({}) is True and pk.tree_sum([]) == 0
    # a str, bytes or bytearray start joins the leaves (sum() refuses them), as optree's
    assert pk.tree_sum({"x": "a", "y": ("b", None)}, start="") == "ab"
    assert pk.tree_sum([b"a", (b"b",)], start=b">") == b">ab"
    joined = pk.tree_sum([b"a"], start=bytearray(b">"))
    assert joined == bytearray(b">a") and type(joined) is bytearray
    assert pk.tree_sum([], start="") == "" and pk.tree_sum([1.5], start=1) == 2.5
    with pytest.raises(TypeError):
        pk.tree_sum(["a", 1], start="")  # a leaf that is not a str: join's own error
    with pytest.raises(TypeError, match="tree_any_only expects a type"):
        pk.tree_any_only(lambda x: x, bool, [1])
    with pytest.raises(TypeError, match="tree_map_only expects a type"):
        pk.tree_map_only(3, str, [1])


def test_ops_through_rules_and_is_leaf() -> None:
    tree = {"o": Opaque([1, 2], 3), "p": (4, [5])}
    assert pk.tree_sum(tree, rules=RULES) == 12
    assert pk.tree_map_only(int, str, tree)["o"] is tree["o"]  # a leaf without the rule
    assert pk.tree_map_only(int, str, tree, rules=RULES)["o"].items == ["1", "2"]
    assert pk.tree_max(tree, is_leaf=lambda x: isinstance(x, list), key=str, rules=RULES) == [5]


# -- against the peers ------------------------------------------------------------------

PEER = settings(max_examples=100, deadline=None)


def _truthy(tree: Any) -> Any:
    """Some leaves made falsy, so any and all both vary."""
    return pk.tree_map(lambda x: x if hash(x) % 3 else 0, tree)


@PEER
@given(peer_trees(with_deque=True))
def test_reductions_match_optree(tree: Any) -> None:
    optree = pytest.importorskip("optree")
    tree = _truthy(tree)
    assert pk.tree_any(tree) == optree.tree_any(tree)
    assert pk.tree_all(tree) == optree.tree_all(tree)
    key = functools.partial(hash)
    assert pk.tree_max(tree, key=key, default=-1) == optree.tree_max(tree, key=key, default=-1)
    assert pk.tree_min(tree, key=key, default=-1) == optree.tree_min(tree, key=key, default=-1)
    add = operator.add
    as_float = pk.tree_map(lambda x: float(hash(x) % 7), tree)
    assert pk.tree_sum(as_float) == optree.tree_sum(as_float)
    as_str = pk.tree_map(lambda x: str(hash(x) % 7), tree)  # sum() refuses a str start
    for start in ("", "s", b"", bytearray(b"b")):
        leaves = as_str if isinstance(start, str) else pk.tree_map(str.encode, as_str)
        mine, theirs = pk.tree_sum(leaves, start=start), optree.tree_sum(leaves, start=start)
        assert mine == theirs and type(mine) is type(theirs) is type(start)
    assert pk.tree_reduce(add, as_float, 1.0) == optree.tree_reduce(add, as_float, 1.0)
    for fill in (None, 0):
        mine = pk.tree_partition(lambda x: hash(x) % 2, tree, fillvalue=fill)
        theirs = optree.tree_partition(lambda x: hash(x) % 2, tree, fillvalue=fill)
        assert all(_same_tree(a, b, dict_order=True) for a, b in zip(mine, theirs))
    replaced = pk.tree_replace_nones("none", tree)
    assert _same_tree(replaced, optree.tree_replace_nones("none", tree), dict_order=True)


@PEER
@given(peer_trees(), st.sampled_from([int, float, (int, str), int | float]))
def test_map_only_and_any_only_match_torch(tree: Any, types: Any) -> None:
    pytest.importorskip("torch")
    import torch.utils._pytree as tp

    tree = _truthy(tree)
    mine = pk.tree_map_only(types, Tag, tree)
    theirs = tp.tree_map_only(types, Tag, tree)
    assert _same_tree(mine, theirs, dict_order=True)
    for fn in ("tree_any_only", "tree_all_only"):
        got = getattr(pk, fn)(types, bool, tree)
        assert got == getattr(tp, fn)(types, bool, tree)
