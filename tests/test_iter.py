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
from scripts.corpus.trees import RULES, Leaf, snapshot, trees
from tests.support.peer_trees import trees as peer_trees

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


@pytest.mark.thread_unsafe  # counts reads in a class the threads would share
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


@pytest.mark.thread_unsafe  # counts references other threads' calls share
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


#: the Truth leaves whose truth was asked, in order
ASKED: list = []


class Truth:
    """A leaf whose truth runs Python code, noted in ASKED."""

    __slots__ = ("value",)

    def __init__(self, value: bool) -> None:
        self.value = value

    def __bool__(self) -> bool:
        ASKED.append(self)
        return self.value

    def __repr__(self) -> str:
        return f"Truth({self.value})"


#: leaves whose truth runs no Python code (each plain type) and Truths
truth_leaves = st.one_of(
    st.sampled_from([0, 1, -1, 0.0, 2.5, "", "s", b"", b"x", None, True, False, 0j, 1j]),
    st.booleans().map(Truth),
)


def _expected(leaves: list, want: bool) -> tuple[bool, list]:
    """Whether some leaf's truth is want, and the Truths asked on the way."""
    asked = []
    for x in leaves:
        if isinstance(x, Truth):
            asked.append(x)
        if bool(x.value if isinstance(x, Truth) else x) is want:
            return True, asked
    return False, asked


@pytest.mark.thread_unsafe  # logs calls in a list (or a class) the threads would share
@SETTINGS
@given(trees(truth_leaves), st.booleans())
def test_any_and_all_ask_the_leaves_in_order_and_stop_at_the_first_that_decides(
    tree: Any, any_: bool
) -> None:
    """tree_any / tree_all ask each leaf's truth in leaf order, only up to
    the first that decides, on every kind of node; the tree is unchanged."""
    want = any_
    found, asked = _expected(pk.leaves(tree, rules=RULES), want)
    before = snapshot(tree)
    ASKED.clear()
    got = pk.tree_any(tree, rules=RULES) if any_ else pk.tree_all(tree, rules=RULES)
    assert got is (found if any_ else not found)
    assert _same_objects(ASKED, asked)
    ASKED.clear()
    assert (any if any_ else all)(pk.tree_iter(tree, rules=RULES)) is got
    assert _same_objects(ASKED, asked)
    assert snapshot(tree) == before


class Changes:
    """A leaf whose truth is ``value`` and, when asked, puts ``put`` at the
    end of ``now`` (a list being read) and of ``later`` (one not reached yet)."""

    def __init__(self, now: list, later: list, value: bool, put: Any) -> None:
        self.now, self.later, self.value, self.put = now, later, value, put

    def __bool__(self) -> bool:
        self.now[-1] = self.put
        self.now.append(self.put)
        self.later.append(self.put)
        return self.value


def test_any_reads_a_list_as_it_was_when_a_leaf_ran_code() -> None:
    """As tree_iter: a list being read is read as it was when the walk
    reached it, also when a leaf's truth changes it; a list not reached yet is
    read as it is when reached. (The C engine tests plain leaves in place and
    copies the lists being read only before a leaf's code runs.)"""
    for any_ in (True, False):
        fn = pk.tree_any if any_ else pk.tree_all
        plain = ["", None, 0] if any_ else ["s", 1, 2.5]
        for make in (
            lambda now, later: {"a": now, "b": later},
            lambda now, later, p=plain: [p[0], (now, [later])],
            lambda now, later, p=plain: ([p[1]], now, None, later),
        ):
            for tree_iter in (False, True):
                now, later = list(plain), list(plain[:1])
                now.insert(1, Changes(now, later, not any_, any_))
                tree = make(now, later)
                # the change to `later` (reached after) decides
                got = (any if any_ else all)(pk.tree_iter(tree)) if tree_iter else fn(tree)
                assert got is any_
                # the change to `now` (being read) is not seen
                now, elsewhere = list(plain), list(plain[:1])
                now.insert(1, Changes(now, elsewhere, not any_, any_))
                got = (any if any_ else all)(pk.tree_iter([now])) if tree_iter else fn([now])
                assert got is not any_


@pytest.mark.thread_unsafe  # counts references other threads' calls share
def test_any_and_all_errors_and_references() -> None:
    class Fails:
        def __bool__(self) -> bool:
            raise ZeroDivisionError("no truth here")

    with pytest.raises(ZeroDivisionError, match="no truth here"):
        pk.tree_any({"a": [0, Fails()], "b": 1})
    assert pk.tree_any({"a": [0, 1], "b": Fails()}) is True  # decided before
    assert pk.tree_all([0, Fails()]) is False
    leaves = [Leaf(i) for i in range(40)]
    tree = {"a": leaves[:20], "b": (leaves[20:], 0, [Probe()])}
    counts = [sys.getrefcount(x) for x in leaves]
    for _ in range(3):
        assert pk.tree_any(tree) is True
        assert pk.tree_all(tree) is False
        assert pk.tree_any([0, (None, "")]) is False
    assert [sys.getrefcount(x) for x in leaves] == counts
    with pytest.raises(TypeError, match="rules must be"):
        pk.tree_any([1], rules=5)


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
