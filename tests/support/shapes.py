"""Small leaves and shapes that several test modules build: a leaf that
wraps a value, fresh distinct leaves, and a chain of lists deep enough that
only an iterative walk gets through it."""

from __future__ import annotations

from typing import Any

from tests.support.peer_trees import _unique_leaf

#: the depth of the deep chains: far past any recursion limit
DEPTH = 100_000


class Tag:
    """A leaf that wraps a value (a tuple would be a node)."""

    __slots__ = ("value",)

    def __init__(self, value: Any) -> None:
        self.value = value

    def __eq__(self, other: object) -> bool:
        return type(other) is Tag and other.value == self.value

    def __hash__(self) -> int:
        return hash((Tag, self.value))

    def __repr__(self) -> str:
        return f"Tag({self.value!r})"


def fresh_leaves(n: int) -> list:
    """n leaves, each a new object (so that a test can tell them by identity)."""
    counter = [10 * n]
    return [_unique_leaf(k % 3, counter) for k in range(n)]


def deep_list(depth: int = DEPTH) -> Any:
    """[[[...[0]...]]], depth lists deep."""
    t: Any = 0
    for _ in range(depth):
        t = [t]
    return t
