"""Paths into trees: tree_get, tree_set, tree_at, flatten_one_level,
keystr's options, parse_keystr, spec.paths() and the flat keystr dict; and the
spec algebra (TreeSpec.leaf, from_collection, compose, is_prefix and the
order, num_children). Every kind of node, on whichever engine runs."""

from __future__ import annotations

import collections
import dataclasses
import math
import pickle
from typing import Any

import pytest
from hypothesis import assume, given, settings
from hypothesis import strategies as st

import pytree_kit as pk
from scripts.corpus.trees import RULES, Node, Opaque, assert_same_tree, snapshot, trees

SETTINGS = settings(max_examples=150, deadline=None)

# the mapping keys whose keystr reads back (parse_keystr's contract)
_READABLE = (str, bytes, bool, type(None), int, float)


def _readable(path: tuple) -> bool:
    return all(type(k) is not pk.DictKey or type(k.key) in _READABLE for k in path)


def _node_paths(pairs: list) -> list:
    """Every proper prefix of the leaves' paths: the paths of the containers."""
    return sorted({p[:i] for p, _ in pairs for i in range(len(p))}, key=len)


# -- spec.paths() and flatten_one_level -----------------------------------------


@SETTINGS
@given(trees())
def test_spec_paths_are_the_paths_flatten_with_path_gives(tree: Any) -> None:
    pairs, spec = pk.flatten_with_path(tree, rules=RULES)
    want = [p for p, _ in pairs]
    assert spec.paths() == want
    # a spec read back from JSON or pickle names the same paths
    assert pickle.loads(pickle.dumps(spec)).paths() == spec.paths()
    # kept with the spec after the first call: each call a new list, whatever
    # was done to the last; the kept paths are not pickled and change no ==
    first = spec.paths()
    first.append("not a path")
    if first[:-1]:
        first[0] = "nor this"
    again = spec.paths()
    assert again == want and again is not spec.paths()
    copy = pickle.loads(pickle.dumps(spec))
    assert copy._paths is None and copy == spec and hash(copy) == hash(spec)


@SETTINGS
@given(trees())
def test_flatten_one_level_rebuilds_the_root_around_the_same_children(tree: Any) -> None:
    if pk.structure(tree, rules=RULES).is_leaf():
        with pytest.raises(ValueError, match="flatten_one_level: the tree is a leaf"):
            pk.flatten_one_level(tree, rules=RULES)
        return
    before = snapshot(tree)
    children, spec = pk.flatten_one_level(tree, rules=RULES)
    assert spec.num_leaves == len(children) == pk.structure(tree, rules=RULES).num_children
    assert_same_tree(spec.unflatten(children), tree)
    for (key,), child in zip(spec.paths(), children):
        assert pk.tree_get(tree, (key,), rules=RULES) is child
    assert snapshot(tree) == before


def test_flatten_one_level_asks_is_leaf_of_the_root_only() -> None:
    asked = []

    def is_leaf(x: Any) -> bool:
        asked.append(x)
        return False

    tree = {"a": [1, 2], "b": None}
    children, spec = pk.flatten_one_level(tree, is_leaf=is_leaf)
    assert asked == [tree] and children == [[1, 2], None]
    with pytest.raises(ValueError, match=r"the tree is a leaf \(dict\)"):
        pk.flatten_one_level(tree, is_leaf=lambda x: isinstance(x, dict))
    assert pk.flatten_one_level(None) == ([], pk.structure(None))


# -- tree_get and tree_set -------------------------------------------------------


@SETTINGS
@given(trees(), st.data())
def test_tree_get_and_tree_set_at_every_leaf(tree: Any, data: Any) -> None:
    pairs, spec = pk.flatten_with_path(tree, rules=RULES)
    assume(pairs)
    before = snapshot(tree)
    k = data.draw(st.integers(0, len(pairs) - 1))
    path, leaf = pairs[k]
    assert pk.tree_get(tree, path, rules=RULES) is leaf
    new_leaf = object()
    new = pk.tree_set(tree, path, new_leaf, rules=RULES)
    leaves = [x for _, x in pairs]
    got, new_spec = pk.flatten(new, rules=RULES)
    assert new_spec == spec
    assert got[k] is new_leaf
    assert all(a is b for i, (a, b) in enumerate(zip(got, leaves)) if i != k)
    assert snapshot(tree) == before  # the input is never mutated
    # the builtin containers' direct reads agree with the engines' reads
    slow = pk.tree_set(tree, path, new_leaf, is_leaf=lambda x: False, rules=RULES)
    assert_same_tree(slow, new)
    assert pk.tree_get(tree, path, is_leaf=lambda x: False, rules=RULES) is leaf
    # every subtree off the path is shared, not copied
    for other in _node_paths(pairs):
        if other != path[: len(other)] and other[:-1] == path[: len(other) - 1]:
            assert pk.tree_get(new, other, rules=RULES) is pk.tree_get(tree, other, rules=RULES)
    if _readable(path):
        assert pk.tree_get(tree, pk.keystr(path), rules=RULES) is leaf


@SETTINGS
@given(trees(), st.data())
def test_tree_set_replaces_a_whole_subtree(tree: Any, data: Any) -> None:
    pairs, _ = pk.flatten_with_path(tree, rules=RULES)
    nodes = _node_paths(pairs)
    assume(nodes)
    path = data.draw(st.sampled_from(nodes))
    before = snapshot(tree)
    new = pk.tree_set(tree, path, "new", rules=RULES)
    assert pk.tree_get(new, path, rules=RULES) == "new"
    # a leaf where a container was: the new structure is a strict prefix
    assert pk.structure(new, rules=RULES) < pk.structure(tree, rules=RULES)
    assert snapshot(tree) == before


@dataclasses.dataclass(frozen=True)
class Frozen:
    x: Any
    y: Any = None
    tag: str = dataclasses.field(default="t", metadata={"static": True})


Point = collections.namedtuple("Point", "x y")


def test_tree_set_rebuilds_frozen_records_and_keeps_what_the_spec_keeps() -> None:
    tree = {
        "f": Frozen([1, 2], tag="u"),
        "p": Point(3, {"b": 4, "a": 5}),
        "d": collections.defaultdict(list, {"z": 6, "y": 7}),
        "q": collections.deque([8], maxlen=3),
    }
    before = snapshot(tree)
    new = pk.tree_set(tree, "['f'].x[1]", 20)
    assert new["f"] == Frozen([1, 20], tag="u") and new["f"] is not tree["f"]
    assert new["p"] is tree["p"] and new["d"] is tree["d"]
    new = pk.tree_set(tree, "['p'].y['b']", 40)
    assert type(new["p"]) is Point and list(new["p"].y) == ["b", "a"]
    new = pk.tree_set(tree, "['d']['y']", 70)
    assert new["d"].default_factory is list and list(new["d"].items()) == [("z", 6), ("y", 70)]
    new = pk.tree_set(tree, "['q'][0]", 80)
    assert new["q"].maxlen == 3 and list(new["q"]) == [80]
    assert list(pk.tree_set(tree, (), "root")) == list("root")
    assert snapshot(tree) == before


def test_tree_get_and_tree_set_through_the_protocol_and_rules() -> None:
    tree = [Node(1, Opaque([2, 3], 1)), {"o": Opaque([4], 2)}]
    assert pk.tree_get(tree, "[0][1]", rules=RULES).scale == 1
    assert pk.tree_get(tree, "[0][1][1]", rules=RULES) == 3
    new = pk.tree_set(tree, "[1]['o'][0]", 40, rules=RULES)
    assert new[1]["o"].items == [40] and new[1]["o"].scale == 2 and tree[1]["o"].items == [4]
    # without the rule, an Opaque is a leaf: the path goes no further
    with pytest.raises(IndexError, match=r"tree\[1\]\['o'\] is a leaf of type Opaque"):
        pk.tree_get(tree, "[1]['o'][0]")


@pytest.mark.parametrize(
    ("path", "exc", "message"),
    [
        (
            "['f'].z",
            KeyError,
            "tree_get: tree['f'] is dataclass Frozen (static tag='t'), which has no .z",
        ),
        ("['p'].x[3]", IndexError, "tree_get: tree['p'].x is a list of 1, which has no [3]"),
        ("['zz']", KeyError, "tree_get: tree is a dict with keys ['f', 'p'], which has no ['zz']"),
        ("['p'].y[0]", IndexError, "tree_get: tree['p'].y is None, which has no [0]"),
        (
            "['f'].x['k']",
            KeyError,
            "tree_get: tree['f'].x is a leaf of type int, which has no ['k']",
        ),
        (
            (pk.DictKey("p"), pk.SequenceKey(0)),
            IndexError,
            "tree_get: tree['p'] is namedtuple Point, which has no [0]",
        ),
        (
            (pk.DictKey("p"), pk.GetAttrKey("x"), pk.SequenceKey("0")),
            IndexError,
            "tree_get: tree['p'].x is a list of 1, which has no [0]",
        ),
    ],
)
def test_a_bad_path_names_where_it_failed(path: Any, exc: type, message: str) -> None:
    tree = {"f": Frozen(1), "p": Point([0], None)}
    with pytest.raises(exc) as info:
        pk.tree_get(tree, path)
    assert info.value.args[0] == message
    with pytest.raises(exc) as info:
        pk.tree_set(tree, path, 0)
    assert info.value.args[0] == message.replace("tree_get", "tree_set")


def test_a_path_must_be_keys_or_text() -> None:
    with pytest.raises(TypeError, match="a path is a tuple of keys or its keystr text"):
        pk.tree_get({}, 3)
    with pytest.raises(TypeError, match="got str in"):
        pk.tree_get({"a": 1}, ("a",))


def test_an_int_key_read_from_text_finds_a_mapping_key() -> None:
    tree = {3: ["x", "y"], True: "t"}
    assert pk.tree_get(tree, "[3][1]") == "y"
    assert pk.tree_set(tree, "[3][0]", "X") == {3: ["X", "y"], True: "t"}
    # a bool key is not an int position
    with pytest.raises(IndexError):
        pk.tree_get(tree, "[1]")
    assert pk.tree_get(tree, "[True]") == "t"


# -- tree_at ---------------------------------------------------------------------


def test_tree_at_replaces_what_where_selects() -> None:
    tree = {"w": [1, 2], "b": (3, Point(4, None)), "f": Frozen(5)}
    before = snapshot(tree)
    assert pk.tree_at(lambda t: t["w"][1], tree, 20) == {**tree, "w": [1, 20]}
    new = pk.tree_at(lambda t: t["f"].x, tree, replace_fn=lambda v: v * 10)
    assert new["f"] == Frozen(50) and new["w"] is tree["w"]
    # a node, not only a leaf; and a list that is itself a node is one selection
    assert pk.tree_at(lambda t: t["w"], tree, "all")["w"] == "all"
    new = pk.tree_at(lambda t: (t["b"][1].x, t["w"][0]), tree, ("x", "y"))
    assert new["b"] == (3, Point("x", None)) and new["w"] == ["y", 2]
    new = pk.tree_at(lambda t: [t["b"], t["f"]], tree, replace_fn=type)
    assert new["b"] is tuple and new["f"] is Frozen
    assert pk.tree_at(lambda t: t, tree, "root") == "root"
    # None is selectable once it is a leaf
    new = pk.tree_at(lambda t: t["b"][1].y, tree, 6, is_leaf=lambda x: x is None)
    assert new["b"][1] == Point(4, 6)
    assert snapshot(tree) == before


def test_tree_at_through_rules_and_the_protocol() -> None:
    tree = {"n": Node(Opaque([1, 2], 3), 4)}
    new = pk.tree_at(lambda t: t["n"].left.items[1], tree, 20, rules=RULES)
    assert new["n"].left.items == [1, 20] and new["n"].left.scale == 3
    assert tree["n"].left.items == [1, 2]


@pytest.mark.parametrize(
    ("where", "message"),
    [
        (
            lambda t: t["b"][1].y,
            "tree_at: where selected None; to select a None of the tree, "
            "pass is_leaf=lambda x: x is None",
        ),
        (
            lambda t: (t["b"], t["b"][0]),
            "tree_at: where selected tree['b'] and tree['b'][0] inside it",
        ),
        (lambda t: 7, "tree_at: where returned an int, which is not a node or leaf of the tree"),
        (lambda t: (t["w"], t["w"]), "tree_at: where selected a list twice"),
        (
            lambda t: (t["w"][0], t["w"][0]),
            "tree_at: where selected the leaf at tree['w'][0] twice",
        ),
        (
            lambda t: (t["e"], t["w"]),
            "tree_at: where selected a tuple, which stands at tree['e'] and at tree['g']",
        ),
    ],
)
def test_tree_at_refuses_what_it_cannot_place(where: Any, message: str) -> None:
    tree = {"w": [1], "b": (3, Point(4, None)), "e": (), "g": ()}
    with pytest.raises(ValueError) as info:
        pk.tree_at(where, tree, replace_fn=lambda x: x)
    assert str(info.value).startswith(message)


def test_tree_at_wants_one_replacement_per_place() -> None:
    tree = {"a": 1, "b": 2}
    with pytest.raises(ValueError, match="pass exactly one of replace and replace_fn"):
        pk.tree_at(lambda t: t["a"], tree)
    with pytest.raises(ValueError, match="pass exactly one"):
        pk.tree_at(lambda t: t["a"], tree, 1, replace_fn=str)
    with pytest.raises(ValueError, match="selected 2 places, but replace has 1 values"):
        pk.tree_at(lambda t: (t["a"], t["b"]), tree, [0])


# -- keystr, parse_keystr and the flat dict -----------------------------------------


@SETTINGS
@given(trees())
def test_parse_keystr_reads_back_every_path(tree: Any) -> None:
    pairs, spec = pk.flatten_with_path(tree, rules=RULES)
    for path, _ in pairs:
        text = pk.keystr(path)
        if _readable(path):
            assert pk.parse_keystr(text, spec=spec) == path
            # without the spec only an int mapping key reads back as a position
            if not any(type(k) is pk.DictKey and type(k.key) is int for k in path):
                assert pk.parse_keystr(text) == path


@given(
    st.lists(
        st.one_of(
            st.builds(
                pk.DictKey,
                st.one_of(
                    st.text(), st.binary(), st.booleans(), st.none(), st.floats(allow_nan=False)
                ),
            ),
            st.builds(pk.SequenceKey, st.integers(0, 10**20)),
            st.builds(pk.GetAttrKey, st.from_regex(r"[A-Za-z_][A-Za-z0-9_]*", fullmatch=True)),
        ),
        max_size=6,
    ).map(tuple)
)
def test_keystr_and_parse_keystr_are_inverse(path: tuple) -> None:
    assert pk.parse_keystr(pk.keystr(path)) == path


def test_parse_keystr_reads_nan_and_the_spec_tells_int_keys_apart() -> None:
    (key,) = pk.parse_keystr("[nan]")
    assert math.isnan(key.key)
    spec = pk.structure({1: [0, {2: 0}]})
    assert pk.parse_keystr("[1][1][2]", spec=spec) == (
        pk.DictKey(1),
        pk.SequenceKey(1),
        pk.DictKey(2),
    )
    with pytest.raises(
        ValueError,
        match=r"is not a path of the spec: tree\[1\] is a list of 2, "
        r"which has no \[5\]",
    ):
        pk.parse_keystr("[1][5]", spec=spec)


@given(st.text())
def test_parse_keystr_never_runs_text_and_raises_only_value_error(text: str) -> None:
    try:
        path = pk.parse_keystr(text)
    except ValueError as e:
        assert str(e).startswith("parse_keystr: ")
        return
    assert all(type(k) in (pk.DictKey, pk.SequenceKey, pk.GetAttrKey) for k in path)


@pytest.mark.parametrize(
    "text",
    [
        "x",
        "[",
        "['a'",
        "[1",
        ".1a",
        "[foo]",
        "[__import__('os').system('true')]",
        "['a' + 'b']",
        "[f'{1}']",
        "[1 if 1 else 2]",
        "[(1, 2)]",
        "['a']x",
        "[1][",
        "['\\N{bogus}']",
    ],
)
def test_parse_keystr_refuses_anything_but_keys(text: str) -> None:
    with pytest.raises(ValueError, match=r"^parse_keystr: "):
        pk.parse_keystr(text)


def test_keystr_simple_and_separator_as_jax_writes_them() -> None:
    jtu = pytest.importorskip("jax").tree_util
    tree = {"a": [Point(1, {"j": "x", "k": None})], "b": (3, {2: "y", 1.5: "z"})}
    pairs, _ = pk.flatten_with_path(tree)
    jpairs, _ = jtu.tree_flatten_with_path(tree)
    for (path, _), (jpath, _) in zip(pairs, jpairs):
        for kw in ({}, {"simple": True}, {"separator": "/"}, {"simple": True, "separator": "."}):
            assert pk.keystr(path, **kw) == jtu.keystr(jpath, **kw)
    with pytest.raises(TypeError, match="separator must be a str"):
        pk.keystr(pairs[0][0], separator=1)


@SETTINGS
@given(trees())
def test_flatten_keystr_round_trips(tree: Any) -> None:
    pairs, spec = pk.flatten_with_path(tree, rules=RULES)
    flat = pk.flatten_keystr(tree, rules=RULES)
    assert list(flat) == [pk.keystr(p) for p, _ in pairs]
    assert all(a is b for a, (_, b) in zip(flat.values(), pairs))
    assert_same_tree(pk.unflatten_keystr(spec, flat), tree)
    # in any order
    assert_same_tree(pk.unflatten_keystr(spec, dict(reversed(list(flat.items())))), tree)


def test_unflatten_keystr_names_missing_and_unknown_keys() -> None:
    spec = pk.structure({"a.b": [0, 0], "c]": 0})
    with pytest.raises(KeyError) as info:
        pk.unflatten_keystr(spec, {"['a.b'][0]": 1, "['c]']": 3})
    assert info.value.args[0] == "unflatten_keystr: no value for \"['a.b'][1]\""
    with pytest.raises(ValueError, match=r"""the spec has no leaf at "\['a.b'\]\[2\]\""""):
        pk.unflatten_keystr(spec, {"['a.b'][0]": 1, "['a.b'][1]": 2, "['c]']": 3, "['a.b'][2]": 4})
    with pytest.raises(TypeError, match="expects a TreeSpec"):
        pk.unflatten_keystr({}, {})


def test_flatten_keystr_refuses_two_leaves_with_one_text() -> None:
    class Key:
        def __repr__(self) -> str:
            return "K"

    with pytest.raises(ValueError, match=r"two leaves have the path text '\[K\]'"):
        pk.flatten_keystr({Key(): 1, Key(): 2})


# -- the spec algebra --------------------------------------------------------------


@SETTINGS
@given(trees())
def test_from_collection_of_the_children_specs_is_the_spec(tree: Any) -> None:
    spec = pk.structure(tree, rules=RULES)
    assume(not spec.is_leaf())
    children, outer = pk.flatten_one_level(tree, rules=RULES)
    top = outer.unflatten([pk.structure(c, rules=RULES) for c in children])
    built = pk.TreeSpec.from_collection(top, rules=RULES)
    assert built == spec and hash(built) == hash(spec)
    # dict orders travel too: the rebuilt tree is the tree
    leaves = pk.leaves(tree, rules=RULES)
    assert_same_tree(built.unflatten(leaves), tree)
    assert built.to_json() == spec.to_json()


@SETTINGS
@given(trees(), trees())
def test_compose_is_the_spec_of_the_nested_tree(outer_tree: Any, inner_tree: Any) -> None:
    outer = pk.structure(outer_tree, rules=RULES)
    inner = pk.structure(inner_tree, rules=RULES)
    assume(outer.num_leaves * max(inner.num_leaves, 1) < 200)
    nested = pk.tree_map(lambda _: inner_tree, outer_tree, rules=RULES)
    composed = outer.compose(inner)
    assert composed == pk.structure(nested, rules=RULES)
    assert composed.num_leaves == outer.num_leaves * inner.num_leaves
    assert_same_tree(composed.unflatten(pk.leaves(nested, rules=RULES)), nested)
    assert pk.TreeSpec.leaf().compose(inner) == inner and outer.compose(pk.TreeSpec.leaf()) == outer


@SETTINGS
@given(trees(), st.data())
def test_is_prefix_and_the_order(tree: Any, data: Any) -> None:
    pairs, spec = pk.flatten_with_path(tree, rules=RULES)
    nodes = _node_paths(pairs)
    assert spec.is_prefix(spec) and spec <= spec and spec >= spec
    assert not spec.is_prefix(spec, strict=True) and not spec < spec
    assert pk.TreeSpec.leaf() <= spec
    if nodes:
        path = data.draw(st.sampled_from(nodes))
        cut = pk.structure(pk.tree_set(tree, path, 0, rules=RULES), rules=RULES)
        # a container (it holds a leaf) became a leaf
        assert cut.is_prefix(spec) and cut.is_prefix(spec, strict=True)
        assert cut < spec and spec > cut and not spec <= cut and cut != spec


@given(trees(), trees())
def test_the_order_agrees_with_equality(a: Any, b: Any) -> None:
    sa, sb = pk.structure(a, rules=RULES), pk.structure(b, rules=RULES)
    assert (sa <= sb and sb <= sa) == (sa == sb)
    assert (sa < sb) == (sa <= sb and sa != sb)
    assert sa.num_children == len(sa.children())


def test_the_spec_algebra_in_examples() -> None:
    leaf = pk.TreeSpec.leaf()
    assert leaf == pk.structure(1) and leaf.num_leaves == 1 and leaf.num_children == 0
    assert pk.structure(None).num_children == 0 and pk.structure([1, [2]]).num_children == 2
    spec = pk.TreeSpec.from_collection({"a": leaf, "b": [leaf, pk.structure(None)]})
    assert spec == pk.structure({"a": 0, "b": [0, None]})
    with pytest.raises(
        TypeError, match=r"from_collection: tree\['b'\]\[0\] is int, not a TreeSpec"
    ):
        pk.TreeSpec.from_collection({"a": leaf, "b": [1]})
    with pytest.raises(TypeError, match="compose expects a TreeSpec"):
        leaf.compose({})
    with pytest.raises(TypeError, match="is_prefix expects a TreeSpec"):
        leaf.is_prefix(1)
    with pytest.raises(TypeError):
        _ = leaf < 1  # type: ignore[operator]
    # a None is a node: only a leaf is a prefix of it
    assert leaf < pk.structure(None) and not pk.structure([None]) <= pk.structure([[1]])


def test_a_position_out_of_range_is_named_not_wrapped() -> None:
    tree = {"a": [1, 2], "t": (3,)}
    for key in (pk.SequenceKey(-1), pk.SequenceKey(2)):
        with pytest.raises(IndexError) as info:
            pk.tree_get(tree, (pk.DictKey("a"), key))
        assert info.value.args[0] == f"tree_get: tree['a'] is a list of 2, which has no {key}"
    with pytest.raises(IndexError, match=r"tree\['t'\] is a tuple of 1, which has no \[-1\]"):
        pk.tree_set(tree, (pk.DictKey("t"), pk.SequenceKey(-1)), 0)
    with pytest.raises(
        KeyError, match=r"tree is a dict with keys \['a', 't'\], which has no \[\['x'\]\]"
    ):
        pk.tree_get(tree, (pk.DictKey(["x"]),))  # an unhashable key


def _step(key: Any) -> str:
    """A path key taken apart with ``match``, as jax's keys allow."""
    match key:
        case pk.DictKey(k):
            return f"dict {k!r}"
        case pk.SequenceKey(i):
            return f"seq {i}"
        case pk.GetAttrKey(name):
            return f"attr {name}"
    raise AssertionError(key)


@settings(max_examples=60, deadline=None)
@given(trees())
def test_path_keys_match_by_position(tree: Any) -> None:
    """``case DictKey(k):`` (``__match_args__``) on every key of every path,
    on both engines' paths: each binds the key's one field."""
    for path, _ in pk.flatten_with_path(tree, rules=RULES)[0]:
        for key in path:
            if type(key) is pk.DictKey:
                assert _step(key) == f"dict {key.key!r}"
            elif type(key) is pk.SequenceKey:
                assert _step(key) == f"seq {key.idx}"
            else:
                assert _step(key) == f"attr {key.name}"


# -- is_leaf_takes_path (jax's) ---------------------------------------------------

_plain = st.recursive(
    st.integers() | st.none(),
    lambda inner: (
        st.lists(inner, max_size=3)
        | st.lists(inner, max_size=3).map(tuple)
        | st.dictionaries(st.sampled_from("abcd"), inner, max_size=3)
    ),
    max_leaves=12,
)


@SETTINGS
@given(_plain, st.integers(0, 2))
def test_is_leaf_takes_path_as_jax(tree: Any, which: int) -> None:
    """jax's is_leaf_takes_path: is_leaf asked about the same values at the
    same paths (as keystr writes them), in the same order, and the same
    leaves; tree_map_with_path too."""
    jtu = pytest.importorskip("jax").tree_util
    ask = [
        lambda text, x: text.count("[") == 1,
        lambda text, x: text.endswith("[1]") or text.endswith("['b']"),
        lambda text, x: isinstance(x, list) and "a" in text,
    ][which]
    asked: dict[str, list] = {"pk": [], "jax": []}

    def asking(who: str, keystr: Any) -> Any:
        def is_leaf(path: tuple, x: Any) -> bool:
            asked[who].append((keystr(path), id(x)))
            return ask(keystr(path), x)

        return is_leaf

    pairs, spec = pk.flatten_with_path(
        tree, is_leaf=asking("pk", pk.keystr), is_leaf_takes_path=True
    )
    jpairs, _ = jtu.tree_flatten_with_path(tree, asking("jax", jtu.keystr), is_leaf_takes_path=True)
    assert asked["pk"] == asked["jax"]
    assert [pk.keystr(p) for p, _ in pairs] == [jtu.keystr(p) for p, _ in jpairs]
    assert all(x is y for (_, x), (_, y) in zip(pairs, jpairs)) and len(pairs) == len(jpairs)
    assert spec.unflatten([x for _, x in pairs]) == tree
    mapped = pk.tree_map_with_path(
        lambda p, x: (pk.keystr(p), x),
        tree,
        is_leaf=asking("pk", pk.keystr),
        is_leaf_takes_path=True,
    )
    jmapped = jtu.tree_map_with_path(
        lambda p, x: (jtu.keystr(p), x),
        tree,
        is_leaf=asking("jax", jtu.keystr),
        is_leaf_takes_path=True,
    )
    assert mapped == jmapped


def test_is_leaf_takes_path_with_rest_trees_and_errors() -> None:
    tree = {"frozen": {"w": 1, "b": 2}, "train": {"w": 3}}
    frozen = lambda p, x: p == (pk.DictKey("frozen"),)  # noqa: E731
    out = pk.tree_map_with_path(
        lambda p, x, y: (pk.keystr(p), x, y), tree, tree, is_leaf=frozen, is_leaf_takes_path=True
    )
    assert out == {
        "frozen": ("['frozen']", tree["frozen"], tree["frozen"]),
        "train": {"w": ("['train']['w']", 3, 3)},
    }
    # the root is asked with the empty path; an error in is_leaf comes out
    seen: list = []
    pk.flatten_with_path([1], is_leaf=lambda p, x: seen.append(p), is_leaf_takes_path=True)
    assert seen == [(), (pk.SequenceKey(0),)]

    def boom(p: tuple, x: Any) -> bool:
        if p:
            raise KeyError(pk.keystr(p))
        return False

    with pytest.raises(KeyError, match=r"\[0\]"):
        pk.flatten_with_path([[1]], is_leaf=boom, is_leaf_takes_path=True)
    # without the flag is_leaf takes the value alone
    with pytest.raises(TypeError):
        pk.flatten_with_path([1], is_leaf=lambda p, x: False)
