"""Depth 100,000 flattens, unflattens and maps at the default recursion limit:
every traversal is iterative (the peers stop near 1,000)."""

from __future__ import annotations

import pickle
import sys
from collections import OrderedDict

import pytest

import pytree_kit as pk
from tests.trees import DC, Node, Point

DEPTH = 100_000


def chain(kind: str, depth: int = DEPTH):
    t: object = "bottom"
    for i in range(depth):
        if kind == "list":
            t = [t]
        elif kind == "tuple":
            t = (i, t)
        elif kind == "dict":
            t = {"k": t, "a": i}
        elif kind == "ordereddict":
            t = OrderedDict(k=t)
        elif kind == "namedtuple":
            t = Point(t, None)
        elif kind == "dataclass":
            t = DC(t)
        elif kind == "protocol":
            t = Node(t, None)
        else:  # mixed
            t = [{"k": DC((t,))}] if i % 2 else Node(Point(t, i), None)
    return t


def bottom(t: object) -> object:
    """Walk down a chain iteratively (comparing deep trees with == would recurse)."""
    while not isinstance(t, (str, int)):
        if isinstance(t, list):
            t = t[0]
        elif isinstance(t, Point):
            t = t.x
        elif isinstance(t, tuple):
            t = t[-1]
        elif isinstance(t, dict):
            t = t["k"]
        elif isinstance(t, DC):
            t = t.a
        elif isinstance(t, Node):
            t = t.left
        else:
            raise AssertionError(type(t))
    return t


KINDS = ["list", "tuple", "dict", "ordereddict", "namedtuple", "dataclass", "protocol", "mixed"]


@pytest.fixture(autouse=True)
def default_recursion_limit():
    assert sys.getrecursionlimit() <= 1000 or sys.getrecursionlimit() < DEPTH // 10


@pytest.mark.parametrize("kind", KINDS)
def test_deep_flatten_unflatten_map(kind):
    tree = chain(kind)
    leaves, spec = pk.flatten(tree)
    assert "bottom" in (leaves[0], leaves[-1])
    assert spec.num_nodes > DEPTH
    rebuilt = spec.unflatten(leaves)
    assert bottom(rebuilt) == "bottom"
    mapped = pk.tree_map(lambda x: x.upper() if isinstance(x, str) else x, tree)
    assert bottom(mapped) == "BOTTOM"
    assert pk.leaves(tree) == leaves
    assert spec.flatten_up_to(tree) == leaves
    assert pk.structure(rebuilt) == spec and hash(pk.structure(rebuilt)) == hash(spec)


def test_deep_paths_repr_json_pickle_children():
    tree = chain("list")
    pairs, spec = pk.flatten_with_path(tree)
    ((path, leaf),) = pairs
    assert leaf == "bottom" and len(path) == DEPTH
    assert pk.keystr(path) == "[0]" * DEPTH
    out = pk.tree_map_with_path(lambda p, x: len(p), tree)
    assert bottom(out) == DEPTH
    assert repr(spec) == "TreeSpec(" + "[" * DEPTH + "*" + "]" * DEPTH + ")"
    assert pk.TreeSpec.from_json(spec.to_json()) == spec
    assert pickle.loads(pickle.dumps(spec)) == spec
    (child,) = spec.children()
    assert child.num_nodes == spec.num_nodes - 1


def test_deep_mismatch_names_the_deep_path():
    spec = pk.structure(chain("list", 5000))
    other = chain("list", 4999)
    with pytest.raises(ValueError, match=r"tree(\[0\]){4999}: structure mismatch"):
        spec.flatten_up_to(other)


def test_deep_cycle_is_found():
    root: list = []
    t = root
    for _ in range(DEPTH):
        t.append([])
        t = t[0]
    t.append(root)
    with pytest.raises(ValueError, match="cycle: this container is the one at tree, which"):
        pk.leaves(root)
    t.clear()


def test_wide_tree():
    tree = {f"k{i:06d}": [i, (i,)] for i in range(100_000)}
    leaves, spec = pk.flatten(tree)
    assert leaves[:4] == [0, 0, 1, 1] and len(leaves) == 200_000
    assert spec.unflatten(leaves) == tree
