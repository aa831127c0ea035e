"""tree_is_leaf, all_leaves, is_namedtuple and is_structseq: what they say
agrees with how the engines flatten, and with optree's and jax's functions of
the same names where those are installed."""

from __future__ import annotations

import collections
import dataclasses
import os
import sys
import time
import typing
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import pytree_kit as pk

Point = collections.namedtuple("Point", "x y")


class Typed(typing.NamedTuple):
    a: int
    b: str = "b"


class SubPoint(Point):
    pass


class Flattens(tuple):
    """A tuple subclass with the protocol: a node, but no namedtuple."""

    def __tree_flatten__(self) -> tuple:
        return tuple(self), None

    @classmethod
    def __tree_unflatten__(cls, aux: Any, children: Any) -> Flattens:
        return cls(children)


class FakeFields(tuple):
    _fields = ("a", "b")  # no _make or _asdict: not a namedtuple to optree


@dataclasses.dataclass
class DC:
    x: int


VALUES: list = [
    Point(1, 2),
    Point,
    SubPoint(1, 2),
    SubPoint,
    Typed(1),
    Typed,
    Flattens((1, 2)),
    FakeFields((1, 2)),
    FakeFields,
    (1, 2),
    tuple,
    time.gmtime(0),
    time.struct_time,
    os.stat("."),
    os.stat_result,
    sys.flags,
    type(sys.flags),
    sys.float_info,
    1,
    "ab",
    None,
    [1],
    {"a": 1},
    DC(1),
    DC,
    collections.OrderedDict(a=1),
    collections.deque([1]),
]

CHECKS = [
    "is_namedtuple",
    "is_namedtuple_class",
    "is_namedtuple_instance",
    "is_structseq",
    "is_structseq_class",
    "is_structseq_instance",
]


@pytest.mark.parametrize("name", CHECKS)
def test_the_class_checks_agree_with_optree(name: str) -> None:
    optree = pytest.importorskip("optree")
    ours, theirs = getattr(pk, name), getattr(optree, name)
    got = [ours(v) for v in VALUES]
    assert got == [theirs(v) for v in VALUES]
    assert any(got) and not all(got)  # the list holds both answers


def test_a_namedtuple_or_structseq_instance_flattens_as_one() -> None:
    for v in VALUES:
        if isinstance(v, type):
            continue
        kind = pk.structure(v)._nodes[0][0]
        if pk.is_namedtuple_instance(v) and not hasattr(type(v), "__tree_flatten__"):
            assert kind == pk._kinds.NAMEDTUPLE, v
        if pk.is_structseq_instance(v):
            assert kind == pk._kinds.STRUCTSEQ, v


leaves_and_nodes = st.recursive(
    st.none() | st.integers() | st.text(max_size=2) | st.floats(allow_nan=False),
    lambda kids: (
        st.lists(kids, max_size=3)
        | st.lists(kids, max_size=3).map(tuple)
        | st.dictionaries(st.text(max_size=2), kids, max_size=3)
        | st.builds(Point, kids, kids)
    ),
    max_leaves=8,
)


@settings(max_examples=200, deadline=None)
@given(st.lists(leaves_and_nodes, max_size=5))
def test_tree_is_leaf_and_all_leaves_agree_with_the_peers(values: list) -> None:
    for v in values:
        assert pk.tree_is_leaf(v) == (pk.leaves(v) == [v] and pk.structure(v).num_nodes == 1)
    assert pk.all_leaves(values) == all(pk.tree_is_leaf(v) for v in values)
    optree = pytest.importorskip("optree")
    assert [pk.tree_is_leaf(v) for v in values] == [optree.tree_is_leaf(v) for v in values]
    jtu = pytest.importorskip("jax.tree_util")
    assert pk.all_leaves(values) == jtu.all_leaves(values)
    assert pk.all_leaves(iter(values)) == jtu.all_leaves(values)  # any iterable


def test_is_leaf_and_rules_reach_the_questions() -> None:
    def as_leaf(x: Any) -> bool:
        return isinstance(x, list)

    assert not pk.tree_is_leaf([1]) and pk.tree_is_leaf([1], is_leaf=as_leaf)
    assert pk.all_leaves([[1], [2]], as_leaf) and not pk.all_leaves([[1], (2,)], as_leaf)
    assert pk.tree_is_leaf(DC(1)) is False
    rules = {complex: pk.Rule(lambda c: ((c.real, c.imag), None), lambda aux, ch: complex(*ch))}
    assert pk.tree_is_leaf(1j) and not pk.tree_is_leaf(1j, rules=rules)
    assert pk.all_leaves([]) is True
    with pytest.raises(TypeError):  # not iterable
        pk.all_leaves(3)  # type: ignore[arg-type]


# -- a spec's root: type, kind, entries -----------------------------------------------------


@settings(max_examples=200, deadline=None)
@given(leaves_and_nodes)
def test_a_specs_root_type_and_entries_agree_with_optree(tree: Any) -> None:
    spec = pk.structure(tree)
    assert spec.kind == pk._kinds.KIND_NAMES[spec._nodes[0][0]]
    named = _root_entries(spec)
    if len(named) == spec.num_children:  # every child holds a leaf: paths name them all
        assert spec.entries() == named
    optree = pytest.importorskip("optree")
    theirs = optree.tree_structure(tree)
    assert spec.type is theirs.type
    if not isinstance(tree, Point):  # optree names a namedtuple's children by index
        assert spec.entries() == ([] if theirs.is_leaf() else list(theirs.entries()))


def _root_entries(spec: pk.TreeSpec) -> list:
    """The root's entries, read off the paths of its leaves' first keys."""
    out: list = []
    for path in spec.paths():
        if path:
            k = path[0]
            raw = getattr(k, "key", getattr(k, "idx", getattr(k, "name", None)))
            if not out or out[-1] != raw:
                out.append(raw)
    return out


KINDS = [
    (1, "leaf", None, []),
    (None, "none", type(None), []),
    ((1, 2), "tuple", tuple, [0, 1]),
    ([1], "list", list, [0]),
    ({"b": 1, "a": 2}, "dict", dict, ["a", "b"]),
    (collections.OrderedDict(b=1, a=2), "ordereddict", collections.OrderedDict, ["b", "a"]),
    (collections.defaultdict(int, b=1, a=2), "defaultdict", collections.defaultdict, ["a", "b"]),
    (collections.deque([1, 2]), "deque", collections.deque, [0, 1]),
    (Point(1, 2), "namedtuple", Point, ["x", "y"]),
    (time.gmtime(0), "structseq", time.struct_time, list(time.struct_time.__match_args__)),
    (DC(1), "dataclass", DC, ["x"]),
    (Flattens((1, 2)), "custom", Flattens, [0, 1]),
]


@pytest.mark.parametrize(("tree", "kind", "cls", "entries"), KINDS, ids=[k[1] for k in KINDS])
def test_every_kind_of_root_names_its_type_and_entries(
    tree: Any, kind: str, cls: Any, entries: list
) -> None:
    spec = pk.structure(tree)
    assert (spec.kind, spec.type, spec.entries()) == (kind, cls, entries)
    # a spec read back from JSON says the same
    again = pk.TreeSpec.from_json(spec.to_json(), allow=[Point, DC, Flattens, time.struct_time])
    assert (again.kind, again.type, again.entries()) == (kind, cls, entries)


def test_a_rule_root_is_named_by_its_class() -> None:
    rules = {complex: pk.Rule(lambda c: ((c.real, c.imag), None), lambda aux, ch: complex(*ch))}
    spec = pk.structure(1j, rules=rules)
    assert (spec.kind, spec.type, spec.entries()) == ("rule", complex, [0, 1])
