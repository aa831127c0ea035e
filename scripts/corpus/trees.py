"""Test trees: classes of every kind pytree_kit understands, a hypothesis
strategy that nests them in each other, and exact structural comparison."""

from __future__ import annotations

import dataclasses
import time
from collections import OrderedDict, UserDict, UserList, defaultdict, deque
from typing import Any

import attrs
from hypothesis import strategies as st

import pytree_kit as pk
import pytree_kit.testing as pkt
from pytree_kit._kinds import subclass_base
from scripts.corpus.model_output import ModelOutputBase

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
class ModelOutput(ModelOutputBase):
    """Behaves like transformers' ModelOutput (a dataclass that is an OrderedDict)."""

    logits: Any = None
    loss: Any = None
    hidden: Any = None


def _model_output(logits: Any, loss: Any) -> ModelOutput:
    """A ModelOutput, avoiding inputs its own __post_init__ rejects or misreads."""
    try:
        out = ModelOutput(logits=logits, loss=loss)
    except (ValueError, TypeError):
        out = None
    fields = {"logits", "loss", "hidden"}
    # (key, value) pairs as logits make attributes of their keys, entries or not
    if out is None or not set(out.keys()) <= fields or not set(vars(out)) <= fields:
        out = ModelOutput(logits=Leaf(0), loss=loss)
    return out


# -- subclasses of the builtin containers (the mapping and sequence kinds) --


class Batch(dict):
    """A user's dict subclass, whose instances keep an attribute of their own."""


class Ordered(OrderedDict):
    """An OrderedDict subclass: its keys' order is its structure."""


class Counts(defaultdict):
    """A defaultdict subclass: its default_factory is its structure."""


class Encoded(UserDict):
    """Like transformers' BatchEncoding: a UserDict with attributes of its own
    beside its data, and a __getattr__ that reads the data (so an attribute
    read before ``data`` is set would recurse)."""

    def __getattr__(self, name: str) -> Any:
        try:
            return self.data[name]
        except KeyError:
            raise AttributeError(name) from None


class Mirrored(OrderedDict):
    """Like a transformers ModelOutput built bare, ``ModelOutput({...})``:
    each item is also an attribute of the same name."""

    def __setitem__(self, key: Any, value: Any) -> None:
        super().__setitem__(key, value)
        object.__setattr__(self, key, value)


class SlotDict(dict):
    """A dict subclass whose attribute is a slot."""

    __slots__ = ("meta",)


class Row(tuple):
    """A tuple subclass that is no namedtuple, with an attribute."""

    def __new__(cls, *items: Any) -> Row:  # never called by a rebuild
        return super().__new__(cls, items)


class Items(list):
    """A list subclass."""


class Rows(UserList):
    """A UserList subclass."""


def _batch(a: Any, b: Any, tag: Any) -> Batch:
    out = Batch(b=b, a=a)
    out.tag = tag
    return out


def _encoded(a: Any, b: Any, n: Any) -> Encoded:
    out = Encoded({"input_ids": a, "mask": b})
    out._n = n
    return out


def _mirrored(a: Any, b: Any) -> Mirrored:
    out = Mirrored()
    out["z"] = a
    out["y"] = b
    return out


def _slot_dict(a: Any, meta: Any) -> SlotDict:
    out = SlotDict(k=a)
    if meta is not None:
        out.meta = meta
    return out


def _row(a: Any, b: Any, tag: Any) -> Row:
    out = Row(a, b)
    out.tag = tag
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
    Batch,
    Ordered,
    Counts,
    Encoded,
    Mirrored,
    SlotDict,
    Row,
    Items,
    Rows,
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
    # the mapping and sequence kinds: attributes that JSON can hold
    lambda c: st.builds(_batch, c, c, st.sampled_from(["t", 1, None])),
    lambda c: st.builds(lambda a, b: Ordered([("b", a), ("a", b)]), c, c),
    lambda c: st.builds(lambda a: Counts(list, {"x": a, 2: a}), c),
    lambda c: st.builds(_encoded, c, c, st.integers(0, 2)),
    lambda c: st.builds(_mirrored, c, c),
    lambda c: st.builds(_slot_dict, c, st.sampled_from([None, "m"])),
    lambda c: st.builds(_row, c, c, st.sampled_from(["r", 2])),
    lambda c: st.builds(lambda a, b: Items([a, b]), c, c),
    lambda c: st.builds(lambda a: Rows([a]), c),
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
    if _fields(a) is None and subclass_base(ta):
        _assert_same_subclass(a, b, path, identical_leaves)
        return
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


def _attributes(obj: Any) -> dict:
    """The attributes of an instance of a subclass of a builtin container:
    its ``__dict__`` (less a UserDict's or UserList's data) and set slots."""
    out = dict(vars(obj)) if hasattr(obj, "__dict__") else {}
    if isinstance(obj, (UserDict, UserList)):
        out.pop("data", None)
    for c in type(obj).__mro__:
        for name in c.__dict__.get("__slots__", ()):
            if name not in ("__dict__", "__weakref__") and hasattr(obj, name):
                out[name] = getattr(obj, name)
    return out


def _assert_same_subclass(a: Any, b: Any, path: str, identical_leaves: bool) -> None:
    """Two instances of a subclass of a builtin container: the same items, in
    the same order, and equal attributes (they travel in the spec, as aux
    data does); an attribute that is an item is that very item."""
    base = subclass_base(type(a))
    if base in ("dict", "OrderedDict", "defaultdict", "UserDict"):
        da = a.data if base == "UserDict" else a
        db = b.data if base == "UserDict" else b
        assert type(da) is type(db)
        keys = OrderedDict.keys if base == "OrderedDict" else dict.keys  # (its linked order)
        assert list(keys(da)) == list(keys(db)), f"{path}: keys {list(da)} != {list(db)}"
        if base == "defaultdict":
            assert a.default_factory == b.default_factory, f"{path}: default_factory"
        for k in dict.keys(da):
            assert_same_tree(dict.__getitem__(da, k), dict.__getitem__(db, k), f"{path}[{k!r}]",
                             identical_leaves)  # fmt: skip
    else:
        ia = (
            list(a.data)
            if base == "UserList"
            else list(tuple.__iter__(a) if base == "tuple" else list.__iter__(a))
        )
        ib = (
            list(b.data)
            if base == "UserList"
            else list(tuple.__iter__(b) if base == "tuple" else list.__iter__(b))
        )
        assert len(ia) == len(ib), f"{path}: len {len(ia)} != {len(ib)}"
        for i, (x, y) in enumerate(zip(ia, ib)):
            assert_same_tree(x, y, f"{path}[{i}]", identical_leaves)
    attrs_a, attrs_b = _attributes(a), _attributes(b)
    assert list(attrs_a) == list(attrs_b), f"{path}: attributes {list(attrs_a)} != {list(attrs_b)}"
    for name, x in attrs_a.items():
        y = attrs_b[name]
        if isinstance(a, dict) and name in a and dict.__getitem__(a, name) is x:
            assert dict.__getitem__(b, name) is y, f"{path}.{name}: not the item of that key"
        else:
            assert x == y or x is y, f"{path}.{name}: {x!r} != {y!r}"


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
