"""Which objects may reach an instance of a class: the search behind the
no-silent-skips check of ``pytree_kit.torch`` (a leaf that holds tensors
pytree_kit does not see). This is the specification; the C engine has the same
function (``_reach.c``), and the two give the same answers.

The search follows the references the garbage collector sees
(``gc.get_referents``, a C type's ``tp_traverse``): a superset of an object's
``__dict__``, slots and the containers found there. It is iterative, visits
each object once, and stops after ``limit`` objects per leaf, answering "may"
there, so that an exact search can decide.
"""

from __future__ import annotations

import gc
from typing import Any


def first_reaching(
    leaves: list,
    start: int,
    target: type,
    skip: tuple,
    opaque: tuple,
    registered: Any,
    limit: int,
) -> int:
    """The index of the first of ``leaves[start:]`` from which an instance of
    ``target`` may be reachable, or -1 (a negative ``start`` counts as 0).

    A leaf that is itself a ``target``, or whose type is one of ``skip``
    (exactly) or a subclass of one of ``opaque``, is not searched. Inside the
    search, an object of one of the ``skip`` types is passed by, a ``target``
    answers "may", an ``opaque`` object is not entered, and so is any object
    met before; an object whose type is in ``registered`` (a container of
    classes, such as a registry's dict) answers "may" when it is taken up, as
    does a search that takes up ``limit`` objects with more to go.

    Examples:
        >>> class Target: ...
        >>> class Box:
        ...     def __init__(self, v):
        ...         self.v = v
        >>> leaves = [1, Box([2, 3]), Box({"t": Target()})]
        >>> first_reaching(leaves, 0, Target, (int,), (type,), {}, 100)
        2
        >>> first_reaching(leaves, 0, Target, (int,), (type,), {Box: None}, 100)
        1
    """
    for i in range(max(start, 0), len(leaves)):
        x = leaves[i]
        t = type(x)
        if t in skip or issubclass(t, target) or issubclass(t, opaque):
            continue
        if _may_reach(x, target, skip, opaque, registered, limit):
            return i
    return -1


def _may_reach(
    obj: Any, target: type, skip: tuple, opaque: tuple, registered: Any, limit: int
) -> bool:
    todo = [obj]
    seen = {id(obj)}
    taken = 0
    while todo and taken < limit:
        x = todo.pop()
        taken += 1
        if type(x) in registered:
            return True
        for c in gc.get_referents(x):
            t = type(c)
            if t in skip:
                continue
            if issubclass(t, target):
                return True
            if id(c) in seen or issubclass(t, opaque):
                continue
            seen.add(id(c))
            todo.append(c)
    return bool(todo)
