"""optree_rules and jax_rules: rules read from those libraries' registries,
passed as rules=, registering nothing; differential against the libraries'
own flattening. (torch_rules: tests/torch/test_bridge.py.)"""

from __future__ import annotations

import pickle
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import pytree_kit as pk
from pytree_kit._bridge import Foreign, bridge_rule

optree = pytest.importorskip("optree")
jax = pytest.importorskip("jax")
jtu = jax.tree_util

NS = "pytree_kit-tests"


class OPair:
    """Registered with optree in NS, with entries."""

    def __init__(self, a: Any, b: Any) -> None:
        self.a, self.b = a, b

    def __eq__(self, other: object) -> bool:
        return type(other) is OPair and (self.a, self.b) == (other.a, other.b)


class OList:
    """Registered with optree in NS, with list metadata and no entries."""

    def __init__(self, items: list, tags: list) -> None:
        self.items, self.tags = list(items), list(tags)

    def __eq__(self, other: object) -> bool:
        return type(other) is OList and (self.items, self.tags) == (other.items, other.tags)


class JBox:
    """Registered with jax, with keys."""

    def __init__(self, x: Any, y: Any, note: str = "n") -> None:
        self.x, self.y, self.note = x, y, note

    def __eq__(self, other: object) -> bool:
        return type(other) is JBox and (self.x, self.y, self.note) == (other.x, other.y, other.note)


class JPlain:
    """Registered with jax, without keys."""

    def __init__(self, v: Any) -> None:
        self.v = v


class Unregistered:
    def __init__(self, v: Any) -> None:
        self.v = v


optree.register_pytree_node(
    OPair, lambda p: ((p.a, p.b), None, ("a", "b")), lambda _, ch: OPair(*ch), namespace=NS
)
optree.register_pytree_node(
    OList, lambda o: (o.items, o.tags), lambda tags, ch: OList(ch, tags), namespace=NS
)
jtu.register_pytree_with_keys(
    JBox,
    lambda b: (((jtu.GetAttrKey("x"), b.x), (jtu.GetAttrKey("y"), b.y)), b.note),
    lambda note, ch: JBox(*ch, note=note),
)
jtu.register_pytree_node(JPlain, lambda p: ((p.v,), None), lambda _, ch: JPlain(*ch))


def test_optree_rules_name_children_by_entries_and_round_trip():
    rules = pk.optree_rules(NS, OPair, OList)
    tree = {"p": OPair(1, [2, None]), "l": OList([3, 4], ["t"])}
    pairs, spec = pk.flatten_with_path(tree, rules=rules)
    assert [pk.keystr(p) for p, _ in pairs] == [
        "['l'][0]",
        "['l'][1]",
        "['p']['a']",
        "['p']['b'][0]",
    ]
    leaves = [x for _, x in pairs]
    assert leaves == [3, 4, 1, 2]
    assert spec.unflatten(leaves) == tree
    # the list metadata is kept as it is, made hashable
    again = pk.structure(tree, rules=pk.optree_rules(NS, OPair, OList))
    assert again == spec and hash(again) == hash(spec)
    assert pk.structure({"p": OPair(1, [2, None]), "l": OList([3, 4], ["u"])}, rules=rules) != spec


def test_optree_rules_with_no_types_take_every_registration_but_the_native_ones():
    rules = pk.optree_rules(NS)
    assert OPair in rules and OList in rules
    assert not {tuple, list, dict, type(None)} & set(rules)
    assert optree.typing.StructSequence not in rules


def test_bridge_errors_are_clear():
    with pytest.raises(TypeError, match="Unregistered is not registered with optree in namespace"):
        pk.optree_rules(NS, Unregistered)
    with pytest.raises(TypeError, match="tuple is a container pytree_kit reads by itself"):
        pk.optree_rules(NS, tuple)
    with pytest.raises(TypeError, match="namespace must be a str"):
        pk.optree_rules(OPair)  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="expected classes"):
        pk.jax_rules("JBox")  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="name the classes"):
        pk.jax_rules()
    with pytest.raises(TypeError, match=r"Unregistered is not registered with jax\.tree_util"):
        pk.flatten([Unregistered(1)], rules=pk.jax_rules(Unregistered))


def test_jax_rules_name_children_by_keys_and_keep_aux():
    rules = pk.jax_rules(JBox, JPlain)
    tree = [JBox(1, JPlain(2), note="a")]
    pairs, spec = pk.flatten_with_path(tree, rules=rules)
    assert [pk.keystr(p) for p, _ in pairs] == ["[0]['x']", "[0]['y'][0]"]
    rebuilt = spec.unflatten([10, 20])
    assert type(rebuilt[0]) is JBox and rebuilt[0].note == "a" and rebuilt[0].x == 10
    assert rebuilt[0].y.v == 20
    assert spec != pk.structure([JBox(1, JPlain(2), note="b")], rules=rules)


def test_equal_calls_give_equal_rules_and_specs_that_pickle():
    assert pk.jax_rules(JBox) == pk.jax_rules(JBox)
    assert pk.optree_rules(NS, OPair) == pk.optree_rules(NS, OPair)
    assert bridge_rule("optree", OPair, NS) != bridge_rule("optree", OPair, "elsewhere")
    assert bridge_rule("optree", OPair, NS) != bridge_rule("jax", OPair)
    _, spec = pk.flatten(OPair(1, 2), rules=pk.optree_rules(NS, OPair))
    back = pickle.loads(pickle.dumps(spec))
    assert back == spec and back.unflatten([5, 6]) == OPair(5, 6)
    _, jspec = pk.flatten(JPlain(1), rules=pk.jax_rules(JPlain))
    assert repr(jspec).startswith("TreeSpec(JPlain(*")


def test_nothing_is_registered_anywhere():
    before = pk.leaves([OPair(1, 2), JBox(1, 2)])
    pk.optree_rules(NS)
    pk.jax_rules(JBox)
    assert pk.leaves([OPair(1, 2), JBox(1, 2)]) == before
    assert len(before) == 2  # both stay opaque leaves without rules=


def test_foreign_aux_is_hashable_and_equal_by_value():
    a, b = Foreign([1, {"k": [2]}]), Foreign([1, {"k": [2]}])
    assert a == b and hash(a) == hash(b)
    assert a != Foreign([1, {"k": [3]}])
    assert Foreign({1, 2}) == Foreign({2, 1}) and hash(Foreign({1, 2})) == hash(Foreign({2, 1}))
    assert pickle.loads(pickle.dumps(a)) == a


leaf_values = st.one_of(st.integers(), st.text(max_size=3), st.none())
o_pairs = st.builds(OPair, leaf_values, leaf_values)
j_boxes = st.builds(JBox, leaf_values, leaf_values, st.sampled_from(["a", "b"]))
nested = st.recursive(
    st.one_of(leaf_values, o_pairs, j_boxes),
    lambda kids: st.one_of(
        st.lists(kids, max_size=3),
        st.dictionaries(st.sampled_from("abc"), kids, max_size=3),
        st.builds(OPair, kids, kids),
        st.builds(JBox, kids, kids),
    ),
    max_leaves=12,
)


@settings(max_examples=80, deadline=None)
@given(nested)
def test_leaves_agree_with_optree_and_jax(tree):
    rules = {**pk.optree_rules(NS, OPair), **pk.jax_rules(JBox)}
    ours = pk.leaves(tree, rules=rules)
    # None is an empty node, as in both peers by default
    if not _has(tree, JBox):
        assert ours == optree.tree_leaves(tree, namespace=NS)
    if not _has(tree, OPair):
        assert ours == jtu.tree_leaves(tree)
    leaves, spec = pk.flatten(tree, rules=rules)
    assert pk.leaves(spec.unflatten(leaves), rules=rules) == leaves


def _has(tree: Any, cls: type) -> bool:
    todo = [tree]
    while todo:
        x = todo.pop()
        if type(x) is cls:
            return True
        if isinstance(x, (list, tuple)):
            todo.extend(x)
        elif isinstance(x, dict):
            todo.extend(x.values())
        elif isinstance(x, (OPair, JBox)):
            todo.extend([x.a, x.b] if isinstance(x, OPair) else [x.x, x.y])
    return False


class Meta:
    """Metadata an optree registration keeps: an object of its module's class."""

    __slots__ = ("dims", "tag")

    def __init__(self, tag: str, dims: tuple) -> None:
        self.tag, self.dims = tag, dims

    def __eq__(self, other: object) -> bool:
        return type(other) is Meta and (self.tag, self.dims) == (other.tag, other.dims)

    def __hash__(self) -> int:
        return hash((self.tag, self.dims))


class OMeta:
    """Registered with optree in NS; its metadata is a Meta."""

    def __init__(self, x: Any, meta: Meta) -> None:
        self.x, self.meta = x, meta


optree.register_pytree_node(
    OMeta, lambda o: ((o.x,), o.meta), lambda meta, ch: OMeta(ch[0], meta), namespace=NS
)


def test_a_context_object_of_the_registering_module_round_trips_through_json():
    rules = pk.optree_rules(NS, OMeta)
    tree = {"m": OMeta(1.0, Meta("t", (2, 3)))}
    leaves, spec = pk.flatten(tree, rules=rules)
    text = spec.to_json()
    assert '"object": "tests.test_bridge:Meta"' in text or '"object": "test_bridge:Meta"' in text
    back = pk.TreeSpec.from_json(text, rules=rules)
    assert back == spec and hash(back) == hash(spec)
    rebuilt = back.unflatten([5.0])["m"]
    assert rebuilt.meta == Meta("t", (2, 3)) and rebuilt.x == 5.0
    # only the rule's registration makes the module's names readable
    with pytest.raises(ValueError, match="is not allowed"):
        pk.TreeSpec.from_json(text, rules={OMeta: pk.Rule(lambda o: ((o.x,), 0), OMeta)})


def test_jax_rules_keep_jaxs_own_function_when_pytree_kit_is_put_behind_jaxs_names(monkeypatch):
    """A shim that puts pytree_kit behind jax.tree_util.tree_flatten_with_path,
    with jax_rules for jax's classes, made before or after the shim: the
    rules call jax's own function, not the shim (which would call itself)."""
    import pytree_kit._bridge as bridge

    monkeypatch.setattr(bridge, "_jax_flatten_with_path", None)  # as in a fresh process
    rules: Any = None
    calls = []

    def shim(tree: Any, is_leaf: Any = None) -> Any:
        calls.append(1)
        if len(calls) > 5:
            raise AssertionError("the rules called the shim: it recurses")
        pairs, spec = pk.flatten_with_path(tree, is_leaf=is_leaf, rules=rules)
        return pairs, spec

    monkeypatch.setattr(jtu, "tree_flatten_with_path", shim)
    rules = pk.jax_rules(JBox, JPlain)  # made after the shim is in place
    pairs, _ = jtu.tree_flatten_with_path([JBox(1, JPlain(2))])
    assert [v for _, v in pairs] == [1, 2]
    assert len(calls) == 1
