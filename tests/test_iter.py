"""tree_iter: the leaves of a tree, found as they are asked for, on whichever
engine runs (the C engine's LeafIter, the pure engine's generator). The same
leaves as ``leaves``; laziness (what is read, and which errors are raised);
the iterator's own rules (no re-entry, done after an error); what it holds;
and against optree's and torch's ``tree_iter``."""

from __future__ import annotations

import gc
import itertools
import sys
import weakref
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import pytree_kit as pk
from tests.test_peers import trees as peer_trees
from tests.trees import RULES, Leaf, snapshot, trees

SETTINGS = settings(max_examples=200, deadline=None)


def _same_objects(a: list, b: list) -> bool:
    return len(a) == len(b) and all(x is y for x, y in zip(a, b))


@SETTINGS
@given(trees(), st.integers(0, 40))
def test_the_same_leaves_as_leaves(tree: Any, stop: int) -> None:
    before = snapshot(tree)
    want = pk.leaves(tree, rules=RULES)
    assert _same_objects(list(pk.tree_iter(tree, rules=RULES)), want)
    # taken in pieces, and given up half-way
    it = pk.tree_iter(tree, rules=RULES)
    head = list(itertools.islice(it, stop))
    assert _same_objects(head, want[:stop])
    assert _same_objects(head + list(it), want)
    assert next(it, "done") == "done"
    part = pk.tree_iter(tree, rules=RULES)
    assert _same_objects(list(itertools.islice(part, stop)), want[:stop])
    del part
    assert snapshot(tree) == before


@SETTINGS
@given(trees())
def test_is_leaf_is_asked_as_by_leaves(tree: Any) -> None:
    asked: list = []
    eager: list = []

    def stop_at_lists(x: Any) -> bool:
        return type(x) is list

    def recording(into: list) -> Any:
        def is_leaf(x: Any) -> bool:
            into.append(x)
            return stop_at_lists(x)

        return is_leaf

    want = pk.leaves(tree, is_leaf=recording(eager), rules=RULES)
    got = list(pk.tree_iter(tree, recording(asked), rules=RULES))
    assert _same_objects(got, want)
    assert _same_objects(asked, eager)


class Counted:
    """A protocol node that counts how often it is flattened."""

    calls = 0

    def __init__(self, *children: Any) -> None:
        self.children = children

    def __tree_flatten__(self) -> tuple:
        Counted.calls += 1
        return self.children, None

    @classmethod
    def __tree_unflatten__(cls, aux: Any, children: tuple) -> Counted:
        return cls(*children)


class Refuses:
    """A protocol node whose ``__tree_flatten__`` raises."""

    def __tree_flatten__(self) -> tuple:
        raise RuntimeError("read too far")

    @classmethod
    def __tree_unflatten__(cls, aux: Any, children: tuple) -> Refuses:  # pragma: no cover
        return cls()


def test_nothing_is_read_before_it_is_asked_for() -> None:
    Counted.calls = 0
    tree = {"a": [Counted(1, Counted(2))], "b": Counted(Refuses())}
    it = pk.tree_iter(tree)
    assert Counted.calls == 0  # nothing read yet
    assert next(it) == 1 and Counted.calls == 1  # one path down: a, [0], the first node
    assert next(it) == 2 and Counted.calls == 2
    with pytest.raises(RuntimeError, match="read too far"):
        next(it)
    assert next(it, "done") == "done"  # done after an error, as a generator
    # what decides first stops the walk: the rest is never read
    assert pk.tree_any([0, [1, Refuses()]]) is True
    assert pk.tree_all([1, 0, Refuses()]) is False
    assert pk.tree_any_only(int, lambda x: x > 1, ["s", 2, Refuses()]) is True
    assert pk.tree_all_only(str, str.isupper, [1, "no", Refuses()]) is False
    with pytest.raises(RuntimeError, match="read too far"):
        pk.tree_any([0, Refuses()])


def test_errors_name_the_path_as_flatten_does() -> None:
    cyc: list = [1]
    cyc.append({"k": cyc})
    with pytest.raises(ValueError) as want:
        pk.leaves({"x": [cyc]})
    it = pk.tree_iter({"x": [cyc]})
    assert next(it) == 1
    with pytest.raises(ValueError) as got:
        next(it)
    assert str(got.value) == str(want.value)
    assert "tree['x'][0][1]['k']: cycle" in str(got.value)
    with pytest.raises(TypeError, match="rules must be"):
        pk.tree_iter([1], rules=5)  # checked at the call, not at the first next


def test_a_container_is_read_when_the_walk_reaches_it() -> None:
    inner = [1, (2,), 3]  # the tuple stops the run of leaves read in one go
    later = [4]
    tree = [inner, later]
    it = pk.tree_iter(tree)
    assert next(it) == 1
    inner[1] = "not seen: inner was read when reached"
    inner.append("not seen either")
    later.append("seen: later was not reached yet")
    assert list(it) == [2, 3, 4, "seen: later was not reached yet"]
    d = {"a": 1, "b": {"c": 2}}
    it = pk.tree_iter(d)
    assert next(it) == 1
    d["b"]["d"] = 3
    d["a0"] = "not seen: the root was read"
    assert list(it) == [2, 3]


def test_no_reentry_and_done_after_an_error() -> None:
    holder: list = []

    def reenter(x: Any) -> bool:
        if x == "inside":
            next(holder[0])
        return False

    it = pk.tree_iter([0, "inside", 2], reenter)
    holder.append(it)
    assert next(it) == 0
    with pytest.raises(ValueError, match="already executing"):
        next(it)
    assert list(it) == []


def test_deep_trees_iterate_without_recursion() -> None:
    depth = 100_000
    tree: Any = "bottom"
    for i in range(depth):
        tree = [i, tree] if i % 2 else {"k": tree}
    it = pk.tree_iter(tree)
    assert list(itertools.islice(it, 3)) == [depth - 1, depth - 3, depth - 5]
    assert list(it)[-1] == "bottom"


class Probe:
    """A leaf that can be weakly referenced."""


def test_references_are_dropped() -> None:
    leaves = [Leaf(i) for i in range(50)]
    tree = {"a": leaves[:20], "b": (leaves[20:40], {"c": leaves[40:]})}
    counts = [sys.getrefcount(x) for x in leaves]
    for stop in (0, 1, 25, 50):
        it = pk.tree_iter(tree)
        got = list(itertools.islice(it, stop))
        del it, got
    assert [sys.getrefcount(x) for x in leaves] == counts
    # an iterator in a cycle (its is_leaf holds it) is collected, with its walk
    probe = Probe()
    ref = weakref.ref(probe)
    box: list = []
    it = pk.tree_iter([probe, [probe]], lambda x, box=box: bool(box) and False)
    box.append(it)
    assert next(it) is probe
    del it, box, probe
    gc.collect()
    assert ref() is None


@pytest.mark.parametrize("by", ["optree", "torch"])
@settings(max_examples=100, deadline=None)
@given(tree=peer_trees(with_deque=True))
def test_matches_the_peers_tree_iter(by: str, tree: Any) -> None:
    if by == "optree":
        optree = pytest.importorskip("optree")
        theirs = list(optree.tree_iter(tree, none_is_leaf=False))
        assert _same_objects(list(pk.tree_iter(tree)), theirs)
    else:
        pytree = pytest.importorskip("torch.utils._pytree")
        # torch keeps a dict's insertion order and jax and optree sort it: the
        # same leaves, in another order
        theirs = [x for x in pytree.tree_iter(tree) if x is not None]
        assert sorted(map(id, pk.tree_iter(tree))) == sorted(map(id, theirs))
