"""Tensors hidden in leaves: the check that keeps the data functions from
skipping them silently.

A leaf is whatever pytree_kit does not see into. When that leaf is an object of
a library's own class that holds tensors (transformers' ``DynamicCache``, a
``TensorDict``), ``to_device`` would leave those tensors where they are and
``pin_memory`` unpinned, with no error. ``check_leaves`` raises TypeError for
such a leaf instead, naming its path, its type and where the tensor sits in it.

A leaf holds tensors when a tensor is reachable from it through its
``__dict__``, its slots, the lists, tuples, sets and dicts found there, or its
registration with ``torch.utils._pytree``. The search is iterative, visits each
object once, and stops after ``LIMIT`` objects. Tensors, numbers, strings,
bytes, None, dtypes, devices, numpy arrays and classes are plain leaves and cost
one type test each: a tree without hidden tensors pays one pass over its leaves.
Any other leaf is first searched by the engine's ``first_reaching``
(``pytree_kit/_reach.py``, in C on the C engine: about 0.1 µs for an object
with a few attributes), through what the garbage collector sees; the exact
search here, which writes the path, runs only on a leaf that may hold one.
"""

from __future__ import annotations

import collections
import enum
import functools
import sys
import types
from typing import Any, Iterable, Mapping, Optional

import torch

from .. import _interface, api
from .._bridge import NATIVE, rules_fix, torch_node
from .._keys import keystr
from .._kinds import Rule

Rules = Optional[Mapping[type, Rule]]

LIMIT = 10_000  # objects one leaf's search visits at most

_PLAIN: frozenset = frozenset(
    {
        torch.Tensor,
        torch.nn.Parameter,
        int,
        float,
        complex,
        bool,
        str,
        bytes,
        bytearray,
        type(None),
        torch.dtype,
        torch.device,
        torch.Size,
        torch.memory_format,
        torch.layout,
        slice,
        range,
        type(Ellipsis),
    }
)
_PLAIN_DATA = _PLAIN - {torch.Tensor, torch.nn.Parameter}
_SKIP = tuple(_PLAIN_DATA)  # first_reaching's skip: compared exactly
_SKIP_BUT_SIZE = tuple(t for t in _SKIP if t is not torch.Size)
# registered with torch.utils._pytree, but what they hold is what gc sees
_BUILTIN_CONTAINERS = NATIVE | {set, frozenset}
# objects whose attributes are code or classes, not data
_OPAQUE = (
    type,
    types.ModuleType,
    types.FunctionType,
    types.BuiltinFunctionType,
    types.MethodType,
    enum.Enum,
)


def hidden_tensor(obj: Any) -> Optional[str]:
    """Where the nearest tensor reachable from ``obj`` sits, as an attribute
    path (``.layers[0].keys``), or None when no tensor is reachable (or none
    within ``LIMIT`` objects)."""
    # breadth first, so the nearest tensor is named; each node is (object,
    # parent's index, step), and a path is written only for the tensor found
    nodes: list[tuple[Any, int, Any]] = [(obj, -1, None)]
    seen = {id(obj)}
    head = 0
    while head < len(nodes) and head < LIMIT:
        for child, step in _children(nodes[head][0]):
            t = type(child)
            if t in _PLAIN_DATA:
                continue
            if issubclass(t, torch.Tensor):
                return _path(nodes, head) + _step(step)
            if id(child) in seen or _is_opaque(child):
                continue
            seen.add(id(child))
            nodes.append((child, head, step))
        head += 1
    return None


def _path(nodes: list, i: int) -> str:
    steps = []
    while i > 0:
        _, i, step = nodes[i]
        steps.append(_step(step))
    return "".join(reversed(steps))


def _step(step: Any) -> str:
    kind, key = step
    if kind == "[":
        return f"[{key!r}]"
    if kind == ".":
        return f".{key}"
    if kind == "<":
        return f"<child {key}>"
    return "{...}"


def _is_opaque(x: Any) -> bool:
    if issubclass(type(x), _OPAQUE):
        return True
    numpy = sys.modules.get("numpy")
    return numpy is not None and issubclass(type(x), (numpy.ndarray, numpy.generic))


def _children(x: Any) -> Iterable[tuple[Any, tuple]]:
    """The objects ``x`` holds directly, each with the step that reaches it."""
    # the builtin bases' own iteration: a subclass's __iter__ is not asked
    t = type(x)
    if issubclass(t, list):
        return [(c, ("[", i)) for i, c in enumerate(list.__iter__(x))]
    if issubclass(t, tuple):
        return [(c, ("[", i)) for i, c in enumerate(tuple.__iter__(x))]
    if issubclass(t, collections.deque):  # a subclass: a leaf (only a deque is a node)
        return [(c, ("[", i)) for i, c in enumerate(collections.deque.__iter__(x))]
    if issubclass(t, dict):
        return [(c, ("[", k)) for k, c in list(dict.items(x))]
    if issubclass(t, set):
        return [(c, ("{", None)) for c in list(set.__iter__(x))]
    if issubclass(t, frozenset):
        return [(c, ("{", None)) for c in list(frozenset.__iter__(x))]
    out: list[tuple[Any, tuple]] = []
    registered = torch_node(t)
    if registered is not None:
        try:
            children, _ = registered.flatten_fn(x)
        except Exception:
            children = []
        out.extend((c, ("<", i)) for i, c in enumerate(children))
    try:
        state = object.__getattribute__(x, "__dict__")
    except Exception:  # none, or a __dict__ property of the class's own that raises
        state = None
    if type(state) is dict:
        out.extend((c, (".", k)) for k, c in list(dict.items(state)))
    for name in _slots_of(t):  # type: ignore[arg-type]  # classes hash
        try:
            out.append((object.__getattribute__(x, name), (".", name)))
        except Exception:  # an empty slot
            continue
    return out


@functools.lru_cache(maxsize=1024)
def _slots_of(t: Any) -> tuple:
    """The slot names of a class and its bases."""
    names: list[str] = []
    for cls in t.__mro__:
        slots = cls.__dict__.get("__slots__", ())
        if issubclass(type(slots), str):
            slots = (slots,)
        names.extend(s for s in slots if s not in ("__dict__", "__weakref__"))
    return tuple(names)


def check_leaves(
    leaves: list,
    tree: Any,
    rules: Rules,
    who: str,
    root: str,
    strict: bool,
    method: Optional[str] = None,
) -> list[int]:
    """Raise TypeError for the first leaf of ``tree`` (flattened to ``leaves``)
    that is not a tensor or a plain value and holds tensors; nothing when
    ``strict`` is false. With ``method`` (``"to"``, ``"pin_memory"``), a leaf
    whose class has that method moves itself (:func:`movers`): it is not
    searched, and the indices of such leaves are returned."""
    if _PLAIN.issuperset(map(type, leaves)):  # one C loop, the usual case
        return []
    at = movers(leaves, method) if method is not None else []
    found = first_hidden(leaves, at) if strict else None
    if found is not None:
        i, where = found
        raise TypeError(hidden_message(who, root + leaf_path(tree, rules, i), leaves[i], where))
    return at


def leaf_path(tree: Any, rules: Rules, i: int) -> str:
    """The keystr of leaf ``i`` of ``tree`` (for a message)."""
    return keystr(api.flatten_with_path(tree, rules=rules)[0][i][0])


def movers(leaves: list, method: str) -> list[int]:
    """The indices of the leaves that are not tensors or plain values and
    whose class has a callable ``method`` (``.to()``, ``.pin_memory()``):
    objects that move themselves, as accelerate's ``send_to_device`` and
    Lightning's ``move_data_to_device`` have them do (a graph of a graph
    library, a ``PackedSequence`` kept whole by ``is_leaf``). A class object
    is none: its class, ``type``, has no such method."""
    tensor = torch.Tensor
    return [
        i
        for i, x in enumerate(leaves)
        if type(x) not in _PLAIN
        and not isinstance(x, tensor)
        and callable(getattr(type(x), method, None))
    ]


def first_hidden(leaves: list, skip: Iterable[int] = ()) -> Optional[tuple[int, str]]:
    """``(index, where)`` of the first leaf that holds tensors, or None;
    the leaves at ``skip`` are not searched."""
    if _PLAIN.issuperset(map(type, leaves)):  # one C loop, the usual case
        return None
    if type(leaves) is not list:
        leaves = list(leaves)
    skipped = frozenset(skip)
    opaque = _opaque()
    pytree = sys.modules.get("torch.utils._pytree")
    registered = frozenset(pytree.SUPPORTED_NODES if pytree else ()) - _BUILTIN_CONTAINERS
    i = 0
    while True:
        # a first pass (in C on the C engine) over what the garbage collector
        # sees; the exact search, which writes the path, runs only where it may
        i = _interface.engine.first_reaching(
            leaves, i, torch.Tensor, _SKIP, opaque, registered, LIMIT
        )
        if i < 0:
            return None
        if i in skipped:
            i += 1
            continue
        where = hidden_tensor(leaves[i])
        if where is not None:
            return i, where
        i += 1


def may_hold_tensor(obj: Any) -> bool:
    """False when no tensor is reachable from ``obj`` through the references
    the garbage collector sees (the engine's first pass; a tensor ``obj`` is
    not searched). A ``torch.Size`` is searched too: under ``torch.jit.trace``
    it holds the tensors ``x.shape[0]`` gives."""
    skip = _SKIP_BUT_SIZE
    return _interface.engine.first_reaching([obj], 0, torch.Tensor, skip, _opaque(), (), LIMIT) == 0


def _opaque() -> tuple:
    """The classes whose instances a search does not enter, numpy's with them
    once numpy is loaded."""
    numpy = sys.modules.get("numpy")
    return (*_OPAQUE, numpy.ndarray, numpy.generic) if numpy is not None else _OPAQUE


def hidden_message(who: str, path: str, leaf: Any, where: str) -> str:
    """The error for a leaf that holds a tensor pytree_kit does not see."""
    t = type(leaf)
    name = f"{t.__module__}.{t.__qualname__}"
    fix = rules_fix(t, t.__qualname__, "pytree_kit.Rule(flatten, unflatten)")
    return (
        f"{who}: {path} is a {name} holding tensors (at {path}{where}), which "
        f"pytree_kit sees as one opaque leaf and would pass through as it is. "
        f"Pass {fix} so its tensors are seen, or strict=False to pass it through unchanged."
    )
