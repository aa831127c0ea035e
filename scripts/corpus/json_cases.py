"""The classes of every kind that TreeSpec.to_json / from_json write and read:
the cases of ``tests/test_json.py`` and the corpus of ``scripts/fuzz_json.py``.

Every class is defined at module level, so that pickle and ``allow=`` can name
it (as ``scripts.corpus.json_cases:Name``).
"""

from __future__ import annotations

import collections
import dataclasses
import enum
import json
import math
import os
import sys
import time
import typing
from collections import OrderedDict, defaultdict, deque
from typing import Any

import attrs

import pytree_kit as pk

_PY310 = sys.version_info >= (3, 10)


Point = collections.namedtuple("Point", ["x", "y"])


class Pair(typing.NamedTuple):
    first: Any
    second: Any


class Color(enum.Enum):
    RED = 1
    GREEN = 2


class Level(enum.IntEnum):
    LOW = 1
    HIGH = 2


class Perm(enum.Flag):
    R = 1
    W = 2


def make_zero() -> int:
    return 0


@dataclasses.dataclass
class Plain:
    a: Any
    b: Any = None


@dataclasses.dataclass(frozen=True)
class Frozen:
    x: Any
    y: Any


@dataclasses.dataclass(**({"slots": True} if _PY310 else {}))
class Slotted:
    x: Any
    y: Any


@dataclasses.dataclass(**({"kw_only": True} if _PY310 else {}))
class KwOnly:
    x: Any
    y: Any = 0


@dataclasses.dataclass
class InitFalse:
    a: Any
    b: Any = dataclasses.field(init=False, default=7)
    c: Any = dataclasses.field(init=False)  # never set: "unset" in the spec


@dataclasses.dataclass
class Base:
    x: Any


@dataclasses.dataclass
class Derived(Base):
    y: Any = None


@dataclasses.dataclass(frozen=True)
class WithStatic:
    w: Any
    name: str = dataclasses.field(default="lin", metadata={"static": True})
    dims: tuple = dataclasses.field(default=(2, 3), metadata={"static": True})
    act: Any = dataclasses.field(default=Color.RED, metadata={"static": True})


@dataclasses.dataclass
class Empty:
    pass


@dataclasses.dataclass
class DictOut(dict):
    """A dataclass that is also a dict (like transformers' ModelOutput)."""

    loss: Any = None
    logits: Any = None

    def __post_init__(self) -> None:
        for f in dataclasses.fields(self):
            value = getattr(self, f.name)
            if value is not None:
                self[f.name] = value


@attrs.define
class AttrsPoint:
    x: Any
    y: Any


@attrs.frozen
class AttrsFrozen:
    w: Any
    tag: str = attrs.field(default="t", metadata={"static": True})


@attrs.define
class AttrsInitFalse:
    a: Any
    b: Any = attrs.field(init=False)  # never set: "unset" in the spec


class Outer:
    @dataclasses.dataclass
    class Inner:
        v: Any


class SeqBox:
    """A protocol class with sequence children."""

    def __init__(self, items: Any, aux: Any = None) -> None:
        self.items = list(items)
        self.aux = aux

    def __tree_flatten__(self) -> tuple:
        return self.items, self.aux

    @classmethod
    def __tree_unflatten__(cls, aux: Any, children: Any) -> SeqBox:
        return cls(children, aux)


class MapBox:
    """A protocol class with dict children (keys in insertion order)."""

    def __init__(self, fields: Any, aux: Any = None) -> None:
        self.fields = dict(fields)
        self.aux = aux

    def __tree_flatten__(self) -> tuple:
        return dict(self.fields), self.aux

    @classmethod
    def __tree_unflatten__(cls, aux: Any, children: Any) -> MapBox:
        return cls(children, aux)


class EntriesBox:
    """A protocol class written to optree's convention: (children, aux, entries)."""

    def __init__(self, items: Any, names: Any, aux: Any = None) -> None:
        self.items, self.names, self.aux = list(items), tuple(names), aux

    def __tree_flatten__(self) -> tuple:
        return self.items, (self.aux, self.names), self.names

    @classmethod
    def __tree_unflatten__(cls, aux: Any, children: Any) -> EntriesBox:
        assert type(children) is tuple
        return cls(children, aux[1], aux[0])


class Opaque:
    """A class flattened by a Rule (sequence children)."""

    def __init__(self, a: Any, b: Any) -> None:
        self.a = a
        self.b = b


def _opaque_flatten(o: Opaque) -> tuple:
    return (o.a, o.b), ("opaque", 1)


def _opaque_unflatten(aux: Any, children: Any) -> Opaque:
    return Opaque(*children)


OPAQUE_RULE = pk.Rule(_opaque_flatten, _opaque_unflatten)


class OpaqueMap:
    """A class flattened by a Rule (dict children)."""

    def __init__(self, **kw: Any) -> None:
        self.kw = kw


def _opaque_map_flatten(o: OpaqueMap) -> tuple:
    return dict(o.kw), None


def _opaque_map_unflatten(aux: Any, children: Any) -> OpaqueMap:
    return OpaqueMap(**children)


OPAQUE_MAP_RULE = pk.Rule(_opaque_map_flatten, _opaque_map_unflatten)


class OpaqueEntries:
    """A class flattened by a Rule that returns optree's triple."""

    def __init__(self, a: Any, b: Any) -> None:
        self.a, self.b = a, b


def _opaque_entries_flatten(o: OpaqueEntries) -> tuple:
    return [o.a, o.b], None, [b"a", None]


def _opaque_entries_unflatten(aux: Any, children: Any) -> OpaqueEntries:
    return OpaqueEntries(*children)


OPAQUE_ENTRIES_RULE = pk.Rule(_opaque_entries_flatten, _opaque_entries_unflatten)

RULES = {Opaque: OPAQUE_RULE, OpaqueMap: OPAQUE_MAP_RULE, OpaqueEntries: OPAQUE_ENTRIES_RULE}


class _Unwritable:
    """Hashable, but has no module:qualname of its own: aux that cannot be written."""

    def __hash__(self) -> int:
        return 1

    def __eq__(self, other: object) -> bool:
        return type(other) is _Unwritable


class StrSub(str):
    pass


class Recorder:
    """A protocol class that records every call of its classmethod/constructor."""

    calls: typing.ClassVar[list] = []

    def __init__(self, items: Any) -> None:
        Recorder.calls.append("__init__")
        self.items = list(items)

    def __tree_flatten__(self) -> tuple:
        return self.items, None

    @classmethod
    def __tree_unflatten__(cls, aux: Any, children: Any) -> Recorder:
        Recorder.calls.append("__tree_unflatten__")
        return cls(children)


RICH_AUX = (
    "tag",
    3,
    -1.5,
    None,
    True,
    b"\x00\xff",
    frozenset({1, "a", (2, 3)}),
    complex(1, -2),
    Color.RED,
    float("inf"),
    float("-inf"),
    int,
    OrderedDict,
    ("nested", (1, 2.5)),
)

STAT = os.stat(__file__)
ALL_CLASSES = [
    Point,
    Pair,
    Color,
    Level,
    Perm,
    make_zero,
    Plain,
    Frozen,
    Slotted,
    KwOnly,
    InitFalse,
    Base,
    Derived,
    WithStatic,
    Empty,
    Outer.Inner,
    DictOut,
    AttrsPoint,
    AttrsFrozen,
    AttrsInitFalse,
    SeqBox,
    MapBox,
    EntriesBox,
    Recorder,
    os.stat_result,
    time.struct_time,
    os.terminal_size,
]


#: the classes the hostile documents of tests/test_json.py may name
HOSTILE_ALLOW = [
    Point,
    Plain,
    WithStatic,
    DictOut,
    AttrsPoint,
    SeqBox,
    Color,
    time.struct_time,
    os.stat_result,
]


# -- the cases and documents the JSON tests and fuzzer start from ----------------


def ref(obj: Any) -> str:
    return f"{obj.__module__}:{obj.__qualname__}"


CASES: list = [
    # (id, make_tree, allow, rules)
    ("leaf", lambda: 5, (), None),
    ("none", lambda: None, (), None),
    ("empty-tuple", lambda: (), (), None),
    ("empty-list", lambda: [], (), None),
    ("empty-dict", lambda: {}, (), None),
    ("tuple", lambda: (1, (2, 3), (4,)), (), None),
    ("list", lambda: [1, [2, [3, []]], None], (), None),
    ("dict-sorted", lambda: {"a": 1, "b": [2, 3], "c": None}, (), None),
    ("dict-insertion-order", lambda: {"b": 1, "a": 2, "c": {"z": 3, "y": 4}}, (), None),
    ("dict-mixed-unorderable", lambda: {1: "x", "a": "y", None: "z"}, (), None),
    ("dict-mixed-unorderable-2", lambda: {"a": 1, 1: 2, (0,): 3}, (), None),
    ("key-int", lambda: {3: 1, -2: 2, 10**30: 3}, (), None),
    ("key-str", lambda: {"": 1, "é\u2603": 2, "*": 3, "\ud800": 4}, (), None),
    ("key-float", lambda: {1.5: 1, -0.0: 2, 1e300: 3, 5e-324: 4}, (), None),
    ("key-inf", lambda: {math.inf: 1, -math.inf: 2, 0.5: 3}, (), None),
    ("key-bool", lambda: {True: 1, False: 2}, (), None),
    ("key-none", lambda: {None: 1}, (), None),
    ("key-tuple", lambda: {(1, "a"): 1, (): 2, ((1,), 2.5): 3}, (), None),
    ("key-frozenset", lambda: {frozenset({1, "a", (2,)}): 1, frozenset(): 2}, (), None),
    ("key-bytes", lambda: {b"": 1, b"\x00\xff": 2}, (), None),
    ("key-complex", lambda: {complex(1, -2): 1, complex(0, math.inf): 2}, (), None),
    ("key-enum", lambda: {Color.GREEN: 1, Color.RED: 2}, (Color,), None),
    ("key-intenum", lambda: {Level.HIGH: 1, Level.LOW: 2}, (Level,), None),
    ("key-flag-member", lambda: {Perm.W: 1, Perm.R: 2}, (Perm,), None),
    ("key-builtin-class", lambda: {int: 1, str: 2, OrderedDict: 3}, (), None),
    ("key-allowed-class", lambda: {Plain: 1, Point: 2}, (Plain, Point), None),
    (
        "key-all-types",
        lambda: {
            1: 0,
            "s": 1,
            2.5: 2,
            math.inf: 3,
            False: 4,
            None: 5,
            (1, "t"): 6,
            frozenset({3}): 7,
            b"b": 8,
            complex(0, 1): 9,
            Color.RED: 10,
        },
        (Color,),
        None,
    ),
    ("ordereddict", lambda: OrderedDict([("b", 1), ("a", 2), (3, [4])]), (), None),
    ("ordereddict-empty", lambda: OrderedDict(), (), None),
    ("defaultdict-list", lambda: defaultdict(list, {"b": [1], "a": 2}), (), None),
    ("defaultdict-none", lambda: defaultdict(None, {"x": 1}), (), None),
    ("defaultdict-int-empty", lambda: defaultdict(int), (), None),
    ("defaultdict-collections", lambda: defaultdict(collections.Counter, {1: 2}), (), None),
    ("deque", lambda: deque([1, [2], None]), (), None),
    ("deque-empty", lambda: deque(), (), None),
    ("deque-maxlen", lambda: deque([1, 2], maxlen=5), (), None),
    ("deque-maxlen-full", lambda: deque([1, 2], maxlen=2), (), None),
    ("deque-maxlen-0", lambda: deque(maxlen=0), (), None),
    ("namedtuple", lambda: Point(1, Point(2, None)), (Point,), None),
    ("typing-namedtuple", lambda: Pair([1, 2], {"k": 3}), (Pair,), None),
    ("structseq-stat", lambda: STAT, (os.stat_result,), None),
    (
        "structseq-stat-built",
        lambda: os.stat_result(tuple(range(10)), {"st_atime": 1.5, "st_rdev": 3}),
        (os.stat_result,),
        None,
    ),
    ("structseq-struct_time", lambda: time.gmtime(0), (time.struct_time,), None),
    ("structseq-terminal_size", lambda: os.terminal_size((80, [24])), (os.terminal_size,), None),
    ("dataclass", lambda: Plain(1, [2, 3]), (Plain,), None),
    ("dataclass-frozen", lambda: Frozen(1, (2,)), (Frozen,), None),
    ("dataclass-slots", lambda: Slotted(1, 2), (Slotted,), None),
    ("dataclass-kw-only", lambda: KwOnly(x=1, y=[2]), (KwOnly,), None),
    ("dataclass-init-false", lambda: InitFalse(1), (InitFalse,), None),
    ("dataclass-inheritance", lambda: Derived(1, Base(2)), (Derived, Base), None),
    ("dataclass-static", lambda: WithStatic([1, 2]), (WithStatic, Color), None),
    (
        "dataclass-static-other",
        lambda: WithStatic(3, name="conv", dims=(1, (2, b"x")), act=Color.GREEN),
        (WithStatic, Color),
        None,
    ),
    ("dataclass-empty", lambda: Empty(), (Empty,), None),
    ("dataclass-nested-class", lambda: Outer.Inner([1]), (Outer.Inner,), None),
    ("dataclass-dict", lambda: DictOut(loss=1, logits=[2, 3]), (DictOut,), None),
    ("dataclass-dict-partial", lambda: DictOut(logits=[2]), (DictOut,), None),
    ("attrs", lambda: AttrsPoint(1, [2]), (AttrsPoint,), None),
    ("attrs-frozen-static", lambda: AttrsFrozen({"w": 1}, tag="q"), (AttrsFrozen,), None),
    ("attrs-init-false", lambda: AttrsInitFalse(1), (AttrsInitFalse,), None),
    ("protocol-seq", lambda: SeqBox([1, [2, 3]], "aux"), (SeqBox,), None),
    ("protocol-seq-rich-aux", lambda: SeqBox([1], RICH_AUX), (SeqBox, Color), None),
    ("protocol-seq-empty", lambda: SeqBox([], None), (SeqBox,), None),
    ("protocol-dict", lambda: MapBox({"w": 1, "b": [2], 3: None}, ("m", 1)), (MapBox,), None),
    ("rule-seq", lambda: [Opaque(1, [2, 3])], (), RULES),
    ("rule-dict", lambda: {"o": OpaqueMap(z=1, a=2)}, (), RULES),
    (
        "protocol-entries",
        lambda: EntriesBox([1, EntriesBox([], ())], ("x", 2), "a"),
        (EntriesBox,),
        None,
    ),
    (
        "rule-entries",
        lambda: [OpaqueEntries(1, [2])],
        (),
        {OpaqueEntries: OPAQUE_ENTRIES_RULE},
    ),
    (
        "mixed",
        lambda: {
            "z": [Point(1, 2), Pair(None, (3,))],
            "a": OrderedDict([("q", deque([4, 5], maxlen=3)), ("p", 6)]),
            "m": defaultdict(list, {"y": Plain(7, WithStatic(8)), "x": AttrsPoint(9, 10)}),
            "s": SeqBox([MapBox({"k": 11}, 2)], RICH_AUX),
            "t": time.gmtime(0),
            "r": Opaque({"b": 12, "a": 13}, None),
            "e": {Color.RED: InitFalse(14), 2: DictOut(loss=15)},
        },
        ALL_CLASSES,
        RULES,
    ),
]


def _head(nodes: list, num_leaves: Any = None) -> dict:
    if num_leaves is None:
        num_leaves = sum(1 for n in nodes if n == "*")
    return {"format": "pytree_kit.TreeSpec", "version": 1, "num_leaves": num_leaves, "nodes": nodes}


def _doc(nodes: list, num_leaves: Any = None, /, **changes: Any) -> str:
    d = _head(nodes, num_leaves)
    d.update(changes)
    return json.dumps(d)


_P = ref(Point)


_D = ref(Plain)


_S = ref(SeqBox)


_W = ref(WithStatic)


_A = ref(AttrsPoint)


_C = ref(Color)


_OK_LIST = [{"kind": "list", "arity": 2}, "*", "*"]


_OK_DICT = [{"kind": "dict", "keys": ["a", "b"]}, "*", "*"]


def _dict_keys(*keys: Any) -> str:
    return _doc([{"kind": "dict", "keys": list(keys)}] + ["*"] * len(keys))


# The documents the hostile ones are variations of are themselves valid.
VALID_BASES = [
    _doc(_OK_LIST),
    _doc(_OK_DICT),
    _doc([{"kind": "dict", "keys": ["a", "b"], "order": ["b", "a"]}, "*", "*"]),
    _doc([{"kind": "deque", "arity": 0, "maxlen": None}]),
    _doc([{"kind": "deque", "arity": 0}]),
    _doc([{"kind": "defaultdict", "default_factory": {"ref": "builtins:list"}, "keys": []}]),
    _doc([{"kind": "defaultdict", "default_factory": None, "keys": ["a"]}, "*"]),
    _doc([{"kind": "namedtuple", "class": _P, "fields": ["x", "y"]}, "*", "*"]),
    _doc(
        [
            {
                "kind": "structseq",
                "class": "time:struct_time",
                "arity": 9,
                "hidden": [["tm_zone", "UTC"]],
            }
        ]
        + ["*"] * 9
    ),
    _doc([{"kind": "dataclass", "class": _D, "fields": ["a", "b"]}, "*", "*"]),
    _doc([{"kind": "dataclass", "class": _D, "fields": ["a"], "unset": ["b"]}, "*"]),
    _doc(
        [
            {
                "kind": "dataclass",
                "class": _W,
                "fields": ["w"],
                "static": [["name", "x"]],
                "unset": ["dims", "act"],
            },
            "*",
        ]
    ),
    _doc(
        [
            {
                "kind": "dataclass",
                "class": ref(DictOut),
                "fields": ["loss", "logits"],
                "dict_keys": ["loss"],
            },
            "*",
            "*",
        ]
    ),
    _doc([{"kind": "attrs", "class": _A, "fields": ["x", "y"]}, "*", "*"]),
    _doc([{"kind": "custom", "class": _S, "arity": 2, "keys": ["a", "b"], "aux": None}, "*", "*"]),
    _doc([{"kind": "custom", "class": _S, "arity": 0}]),
    _doc([{"kind": "custom", "class": _S, "arity": 0, "aux": {"ref": "builtins:int"}}]),
    _dict_keys({"enum": _C, "name": "RED"}, {"float": "nan"}, {"float": "-inf"}, {"bytes": "00ff"}),
    _dict_keys({"complex": [1, 2.5]}, {"tuple": []}, {"frozenset": [2, 1]}, 1, False, None),
]


_SPECIAL = [
    "*",
    None,
    0,
    1,
    2,
    -1,
    10**18,
    "",
    "dict",
    "list",
    "tuple",
    "deque",
    "custom",
    "rule",
    "dataclass",
    "namedtuple",
    "structseq",
    "kind",
    "arity",
    "keys",
    "class",
    "fields",
    "static",
    "unset",
    "order",
    "builtins:eval",
    "builtins:list",
    "os:system",
    "nope:Nope",
    _P,
    _D,
    _S,
    _W,
    _C,
    {"kind": "list", "arity": 1},
    {"kind": "tuple", "arity": 0},
    {"kind": "dict", "keys": []},
    {"ref": "builtins:eval"},
    {"ref": "builtins:int"},
    {"ref": _D},
    {"float": "nan"},
    {"float": "inf"},
    {"tuple": []},
    {"frozenset": [1]},
    {"bytes": "0g"},
    {"complex": [1, 2]},
    {"enum": _C, "name": "RED"},
    [],
    {},
]


_MEMBER_NAMES = [
    "format",
    "version",
    "num_leaves",
    "nodes",
    "kind",
    "arity",
    "keys",
    "order",
    "class",
    "fields",
    "static",
    "unset",
    "dict_keys",
    "hidden",
    "aux",
    "maxlen",
    "default_factory",
    "float",
    "tuple",
    "ref",
    "enum",
    "name",
]


def _positions(doc: Any) -> list:
    """Every (container, key) in a parsed document, in a fixed order."""
    out: list = []
    stack = [doc]
    while stack:
        c = stack.pop()
        if isinstance(c, list):
            items: Any = list(enumerate(c))
        elif isinstance(c, dict):
            items = list(c.items())
        else:
            continue
        for k, v in items:
            out.append((c, k))
            stack.append(v)
    return out
