"""Filtering, reducing and restructuring: tree_map_only, tree_any / tree_all
(and _only), tree_reduce / sum / max / min, tree_transpose,
tree_broadcast_prefix, tree_partition / tree_combine, tree_replace_nones. On
every kind of node, on whichever engine runs, and against optree, jax and
torch where they have the function."""

from __future__ import annotations

import collections
import functools
import operator
from typing import Any

import pytest
from hypothesis import assume, given, settings
from hypothesis import strategies as st

import pytree_kit as pk
from tests.test_peers import _same_tree
from tests.test_peers import trees as peer_trees
from tests.trees import RULES, Leaf, Opaque, assert_same_tree, snapshot, trees

SETTINGS = settings(max_examples=150, deadline=None)


class Tag:
    """A leaf that wraps a value (a tuple would be a node)."""

    __slots__ = ("value",)

    def __init__(self, value: Any) -> None:
        self.value = value

    def __eq__(self, other: object) -> bool:
        return type(other) is Tag and other.value == self.value

    def __hash__(self) -> int:
        return hash((Tag, self.value))

    def __repr__(self) -> str:
        return f"Tag({self.value!r})"


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


@SETTINGS
@given(trees(), trees())
def test_transpose_turns_a_tree_of_trees_inside_out(outer_tree: Any, inner_tree: Any) -> None:
    outer = pk.structure(outer_tree, rules=RULES)
    inner = pk.structure(inner_tree, rules=RULES)
    assume(outer.num_leaves * inner.num_leaves < 150)
    # a tree of outer's structure whose leaf i is inner_tree with leaves (i, j)
    inner_leaves = range(inner.num_leaves)
    stacked = outer.unflatten(
        [inner.unflatten([Tag((i, j)) for j in inner_leaves]) for i in range(outer.num_leaves)]
    )
    flipped = pk.tree_transpose(outer, inner, stacked, rules=RULES)
    assert pk.structure(flipped, rules=RULES) == inner.compose(outer)
    expected = inner.unflatten(
        [outer.unflatten([Tag((i, j)) for i in range(outer.num_leaves)]) for j in inner_leaves]
    )
    assert_same_tree(flipped, expected, "tree", False)
    back = pk.tree_transpose(inner, outer, flipped, rules=RULES)
    assert_same_tree(back, stacked, "tree", False)
    if outer.num_leaves and inner.num_leaves:
        assert_same_tree(pk.tree_transpose(outer, None, stacked, rules=RULES), flipped, "t", False)


@SETTINGS
@given(trees(), st.data())
def test_broadcast_prefix_replicates_each_prefix_leaf(tree: Any, data: Any) -> None:
    pairs, spec = pk.flatten_with_path(tree, rules=RULES)
    nodes = sorted({p[:i] for p, _ in pairs for i in range(len(p))}, key=len)
    cut_at = data.draw(st.lists(st.sampled_from(nodes), max_size=3)) if nodes else []
    prefix = tree
    for path in sorted(cut_at, key=len, reverse=True):
        try:
            prefix = pk.tree_set(prefix, path, Leaf(len(path)), rules=RULES)
        except LookupError:  # inside a subtree an earlier cut removed
            pass
    out = pk.tree_broadcast_prefix(prefix, tree, rules=RULES)
    assert pk.structure(out, rules=RULES) == spec
    for path, _ in pairs:
        value = pk.tree_get(out, path, rules=RULES)
        # the prefix's leaf at the longest prefix of this path that it has
        for i in range(len(path), -1, -1):
            try:
                above = pk.tree_get(prefix, path[:i], rules=RULES)
            except LookupError:
                continue
            if pk.structure(above, rules=RULES).is_leaf():
                assert value is above
                break


@SETTINGS
@given(trees())
def test_partition_and_combine_are_inverse(tree: Any) -> None:
    before = snapshot(tree)
    fill = object()
    left, right = pk.tree_partition(lambda x: isinstance(x, int), tree, fillvalue=fill, rules=RULES)
    leaves, spec = pk.flatten(tree, rules=RULES)
    lleaves, lspec = pk.flatten(left, rules=RULES)
    rleaves, _ = pk.flatten(right, rules=RULES)
    assert lspec == spec
    for x, a, b in zip(leaves, lleaves, rleaves):
        assert (a, b) == ((x, fill) if isinstance(x, int) else (fill, x))
    assert_same_tree(pk.tree_combine(left, right, fillvalue=fill, rules=RULES), tree)
    assert_same_tree(pk.tree_combine(right, left, fillvalue=fill, rules=RULES), tree)
    # with None as the fill value, None becomes a leaf of the halves
    left, right = pk.tree_partition(lambda x: isinstance(x, int), tree, rules=RULES)
    assert_same_tree(pk.tree_combine(left, right, rules=RULES), tree)
    assert snapshot(tree) == before


@SETTINGS
@given(trees())
def test_replace_nones(tree: Any) -> None:
    sentinel = object()
    out = pk.tree_replace_nones(sentinel, tree, rules=RULES)
    leaves, spec = pk.flatten(tree, is_leaf=lambda x: x is None, rules=RULES)
    got, out_spec = pk.flatten(out, rules=RULES)
    assert len(got) == len(leaves)
    assert all((a is sentinel) if b is None else (a is b) for a, b in zip(got, leaves))


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


def test_transpose_errors_name_the_path() -> None:
    outer, inner = pk.structure([0, 0]), pk.structure({"x": 0, "y": 0})
    with pytest.raises(TypeError) as info:
        pk.tree_transpose(outer, inner, [{"x": 1, "y": 2}, {"x": 3, "z": 4}])
    assert str(info.value) == (
        "tree_transpose: tree[1]: structure mismatch: outer_spec.compose(inner_spec) has a dict "
        "with keys ['x', 'y'], the tree has a dict with keys ['x', 'z']"
    )
    with pytest.raises(ValueError, match=r"tree_transpose: inner_spec=None .* has no leaves"):
        pk.tree_transpose(pk.structure([]), None, [])
    with pytest.raises(
        ValueError,
        match=r"^tree: structure mismatch: the outer spec has a list of 2, the tree has a list of 1$",
    ):
        pk.tree_transpose(outer, None, [1])
    # no leaves on either side is not an error
    assert pk.tree_transpose(pk.structure([]), inner, []) == {"x": [], "y": []}
    assert pk.tree_transpose(outer, pk.structure(()), [(), ()]) == ()


class _PairNode:
    """A class with __tree_flatten__ that a rule can also read (other aux)."""

    def __init__(self, a: Any, b: Any) -> None:
        self.a, self.b = a, b

    def __tree_flatten__(self) -> tuple:
        return (self.a, self.b), None

    @classmethod
    def __tree_unflatten__(cls, aux: Any, children: Any) -> _PairNode:
        return cls(*children)


class _RuleOnly:
    def __init__(self, a: Any, b: Any) -> None:
        self.a, self.b = a, b


def _pair_flatten(p: Any) -> tuple:
    return (p.a, p.b), "by rule"


def test_transpose_reads_the_tree_by_the_specs_rules() -> None:
    """A class the outer spec holds by a rule is read by that rule, as
    outer.compose(inner).flatten_up_to reads it (optree takes the namespace
    from the spec likewise); rules= on the call still wins."""
    rules = {
        _PairNode: pk.Rule(_pair_flatten, lambda aux, ch: _PairNode(*ch)),
        _RuleOnly: pk.Rule(_pair_flatten, lambda aux, ch: _RuleOnly(*ch)),
    }
    inner = pk.structure([0, 0])
    for cls in (_PairNode, _RuleOnly):
        outer = pk.structure(cls(1, 2), rules=rules)
        tree = cls([1, 2], [3, 4])
        assert outer.compose(inner).flatten_up_to(tree) == [1, 2, 3, 4]
        out = pk.tree_transpose(outer, inner, tree)
        assert [(type(x), x.a, x.b) for x in out] == [(cls, 1, 3), (cls, 2, 4)]
        assert [(x.a, x.b) for x in pk.tree_transpose(outer, inner, tree, rules=rules)] == [
            (1, 3),
            (2, 4),
        ]
    # the call's own rules for the class are used over the spec's: then the
    # tree's aux differs from the spec's, and the mismatch is named
    other = {_PairNode: pk.Rule(lambda p: ((p.a, p.b), "other"), lambda aux, ch: _PairNode(*ch))}
    with pytest.raises(TypeError, match=r"^tree_transpose: tree: structure mismatch"):
        pk.tree_transpose(
            pk.structure(_PairNode(1, 2), rules=rules),
            inner,
            _PairNode([1, 2], [3, 4]),
            rules=other,
        )


def test_broadcast_and_combine_errors_name_the_path() -> None:
    with pytest.raises(ValueError) as info:
        pk.tree_broadcast_prefix({"a": 1, "b": [1, 2]}, {"a": [0], "b": [0, 0, 0]})
    assert str(info.value).startswith(
        "tree['b']: structure mismatch: the prefix tree has a list of 2, the full tree has"
    )
    with pytest.raises(ValueError) as info:
        pk.tree_combine({"a": [1, None]}, {"a": [None, 2, 3]})
    assert str(info.value) == (
        "tree_combine: tree['a']: structure mismatch: trees[0] has a list of 2, trees[1] has a "
        "list of 3"
    )
    with pytest.raises(TypeError, match="at least one tree"):
        pk.tree_combine()
    assert pk.tree_combine({"a": [None, None]}, {"a": [None, 2]}) == {"a": [None, 2]}
    # the first leaf that is not the fill value wins
    assert pk.tree_combine([1, None, None], [2, 3, None], [4, 5, 6]) == [1, 3, 6]
    assert pk.tree_combine([0, "f"], ["f", "f"], fillvalue="f") == [0, "f"]


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
@given(peer_trees(with_deque=True), st.data())
def test_broadcast_prefix_matches_optree(tree: Any, data: Any) -> None:
    optree = pytest.importorskip("optree")
    pairs, _ = pk.flatten_with_path(tree)
    nodes = sorted({p[:i] for p, _ in pairs for i in range(len(p))}, key=len)
    prefix = pk.tree_set(tree, data.draw(st.sampled_from(nodes)), "cut") if nodes else tree
    prefix = pk.tree_map(Tag, prefix)
    mine = pk.tree_broadcast_prefix(prefix, tree)
    assert _same_tree(mine, optree.tree_broadcast_prefix(prefix, tree), dict_order=True)


@PEER
@given(peer_trees(), peer_trees())
def test_transpose_matches_jax_and_optree(outer_tree: Any, inner_tree: Any) -> None:
    jtu = pytest.importorskip("jax").tree_util
    optree = pytest.importorskip("optree")
    outer, inner = pk.structure(outer_tree), pk.structure(inner_tree)
    assume(0 < outer.num_leaves * inner.num_leaves < 100)
    counter = iter(range(10**6))
    stacked = pk.tree_map(lambda _: pk.tree_map(lambda _: next(counter), inner_tree), outer_tree)
    mine = pk.tree_transpose(outer, inner, stacked)
    theirs = optree.tree_transpose(
        optree.tree_structure(outer_tree), optree.tree_structure(inner_tree), stacked
    )
    assert _same_tree(mine, theirs, dict_order=True)
    jaxs = jtu.tree_transpose(
        jtu.tree_structure(outer_tree), jtu.tree_structure(inner_tree), stacked
    )
    assert _same_tree(mine, jaxs, dict_order=False)  # jax rebuilds dicts in sorted order


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


def test_combine_inverts_a_partition_of_a_named_tuple() -> None:
    Point = collections.namedtuple("Point", "x y")
    tree = [Point(1, "a"), {"k": (2.5, None)}]
    left, right = pk.tree_partition(lambda x: isinstance(x, str), tree)
    assert left == [Point(None, "a"), {"k": (None, None)}]
    assert pk.tree_combine(left, right) == tree
