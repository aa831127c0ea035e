"""The walks' steps while torch.compile traces them.

dynamo traces the pure engine in place of the C engine (``_dynamo``), and
it cannot follow every read an eager walk makes: which ones it follows
depends on the installed torch (docs/compatibility.md; ``_tracer`` holds
what ``_dynamo`` learned of it). The specification, ``_pure``, asks one
question where a step differs, :func:`on`, and takes the traced step from
here. Each one below gives what the eager read gives, in a form the tracer
follows (a plain ``getattr`` for ``object.__getattribute__``, ``len`` and
``tuple`` for ``tuple.__len__`` and ``tuple.__getitem__``, ...), or an error
that names the torch from which a compiled call can do it, and what to do
before then.

Two rules hold for all of them, and explain most of the differences:

* The tracer guards what it reads. A read of an ``id()`` or of a type the
  input holds becomes a guard of the compiled graph, so a traced walk reads
  no identity until a path gets deep (:data:`CYCLE_DEPTH`), and tests
  values with ``isinstance`` rather than ``type() is``.
* A fact of a class alone (``_pure.CLASS_FACTS``) is run by the tracer as
  it is and taken as a constant, so the traced steps ask for those rather
  than read class dicts themselves.

This module imports no engine; the specification imports it.
"""

from __future__ import annotations

from typing import Any, Callable

from . import _tracer
from ._keys import where
from ._kinds import NEW, subclass_base
from ._messages import cycle_error, qualname, stack_path

__all__ = [
    "CHECKING",
    "CYCLE_DEPTH",
    "check_path",
    "instance_dict",
    "layout",
    "list_items",
    "mapping_items",
    "no_instance_dicts",
    "on",
    "onpath",
    "plain_tuple_reads",
    "plainly_hashable",
    "reads_instance_dicts",
    "rebuilt_list",
]


def on() -> bool:
    """Whether torch.compile's tracer is tracing the walk (a constant to it:
    ``torch.compiler.is_compiling`` once ``torch._dynamo`` is imported)."""
    return _tracer.compiling()


def plainly_hashable(x: Any) -> bool:
    """``_pure._plainly_hashable`` while traced: the tracer on torch 2.9-2.11
    cannot call ``hash`` (not even on a str), and it cannot guard the
    ``type()`` of a value read from the input, so instances of subclasses of
    str, int, float, bytes and complex count too, in tuples or None."""
    todo = [x]
    while todo:
        v = todo.pop()
        if v is None:
            continue
        if isinstance(v, tuple):
            todo.extend(v)
        elif not isinstance(v, (str, int, float, bytes, complex)):
            return False
    return True


def reads_instance_dicts() -> bool:
    """Whether this walk may read instances' ``__dict__`` (always, unless a
    tracer that cannot is tracing it: dynamo can from torch 2.12 on)."""
    return _tracer.reads_instance_dicts or not _tracer.compiling()


def no_instance_dicts(stack: list, t: Any) -> TypeError:
    """The error for an instance whose rebuild keeps its ``__dict__``, met
    by a tracer that cannot read one."""
    return TypeError(
        f"{where(stack_path(stack))}: torch.compile on this torch (older than 2.12) cannot "
        f"read the attributes of a {qualname(t)} instance (its __dict__), which its "
        "rebuild keeps; flatten it outside the compiled function, or use torch 2.12 "
        "or newer"
    )


def instance_dict(obj: Any) -> Any:
    """The ``__dict__`` of ``obj`` with ``getattr`` (dynamo cannot call
    ``object.__getattribute__``), which finds the class's ``__dict__``
    descriptor before any ``__getattr__``; None when it has none."""
    return getattr(obj, "__dict__", None)


def layout(t: Any, slot_names: Callable[[Any], tuple]) -> tuple:
    """``_pure.subclass_layout`` while traced (``slot_names`` is
    ``_pure.slot_names``): read each time (each a class fact, kept by no
    memo), with each slot's descriptor None, read with ``getattr`` (dynamo
    2.9-2.11 cannot call a member descriptor)."""
    base = subclass_base(t)
    slots = tuple((name, None) for _, name in slot_names(t)) if base else ()
    return base, slots, t.__dictoffset__ != 0


def mapping_items(base: str, obj: Any) -> tuple:
    """``(order, items)`` of a dict subclass's instance, from its base's own
    ``keys`` and ``__getitem__``, one key at a time: the tracer follows
    these, not ``dict.items`` called on a subclass."""
    solid = NEW[base]
    order = tuple(list(solid.keys(obj)))
    return order, {k: solid.__getitem__(obj, k) for k in order}


def list_items(obj: list) -> Any:
    """The items of a list subclass that keeps ``list.__iter__``, as
    ``tuple(obj)`` (which the tracer follows, and which reads the same
    items); None when the class has an ``__iter__`` of its own."""
    if getattr(type(obj), "__iter__", None) is list.__iter__:
        return tuple(obj)
    return None


def rebuilt_list(t: Any, children: list, setters: tuple) -> list:
    """A list subclass's instance made with ``list.__new__`` and extended by
    its ``extend`` (dynamo cannot call ``list.extend`` on a subclass), which
    is ``list.extend`` itself unless ``setters`` (its class's own) name it:
    then TypeError, as the eager rebuild would not call it."""
    if "extend" in setters:
        raise TypeError(
            f"torch.compile cannot rebuild a {qualname(t)} (a list subclass that "
            "defines its own extend) as an eager call does, with list.extend; "
            "unflatten it outside the compiled function, or pass rules= for it"
        )
    obj: list = list.__new__(t)
    obj.extend(children)
    return obj


#: How deep a traced walk's path goes before the walk looks for cycles.
#: dynamo guards on every ``id()`` it traces, so the check made on entry to
#: each container, as in an eager call, would tie a compiled graph to the
#: batch it was traced on (a recompile per batch). While tracing, no identity
#: is read until the path is this deep: a cycle repeats its containers without
#: end, so it always gets there, and the check made there finds the first
#: container the path met again, with the error the check on entry gives.
#: (The same, but for callbacks whose answers change between calls: those
#: are called again down the cycle.) A traced tree deeper than this is
#: guarded on the identity of the containers past this depth.
CYCLE_DEPTH = 100

#: what ``onpath`` holds once cycles are checked on entry (no id is negative)
CHECKING = -1


def onpath() -> set:
    """A walk's set of the ids on its path: checked from the first container
    (``CHECKING`` in it), or, while dynamo traces, empty until the path is
    ``CYCLE_DEPTH`` deep (:func:`check_path`)."""
    return set() if _tracer.compiling() else {CHECKING}


def check_path(stack: list, onpath: set, obj: Any) -> None:
    """Start checking for cycles: raise the error for the first container on
    the path (``stack``'s, then ``obj``) that is one before it on the path,
    else fill ``onpath`` with their ids. Where the tracer tracing the walk
    cannot read identities (torch older than 2.13), raise instead: the walk
    cannot tell a cycle from a deep tree."""
    if not _tracer.reads_identity:
        raise ValueError(
            f"{where(stack_path(stack))}: this path is {CYCLE_DEPTH} containers deep, and "
            "torch.compile on this torch (older than 2.13) cannot read the identities "
            "that tell a cycle from a deep tree; flatten this tree outside the compiled "
            "function, or use torch 2.13 or newer"
        )
    onpath.add(CHECKING)
    for j, o in enumerate([fr[4] for fr in stack] + [obj]):
        if id(o) in onpath:
            onpath.clear()
            raise cycle_error(stack[:j], o)
        onpath.add(id(o))


def plain_tuple_reads(overrides: bool) -> bool:
    """Whether a tuple subclass's stored items are read with ``len`` and
    ``tuple``: while traced, for a class that ``overrides`` none of
    ``__len__``, ``__iter__`` and ``__getitem__`` (``_pure.tuple_overrides``),
    whose ``len`` and ``tuple`` read the stored items, as dynamo 2.9-2.12
    cannot call ``tuple.__len__`` or ``tuple.__getitem__`` on a subclass. A
    traced subclass that overrides them is read as in an eager call, which
    dynamo follows from torch 2.13 on."""
    return not overrides and _tracer.compiling()
