"""Comparing trees: the same structure (and where it first differs), and the
same structure with equal leaves."""

from __future__ import annotations

from typing import Any, Callable, Optional

from . import _interface
from ._errors import StructureError
from ._keys import where
from ._kinds import LEAF, check_rules
from ._messages import describe_node, qualname, tell_apart
from ._paths import tree_get
from ._spec import TreeSpec, node_paths

__all__ = [
    "assert_same_structure",
    "first_difference",
    "leaf_equal",
    "mismatch_text",
    "tree_equal",
]

IsLeaf = Optional[Callable[[Any], bool]]


def first_difference(a: TreeSpec, b: TreeSpec) -> Optional[tuple]:
    """``(path, node of a, node of b)`` at the first node (in pre-order) where
    two specs differ, or None when they are equal.

    Up to that node both specs have the same nodes, so it stands at the
    same path in both.
    """
    if a == b:
        return None
    for (mine, keys), theirs in zip(node_paths(a._nodes), b._nodes):
        if mine != theirs:
            return tuple(keys), mine, theirs
    raise AssertionError("unequal specs with equal nodes")  # pragma: no cover


def mismatch_text(found: tuple, first: str, second: str) -> str:
    """The message for :func:`first_difference`'s result, the trees called
    ``first`` and ``second``: ``tree['a']: structure mismatch: ...``."""
    path, mine, theirs = found
    a, b = tell_apart(describe_node(mine), mine[1], describe_node(theirs), theirs[1])
    return f"{where(path)}: structure mismatch: {first} has {a}, {second} has {b}"


def _what(node: tuple, tree: Any, path: tuple, is_leaf: IsLeaf, rules: Any) -> str:
    if node[0] != LEAF:
        return describe_node(node)
    return f"a leaf of type {qualname(type(tree_get(tree, path, is_leaf=is_leaf, rules=rules)))}"


def assert_same_structure(a: Any, b: Any, *, is_leaf: IsLeaf = None, rules: Any = None) -> None:
    """Raise ValueError unless ``a`` and ``b`` have the same structure: the
    same containers with the same types, keys and aux data, and leaves at the
    same places (the leaves' values do not matter, nor the insertion order of
    dicts). The message names the first path where they differ and what each
    tree has there.

    Examples:
        >>> import pytree_kit as pk
        >>> pk.assert_same_structure({"a": [1, 2]}, {"a": [3, 4]})
        >>> pk.assert_same_structure({"a": [1, 2], "b": 0}, {"a": (1, 2), "b": 0})
        ... # doctest: +ELLIPSIS
        Traceback (most recent call last):
        ...
        pytree_kit.StructureError: tree['a']: structure mismatch: the first tree has a list ...
    """
    rules = check_rules(rules)
    sa = _interface.engine.flatten(a, is_leaf, rules)[1]
    sb = _interface.engine.flatten(b, is_leaf, rules)[1]
    found = first_difference(sa, sb)
    if found is None:
        return
    path, na, nb = found
    first, second = tell_apart(
        _what(na, a, path, is_leaf, rules), na[1], _what(nb, b, path, is_leaf, rules), nb[1]
    )
    raise StructureError(
        f"{where(path)}: structure mismatch: the first tree has {first}, "
        f"the second tree has {second}"
    )


def tree_equal(a: Any, b: Any, *, is_leaf: IsLeaf = None, rules: Any = None) -> bool:
    """Whether ``a`` and ``b`` have the same structure (as
    :func:`assert_same_structure` sees it) and equal leaves.

    Leaves are compared with ``==``. Two arrays (anything with ``shape`` and
    ``dtype``: numpy, torch, jax) are equal when their shapes and dtypes are
    equal and so is every element; NaN is not equal to itself, as with ``==``.

    Examples:
        >>> import pytree_kit as pk
        >>> pk.tree_equal({"a": [1, 2.0]}, {"a": [1, 2]})
        True
        >>> pk.tree_equal({"a": [1, 2]}, {"a": (1, 2)})
        False
    """
    rules = check_rules(rules)
    la, sa = _interface.engine.flatten(a, is_leaf, rules)
    lb, sb = _interface.engine.flatten(b, is_leaf, rules)
    return sa == sb and all(map(leaf_equal, la, lb))


def leaf_equal(x: Any, y: Any) -> bool:
    """``x == y`` as one bool, for scalars and arrays alike."""
    if x is y:
        return True
    array_x = hasattr(x, "shape") and hasattr(x, "dtype")
    array_y = hasattr(y, "shape") and hasattr(y, "dtype")
    if array_x or array_y:
        if not (array_x and array_y):
            return False
        if tuple(x.shape) != tuple(y.shape) or x.dtype != y.dtype:
            return False
        same = x == y
        return bool(same.all()) if hasattr(same, "all") else bool(same)
    same = x == y
    if type(same) is bool:
        return same
    return bool(same.all()) if hasattr(same, "all") else bool(same)
