"""Annotations with PyTree that must not type-check: each line marked
``# error`` is one mypy reports (tests/test_typing.py checks the lines)."""

from __future__ import annotations

from pytree_kit.typing import PyTree


def total(tree: PyTree[int]) -> int:
    return 0


total("text")  # error
total([1, "text"])  # error
total({"a": [1, (2, b"x")]})  # error
total({1, 2})  # error
