"""What optree's and dm-tree's users reach for (issue 49): ``TreeSpec.is_suffix``
and ``TreeSpec.transform`` (optree's), accessors (``pk.Accessor``,
``pk.flatten_with_accessor``, ``spec.accessors()``: optree's
``PyTreeAccessor``, ``tree_flatten_with_accessor`` and ``accessors()``) and
``pk.traverse`` (dm-tree's).

Each is checked against its peer on hypothesis trees of the containers both
understand (the strategy of ``test_peers``), on pytree_kit's own every kind
(``tests.trees``), on a chain 100,000 deep, and for the errors it raises.
The suite runs once per engine.
"""

from __future__ import annotations

import copy
import pickle
from collections import OrderedDict, deque
from typing import Any

import pytest

import pytree_kit as pk
from tests.test_peers import _as_dicts, _nodes_of, _same_tree, _unique_leaf, trees
from tests.trees import RULES, Node, Opaque, Point, assert_same_tree
from tests.trees import trees as every_kind

pytest.importorskip("hypothesis")
from hypothesis import given, settings
from hypothesis import strategies as st

DEPTH = 100_000
SETTINGS = settings(deadline=None)


def _optree() -> Any:
    return pytest.importorskip("optree")


def _dmtree() -> Any:
    mod = pytest.importorskip("tree")
    if not hasattr(mod, "traverse"):
        pytest.skip("the module 'tree' here is not dm-tree")
    return mod


def _fresh(n: int) -> list:
    counter = [10 * n]
    return [_unique_leaf(k % 3, counter) for k in range(n)]


def _plain(*trees_: Any) -> bool:
    """No deque in the trees: optree's prefix order takes deques of any maxlen as one."""
    return not any(isinstance(t, deque) for tree in trees_ for t in _nodes_of(tree))


def _cut(tree: Any, data: Any) -> Any:
    """The tree with one of its containers replaced by a leaf (a prefix of it)."""
    pairs, _ = pk.flatten_with_path(tree)
    nodes = sorted({p[:i] for p, _ in pairs for i in range(len(p))}, key=len)
    return pk.tree_set(tree, data.draw(st.sampled_from(nodes)), 0) if nodes else tree


def _deep_list(depth: int = DEPTH) -> Any:
    t: Any = 0
    for _ in range(depth):
        t = [t]
    return t


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
    leaves = _fresh(spec.num_leaves)
    assert _same_tree(same.unflatten(leaves), ospec.unflatten(leaves), dict_order=True)
    # functions that change nodes and leaves
    ours, peers = _funcs(pk.structure), _funcs(optree.tree_structure)
    for name in ours:
        out = spec.transform(*ours[name])
        oout = ospec.transform(*peers[name])
        assert (out.num_leaves, out.num_nodes) == (oout.num_leaves, oout.num_nodes), name
        leaves = _fresh(out.num_leaves)
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
    deep = _deep_list()
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


# --------------------------------------------------------------------------
# accessors


@SETTINGS
@given(trees(with_deque=True))
def test_accessors_match_optree(tree: Any) -> None:
    optree = _optree()
    pairs, spec = pk.flatten_with_accessor(tree)
    oaccessors, oleaves, ospec = optree.tree_flatten_with_accessor(tree)
    accessors = [a for a, _ in pairs]
    leaves = [x for _, x in pairs]
    assert all(x is y for x, y in zip(leaves, oleaves)) and len(leaves) == len(oleaves)
    assert (
        accessors
        == spec.accessors()
        == spec.paths()
        == [p for p, _ in pk.flatten_with_path(tree)[0]]
    )
    assert [str(a) for a in accessors] == [o.codify("") for o in oaccessors]
    fresh_leaves = _fresh(spec.num_leaves)
    fresh = spec.unflatten(fresh_leaves)
    for k, (acc, oacc) in enumerate(zip(accessors, oaccessors)):
        assert type(acc) is pk.Accessor
        assert acc(tree) is leaves[k] is oacc(tree)
        assert acc(fresh) is fresh_leaves[k] is oacc(fresh)
        assert pk.tree_get(fresh, acc) is fresh_leaves[k]


@SETTINGS
@given(every_kind())
def test_accessors_fetch_every_kind(tree: Any) -> None:
    pairs, spec = pk.flatten_with_accessor(tree, rules=RULES)
    assert [a for a, _ in pairs] == spec.accessors()
    for acc, leaf in pairs:
        assert acc(tree, rules=RULES) is leaf
        assert pk.tree_set(tree, acc, "new", rules=RULES) is not tree
        back = pickle.loads(pickle.dumps(acc))
        assert back == acc and type(back) is pk.Accessor and hash(back) == hash(tuple(acc))


def test_accessor_object() -> None:
    tree = {"a": [Point(1, 2), {"k": 3}]}
    pairs, spec = pk.flatten_with_accessor(tree)
    acc = pairs[1][0]
    assert repr(acc) == "Accessor(['a'][0].y)" and str(acc) == "['a'][0].y"
    assert acc == (pk.DictKey("a"), pk.SequenceKey(0), pk.GetAttrKey("y"))
    assert {acc: 1}[tuple(acc)] == 1 and {tuple(acc): 1}[acc] == 1
    assert acc(tree) == 2 and pk.keystr(acc) == str(acc)
    assert list(acc) == list(spec.paths()[1]) and len(acc) == 3
    # slices and + are accessors; an item is a key
    parent = acc[:-1]
    assert type(parent) is pk.Accessor and parent(tree) == Point(1, 2)
    assert type(acc[0]) is pk.DictKey and acc[-1] == pk.GetAttrKey("y")
    joined = pk.Accessor([pk.DictKey("a")]) + (pk.SequenceKey(1), pk.DictKey("k"))  # noqa: RUF005
    assert type(joined) is pk.Accessor and joined(tree) == 3
    before = (pk.DictKey("a"),) + pk.Accessor([pk.SequenceKey(1)])  # noqa: RUF005
    assert type(before) is pk.Accessor and before(tree) == {"k": 3}
    assert pk.Accessor()(tree) is tree and repr(pk.Accessor()) == "Accessor()"
    assert copy.copy(acc) == acc and copy.deepcopy(acc) == acc
    with pytest.raises(TypeError, match="keys are DictKey, SequenceKey or GetAttrKey, got str"):
        pk.Accessor(["a"])
    with pytest.raises(TypeError, match="got str"):
        _ = acc + ("b",)  # noqa: RUF005
    with pytest.raises(AttributeError):
        acc.x = 1  # type: ignore[attr-defined]
    # a path the tree lacks names what exists
    with pytest.raises(
        IndexError, match=r"tree_get: tree\['a'\] is a list of 1, which has no \[1\]"
    ):
        pairs[2][0]({"a": [Point(1, 2)]})
    # rules and is_leaf, as tree_get takes them
    opaque = {"o": Opaque([1, 2], 3)}
    first = pk.flatten_with_accessor(opaque, rules=RULES)[0][0][0]
    assert first(opaque, rules=RULES) == 1
    with pytest.raises(IndexError, match=r"tree\['o'\] is a leaf of type Opaque"):
        first(opaque)
    node = Node(1, [2])
    accs = pk.structure(node).accessors()
    assert [a(node) for a in accs] == [1, 2]


def test_accessor_deep_chain() -> None:
    deep = _deep_list()
    (acc,) = pk.structure(deep).accessors()
    assert len(acc) == DEPTH and acc(deep) == 0
    assert pk.flatten_with_accessor(deep)[0][0][0] == acc


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


@SETTINGS
@given(trees(), st.sampled_from(["replace_tuples", "lists_to_none", "sizes", "keep"]))
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


@SETTINGS
@given(trees(), st.sampled_from(["replace_tuples", "lists_to_none", "sizes", "keep"]))
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


@SETTINGS
@given(every_kind())
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


@SETTINGS
@given(every_kind())
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
    deep = _deep_list()
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
