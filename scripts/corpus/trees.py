"""Test trees: classes of every kind pytree_kit understands, a hypothesis
strategy that nests them in each other, and exact structural comparison."""

from __future__ import annotations

import dataclasses
import time
from collections import OrderedDict, defaultdict, deque
from typing import Any

import attrs
from hypothesis import strategies as st

import pytree_kit as pk
import pytree_kit.testing as pkt

# -- classes (module level, so pickle and from_json(allow=) can name them) --

# The namedtuples and the plain dataclass that pytree_kit.testing draws.
Point = pkt.Point
Pair = pkt.Pair
DC = pkt.Record
Leaf = pkt.Leaf  # an opaque leaf, compared by identity


@dataclasses.dataclass(frozen=True)
class FrozenDC:
    x: Any
    tag: str = dataclasses.field(default="t", metadata={"static": True})


@dataclasses.dataclass(slots=True)
class SlotsDC:
    x: Any
    y: Any


@dataclasses.dataclass(kw_only=True)
class KwDC:
    x: Any
    y: Any = 0


@dataclasses.dataclass
class InitFalseDC:
    x: Any
    z: Any = dataclasses.field(init=False, default=None)


@dataclasses.dataclass
class ChildDC(DC):
    c: Any = None


@attrs.define
class AttrsCls:
    p: Any
    q: Any = None


@attrs.frozen
class AttrsStatic:
    v: Any
    scale: int = attrs.field(default=1, metadata={"static": True})


class Node:
    """A user class that opts in with the protocol, with sequence children."""

    def __init__(self, left: Any, right: Any, label: str = "n") -> None:
        self.left, self.right, self.label = left, right, label

    def __tree_flatten__(self) -> tuple:
        return (self.left, self.right), self.label

    @classmethod
    def __tree_unflatten__(cls, aux: Any, children: tuple) -> Node:
        return cls(children[0], children[1], aux)

    def __eq__(self, other: object) -> bool:
        return type(other) is Node and (self.left, self.right, self.label) == (
            other.left,
            other.right,
            other.label,
        )

    __hash__ = None  # type: ignore[assignment]


class Record:
    """A protocol class with dict children, whose keys name the paths."""

    def __init__(self, **fields: Any) -> None:
        self.fields = dict(fields)

    def __tree_flatten__(self) -> tuple:
        return dict(self.fields), None

    @classmethod
    def __tree_unflatten__(cls, aux: Any, children: dict) -> Record:
        return cls(**children)


class Opaque:
    """A class we pretend we cannot edit: handled by a Rule."""

    def __init__(self, items: Any, scale: int) -> None:
        self.items, self.scale = items, scale


def _opaque_flatten(o: Opaque) -> tuple:
    return list(o.items), o.scale


def _opaque_unflatten(scale: int, children: tuple) -> Opaque:
    return Opaque(list(children), scale)


class Span:
    """A class written to optree's convention: ``__tree_flatten__`` returns
    (children, aux, entries), and the entries name the children."""

    def __init__(self, lo: Any, hi: Any, unit: str = "s") -> None:
        self.lo, self.hi, self.unit = lo, hi, unit

    def __tree_flatten__(self) -> tuple:
        return (self.lo, self.hi), self.unit, ("lo", 1)

    @classmethod
    def __tree_unflatten__(cls, unit: Any, children: tuple) -> Span:
        return cls(children[0], children[1], unit)


class Sealed:
    """A class handled by a rule that returns optree's triple."""

    def __init__(self, a: Any, b: Any, tag: int) -> None:
        self.a, self.b, self.tag = a, b, tag


def _sealed_flatten(o: Sealed) -> tuple:
    return [o.a, o.b], o.tag, ["a", "b"]


def _sealed_unflatten(tag: int, children: tuple) -> Sealed:
    return Sealed(children[0], children[1], tag)


RULES = {
    Opaque: pk.Rule(_opaque_flatten, _opaque_unflatten),
    Sealed: pk.Rule(_sealed_flatten, _sealed_unflatten),
}


@dataclasses.dataclass
class ModelOutput(OrderedDict):
    """Behaves like transformers' ModelOutput (a dataclass that is an OrderedDict)."""

    logits: Any = None
    loss: Any = None
    hidden: Any = None

    def __post_init__(self) -> None:
        fields = dataclasses.fields(self)
        first = getattr(self, fields[0].name)
        others_none = all(getattr(self, f.name) is None for f in fields[1:])
        if others_none and isinstance(first, (list, tuple, dict)):
            # transformers treats a non-tensor first field as (key, value) pairs
            items = first.items() if isinstance(first, dict) else first
            for element in items:
                if not isinstance(element, (list, tuple)) or len(element) != 2:
                    raise ValueError("cannot set key/value for " + repr(element))
                self[element[0]] = element[1]
            return
        for f in fields:
            v = getattr(self, f.name)
            if v is not None:
                self[f.name] = v

    def __setitem__(self, key: Any, value: Any) -> None:
        super().__setitem__(key, value)
        super().__setattr__(key, value)

    def __setattr__(self, name: str, value: Any) -> None:
        if name in self.keys() and value is not None:
            super().__setitem__(name, value)
        super().__setattr__(name, value)


def _model_output(logits: Any, loss: Any) -> ModelOutput:
    """A ModelOutput, avoiding inputs its own __post_init__ rejects or misreads."""
    try:
        out = ModelOutput(logits=logits, loss=loss)
    except (ValueError, TypeError):
        out = None
    if out is None or not set(out.keys()) <= {"logits", "loss", "hidden"}:
        out = ModelOutput(logits=Leaf(0), loss=loss)
    return out


ALLOW = (
    pkt.Pair,
    pkt.Point,
    pkt.Record,
    pkt.Tagged,
    time.struct_time,
    FrozenDC,
    SlotsDC,
    KwDC,
    InitFalseDC,
    ChildDC,
    AttrsCls,
    AttrsStatic,
    Node,
    Record,
    Span,
    ModelOutput,
)


# -- strategy -------------------------------------------------------------
# pytree_kit.testing.trees draws the builtin kinds, namedtuples and plain
# dataclasses; the library's own tests add every other kind it understands.

leaf_values = st.one_of(
    st.integers(-5, 5),
    st.text(max_size=3),
    st.floats(allow_nan=False),
    st.builds(Leaf, st.integers(0, 99)),
    st.binary(max_size=2),
    st.frozensets(st.integers(0, 3), max_size=2),
)

EXTRA_KINDS = [
    lambda c: st.lists(c, min_size=9, max_size=9).map(time.struct_time),  # a structseq
    lambda c: st.builds(FrozenDC, c, st.sampled_from(["t", "u"])),
    lambda c: st.builds(SlotsDC, c, c),
    lambda c: st.builds(KwDC, x=c, y=c),
    lambda c: st.builds(InitFalseDC, c),
    lambda c: st.builds(ChildDC, c, c, c),
    lambda c: st.builds(AttrsCls, c, c),
    lambda c: st.builds(AttrsStatic, c, st.integers(1, 3)),
    lambda c: st.builds(Node, c, c, st.sampled_from(["n", "m"])),
    lambda c: st.builds(Record, a=c, b=c),
    lambda c: st.builds(Opaque, st.lists(c, max_size=3), st.integers(0, 2)),
    lambda c: st.builds(Span, c, c, st.sampled_from(["s", "ms"])),
    lambda c: st.builds(Sealed, c, c, st.integers(0, 2)),
    lambda c: st.builds(_model_output, c, st.one_of(st.none(), c)),
]


def trees(leaves: Any = leaf_values) -> Any:
    """Trees of every kind pytree_kit understands, nested in each other."""
    return pkt.trees(leaves, max_depth=3, max_width=4, containers=EXTRA_KINDS)


# -- comparison -------------------------------------------------------------


def _fields(obj: Any) -> Any:
    if dataclasses.is_dataclass(obj):
        return [f.name for f in dataclasses.fields(obj)]
    if hasattr(type(obj), "__attrs_attrs__"):
        return [a.name for a in type(obj).__attrs_attrs__]
    return None


def _static_fields(obj: Any) -> set:
    if dataclasses.is_dataclass(obj):
        fields: Any = dataclasses.fields(obj)
    else:
        fields = type(obj).__attrs_attrs__
    return {f.name for f in fields if (f.metadata or {}).get("static")}


_MISSING = object()


def assert_same_tree(a: Any, b: Any, path: str = "tree", identical_leaves: bool = True) -> None:
    """a and b have the same types, orders, aux data and state; leaves are the
    same objects (or equal, with identical_leaves=False)."""
    ta, tb = type(a), type(b)
    assert ta is tb, f"{path}: {ta.__qualname__} != {tb.__qualname__}"
    if isinstance(a, dict):
        assert list(a.keys()) == list(b.keys()), f"{path}: keys {list(a)} != {list(b)}"
        if isinstance(a, defaultdict):
            assert a.default_factory == b.default_factory, f"{path}: default_factory"
        if _fields(a) is None:
            for k in a:
                assert_same_tree(a[k], b[k], f"{path}[{k!r}]", identical_leaves)
    if isinstance(a, deque):
        assert a.maxlen == b.maxlen, f"{path}: maxlen"
    if isinstance(a, (list, tuple, deque)):
        assert len(a) == len(b), f"{path}: len {len(a)} != {len(b)}"
        for i, (x, y) in enumerate(zip(a, b)):
            assert_same_tree(x, y, f"{path}[{i}]", identical_leaves)
        return
    names = _fields(a)
    if names is not None:
        static = _static_fields(a)
        for n in names:
            x, y = getattr(a, n, _MISSING), getattr(b, n, _MISSING)
            assert (x is _MISSING) == (y is _MISSING), f"{path}.{n}: set in one only"
            if x is not _MISSING:
                # static fields travel in the spec (and through JSON): equal, not identical
                same = identical_leaves and n not in static
                assert_same_tree(x, y, f"{path}.{n}", same)
        if isinstance(a, dict):
            for k in a:
                assert dict.__getitem__(b, k) is getattr(b, k), f"{path}: dict view {k!r}"
        return
    user = {
        Node: ("label", ("left", "right")),
        Opaque: ("scale", ("items",)),
        Span: ("unit", ("lo", "hi")),
        Sealed: ("tag", ("a", "b")),
    }
    if ta in user:
        # aux data travels in the spec (and through pickle and JSON): equal, not identical
        aux, kids = user[ta]
        assert getattr(a, aux) == getattr(b, aux), f"{path}: aux"
        for n in kids:
            assert_same_tree(getattr(a, n), getattr(b, n), f"{path}.{n}", identical_leaves)
        return
    if isinstance(a, Record):
        assert_same_tree(a.fields, b.fields, path, identical_leaves)
        return
    if isinstance(a, dict):
        return
    if identical_leaves:
        assert a is b, f"{path}: leaf {a!r} is not {b!r}"
    else:
        assert a == b or (a != a and b != b), f"{path}: leaf {a!r} != {b!r}"


def resolve(tree: Any, path: tuple) -> Any:
    """Follow a path of keys from the root, the way a user reads it."""
    obj = tree
    for key in path:
        t = type(obj)
        if t in RULES or hasattr(t, "__tree_flatten__"):
            res = RULES[t].flatten(obj) if t in RULES else obj.__tree_flatten__()
            children = res[0]
            if isinstance(key, pk.SequenceKey):
                obj = list(children)[key.idx]
            elif len(res) == 3:  # optree's entries name the children
                obj = list(children)[list(res[2]).index(key.key)]
            else:
                obj = children[key.key]
        elif isinstance(key, pk.DictKey):
            obj = obj[key.key]
        elif isinstance(key, pk.SequenceKey):
            obj = obj[key.idx]
        else:
            obj = getattr(obj, key.name)
    return obj


def snapshot(tree: Any) -> list:
    """Ids, types and contents of every container reachable from tree, to
    check that nothing was mutated."""
    out = []
    todo = [tree]
    seen = set()
    while todo:
        obj = todo.pop()
        if id(obj) in seen:
            continue
        seen.add(id(obj))
        if isinstance(obj, dict):
            items = list(obj.items())
        elif isinstance(obj, (list, tuple, deque)):
            items = list(enumerate(obj))
        elif hasattr(obj, "__dict__") or hasattr(type(obj), "__slots__"):
            names = _fields(obj) or list(getattr(obj, "__dict__", {}))
            items = [(n, getattr(obj, n, _MISSING)) for n in names]
        else:
            continue
        out.append((id(obj), type(obj), [(k, id(v)) for k, v in items]))
        todo.extend(v for _, v in items)
    return out
