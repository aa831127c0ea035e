"""Deep trees at the default recursion limit: every traversal is iterative
(the peers stop near 1,000).

Every kind at depth 100,000 (``PYTREE_KIT_TEST_DEPTH`` sets another depth:
``scripts/long_runs.sh`` runs them at 1,000,000), and every operation on a
chain of a million lists. The suite runs once per engine, so both engines
are covered.
"""

from __future__ import annotations

import copy
import os
import pickle
import sys
from collections import OrderedDict

import pytest

import pytree_kit as pk
from scripts.corpus.trees import DC, Node, Point

DEPTH = int(os.environ.get("PYTREE_KIT_TEST_DEPTH", "100000"))
MILLION = 1_000_000


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


# -- a million levels, every operation --------------------------------------------


@pytest.fixture(scope="module")
def million() -> tuple:
    """A chain of a million one-element lists, its spec, and one level less."""
    tree: object = "bottom"
    for _ in range(MILLION):
        tree = [tree]
    return tree, pk.structure(tree)


def test_million_flatten_leaves_structure(million):
    tree, spec = million
    leaves, spec2 = pk.flatten(tree)
    assert leaves == ["bottom"] and spec2 == spec and hash(spec2) == hash(spec)
    assert spec.num_nodes == MILLION + 1 and spec.num_leaves == 1
    assert pk.leaves(tree) == ["bottom"]
    assert pk.leaves(tree, is_leaf=lambda x: type(x) is list and type(x[0]) is str) == [["bottom"]]
    assert spec.flatten_up_to(tree) == ["bottom"]


def test_million_unflatten_and_tree_map(million):
    tree, spec = million
    rebuilt = spec.unflatten(["top"])
    assert bottom(rebuilt) == "top"
    assert bottom(pk.tree_map(str.upper, tree)) == "BOTTOM"
    assert bottom(pk.tree_map(lambda a, b: a + b, tree, rebuilt)) == "bottomtop"


def test_million_paths(million):
    tree, spec = million
    ((path, leaf),), spec2 = pk.flatten_with_path(tree)
    assert leaf == "bottom" and len(path) == MILLION and spec2 == spec
    assert pk.keystr(path) == "[0]" * MILLION
    assert bottom(pk.tree_map_with_path(lambda p, x: len(p), tree)) == MILLION


def test_million_spec_json_pickle_repr_children(million):
    _, spec = million
    assert pk.TreeSpec.from_json(spec.to_json()) == spec
    assert pickle.loads(pickle.dumps(spec)) == spec
    assert copy.deepcopy(spec) == spec
    assert repr(spec) == "TreeSpec(" + "[" * MILLION + "*" + "]" * MILLION + ")"
    (child,) = spec.children()
    assert child.num_nodes == MILLION and child != spec


def test_million_mismatch_and_cycle(million):
    tree, spec = million
    other = tree[0]  # a million minus one levels
    with pytest.raises(ValueError, match=r"^tree(\[0\]){999999}: structure mismatch: the spec"):
        spec.flatten_up_to(other)
    deepest = tree
    while type(deepest[0]) is list:
        deepest = deepest[0]
    deepest.append(tree)  # the bottom list now holds the root: a cycle
    try:
        with pytest.raises(ValueError, match="cycle: this container is the one at tree, which"):
            pk.leaves(tree)
    finally:
        deepest.pop()
