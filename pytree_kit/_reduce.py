"""Filtering and reducing the leaves of a tree: ``tree_map_only``, the
``tree_any`` / ``tree_all`` family and the reductions, with optree's and
torch's semantics. The reductions read the leaves in one call to the engine;
``tree_any`` and ``tree_all`` and their ``_only`` forms walk lazily and stop
at the first leaf that decides."""

from __future__ import annotations

import functools
from typing import Any, Callable, Iterator, Optional

from . import _interface
from ._kinds import check_rules

__all__ = [
    "tree_all",
    "tree_all_only",
    "tree_any",
    "tree_any_only",
    "tree_map_only",
    "tree_max",
    "tree_min",
    "tree_reduce",
    "tree_sum",
]

IsLeaf = Optional[Callable[[Any], bool]]
_MISSING: Any = object()


def _leaves(tree: Any, is_leaf: IsLeaf, rules: Any) -> list:
    return _interface.engine.leaves(tree, is_leaf, check_rules(rules))  # type: ignore[no-any-return]


def _lazy(tree: Any, is_leaf: IsLeaf, rules: Any) -> Iterator[Any]:
    """The leaves as the engine's iterator: the walk stops where the caller does."""
    return _interface.engine.iter_leaves(tree, is_leaf, check_rules(rules))  # type: ignore[no-any-return]


def _is_types(x: Any) -> bool:
    """Whether isinstance takes x: a type, a tuple of them, or a union."""
    try:
        isinstance(None, x)
    except TypeError:
        return False
    return True


def _types(type_or_types: Any, fn: str) -> Any:
    """A type, a tuple of types or a union (``int | str``), for isinstance."""
    if _is_types(type_or_types):
        return type_or_types
    raise TypeError(
        f"{fn} expects a type, a tuple of types or a union of types, got {type_or_types!r}"
    )


def _selector(type_or_types_or_pred: Any) -> Callable[[Any], bool]:
    """A predicate from a type, a tuple of types, a union, or a predicate."""
    s = type_or_types_or_pred
    if _is_types(s):
        return lambda x: isinstance(x, s)
    if callable(s):
        return s  # type: ignore[no-any-return]
    raise TypeError(
        "tree_map_only expects a type, a tuple of types, a union of types or a "
        f"predicate, got {s!r}"
    )


def tree_map_only(
    type_or_types_or_pred: Any,
    fn: Callable[[Any], Any],
    tree: Any,
    is_leaf: IsLeaf = None,
    *,
    rules: Any = None,
) -> Any:
    """``fn`` on each leaf that is an instance of the given type(s) (or that
    the predicate accepts); every other leaf is kept as it is. torch's
    ``tree_map_only``, on every kind of node.

    Examples:
        >>> import pytree_kit as pk
        >>> pk.tree_map_only(int, lambda x: x * 10, {"a": [1, "s"], "b": (2.5, 3)})
        {'a': [10, 's'], 'b': (2.5, 30)}
        >>> pk.tree_map_only(lambda x: x == "s", str.upper, ["s", "t"])
        ['S', 't']
    """
    wanted = _selector(type_or_types_or_pred)
    leaves, spec = _interface.engine.flatten(tree, is_leaf, check_rules(rules))
    return _interface.engine.unflatten(spec, [fn(x) if wanted(x) else x for x in leaves])


def tree_any(tree: Any, is_leaf: IsLeaf = None, *, rules: Any = None) -> bool:
    """Whether any leaf is true, as optree's ``tree_any`` (False for no leaves).
    The walk stops at the first true leaf.

    torch's ``tree_any(pred, tree)`` is ``pk.tree_any(pk.tree_map(pred, tree))``.

    Examples:
        >>> import pytree_kit as pk
        >>> pk.tree_any({"a": [0, None], "b": ""}), pk.tree_any([0, (1,)])
        (False, True)
    """
    return _interface.engine.any_leaf(tree, is_leaf, check_rules(rules), True)  # type: ignore[no-any-return]


def tree_all(tree: Any, is_leaf: IsLeaf = None, *, rules: Any = None) -> bool:
    """Whether every leaf is true, as optree's ``tree_all`` (True for no leaves).
    The walk stops at the first false leaf.

    Examples:
        >>> import pytree_kit as pk
        >>> pk.tree_all({"a": [1, None], "b": "s"}), pk.tree_all([1, (0,)])
        (True, False)
    """
    return not _interface.engine.any_leaf(tree, is_leaf, check_rules(rules), False)


def tree_any_only(
    type_or_types: Any,
    pred: Callable[[Any], Any],
    tree: Any,
    is_leaf: IsLeaf = None,
    *,
    rules: Any = None,
) -> bool:
    """Whether ``pred`` is true of any leaf of the given type(s), as torch's
    ``tree_any_only``; other leaves are not passed to ``pred``.

    Examples:
        >>> import pytree_kit as pk
        >>> pk.tree_any_only(int, lambda x: x > 2, {"a": [1, "long text"], "b": 3})
        True
    """
    return any(_chosen(type_or_types, pred, tree, is_leaf, rules, "tree_any_only"))


def _chosen(
    type_or_types: Any, pred: Callable[[Any], Any], tree: Any, is_leaf: IsLeaf, rules: Any, fn: str
) -> Any:
    """``pred`` of each leaf of the given type(s), lazily."""
    kinds = _types(type_or_types, fn)
    return (pred(x) for x in _lazy(tree, is_leaf, rules) if isinstance(x, kinds))


def tree_all_only(
    type_or_types: Any,
    pred: Callable[[Any], Any],
    tree: Any,
    is_leaf: IsLeaf = None,
    *,
    rules: Any = None,
) -> bool:
    """Whether ``pred`` is true of every leaf of the given type(s), as torch's
    ``tree_all_only``; other leaves are not passed to ``pred``.

    Examples:
        >>> import pytree_kit as pk
        >>> pk.tree_all_only(int, lambda x: x > 0, {"a": [1, "s"], "b": 3})
        True
    """
    return all(_chosen(type_or_types, pred, tree, is_leaf, rules, "tree_all_only"))


def tree_reduce(
    fn: Callable[[Any, Any], Any],
    tree: Any,
    initial: Any = _MISSING,
    *,
    is_leaf: IsLeaf = None,
    rules: Any = None,
) -> Any:
    """``functools.reduce(fn, leaves, initial)``, as optree's ``tree_reduce``
    (jax's ``initializer`` is ``initial`` here). A tree with no leaves and no
    ``initial`` raises TypeError, as ``functools.reduce`` does.

    Examples:
        >>> import operator, pytree_kit as pk
        >>> pk.tree_reduce(operator.add, {"a": [1, 2], "b": (3, None)})
        6
        >>> pk.tree_reduce(operator.add, {"a": []}, 10)
        10
    """
    leaves = _leaves(tree, is_leaf, rules)
    if initial is _MISSING:
        return functools.reduce(fn, leaves)
    return functools.reduce(fn, leaves, initial)


def tree_sum(tree: Any, start: Any = 0, *, is_leaf: IsLeaf = None, rules: Any = None) -> Any:
    """``sum(leaves, start)``, as optree's ``tree_sum``: where ``start`` is a
    str, bytes or bytearray (which ``sum`` refuses) the leaves are joined to it
    instead, and the result is a str, bytes or bytearray as ``start`` is.

    Examples:
        >>> import pytree_kit as pk
        >>> pk.tree_sum({"a": [1, 2], "b": 3}), pk.tree_sum({"a": [1.5, 2]}, start=10)
        (6, 13.5)
        >>> pk.tree_sum({"x": "a", "y": ("b", None)}, start="")
        'ab'
    """
    leaves = _leaves(tree, is_leaf, rules)
    if isinstance(start, str):
        return "".join([start, *leaves])
    if isinstance(start, bytes):
        return b"".join([start, *leaves])
    if isinstance(start, bytearray):  # b"".join would give bytes
        return bytearray().join([start, *leaves])
    return sum(leaves, start)


def tree_max(
    tree: Any,
    *,
    default: Any = _MISSING,
    key: Optional[Callable[[Any], Any]] = None,
    is_leaf: IsLeaf = None,
    rules: Any = None,
) -> Any:
    """``max(leaves, key=key, default=default)``, as optree's ``tree_max``;
    no leaves and no ``default`` raises ValueError, as ``max`` does.

    Examples:
        >>> import pytree_kit as pk
        >>> pk.tree_max({"a": [1, 5], "b": 3}), pk.tree_max([], default=None)
        (5, None)
    """
    return _extreme(max, tree, default, key, is_leaf, rules)


def tree_min(
    tree: Any,
    *,
    default: Any = _MISSING,
    key: Optional[Callable[[Any], Any]] = None,
    is_leaf: IsLeaf = None,
    rules: Any = None,
) -> Any:
    """``min(leaves, key=key, default=default)``, as optree's ``tree_min``;
    no leaves and no ``default`` raises ValueError, as ``min`` does.

    Examples:
        >>> import pytree_kit as pk
        >>> pk.tree_min({"a": [1, 5], "b": 3}), pk.tree_min({"a": "xyz"}, key=len)
        (1, 'xyz')
    """
    return _extreme(min, tree, default, key, is_leaf, rules)


def _extreme(pick: Any, tree: Any, default: Any, key: Any, is_leaf: IsLeaf, rules: Any) -> Any:
    """``max`` or ``min`` of the leaves, with ``default`` only when given."""
    leaves = _leaves(tree, is_leaf, rules)
    if default is _MISSING:
        return pick(leaves, key=key)
    return pick(leaves, key=key, default=default)
