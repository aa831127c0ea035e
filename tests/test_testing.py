"""pytree_kit.testing: the strategy covers every kind, check_container passes
correct containers and catches the typical bugs, naming the law."""

from __future__ import annotations

import dataclasses
import warnings
from collections import OrderedDict, defaultdict, deque

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import pytree_kit as pk
from pytree_kit.testing import (
    LawSkipped,
    Leaf,
    Pair,
    Point,
    Record,
    Tagged,
    check_container,
    trees,
)

# -- correct containers ------------------------------------------------------------


class Interval:
    def __init__(self, lo, hi, closed=True):
        self.lo, self.hi, self.closed = lo, hi, closed

    def __tree_flatten__(self):
        return (self.lo, self.hi), self.closed

    @classmethod
    def __tree_unflatten__(cls, closed, children):
        return cls(*children, closed=closed)


class Named:
    """Dict children, and an __eq__."""

    def __init__(self, **parts):
        self.parts = parts

    def __tree_flatten__(self):
        return dict(self.parts), tuple(self.parts)

    @classmethod
    def __tree_unflatten__(cls, order, children):
        return cls(**{k: children[k] for k in order})

    def __eq__(self, other):
        return type(other) is Named and self.parts == other.parts


class Slotted:
    __slots__ = ("a", "b")

    def __init__(self, a, b):
        self.a, self.b = a, b


def _slotted_flatten(s):
    return (s.a, s.b), None


def _slotted_unflatten(aux, children):
    return Slotted(*children)


SLOTTED_RULES = {Slotted: pk.Rule(_slotted_flatten, _slotted_unflatten)}

ints = st.integers(-3, 3)


def test_builtin_kinds_obey_the_laws():
    check_container(trees(max_depth=3), max_examples=60)


def test_protocol_classes_obey_the_laws():
    check_container(st.builds(Interval, trees(max_depth=1), ints, st.booleans()))
    check_container(st.builds(Named, a=trees(max_depth=1), b=ints), max_examples=50)


def test_rule_class_obeys_the_laws():
    check_container(st.builds(Slotted, ints, trees(max_depth=1)), rules=SLOTTED_RULES)


# -- buggy containers: each is caught, naming the law ----------------------------------


class Swapped(Interval):
    @classmethod
    def __tree_unflatten__(cls, closed, children):
        return cls(children[1], children[0], closed=closed)


class DropsAux(Interval):
    @classmethod
    def __tree_unflatten__(cls, closed, children):
        return cls(*children)  # closed is lost


class UnhashableAux(Interval):
    def __tree_flatten__(self):
        return (self.lo, self.hi), [self.closed]


class LosesChild:
    def __init__(self, a, b, extra=None):
        self.a, self.b, self.extra = a, b, extra

    def __repr__(self):
        return f"LosesChild({self.a}, {self.b}, {self.extra})"

    def __tree_flatten__(self):
        return (self.a, self.b), None  # extra is silently lost

    @classmethod
    def __tree_unflatten__(cls, aux, children):
        return cls(*children)


class BadPathKeys:
    """Dict children under keys that do not reach them."""

    def __init__(self, x, y):
        self.x, self.y = x, y

    def __tree_flatten__(self):
        return {"x": self.x, "y": self.y}, None

    @classmethod
    def __tree_unflatten__(cls, aux, children):
        return cls(children["x"], children["y"])


@pytest.mark.parametrize(
    ("strategy", "law"),
    [
        (st.builds(Swapped, st.integers(0, 5), st.integers(6, 9)), "unflatten puts each leaf in its place"),
        (st.builds(DropsAux, ints, ints, st.just(False)), "round trip keeps the spec (types and aux data)"),
        (st.builds(UnhashableAux, ints, ints), "flatten succeeds (aux data is hashable)"),
        (st.builds(LosesChild, ints, ints, st.integers(1, 5)), "round trip gives an equal value (or the same instance state)"),
    ],
    ids=["swapped", "aux-dropped", "unhashable-aux", "child-lost"],
)  # fmt: skip
def test_typical_bugs_are_caught_with_the_law_and_a_minimal_example(strategy, law):
    with pytest.raises(AssertionError) as e:
        check_container(strategy, max_examples=50)
    message = str(e.value)
    assert f"law violated: {law}" in message
    # hypothesis's minimal example, in the words of its version
    assert "Falsifying example" in message or "Failing test case" in message


def test_minimal_example_is_shrunk():
    with pytest.raises(AssertionError) as e:
        check_container(st.builds(LosesChild, ints, ints, st.integers(1, 1000)))
    assert "LosesChild(0, 0, 1)" in str(e.value)  # shrunk to the smallest failing value


class ObjAux(Interval):
    """Hashable, comparable aux data that JSON cannot hold."""

    def __tree_flatten__(self):
        return (self.lo, self.hi), Tagged(self.closed)

    @classmethod
    def __tree_unflatten__(cls, aux, children):
        return cls(*children, closed=aux.value)


def test_json_law_can_be_skipped_for_aux_json_cannot_hold():
    strategy = st.builds(ObjAux, ints, ints, st.booleans())
    with pytest.raises(AssertionError, match="law violated: JSON round trip of the spec"):
        check_container(strategy, max_examples=5)
    check_container(strategy, max_examples=20, check_json=False)


def test_aux_compared_by_identity_breaks_the_spec_law():
    class FreshAux(Interval):
        def __tree_flatten__(self):
            return (self.lo, self.hi), Leaf(0)  # a new object each time: specs never equal

    with pytest.raises(AssertionError, match="law violated: round trip keeps the spec"):
        check_container(st.builds(FreshAux, ints, ints), max_examples=5)


LAMBDA_RULES = {Slotted: pk.Rule(lambda s: ([s.a, s.b], None), lambda aux, ch: Slotted(*ch))}


def test_rules_of_lambdas_skip_only_the_pickle_law_and_say_so():
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        check_container(st.builds(Slotted, ints, trees(max_depth=1)), rules=LAMBDA_RULES)
    skips = [w for w in caught if issubclass(w.category, LawSkipped)]
    assert len(skips) == 1, [str(w.message) for w in caught]
    assert "'pickle round trip of the spec'" in str(skips[0].message)
    assert "cannot be pickled" in str(skips[0].message)
    assert skips[0].filename == __file__  # points at the caller


def test_a_container_with_rules_of_lambdas_that_breaks_a_law_still_fails():
    swapped = {
        Slotted: pk.Rule(lambda s: ([s.a, s.b], None), lambda aux, ch: Slotted(ch[1], ch[0]))
    }
    with pytest.raises(AssertionError, match="law violated: unflatten puts each leaf in its place"):
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", LawSkipped)
            check_container(st.builds(Slotted, ints, ints), rules=swapped, max_examples=20)


class Drifts:
    """Aux data that pickles into a different value."""

    def __init__(self, v):
        self.v = v

    def __eq__(self, other):
        return type(other) is Drifts and other.v == self.v

    def __hash__(self):
        return hash(self.v)

    def __reduce__(self):
        return (Drifts, (self.v + 1,))


class DriftingAux(Interval):
    def __tree_flatten__(self):
        return (self.lo, self.hi), Drifts(0)

    @classmethod
    def __tree_unflatten__(cls, aux, children):
        return cls(*children)


def test_a_spec_that_pickles_still_runs_the_pickle_law():
    with warnings.catch_warnings():
        warnings.simplefilter("error", LawSkipped)
        with pytest.raises(AssertionError, match="law violated: pickle round trip of the spec"):
            check_container(st.builds(DriftingAux, ints, ints), max_examples=5, check_json=False)


def test_check_container_needs_a_strategy():
    with pytest.raises(TypeError, match="hypothesis strategy"):
        check_container([1, 2])


# -- the strategy -------------------------------------------------------------------------


def _kinds(tree, found):
    todo = [tree]
    while todo:
        x = todo.pop()
        found.add(type(x))
        if isinstance(x, dict):
            todo.extend(x.values())
        elif isinstance(x, (list, tuple, deque)):
            todo.extend(x)
        elif dataclasses.is_dataclass(x):
            todo.extend(getattr(x, f.name) for f in dataclasses.fields(x))


def test_strategy_draws_every_kind():
    found: set = set()

    @settings(max_examples=300, database=None)
    @given(trees(max_depth=2))
    def collect(tree):
        _kinds(tree, found)

    collect()
    wanted = {
        list,
        tuple,
        dict,
        OrderedDict,
        defaultdict,
        deque,
        Pair,
        Point,
        Record,
        Tagged,
        type(None),
        Leaf,
    }
    assert wanted <= found, wanted - found


def test_strategy_takes_custom_containers_leaves_and_limits():
    @settings(max_examples=100, database=None)
    @given(
        trees(
            st.just("L"), max_depth=2, max_width=2, containers=[lambda c: st.builds(Interval, c, c)]
        )
    )
    def check(tree):
        leaves = pk.leaves(tree)
        assert all(x == "L" for x in leaves)
        assert len(leaves) <= (2 * 2 + 2) ** 2  # width and depth bound the size

    check()
    found: set = set()

    @settings(max_examples=200, database=None)
    @given(trees(max_depth=2, containers=[lambda c: st.builds(Interval, c, c)]))
    def collect(tree):
        todo = [tree]
        while todo:
            x = todo.pop()
            found.add(type(x))
            if isinstance(x, Interval):
                todo.extend([x.lo, x.hi])
            elif isinstance(x, (list, tuple)):
                todo.extend(x)
            elif isinstance(x, dict):
                todo.extend(x.values())

    collect()
    assert Interval in found


def test_strategy_depth_zero_is_leaves_and_none():
    @settings(max_examples=50, database=None)
    @given(trees(max_depth=0))
    def check(tree):
        assert pk.structure(tree).num_nodes == 1

    check()
    with pytest.raises(ValueError):
        trees(max_depth=-1)
