"""pytree_kit._keys: the path keys and accessors (``pk.Accessor``,
``pk.flatten_with_accessor``, ``spec.accessors()``), against optree's
``PyTreeAccessor``, ``tree_flatten_with_accessor`` and ``accessors()`` on
hypothesis trees both understand, on every kind, and on a chain 100,000 deep.
(Paths as a whole, keystr and tree_get: tests/test_paths.py.)
"""

from __future__ import annotations

import copy
import pickle
from typing import Any

import pytest

import pytree_kit as pk
from scripts.corpus.trees import RULES, Node, Opaque, Point
from scripts.corpus.trees import trees as every_kind
from tests.support.peer_trees import _optree, trees
from tests.support.shapes import DEPTH, deep_list, fresh_leaves

pytest.importorskip("hypothesis")
from hypothesis import given, settings

SETTINGS = settings(deadline=None)


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
    new_leaves = fresh_leaves(spec.num_leaves)
    fresh = spec.unflatten(new_leaves)
    for k, (acc, oacc) in enumerate(zip(accessors, oaccessors)):
        assert type(acc) is pk.Accessor
        assert acc(tree) is leaves[k] is oacc(tree)
        assert acc(fresh) is new_leaves[k] is oacc(fresh)
        assert pk.tree_get(fresh, acc) is new_leaves[k]


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
    deep = deep_list()
    (acc,) = pk.structure(deep).accessors()
    assert len(acc) == DEPTH and acc(deep) == 0
    assert pk.flatten_with_accessor(deep)[0][0][0] == acc
