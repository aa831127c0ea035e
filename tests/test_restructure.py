"""pytree_kit._restructure: tree_transpose, tree_broadcast_prefix, tree_partition /
tree_combine, tree_replace_nones, and traverse / traverse_with_path (dm-tree's).
On every kind of node, on whichever engine runs, on a chain 100,000 deep, and
against optree, jax and dm-tree where they have the function."""

from __future__ import annotations

import collections
import copy
import pickle
from typing import Any

import pytest
from hypothesis import assume, given, settings
from hypothesis import strategies as st

import pytree_kit as pk
from scripts.corpus.trees import RULES, Leaf, assert_same_tree, snapshot, trees
from tests.support.peer_trees import _as_dicts, _same_tree
from tests.support.peer_trees import trees as peer_trees
from tests.support.shapes import DEPTH, Tag, deep_list

SETTINGS = settings(max_examples=150, deadline=None)


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


def test_combine_inverts_a_partition_of_a_named_tuple() -> None:
    Point = collections.namedtuple("Point", "x y")
    tree = [Point(1, "a"), {"k": (2.5, None)}]
    left, right = pk.tree_partition(lambda x: isinstance(x, str), tree)
    assert left == [Point(None, "a"), {"k": (None, None)}]
    assert pk.tree_combine(left, right) == tree


TRAVERSE_SETTINGS = settings(deadline=None)


def _dmtree() -> Any:
    mod = pytest.importorskip("tree")
    if not hasattr(mod, "traverse"):
        pytest.skip("the module 'tree' here is not dm-tree")
    return mod


# --------------------------------------------------------------------------
# traverse


def _plain_tree(tree: Any) -> Any:
    """dm-tree's containers only: dicts (it sorts an OrderedDict's keys),
    lists, tuples and namedtuples."""
    return _as_dicts(tree)


def _answers(name: str, mtn: Any) -> Any:
    """fn for both libraries (``mtn``: its MAP_TO_NONE)."""

    def replace_tuples(x: Any) -> Any:
        return ("tuple of", len(x)) if type(x) is tuple else None

    def lists_to_none(x: Any) -> Any:
        return mtn if type(x) is list else None

    def sizes(x: Any) -> Any:
        return len(x) if type(x) is dict else None

    def keep(x: Any) -> Any:
        return None

    return {"replace_tuples": replace_tuples, "lists_to_none": lists_to_none, "sizes": sizes,
            "keep": keep}[name]  # fmt: skip


def _seeing(seen: list, fn: Any) -> Any:
    """fn, recording what it is given in ``seen``."""

    def f(x: Any) -> Any:
        seen.append(x)
        return fn(x)

    return f


@TRAVERSE_SETTINGS
@given(peer_trees(), st.sampled_from(["replace_tuples", "lists_to_none", "sizes", "keep"]))
def test_traverse_matches_dmtree(tree: Any, name: str) -> None:
    dmtree = _dmtree()
    tree = _plain_tree(tree)
    for top_down in (True, False):
        mine: list = []
        theirs: list = []
        fn = _seeing(mine, _answers(name, pk.MAP_TO_NONE))
        out = pk.traverse(fn, tree, top_down)
        dfn = _seeing(theirs, _answers(name, dmtree.MAP_TO_NONE))
        dout = dmtree.traverse(dfn, tree, top_down=top_down)
        assert _same_tree(out, dout, dict_order=True)
        assert len(mine) == len(theirs)
        for x, y in zip(mine, theirs):
            # top-down: the very subtrees; bottom-up: rebuilt ones, alike
            assert x is y if top_down else _same_tree(x, y, dict_order=True)


def _raw(path: tuple) -> tuple:
    """A pytree_kit path as dm-tree's tuple of raw keys."""
    return tuple(
        k.key if isinstance(k, pk.DictKey) else k.idx if isinstance(k, pk.SequenceKey) else k.name
        for k in path
    )


@TRAVERSE_SETTINGS
@given(peer_trees(), st.sampled_from(["replace_tuples", "lists_to_none", "sizes", "keep"]))
def test_traverse_with_path_matches_dmtree(tree: Any, name: str) -> None:
    """fn(path, subtree) sees the same subtrees at the same paths as
    dm-tree's traverse_with_path, and the results agree."""
    dmtree = _dmtree()
    tree = _plain_tree(tree)
    for top_down in (True, False):
        mine: list = []
        theirs: list = []
        fn = _recording_path(mine, _answers(name, pk.MAP_TO_NONE), _raw)
        dfn = _recording_path(theirs, _answers(name, dmtree.MAP_TO_NONE), tuple)
        out = pk.traverse_with_path(fn, tree, top_down)
        dout = dmtree.traverse_with_path(dfn, tree, top_down=top_down)
        assert _same_tree(out, dout, dict_order=True)
        assert [p for p, _ in mine] == [p for p, _ in theirs]
        for (_, x), (_, y) in zip(mine, theirs):
            assert x is y if top_down else _same_tree(x, y, dict_order=True)


def _recording_path(log: list, answer: Any, convert: Any) -> Any:
    """fn(path, x): records (convert(path), x) in ``log``, answers answer(x)."""

    def fn(path: tuple, x: Any) -> Any:
        log.append((convert(path), x))
        return answer(x)

    return fn


@TRAVERSE_SETTINGS
@given(trees())
def test_traverse_with_path_paths_are_flatten_with_paths(tree: Any) -> None:
    """Each leaf's path is the one flatten_with_path gives it, each subtree is
    at its path (tree_get), on every kind of node; the results are
    traverse's."""
    pairs, _ = pk.flatten_with_path(tree, rules=RULES)
    for top_down in (True, False):
        seen: list = []
        fn = _recording_path(seen, lambda x: None, tuple)
        out = pk.traverse_with_path(fn, tree, top_down, rules=RULES)
        assert_same_tree(out, tree)
        leaf_paths = [p for p, x in seen if pk.structure(x, rules=RULES).is_leaf()]
        assert leaf_paths == [p for p, _ in pairs]
        if top_down:
            assert all(pk.tree_get(tree, p, rules=RULES) is x for p, x in seen)


@TRAVERSE_SETTINGS
@given(trees())
def test_traverse_rebuilds_every_kind(tree: Any) -> None:
    leaves, spec = pk.flatten(tree, rules=RULES)
    for top_down in (True, False):
        seen: list = []
        out = pk.traverse(seen.append, tree, top_down, rules=RULES)
        assert_same_tree(out, tree)
        assert pk.structure(out, rules=RULES) == spec
        assert len(seen) == spec.num_nodes  # every node and leaf, once
        assert [x for x in seen if pk.structure(x, rules=RULES).is_leaf()] == leaves
    # each leaf replaced, top-down and bottom-up: tree_map
    wrapped = pk.tree_map(lambda x: ("w", x), tree, rules=RULES)
    for top_down in (True, False):
        out = pk.traverse(
            lambda x: ("w", x) if pk.structure(x, rules=RULES).is_leaf() else None,
            tree,
            top_down,
            rules=RULES,
        )
        assert_same_tree(out, wrapped, identical_leaves=False)


def test_traverse_top_down_stops_and_bottom_up_sees_the_new_children() -> None:
    tree = {"a": (1, [2, 3]), "b": [4]}
    seen: list = []

    def stop_at_tuples(x: Any) -> Any:
        seen.append(x)
        return "T" if type(x) is tuple else None

    assert pk.traverse(stop_at_tuples, tree) == {"a": "T", "b": [4]}
    assert (1, [2, 3]) in seen and 1 not in seen and 2 not in seen
    # bottom-up: the lists' sums, then the tuple sees them
    got: list = []

    def sums(x: Any) -> Any:
        got.append(x)
        return sum(x) if type(x) in (list, tuple) else None

    assert pk.traverse(sums, tree, top_down=False) == {"a": 6, "b": 4}
    assert (1, 5) in got
    # MAP_TO_NONE puts None in place; None keeps the subtree
    assert pk.traverse(lambda x: pk.MAP_TO_NONE if x == 4 else None, tree) == {
        "a": (1, [2, 3]),
        "b": [None],
    }
    assert pk.traverse(lambda x: pk.MAP_TO_NONE, tree) is None
    assert pk.traverse(lambda x: pk.MAP_TO_NONE if x is None else None, [None], False) == [None]
    # fn sees None (a node with no children here, a leaf in dm-tree) and empty containers
    seen = []
    pk.traverse(seen.append, [None, (), {}])
    assert seen == [[None, (), {}], None, (), {}]
    # is_leaf stops the descent; fn still sees the subtree whole
    seen = []
    assert pk.traverse(seen.append, [[1, 2]], is_leaf=lambda x: x == [1, 2]) == [[1, 2]]
    assert seen == [[[1, 2]], [1, 2]]


def test_traverse_errors_name_the_place() -> None:
    loop: dict = {"x": 1}
    loop["self"] = [loop]
    for top_down in (True, False):
        with pytest.raises(
            ValueError,
            match=r"^traverse: tree\['self'\]\[0\]: cycle: this container is the one at tree, "
            "which holds itself$",
        ):
            pk.traverse(lambda x: None, loop, top_down)
    shared = [1]
    assert pk.traverse(lambda x: None, {"a": shared, "b": shared}) == {"a": [1], "b": [1]}

    class Tagged:
        def __init__(self, tags: Any) -> None:
            self.tags = tags

        def __tree_flatten__(self) -> tuple:
            return (), self.tags

        @classmethod
        def __tree_unflatten__(cls, aux: Any, children: tuple) -> Any:
            return cls(aux)

    with pytest.raises(
        TypeError, match=r"^traverse: tree\['a'\]\[1\]: the aux data of .*Tagged.__tree_flatten__"
    ):
        pk.traverse(lambda x: None, {"a": [0, Tagged(["x"])]})
    # fn's own errors are fn's
    with pytest.raises(ZeroDivisionError):
        pk.traverse(lambda x: 1 / 0, [1])


def test_traverse_deep_chain() -> None:
    deep = deep_list()
    for top_down in (True, False):
        seen: list = []
        out = pk.traverse(_seeing(seen, lambda x: "bottom" if x == 0 else None), deep, top_down)
        assert len(seen) == DEPTH + 1
        assert pk.structure(out) == pk.structure(deep) and pk.leaves(out) == ["bottom"]
    # bottom-up sees each level rebuilt: the depth, counted from the bottom
    out = pk.traverse(lambda x: 1 if x == 0 else x[0] + 1, deep, top_down=False)
    assert out == DEPTH + 1


def test_map_to_none_is_one_object() -> None:
    assert repr(pk.MAP_TO_NONE) == "pytree_kit.MAP_TO_NONE"
    assert pickle.loads(pickle.dumps(pk.MAP_TO_NONE)) is pk.MAP_TO_NONE
    assert copy.deepcopy(pk.MAP_TO_NONE) is pk.MAP_TO_NONE
