"""The public functions of pytree_kit. Every one works on any tree, with no
registration: containers are recognised by their structure (see
``docs/design.md``), ``is_leaf`` stops the descent at a value, and ``rules``
maps a type to a :class:`~pytree_kit.Rule` for this call only.
"""

from __future__ import annotations

from typing import Any, Callable, Iterable, Iterator, Mapping, Optional

from . import _interface
from ._engine import c_fast_call
from ._kinds import Rule, check_rules
from ._spec import TreeSpec

__all__ = [
    "flatten",
    "flatten_one_level",
    "flatten_with_path",
    "leaves",
    "structure",
    "tree_flatten",
    "tree_iter",
    "tree_leaves",
    "tree_map",
    "tree_map_with_path",
    "tree_structure",
    "tree_unflatten",
    "unflatten",
]

IsLeaf = Optional[Callable[[Any], bool]]
#: ``is_leaf(value)``, or ``is_leaf(path, value)`` with ``is_leaf_takes_path=True``
PathIsLeaf = Optional[Callable[..., bool]]
Rules = Optional[Mapping[type, Rule]]
Path = tuple


@c_fast_call("flatten")  # common calls run in C (_fastcall.c); this body specifies them
def flatten(
    tree: Any, *, is_leaf: IsLeaf = None, rules: Rules = None
) -> tuple[list[Any], TreeSpec]:
    """Flatten a tree into its leaves and its structure.

    Examples:
        >>> import pytree_kit as pk
        >>> leaves, spec = pk.flatten({"b": (1, None), "a": [2, 3]})
        >>> leaves
        [2, 3, 1]
        >>> spec
        TreeSpec({'a': [*, *], 'b': (*, None)})
        >>> pk.unflatten(spec, [20, 30, 10])
        {'b': (10, None), 'a': [20, 30]}
    """
    return _interface.engine.flatten(tree, is_leaf, check_rules(rules))


@c_fast_call("unflatten")  # common calls run in C (_fastcall.c); this body specifies them
def unflatten(spec: TreeSpec, leaves: Iterable[Any]) -> Any:
    """Build a tree of ``spec``'s structure from leaves (any iterable).

    The same as ``spec.unflatten(leaves)``. Raises ValueError giving both
    counts when there are too few or too many leaves. A list, tuple or other
    sized iterable is read whole; an iterator is read up to one leaf past
    the spec's count, so an endless one is an error, not a hang. A str,
    bytes or mapping raises TypeError: its characters, bytes or keys are
    not leaves (pass ``[it]`` for one leaf, ``iter(it)`` for its items).

    Examples:
        >>> import pytree_kit as pk
        >>> spec = pk.structure([0, (0, 0)])
        >>> pk.unflatten(spec, iter("abc"))
        ['a', ('b', 'c')]
    """
    if type(spec) is not TreeSpec:
        raise TypeError(f"unflatten expects a TreeSpec, got {type(spec).__name__}")
    return _interface.engine.unflatten(spec, leaves)


@c_fast_call("leaves")  # common calls run in C (_fastcall.c); this body specifies them
def leaves(tree: Any, *, is_leaf: IsLeaf = None, rules: Rules = None) -> list[Any]:
    """The leaves of a tree, in order, without building a spec.

    Examples:
        >>> import dataclasses, pytree_kit as pk
        >>> @dataclasses.dataclass
        ... class Batch:
        ...     x: object
        ...     y: object
        >>> pk.leaves([Batch(1, {"k": 2}), None, "s"])
        [1, 2, 's']
    """
    return _interface.engine.leaves(tree, is_leaf, check_rules(rules))


def tree_iter(tree: Any, is_leaf: IsLeaf = None, *, rules: Rules = None) -> Iterator[Any]:
    """The leaves of a tree, in order, found as they are asked for.

    Nothing is read until the first leaf is asked for, and the walk stops
    where the caller stops: ``next(pk.tree_iter(tree))`` reads one path down
    the tree, and an error further on is not raised. A container's children
    are read when the walk reaches it. Like a generator, the iterator is done
    after an error and may not be re-entered (from ``is_leaf``, or another
    thread): that raises ValueError.

    Examples:
        >>> import pytree_kit as pk
        >>> it = pk.tree_iter({"b": [1, 2], "a": (0, None)})
        >>> next(it), list(it)
        (0, [1, 2])
        >>> any(x > 1 for x in pk.tree_iter([3, {"never": "read"}]))
        True
    """
    return _interface.engine.iter_leaves(tree, is_leaf, check_rules(rules))  # type: ignore[no-any-return]


@c_fast_call("structure")  # common calls run in C (_fastcall.c); this body specifies them
def structure(tree: Any, *, is_leaf: IsLeaf = None, rules: Rules = None) -> TreeSpec:
    """The spec of a tree.

    Examples:
        >>> import pytree_kit as pk
        >>> pk.structure((1, [2, None]))
        TreeSpec((*, [*, None]))
    """
    return _interface.engine.flatten(tree, is_leaf, check_rules(rules))[1]


@c_fast_call("flatten_with_path")  # common calls run in C (_fastcall.c); this body specifies them
def flatten_with_path(
    tree: Any,
    *,
    is_leaf: PathIsLeaf = None,
    is_leaf_takes_path: bool = False,
    rules: Rules = None,
) -> tuple[list[tuple[Path, Any]], TreeSpec]:
    """Like :func:`flatten`, with each leaf paired with its path.

    With ``is_leaf_takes_path=True`` (jax's argument), ``is_leaf`` is called
    as ``is_leaf(path, value)``, the path being the keys that lead to the
    value (``()`` for the root), as the pairs give them.

    Examples:
        >>> import pytree_kit as pk
        >>> pairs, _ = pk.flatten_with_path({"targets": [{"boxes": 1}]})
        >>> [(pk.keystr(path), leaf) for path, leaf in pairs]
        [("['targets'][0]['boxes']", 1)]
        >>> frozen = lambda path, x: pk.keystr(path) == "['frozen']"
        >>> tree = {"frozen": [1, 2], "trained": [3]}
        >>> [leaf for _, leaf in pk.flatten_with_path(
        ...     tree, is_leaf=frozen, is_leaf_takes_path=True)[0]]
        [[1, 2], 3]
    """
    if is_leaf_takes_path:
        return _interface.engine.flatten_with_path(tree, is_leaf, check_rules(rules), True)
    return _interface.engine.flatten_with_path(tree, is_leaf, check_rules(rules))


def flatten_one_level(
    tree: Any, *, is_leaf: IsLeaf = None, rules: Rules = None
) -> tuple[list[Any], TreeSpec]:
    """The children of the root of ``tree``, and the spec that puts them back.

    The spec has the root's node with a leaf for each child, so
    ``spec.unflatten(children)`` rebuilds the root around the same children,
    and ``spec.paths()`` names them. A leaf (where ``is_leaf`` says so, or
    anything that is not a container) raises ValueError; None has no children.

    Examples:
        >>> import pytree_kit as pk
        >>> children, spec = pk.flatten_one_level({"b": [1, 2], "a": None})
        >>> children
        [None, [1, 2]]
        >>> spec
        TreeSpec({'a': *, 'b': *})
        >>> spec.unflatten(["x", "y"])
        {'b': 'y', 'a': 'x'}
    """
    found = _interface.engine.flatten_one_level(
        tree, is_leaf, None if rules is None else check_rules(rules)
    )
    if found is None:
        raise ValueError(
            f"flatten_one_level: the tree is a leaf ({type(tree).__qualname__}): it has no children"
        )
    children, spec = found
    return children, spec


@c_fast_call("tree_map")  # common calls run in C (_fastcall.c); this body specifies them
def tree_map(
    fn: Callable[..., Any],
    tree: Any,
    *rest: Any,
    is_leaf: IsLeaf = None,
    rules: Rules = None,
) -> Any:
    """Apply ``fn`` to every leaf of ``tree`` (and the matching leaves of ``rest``).

    Each tree in ``rest`` must have the structure of ``tree``; as in jax, where
    ``tree`` has a leaf, the value of a ``rest`` tree is passed whole. On a
    mismatch, raises ValueError naming the first differing path and both kinds.

    Examples:
        >>> import pytree_kit as pk
        >>> pk.tree_map(lambda x, y: x + y, {"a": 1, "b": (2, None)}, {"a": 10, "b": (20, None)})
        {'a': 11, 'b': (22, None)}
        >>> pk.tree_map(lambda x, y: x + y, [1, (2,)], [1, 2])  # doctest: +ELLIPSIS
        Traceback (most recent call last):
        ...
        pytree_kit.StructureError: tree[1]: structure mismatch: the first tree has a tuple of 1, ...
    """
    leaves, spec = _interface.engine.flatten(tree, is_leaf, check_rules(rules))
    if not rest:
        return _interface.engine.unflatten(spec, [fn(x) for x in leaves])
    others = _rest_leaves(spec, rest)
    return _interface.engine.unflatten(spec, list(map(fn, leaves, *others)))


def tree_map_with_path(
    fn: Callable[..., Any],
    tree: Any,
    *rest: Any,
    is_leaf: PathIsLeaf = None,
    is_leaf_takes_path: bool = False,
    rules: Rules = None,
) -> Any:
    """Like :func:`tree_map`, calling ``fn(path, leaf, *rest_leaves)``.

    With ``is_leaf_takes_path=True``, ``is_leaf`` is called as
    ``is_leaf(path, value)``, as in :func:`flatten_with_path`.

    Examples:
        >>> import pytree_kit as pk
        >>> pk.tree_map_with_path(lambda p, x: pk.keystr(p), {"a": [0, 0]})
        {'a': ["['a'][0]", "['a'][1]"]}
        >>> pk.tree_map_with_path(lambda p, x: len(x), {"a": [0, 0], "b": [1]},
        ...     is_leaf=lambda p, x: len(p) == 1, is_leaf_takes_path=True)
        {'a': 2, 'b': 1}
    """
    if is_leaf_takes_path:
        pairs, spec = _interface.engine.flatten_with_path(tree, is_leaf, check_rules(rules), True)
    else:
        pairs, spec = _interface.engine.flatten_with_path(tree, is_leaf, check_rules(rules))
    if not rest:
        return _interface.engine.unflatten(spec, [fn(p, x) for p, x in pairs])
    others = _rest_leaves(spec, rest)
    paths = [p for p, _ in pairs]
    values = [x for _, x in pairs]
    return _interface.engine.unflatten(spec, list(map(fn, paths, values, *others)))


def _rest_leaves(spec: TreeSpec, rest: tuple) -> list[list[Any]]:
    """The leaves of each tree in ``rest``, which must have ``spec``'s structure."""
    return [
        _interface.engine.flatten_up_to(spec, r, "the first tree", f"rest[{i}]")
        for i, r in enumerate(rest)
    ]


# -- drop-in aliases with the jax.tree_util / optree signatures -------------


@c_fast_call("flatten")  # common calls run in C (_fastcall.c); this body specifies them
def tree_flatten(tree: Any, is_leaf: IsLeaf = None) -> tuple[list[Any], TreeSpec]:
    """``jax.tree_util.tree_flatten``'s signature.

    Examples:
        >>> import pytree_kit as pk
        >>> pk.tree_flatten([1, (2, 3)])[0]
        [1, 2, 3]
    """
    return _interface.engine.flatten(tree, is_leaf, None)


@c_fast_call("unflatten")  # common calls run in C (_fastcall.c); this body specifies them
def tree_unflatten(spec: TreeSpec, leaves: Iterable[Any]) -> Any:
    """``jax.tree_util.tree_unflatten(treedef, leaves)``'s signature.

    Examples:
        >>> import pytree_kit as pk
        >>> pk.tree_unflatten(pk.tree_structure([0, 0]), [5, 6])
        [5, 6]
    """
    return unflatten(spec, leaves)


@c_fast_call("leaves")  # common calls run in C (_fastcall.c); this body specifies them
def tree_leaves(tree: Any, is_leaf: IsLeaf = None) -> list[Any]:
    """``jax.tree_util.tree_leaves``'s signature.

    Examples:
        >>> import pytree_kit as pk
        >>> pk.tree_leaves({"b": 2, "a": 1})
        [1, 2]
    """
    return _interface.engine.leaves(tree, is_leaf, None)


@c_fast_call("structure")  # common calls run in C (_fastcall.c); this body specifies them
def tree_structure(tree: Any, is_leaf: IsLeaf = None) -> TreeSpec:
    """``jax.tree_util.tree_structure``'s signature.

    Examples:
        >>> import pytree_kit as pk
        >>> pk.tree_structure({"a": None})
        TreeSpec({'a': None})
    """
    return _interface.engine.flatten(tree, is_leaf, None)[1]
