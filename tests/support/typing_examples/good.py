"""Annotations with PyTree that type-check (tests/test_typing.py runs mypy here)."""

from __future__ import annotations

import collections
from typing import Any, NamedTuple

import pytree_kit as pk
from pytree_kit.typing import PyTree


class Point(NamedTuple):
    x: int
    y: int


def total(tree: PyTree[int]) -> int:
    return sum(pk.leaves(tree))


def scaled(tree: PyTree[float], k: float) -> PyTree[float]:
    return pk.tree_map(lambda x: x * k, tree)  # type: ignore[no-any-return]


total(1)
total(None)
total([1, (2, 3), {"a": [4, None]}])
total({0: {"deep": [[[5]]]}})
total(Point(1, 2))
total(collections.OrderedDict(a=1))
scaled({"w": [1.0, 2.0], "b": 0.5}, 2.0)
scaled([1, 2], 0.5)  # an int is a float to a type checker
anything: PyTree[Any] = [object(), {"k": object()}]
