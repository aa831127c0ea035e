"""The words of pytree_kit's errors, which both engines raise.

Each error a walk raises says where in the tree it happened
(``tree['targets'][3].boxes``) and what stood there. The text is written
once, here: the pure engine (``_pure``) calls these functions, and the C
engine calls the ones ``_interface.C_BINDINGS`` lists under ``_messages``
by name (``_speedups.c``'s ``constants_init``), so that its errors read the
same, word for word.

A walk's stack is a list of frames ``[children, next, mode, names, obj]``:
``next`` is one past the child being visited, ``mode`` says how children
are named (``BY_SEQ``, ``BY_KEY`` or ``BY_ATTR``), ``names`` are their keys or
attribute names, and ``obj`` is the container. Paths are built from it
lazily: only for ``flatten_with_path`` and for an error.

This module reads no tree: it turns what a walk found into text.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from ._keys import DictKey, GetAttrKey, SequenceKey, where
from ._kinds import (
    ATTRS,
    CUSTOM,
    DATACLASS,
    DEFAULTDICT,
    DEQUE,
    DICT,
    LEAF,
    LIST,
    MAPPING,
    NAMEDTUPLE,
    NONE,
    ORDEREDDICT,
    SEQUENCE,
    STRUCTSEQ,
    TUPLE,
    user_tail,
)

# How the children of a frame are named in paths.
BY_SEQ = 0  # SequenceKey(position)
BY_KEY = 1  # DictKey(names[position])
BY_ATTR = 2  # GetAttrKey(names[position])


def frame_key(frame: list, i: int) -> Any:
    mode = frame[2]
    if mode == BY_SEQ:
        return SequenceKey(i)
    if mode == BY_KEY:
        return DictKey(frame[3][i])
    return GetAttrKey(frame[3][i])


def stack_path(stack: list) -> tuple:
    """The path to the child each frame of the stack is at now."""
    return tuple(frame_key(fr, fr[1] - 1) for fr in stack)


def qualname(t: Any) -> str:
    return str(getattr(t, "__qualname__", None) or getattr(t, "__name__", repr(t)))


def changed(stack: list, e: RuntimeError) -> RuntimeError:
    """A container that changed size while it was read (another thread
    changed it): CPython's message, at the container's path."""
    return RuntimeError(f"{where(stack_path(stack))}: {e}")


def cycle_error(stack: list, obj: Any) -> ValueError:
    """The error for ``obj``, a container already on the path ``stack``."""
    path = stack_path(stack)
    first = next(i for i, fr in enumerate(stack) if fr[4] is obj)
    return ValueError(
        f"{where(path)}: cycle: this container is the one at "
        f"{where(path[:first])}, which holds itself"
    )


def refuse_iterable(value: Any, call: str, one: str, many: str) -> None:
    """Raise TypeError for a str, bytes or mapping given where an iterable of
    leaves or trees belongs: iterating it gives characters, bytes or keys,
    never what the caller meant (a bug in the caller's code)."""
    if isinstance(value, str):
        items = "characters"
    elif isinstance(value, (bytes, bytearray)):
        items = "bytes"
    elif isinstance(value, Mapping):
        items = "keys"
    else:
        return
    name = type(value).__name__
    raise TypeError(
        f"{call}: the {many} must be a list (or another iterable) of {many}, not {name}: "
        f"its {items} would each be taken as a {one}; to give the {name} as one {one}, "
        "pass [it]"
    )


def refuse_leaves(leaves: Any) -> None:
    """``refuse_iterable`` for unflatten's leaves (the C engine calls it too)."""
    refuse_iterable(leaves, "unflatten", "leaf", "leaves")


def refuse_trees(trees: Any) -> None:
    """``refuse_iterable`` for ``TreeSpec.columns``'s trees (the C engine calls it too)."""
    refuse_iterable(trees, "TreeSpec.columns", "tree", "trees")


def describe_node(node: tuple) -> str:
    kind, t, arity, aux = node
    if kind == LEAF:
        return "a leaf"
    if kind == NONE:
        return "None"
    if kind == TUPLE:
        return f"a tuple of {arity}"
    if kind == LIST:
        return f"a list of {arity}"
    if kind == DICT:
        return f"a dict with keys {keys_text(aux)}"
    if kind == ORDEREDDICT:
        return f"an OrderedDict with keys {keys_text(aux)}"
    if kind == DEFAULTDICT:
        return (
            f"a defaultdict({qualname(aux[0]) if aux[0] else None}) with keys {keys_text(aux[1])}"
        )
    if kind == DEQUE:
        return f"a deque of {arity} (maxlen={aux})"
    if kind == NAMEDTUPLE:
        return f"namedtuple {qualname(t)}"
    if kind == STRUCTSEQ:
        return f"structseq {qualname(t)}"
    if kind == DATACLASS:
        return f"dataclass {qualname(t)}{fields_text(aux)}"
    if kind == ATTRS:
        return f"attrs class {qualname(t)}{fields_text(aux)}"
    if kind == MAPPING:
        base, keys, factory, _carried = aux
        made = f"{base}({qualname(factory) if factory else None})" if factory else base
        return f"{qualname(t)} (a {made}) with keys {keys_text(keys)}"
    if kind == SEQUENCE:
        return f"{qualname(t)} (a {aux[0]}) of {arity}"
    tail = user_tail(kind, aux)
    how = "__tree_flatten__" if kind == CUSTOM else "a rule"
    if len(tail) == 3:
        children = f"children with entries {keys_text(tail[2])}"
    else:
        children = children_text(arity, tail[1])
    return f"{qualname(t)} (by {how}, aux={tail[0]!r}) with {children}"


def keys_text(keys: Any) -> str:
    keys = list(keys)
    if len(keys) > 8:
        return "[" + ", ".join(map(repr, keys[:8])) + f", ... ({len(keys)} keys)]"
    return repr(keys)


def fields_text(aux: tuple) -> str:
    _names, static, absent, dict_keys = aux
    parts = []
    if static:
        parts.append("static " + ", ".join(f"{n}={v!r}" for n, v in static))
    if absent:
        parts.append("unset " + ", ".join(absent))
    if dict_keys is not None:  # a record that is a dict (ModelOutput): its entries' keys
        parts.append("entries " + keys_text(dict_keys))
    return f" ({'; '.join(parts)})" if parts else ""


def children_text(arity: int, keys: Any) -> str:
    if keys is not None:
        return f"children {keys_text(keys)}"
    return "1 child" if arity == 1 else f"{arity} children"


def tell_apart(a: str, ta: Any, b: str, tb: Any) -> tuple[str, str]:
    """Descriptions ``a`` and ``b`` of nodes of classes ``ta`` and ``tb``,
    told apart where they read the same but the classes differ: two
    namedtuples of one name and other fields, two classes of one name."""
    if a != b or ta is tb or not isinstance(ta, type) or not isinstance(tb, type):
        return a, b
    if issubclass(ta, tuple) and issubclass(tb, tuple):  # namedtuples: their fields
        fa, fb = field_names(ta), field_names(tb)
        if fa != fb:
            return f"{a} with fields {fa!r}", f"{b} with fields {fb!r}"
    ma, mb = getattr(ta, "__module__", None), getattr(tb, "__module__", None)
    if type(ma) is str and type(mb) is str and ma != mb:
        return f"{a} of module {ma}", f"{b} of module {mb}"
    return a, f"{b} (another class of the same name)"


def field_names(t: type) -> Any:
    """A namedtuple class's field names as a tuple of str, or None."""
    try:
        fields = getattr(t, "_fields", None)
    except Exception:  # a metaclass of one's own: no names, rather than no message
        return None
    if type(fields) is tuple and all(type(f) is str for f in fields):
        return fields
    return None


def missing(fn: str, path: tuple, depth: int, key: Any, what: str) -> LookupError:
    """KeyError, or IndexError for a position, naming where the path failed."""
    exc = IndexError if type(key) is SequenceKey else KeyError
    return exc(f"{fn}: {where(path[:depth])} is {what}, which has no {key}")


def returned(res: Any) -> str:
    if type(res) is tuple:
        return f"a tuple of {len(res)}"
    return type(res).__name__
