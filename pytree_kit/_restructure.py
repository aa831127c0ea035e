"""Changing a tree's structure: transpose a tree of trees, broadcast a
prefix over a full tree, split a tree in two by a predicate and join it
back, replace None, and visit every subtree, replacing some (``traverse``)."""

from __future__ import annotations

from typing import Any, Callable, Final, Optional

from . import _interface
from ._compare import first_difference, mismatch_text
from ._errors import StructureError
from ._keys import where
from ._kinds import RULE, check_rules
from ._spec import TreeSpec, child_key

__all__ = [
    "MAP_TO_NONE",
    "traverse",
    "traverse_with_path",
    "tree_broadcast_prefix",
    "tree_combine",
    "tree_partition",
    "tree_replace_nones",
    "tree_transpose",
]

IsLeaf = Optional[Callable[[Any], bool]]


def tree_transpose(
    outer_spec: TreeSpec,
    inner_spec: Optional[TreeSpec],
    tree: Any,
    *,
    is_leaf: IsLeaf = None,
    rules: Any = None,
) -> Any:
    """Turn a tree of ``outer_spec``'s structure whose every leaf is a tree of
    ``inner_spec``'s structure inside out: a tree of the inner structure whose
    leaves are trees of the outer one. jax's ``tree_transpose``.

    With ``inner_spec=None`` the inner structure is read from the first inner
    tree. A tree that is not ``outer_spec.compose(inner_spec)`` raises
    TypeError (as in jax) naming the first path where it differs. Classes
    that the specs hold by a rule are read by that rule, as
    ``flatten_up_to`` reads them, unless ``rules`` gives their own.

    Examples:
        >>> import pytree_kit as pk
        >>> rows = [{"x": 1, "y": 2}, {"x": 3, "y": 4}]
        >>> outer, inner = pk.structure([0, 0]), pk.structure({"x": 0, "y": 0})
        >>> pk.tree_transpose(outer, inner, rows)
        {'x': [1, 3], 'y': [2, 4]}
        >>> pk.tree_transpose(outer, None, rows)
        {'x': [1, 3], 'y': [2, 4]}
    """
    rules = check_rules(rules)
    if type(outer_spec) is not TreeSpec:
        raise TypeError(f"tree_transpose: outer_spec must be a TreeSpec, got {outer_spec!r}")
    if inner_spec is None:
        if outer_spec.num_leaves == 0:
            raise ValueError(
                "tree_transpose: inner_spec=None reads the inner structure from the "
                "first inner tree, but the outer structure has no leaves"
            )
        first = _interface.engine.flatten_up_to(outer_spec, tree, "the outer spec", "the tree")[0]
        inner_spec = _interface.engine.flatten(first, is_leaf, rules)[1]
    elif type(inner_spec) is not TreeSpec:
        raise TypeError(f"tree_transpose: inner_spec must be a TreeSpec, got {inner_spec!r}")
    expected = outer_spec.compose(inner_spec)
    # the specs' own rules read the tree (as flatten_up_to reads it), where
    # the call gives none for the class
    carried = {node[1]: node[3][0] for node in expected._nodes if node[0] == RULE}
    if carried:
        rules = {**carried, **(rules or {})}
    leaves, spec = _interface.engine.flatten(tree, is_leaf, rules)
    found = None if spec == expected else first_difference(expected, spec)
    if found is not None:
        text = mismatch_text(found, "outer_spec.compose(inner_spec)", "the tree")
        raise StructureError(f"tree_transpose: {text}")
    n_outer, n_inner = outer_spec.num_leaves, inner_spec.num_leaves
    rebuild = _interface.engine.unflatten
    subtrees = [
        rebuild(outer_spec, leaves[j : n_outer * n_inner : n_inner]) for j in range(n_inner)
    ]
    return rebuild(inner_spec, subtrees)


def tree_broadcast_prefix(
    prefix_tree: Any, full_tree: Any, is_leaf: IsLeaf = None, *, rules: Any = None
) -> Any:
    """A tree of ``full_tree``'s structure in which each leaf of
    ``prefix_tree`` stands for every leaf of the subtree at its place.
    optree's ``tree_broadcast_prefix``. ``prefix_tree`` must be a prefix of
    ``full_tree``; where it is not, ValueError names the path.

    Examples:
        >>> import pytree_kit as pk
        >>> pk.tree_broadcast_prefix({"a": 1, "b": 2}, {"a": [0, 0], "b": (0, {"c": 0})})
        {'a': [1, 1], 'b': (2, {'c': 2})}
    """
    rules = check_rules(rules)
    values, spec = _interface.engine.flatten(prefix_tree, is_leaf, rules)
    subtrees = _interface.engine.flatten_up_to(spec, full_tree, "the prefix tree", "the full tree")
    out = []
    for value, sub in zip(values, subtrees):
        sub_spec = _interface.engine.flatten(sub, is_leaf, rules)[1]
        out.append(_interface.engine.unflatten(sub_spec, [value] * sub_spec.num_leaves))
    return _interface.engine.unflatten(spec, out)


def tree_partition(
    predicate: Callable[[Any], Any],
    tree: Any,
    is_leaf: IsLeaf = None,
    *,
    fillvalue: Any = None,
    rules: Any = None,
) -> tuple[Any, Any]:
    """Two trees of ``tree``'s structure: the first keeps the leaves
    ``predicate`` accepts, the second the others, each with ``fillvalue``
    where the other has its leaf. optree's ``tree_partition``;
    :func:`tree_combine` joins them back.

    Examples:
        >>> import pytree_kit as pk
        >>> ints, rest = pk.tree_partition(lambda x: isinstance(x, int), {"a": [1, "s"], "b": 2})
        >>> ints, rest
        ({'a': [1, None], 'b': 2}, {'a': [None, 's'], 'b': None})
        >>> pk.tree_combine(ints, rest)
        {'a': [1, 's'], 'b': 2}
    """
    leaves, spec = _interface.engine.flatten(tree, is_leaf, check_rules(rules))
    chosen = [bool(predicate(x)) for x in leaves]
    left = _interface.engine.unflatten(
        spec, [x if c else fillvalue for x, c in zip(leaves, chosen)]
    )
    right = _interface.engine.unflatten(
        spec, [fillvalue if c else x for x, c in zip(leaves, chosen)]
    )
    return left, right


def tree_combine(
    *trees: Any, fillvalue: Any = None, is_leaf: IsLeaf = None, rules: Any = None
) -> Any:
    """One tree from trees of one structure in which ``fillvalue`` (None by
    default, compared by identity) marks an empty place: each place takes the
    first leaf there that is not ``fillvalue``. The inverse of
    :func:`tree_partition` (and of equinox's ``partition``, as its ``combine``).

    The trees must have the same structure, ``fillvalue`` counting as a leaf;
    where they do not, ValueError names the path.

    Examples:
        >>> import pytree_kit as pk
        >>> pk.tree_combine({"a": [1, None]}, {"a": [None, 2]})
        {'a': [1, 2]}
    """
    if not trees:
        raise TypeError("tree_combine needs at least one tree")
    rules = check_rules(rules)

    def leaf(x: Any) -> bool:
        return x is fillvalue or (is_leaf is not None and bool(is_leaf(x)))

    leaves, spec = _interface.engine.flatten(trees[0], leaf, rules)
    columns = [leaves]
    for k, other in enumerate(trees[1:], 1):
        more, other_spec = _interface.engine.flatten(other, leaf, rules)
        found = first_difference(spec, other_spec)
        if found is not None:
            raise StructureError(f"tree_combine: {mismatch_text(found, 'trees[0]', f'trees[{k}]')}")
        columns.append(more)
    out = []
    for row in zip(*columns):
        for x in row:
            if x is not fillvalue:
                break
        out.append(x)
    return _interface.engine.unflatten(spec, out)


def tree_replace_nones(sentinel: Any, tree: Any, *, rules: Any = None) -> Any:
    """``tree`` with every None replaced by ``sentinel``. optree's
    ``tree_replace_nones``.

    Examples:
        >>> import pytree_kit as pk
        >>> pk.tree_replace_nones(0, {"a": [1, None], "b": None})
        {'a': [1, 0], 'b': 0}
    """
    leaves, spec = _interface.engine.flatten(tree, _is_none, check_rules(rules))
    return _interface.engine.unflatten(spec, [sentinel if x is None else x for x in leaves])


def _is_none(x: Any) -> bool:
    return x is None


class _MapToNone:
    """The type of :data:`pytree_kit.MAP_TO_NONE`: one instance, which pickles
    and copies as itself.

    Examples:
        >>> import copy, pickle, pytree_kit as pk
        >>> pk.MAP_TO_NONE
        pytree_kit.MAP_TO_NONE
        >>> pickle.loads(pickle.dumps(pk.MAP_TO_NONE)) is pk.MAP_TO_NONE
        True
        >>> copy.deepcopy(pk.MAP_TO_NONE) is pk.MAP_TO_NONE
        True
    """

    __slots__ = ()

    def __repr__(self) -> str:
        return "pytree_kit.MAP_TO_NONE"

    def __reduce__(self) -> str:
        return "MAP_TO_NONE"


MAP_TO_NONE: Final = _MapToNone()
"""What a :func:`traverse` function returns to put None in place of a subtree
(returning None itself keeps the subtree): dm-tree's ``tree.MAP_TO_NONE``."""


def traverse(
    fn: Callable[[Any], Any],
    tree: Any,
    top_down: bool = True,
    *,
    is_leaf: IsLeaf = None,
    rules: Any = None,
) -> Any:
    """Call ``fn`` on every subtree of ``tree``, containers and leaves, and
    build the tree its answers make: dm-tree's ``traverse``.

    Top-down (the default), ``fn`` sees a container before its children: an
    answer of None goes on into it, any other answer takes the subtree's
    place and its children are not visited. Bottom-up, ``fn`` sees each
    container after its children, rebuilt from what they became: None keeps
    it, any other answer takes its place. :data:`MAP_TO_NONE` puts None
    there. Children are visited in leaf order; every container is rebuilt,
    as ``unflatten`` rebuilds it.

    The containers are pytree_kit's (``None`` is one with no children, and
    ``fn`` sees it, as in dm-tree, where it is a leaf); ``is_leaf`` and
    ``rules`` are as in :func:`pytree_kit.flatten`. Iterative: any depth. A
    container that holds itself raises ValueError naming both places.

    Examples:
        >>> import pytree_kit as pk
        >>> seen = []
        >>> pk.traverse(seen.append, [(1, 2), {"a": None}])
        [(1, 2), {'a': None}]
        >>> seen
        [[(1, 2), {'a': None}], (1, 2), 1, 2, {'a': None}, None]
        >>> pk.traverse(lambda x: "pair" if isinstance(x, tuple) else None, [(1, 2), 3])
        ['pair', 3]
        >>> pk.traverse(lambda x: sum(x) if isinstance(x, tuple) else None, [(1, (2, 3))], False)
        [6]
    """
    return _traverse(fn, tree, top_down, is_leaf, rules, False)


def traverse_with_path(
    fn: Callable[[tuple, Any], Any],
    tree: Any,
    top_down: bool = True,
    *,
    is_leaf: IsLeaf = None,
    rules: Any = None,
) -> Any:
    """:func:`traverse`, calling ``fn(path, subtree)``: dm-tree's
    ``traverse_with_path``. The path is the keys that lead to the subtree
    (``()`` for the root), as :func:`pytree_kit.flatten_with_path` gives
    them.

    Examples:
        >>> import pytree_kit as pk
        >>> seen = []
        >>> _ = pk.traverse_with_path(lambda p, x: seen.append(pk.keystr(p)), {"a": [1, 2]})
        >>> seen
        ['', "['a']", "['a'][0]", "['a'][1]"]
        >>> pk.traverse_with_path(lambda p, x: len(p) if p else None, {"a": [1], "b": 2})
        {'a': 1, 'b': 1}
    """
    return _traverse(fn, tree, top_down, is_leaf, rules, True)


def _traverse(
    fn: Callable[..., Any], tree: Any, top_down: bool, is_leaf: IsLeaf, rules: Any, paths: bool
) -> Any:
    rules = check_rules(rules)
    frames: list = []  # [one-level spec, children, results, the container]
    if paths:  # fn(path, x): the path of x from the frames above it, as they are now
        with_path = fn

        def at_path(x: Any) -> Any:
            return with_path(tuple(_path(frames)), x)

        fn = at_path
    holders: dict = {}  # id of each container being visited -> its frame's index
    x = tree
    while True:
        value: Any = _UNSET
        if top_down:
            answer = fn(x)
            if answer is not None:
                value = None if answer is MAP_TO_NONE else answer
        if value is _UNSET:
            try:
                found = _interface.engine.flatten_one_level(x, is_leaf, rules)
            except (TypeError, ValueError) as e:
                placed = _placed(e, frames)
                if placed is e:
                    raise
                raise placed from None
            if found is None:  # a leaf
                value = x
                if not top_down:
                    value = _answer(fn, x)
            else:
                children, spec = found
                if children:
                    if id(x) in holders:
                        raise ValueError(
                            f"traverse: {where(_path(frames))}: cycle: this container is the one "
                            f"at {where(_path(frames[: holders[id(x)]]))}, which holds itself"
                        )
                    holders[id(x)] = len(frames)
                    frames.append((spec, children, [], x))
                    x = children[0]
                    continue
                value = _interface.engine.unflatten(spec, [])
                if not top_down:
                    value = _answer(fn, value)
        # value is what x became: hand it to the containers above
        while frames:
            spec, children, results, holder = frames[-1]
            results.append(value)
            if len(results) < len(children):
                x = children[len(results)]
                break
            frames.pop()
            del holders[id(holder)]
            value = _interface.engine.unflatten(spec, results)
            if not top_down:
                value = _answer(fn, value)
        else:
            return value


_UNSET: Any = object()  # traverse: what a subtree becomes is not known yet


def _answer(fn: Callable[[Any], Any], x: Any) -> Any:
    """What a bottom-up traverse keeps of ``x``, given ``fn``'s answer."""
    answer = fn(x)
    if answer is None:
        return x
    return None if answer is MAP_TO_NONE else answer


def _path(frames: list) -> list:
    """The path of the subtree being visited, from traverse's frames."""
    return [child_key(spec._nodes[0], len(results)) for spec, _, results, _ in frames]


def _placed(e: Exception, frames: list) -> Exception:
    """``e``, raised of the subtree being visited as its root (``tree: ...``),
    with its place in the whole tree."""
    text = str(e)
    if not text.startswith("tree: "):
        return e
    return type(e)(f"traverse: {where(_path(frames))}{text[4:]}")
