"""Types for annotations: ``PyTree[T]``, a tree whose leaves are ``T``.

``PyTree[T]`` is a recursive type alias: a ``T``, None, or a list, tuple or
dict (any key) of ``PyTree[T]``. Type checkers (mypy, pyright) check the
leaves through any nesting of those containers, and the subclasses of them
that pytree_kit flattens: namedtuples, OrderedDict, defaultdict.

What it cannot express: a dataclass, attrs class or protocol class is a node
to pytree_kit but only a value to a type checker, so ``Batch(x=1)`` is a
``PyTree[T]`` only when ``Batch`` itself is ``T`` (annotate such a class's
fields instead, or use ``PyTree[Any]``); a deque is not a list; and no alias
can say that two trees have the same structure. It changes nothing at run
time: pytree_kit reads trees by their structure, not by their annotations.

Examples:
    >>> import pytree_kit as pk
    >>> from pytree_kit.typing import PyTree
    >>> def total(tree: PyTree[int]) -> int:
    ...     return sum(pk.leaves(tree))
    >>> total({"a": [1, 2], "b": (3, None)})
    6
    >>> import typing
    >>> typing.get_args(PyTree[int])[:2]  # (a Union, shown another way from 3.14)
    (<class 'int'>, <class 'NoneType'>)
    >>> [typing.get_origin(a) for a in typing.get_args(PyTree[int])[2:]]
    [<class 'list'>, <class 'tuple'>, <class 'dict'>]
"""

from __future__ import annotations

from typing import Any, TypeVar, Union

__all__ = ["PyTree"]

T = TypeVar("T")

#: A ``T``, None, or a list, tuple or dict of ``PyTree[T]`` (see the module's docs).
PyTree = Union[T, None, list["PyTree[T]"], tuple["PyTree[T]", ...], dict[Any, "PyTree[T]"]]
