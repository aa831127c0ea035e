"""first_reaching: the search behind the no-silent-skips check. The C engine's
(_reach.c) against the specification (pytree_kit/_reach.py) on generated
object graphs (cycles, slots, dicts, registered classes, opaque objects, the
limit), and what the answers mean."""

from __future__ import annotations

import gc
import sys
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from pytree_kit import _interface, _reach

try:
    from pytree_kit import _speedups
except ImportError:  # the pure engine only
    _speedups = None  # type: ignore[assignment]


# runs the engines side by side, not through the public API: the same whichever
# engine that uses, so the pure-engine jobs leave it out (scripts/ci.py)
pytestmark = pytest.mark.side_by_side


class Target:
    """What the search looks for (a tensor, in pytree_kit.torch)."""


class SubTarget(Target):
    pass


class Box:
    def __init__(self) -> None:
        self.items: list = []


class Slotted:
    __slots__ = ("a", "b")


class Registered:
    """Answers "may" when taken up, whatever it holds."""

    def __init__(self) -> None:
        self.x = 1


def helper() -> None:
    """A function: opaque, so its globals (this module) are not searched."""


SKIP = (int, str, float, type(None))
OPAQUE = (type, type(helper))
REGISTERED = frozenset({Registered})
ENGINES = [_reach.first_reaching] + ([_speedups.first_reaching] if _speedups else [])


@st.composite
def graphs(draw: Any) -> list:
    """A list of leaves over a graph of containers and objects, with edges
    drawn between them (cycles included) and targets, plain values, functions
    and classes among the ends."""
    kinds = draw(
        st.lists(st.sampled_from(["box", "slots", "list", "dict", "set", "reg"]), max_size=12)
    )
    nodes: list = []
    for k in kinds:
        nodes.append(
            {
                "box": Box,
                "slots": Slotted,
                "list": list,
                "dict": dict,
                "set": set,
                "reg": Registered,
            }[k]()
        )
    ends = st.one_of(
        st.sampled_from(["target", "sub", "int", "str", "none", "helper", "class"]),
        st.integers(0, max(len(nodes) - 1, 0)),
    )

    def value(e: Any) -> Any:
        if isinstance(e, int) and nodes:
            return nodes[e]
        return {
            "target": Target(),
            "sub": SubTarget(),
            "int": 7,
            "str": "s",
            "none": None,
            "helper": helper,
            "class": Target,
        }.get(e, 0)

    for node in nodes:
        for e in draw(st.lists(ends, max_size=3)):
            v = value(e)
            if isinstance(node, Box):
                node.items.append(v)
            elif isinstance(node, Slotted):
                node.a = v
            elif isinstance(node, list):
                node.append(v)
            elif isinstance(node, dict):
                node[len(node)] = v
            elif isinstance(node, set):
                try:
                    node.add(v)
                except TypeError:  # unhashable
                    pass
            else:
                node.x = v
    leaves = [value(e) for e in draw(st.lists(ends, max_size=6))]
    return leaves


@pytest.mark.skipif(_speedups is None, reason="the C engine is not built")
@settings(max_examples=300, deadline=None)
@given(graphs(), st.integers(-2, 3), st.sampled_from([0, 1, 2, 5, 10_000]))
def test_the_c_search_answers_as_the_specification(leaves: list, start: int, limit: int) -> None:
    for registered in (REGISTERED, frozenset()):
        args = (leaves, start, Target, SKIP, OPAQUE, registered, limit)
        assert _speedups.first_reaching(*args) == _reach.first_reaching(*args)


@pytest.mark.parametrize("first_reaching", ENGINES)
def test_what_the_answers_mean(first_reaching: Any) -> None:
    box, loop, slotted = Box(), Box(), Slotted()
    loop.items.append(loop)  # a cycle without a target: searched once, no hang
    slotted.b = {"deep": [(1, Target())]}
    box.items.append(helper)  # a function's globals reach Target, but are not data
    leaves = [1, "s", Target(), box, loop, Target, slotted]

    def first(start: int = 0, **kw: Any) -> int:
        args = dict(target=Target, skip=SKIP, opaque=OPAQUE, registered=frozenset(), limit=100)
        args.update(kw)
        return first_reaching(leaves, start, *args.values())

    assert first() == 6  # a target leaf is not hidden; a class is opaque
    assert first(7) == -1 and first(100) == -1
    registered = frozenset({Box})
    assert first(registered=registered) == 3
    assert first(limit=1) == 3  # past the limit, "may": the exact search decides
    assert first(opaque=(type, type(helper), Slotted)) == -1
    assert first(target=SubTarget) == -1


@pytest.mark.parametrize("first_reaching", ENGINES)
def test_a_deep_chain_is_searched_without_recursion(first_reaching: Any) -> None:
    head = Box()
    node = head
    for _ in range(100_000):
        nxt = Box()
        node.items.append(nxt)
        node = nxt
    node.items.append(Target())
    assert first_reaching([head], 0, Target, SKIP, OPAQUE, frozenset(), 10**6) == 0
    assert first_reaching([head], 0, Target, SKIP, OPAQUE, frozenset(), 1000) == 0  # the limit


@pytest.mark.skipif(_speedups is None, reason="the C engine is not built")
def test_bad_arguments_raise_and_nothing_leaks() -> None:
    with pytest.raises(TypeError, match="takes 7 arguments"):
        _speedups.first_reaching([], 0)
    with pytest.raises(TypeError, match="skip and opaque hold types"):
        _speedups.first_reaching([Box()], 0, Target, (1,), OPAQUE, frozenset(), 10)
    with pytest.raises(TypeError):
        _speedups.first_reaching((Box(),), 0, Target, SKIP, OPAQUE, frozenset(), 10)

    class Unhashable(type):
        __hash__ = None  # type: ignore[assignment]

    odd = Unhashable("Odd", (), {})()
    with pytest.raises(TypeError, match="unhashable"):  # the registry lookup's error
        _speedups.first_reaching([odd], 0, Target, SKIP, OPAQUE, frozenset({Box}), 10)
    box = Box()
    box.items.extend([[1, 2], {"a": (3,)}, Slotted()])
    before = sys.getrefcount(box.items[0])
    for _ in range(1000):
        _speedups.first_reaching([box], 0, Target, SKIP, OPAQUE, frozenset(), 100)
    gc.collect()
    after = sys.getrefcount(box.items[0])  # (not inside assert: pytest's rewrite holds one)
    assert after == before


def test_the_engine_has_it() -> None:
    assert callable(_interface.engine.first_reaching)
