"""Questions about one value: is it a leaf, are these all leaves, is this a
namedtuple or a structseq class (jax's ``all_leaves``, optree's
``tree_is_leaf``, ``is_namedtuple`` and ``is_structseq``)."""

from __future__ import annotations

from typing import Any, Iterable

from .api import IsLeaf, Rules, structure

__all__ = [
    "all_leaves",
    "is_namedtuple",
    "is_namedtuple_class",
    "is_namedtuple_instance",
    "is_structseq",
    "is_structseq_class",
    "is_structseq_instance",
    "tree_is_leaf",
]


def tree_is_leaf(tree: Any, is_leaf: IsLeaf = None, *, rules: Rules = None) -> bool:
    """True when ``tree`` is a leaf: ``is_leaf`` says so, or it is no container.

    None is a container with no children, as in jax and optree (without
    ``none_is_leaf``), so it is not a leaf.

    Examples:
        >>> import pytree_kit as pk
        >>> pk.tree_is_leaf(1.0), pk.tree_is_leaf([1.0]), pk.tree_is_leaf(None)
        (True, False, False)
        >>> pk.tree_is_leaf([1.0], is_leaf=lambda x: isinstance(x, list))
        True
    """
    return structure(tree, is_leaf=is_leaf, rules=rules).is_leaf()


def all_leaves(iterable: Iterable[Any], is_leaf: IsLeaf = None, *, rules: Rules = None) -> bool:
    """True when every element of ``iterable`` is a leaf (see
    :func:`tree_is_leaf`): jax's ``all_leaves``. An empty iterable gives True.

    Examples:
        >>> import pytree_kit as pk
        >>> pk.all_leaves([1, "a", 2.0]), pk.all_leaves([1, (2,)]), pk.all_leaves([None])
        (True, False, False)
    """
    return all(structure(x, is_leaf=is_leaf, rules=rules).is_leaf() for x in iterable)


def is_namedtuple_class(cls: Any) -> bool:
    """True for a class made by ``collections.namedtuple`` or
    ``typing.NamedTuple`` (or a subclass of one): a tuple subclass with a
    tuple of str ``_fields`` and callable ``_make`` and ``_asdict``, as
    optree checks. Such an instance flattens into its fields, unless its
    class defines ``__tree_flatten__``, which comes first.

    Examples:
        >>> import collections, pytree_kit as pk
        >>> Point = collections.namedtuple("Point", "x y")
        >>> pk.is_namedtuple_class(Point), pk.is_namedtuple_class(tuple)
        (True, False)
    """
    if not isinstance(cls, type) or not issubclass(cls, tuple):
        return False
    fields = getattr(cls, "_fields", None)
    if type(fields) is not tuple or not all(type(f) is str for f in fields):
        return False
    return callable(getattr(cls, "_make", None)) and callable(getattr(cls, "_asdict", None))


def is_namedtuple_instance(obj: Any) -> bool:
    """True for an instance of a namedtuple class (:func:`is_namedtuple_class`)."""
    return is_namedtuple_class(type(obj))


def is_namedtuple(obj: Any) -> bool:
    """True for a namedtuple class or an instance of one, as optree's.

    Examples:
        >>> import collections, pytree_kit as pk
        >>> Point = collections.namedtuple("Point", "x y")
        >>> pk.is_namedtuple(Point(1, 2)), pk.is_namedtuple(Point), pk.is_namedtuple((1, 2))
        (True, True, False)
    """
    return is_namedtuple_class(obj if isinstance(obj, type) else type(obj))


def is_structseq_class(cls: Any) -> bool:
    """True for a C "struct sequence" class (``os.stat_result``,
    ``time.struct_time``, ``sys.flags``' class): a tuple subclass with int
    ``n_sequence_fields``, ``n_fields`` and ``n_unnamed_fields``, that cannot
    be subclassed, as optree checks.

    Examples:
        >>> import os, time, pytree_kit as pk
        >>> pk.is_structseq_class(time.struct_time), pk.is_structseq_class(tuple)
        (True, False)
    """
    if not isinstance(cls, type) or not issubclass(cls, tuple):
        return False
    for name in ("n_sequence_fields", "n_fields", "n_unnamed_fields"):
        if type(getattr(cls, name, None)) is not int:
            return False
    return not cls.__flags__ & (1 << 10)  # Py_TPFLAGS_BASETYPE: a structseq has it unset


def is_structseq_instance(obj: Any) -> bool:
    """True for an instance of a struct sequence class (:func:`is_structseq_class`)."""
    return is_structseq_class(type(obj))


def is_structseq(obj: Any) -> bool:
    """True for a struct sequence class or an instance of one, as optree's.

    Examples:
        >>> import time, pytree_kit as pk
        >>> pk.is_structseq(time.gmtime(0)), pk.is_structseq(time.struct_time), pk.is_structseq(())
        (True, True, False)
    """
    return is_structseq_class(obj if isinstance(obj, type) else type(obj))
