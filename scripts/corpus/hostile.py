"""Hostile input for the differential fuzz: the C engine against the pure one.

``run_case(engine, seed)`` builds a tree from ``seed`` (a fresh, independent
copy each time, since hostile objects keep state), runs a fixed sequence of
operations on it with one engine, and returns a canonical, comparable record
of every outcome: results, or exception type and message. Both engines must
give equal records, and neither may crash. ``tests/test_engines.py`` runs a
few thousand seeds; ``scripts/fuzz_engines.py`` runs as many as asked.

What a tree may hold, besides the ordinary kinds:

- dict keys whose ``__hash__``, ``__eq__`` or ``__lt__`` raise, lie, or
  change the dict being sorted;
- ``is_leaf``, ``__tree_flatten__`` and rules that mutate lists and dicts of
  the tree while it is flattened, or raise, or answer with odd truth values;
- ``__tree_flatten__`` and rules returning the wrong shapes and types, children
  that are list, tuple or dict subclasses overriding ``__iter__``, ``__len__``
  or ``__getitem__``, and unhashable aux data or aux whose hash or == raise;
- namedtuples, dataclasses and dict-dataclasses whose methods are overridden;
- metaclasses whose attribute lookup raises;
- huge arity, shared subtrees and cycles;
- and, for unflatten, leaves given as generators, iterators, endless or
  raising iterators, and list or tuple subclasses overriding their protocol.
"""

from __future__ import annotations

import dataclasses
import itertools
import random
import re
import time
from collections import OrderedDict, defaultdict, deque, namedtuple
from typing import Any, Callable

import attrs

import pytree_kit as pk
from pytree_kit import _pure


class Boom(Exception):
    """What hostile objects raise."""


class Counter:
    """Calls are counted per build, so both engines' copies behave alike."""

    def __init__(self) -> None:
        self.n = 0

    def tick(self) -> int:
        self.n += 1
        return self.n


# -- dict keys ----------------------------------------------------------------


class Key:
    """A dict key with a hostile __hash__, __eq__ or __lt__ (``mode``)."""

    def __init__(self, v: int, mode: str, after: int, ctx: Ctx) -> None:
        self.v, self.mode, self.after, self.calls = v, mode, after, Counter()
        self.ctx = ctx
        self.hashing = True  # off while the dict is built, for modes that lie

    def __hash__(self) -> int:
        n = self.calls.tick()
        if self.mode == "hash-raises" and n > self.after:
            raise Boom(f"hash of {self!r}")
        if self.mode == "hash-lies" and n > self.after:
            return self.v + n
        if self.mode in ("eq-raises", "eq-lies", "collide"):
            return 7  # every such key collides, so == is asked
        return self.v

    def __eq__(self, other: object) -> bool:
        n = self.calls.tick()
        if self.mode == "eq-raises" and n > self.after:
            raise Boom(f"== on {self!r}")
        if self.mode == "eq-lies" and n > self.after:
            return n % 2 == 0
        return isinstance(other, Key) and other.v == self.v

    def __lt__(self, other: object) -> bool:
        n = self.calls.tick()
        if self.mode == "lt-raises" and n > self.after:
            raise Boom(f"< on {self!r}")
        if self.mode == "lt-lies":
            return n % 3 == 0
        if self.mode == "lt-mutates" and n == self.after:
            self.ctx.mutate(self.after)
        if not isinstance(other, Key):
            return NotImplemented
        return self.v < other.v

    def __repr__(self) -> str:
        return f"Key({self.v}, {self.mode})"


# -- hostile aux data ---------------------------------------------------------


class Aux:
    """Aux data whose hash or == raise, or which is unhashable (``mode``)."""

    def __init__(self, v: int, mode: str) -> None:
        self.v, self.mode = v, mode

    def __hash__(self) -> int:
        if self.mode == "hash-raises":
            raise Boom("hash of aux")
        if self.mode == "unhashable":
            raise TypeError("unhashable type: 'Aux'")
        return self.v

    def __eq__(self, other: object) -> bool:
        if self.mode == "eq-raises":
            raise Boom("== on aux")
        return isinstance(other, Aux) and other.v == self.v

    def __call__(self) -> int:  # a defaultdict's default_factory may be one
        return 0

    def __repr__(self) -> str:
        return f"Aux({self.v}, {self.mode})"


# -- containers with an overridden protocol -----------------------------------


class _Overrides:
    """The sequence protocol of a list or tuple subclass, disagreeing with its
    storage as ``mode`` says: ``odd_iter`` (what __iter__ gives instead) and
    ``len_extra`` (what __len__ adds) are set by each subclass."""

    mode = "iter"
    len_extra = 0

    def odd_iter(self) -> Any:
        raise NotImplementedError

    def __iter__(self) -> Any:
        if self.mode == "iter-raises":
            raise Boom("iter")
        return self.odd_iter() if self.mode == "iter" else super().__iter__()  # type: ignore[misc]

    def __len__(self) -> int:
        if self.mode == "len-raises":
            raise Boom("len")
        return super().__len__() + (self.len_extra if self.mode == "len" else 0)  # type: ignore[misc]

    def __getitem__(self, i: Any) -> Any:
        if self.mode == "getitem":
            return "from __getitem__"
        return super().__getitem__(i)  # type: ignore[misc]


class ListSub(_Overrides, list):
    """A list whose __iter__, __len__ and __getitem__ disagree with its storage."""

    len_extra = 3

    def odd_iter(self) -> Any:
        return iter([*list.__iter__(self), "extra"])


class TupleSub(_Overrides, tuple):
    """A tuple whose __iter__, __len__ and __getitem__ disagree with its storage."""

    len_extra = 1

    def odd_iter(self) -> Any:
        return iter(("extra",) * 2)


class DictSub(dict):
    """A dict whose iteration, keys, values and items disagree with its storage."""

    mode = "iter"

    def __iter__(self) -> Any:
        if self.mode == "iter-raises":
            raise Boom("iter")
        return iter(["ghost", *dict.__iter__(self)]) if self.mode == "iter" else dict.__iter__(self)

    def keys(self) -> Any:
        return list(self)

    def values(self) -> Any:
        if self.mode == "values":
            return ["v"] * 5
        return dict.values(self)

    def __len__(self) -> int:
        return dict.__len__(self) + (2 if self.mode == "len" else 0)

    def __getitem__(self, k: Any) -> Any:
        if self.mode == "getitem":
            return "from __getitem__"
        return dict.__getitem__(self, k)


def _sub(cls: type, items: Any, mode: str) -> Any:
    obj = cls(items)
    obj.mode = mode
    return obj


NT = namedtuple("NT", "a b")


class NTOverrides(_Overrides, NT):
    """A namedtuple subclass overriding the sequence protocol."""

    len_extra = 3  # a length of 5 for its 2 fields

    def odd_iter(self) -> Any:
        return iter(("x", "y", "z"))


# -- protocol classes and rules -----------------------------------------------


class _Answers:
    """Children, aux and a ``mode`` saying what flattening it answers (_answer)."""

    def __init__(self, kids: Any, aux: Any, mode: str, ctx: Ctx, after: int = 1) -> None:
        self.kids, self.aux, self.mode, self.ctx, self.after = kids, aux, mode, ctx, after
        self.calls = Counter()

    def answer(self) -> Any:
        return _answer(self.kids, self.aux, self.mode, self.ctx, self.calls.tick(), self.after)


class Proto(_Answers):
    """A protocol class whose __tree_flatten__ does what ``mode`` says."""

    def __tree_flatten__(self) -> Any:
        return self.answer()

    @classmethod
    def __tree_unflatten__(cls, aux: Any, children: Any) -> Any:
        if isinstance(aux, Aux) and aux.mode == "unflatten-raises":
            raise Boom("unflatten")
        return ("Proto", aux, children)


class ProtoNotCallable:
    __tree_unflatten__ = 5

    def __tree_flatten__(self) -> Any:
        return (1,), None


class ProtoFlattenAttr:
    """__tree_flatten__ that is an attribute, not a method."""

    __tree_flatten__ = "not callable"

    @classmethod
    def __tree_unflatten__(cls, aux: Any, children: Any) -> Any:
        return cls()


class Opaque(_Answers):
    """Flattened by a rule, which does what ``mode`` says."""


def _rule_flatten(o: Opaque) -> Any:
    return o.answer()


def _rule_unflatten(aux: Any, children: Any) -> Any:
    if isinstance(aux, Aux) and aux.mode == "unflatten-raises":
        raise Boom("rule unflatten")
    return ("Opaque", aux, children)


RULES = {Opaque: pk.Rule(_rule_flatten, _rule_unflatten)}

ANSWERS = [
    "ok",
    "ok-dict",
    "ok-list",
    "not-a-pair",
    "triple",
    "list-pair",
    "children-set",
    "children-str",
    "children-int",
    "children-none",
    "children-gen",
    "children-listsub",
    "children-tuplesub",
    "children-dictsub",
    "raises",
    "grows",
    "mutates",
    "unhashable-aux",
    "aux-hash-raises",
]


def _answer(kids: list, aux: Any, mode: str, ctx: Ctx, n: int, after: int) -> Any:
    """What a __tree_flatten__ or rule returns in ``mode`` (the n-th call)."""
    if mode == "ok":
        return tuple(kids), aux
    if mode == "ok-dict":
        return {f"k{i}": k for i, k in enumerate(kids)}, aux
    if mode == "ok-list":
        return list(kids), aux
    if mode == "not-a-pair":
        return kids
    if mode == "triple":
        return kids, aux, aux
    if mode == "list-pair":
        return [kids, aux]
    if mode == "children-set":
        return {1, 2}, aux
    if mode == "children-str":
        return "ab", aux
    if mode == "children-int":
        return 3, aux
    if mode == "children-none":
        return None, aux
    if mode == "children-gen":
        return (k for k in kids), aux
    if mode == "children-listsub":
        return _sub(ListSub, kids, ctx.pick(SUB_MODES)), aux
    if mode == "children-tuplesub":
        return _sub(TupleSub, kids, ctx.pick(SUB_MODES)), aux
    if mode == "children-dictsub":
        return _sub(DictSub, {f"d{i}": k for i, k in enumerate(kids)}, ctx.pick(SUB_MODES)), aux
    if mode == "raises":
        if n >= after:
            raise Boom("flatten")
        return tuple(kids), aux
    if mode == "grows":
        kids.append(n)
        return kids, aux
    if mode == "mutates":
        if n == after:
            ctx.mutate(n)
        return tuple(kids), aux
    if mode == "unhashable-aux":
        return tuple(kids), [aux]
    if mode == "aux-hash-raises":
        return tuple(kids), Aux(n, "hash-raises")
    raise AssertionError(mode)


SUB_MODES = ["iter", "len", "getitem", "iter-raises", "len-raises", "plain", "values"]


# -- dataclasses, attrs and metaclasses ---------------------------------------


@dataclasses.dataclass
class DC:
    a: Any
    b: Any = None


@dataclasses.dataclass
class DCStatic:
    a: Any
    s: Any = dataclasses.field(default=None, metadata={"static": True})


@dataclasses.dataclass
class DCProperty:
    """A field shadowed by a property that raises (``mode`` picks what)."""

    a: Any
    mode: Any = dataclasses.field(default="attr", metadata={"static": True})

    def __getattribute__(self, name: str) -> Any:
        if name == "a":
            mode = object.__getattribute__(self, "mode")
            if mode == "attr":
                raise AttributeError("a is not there")
            if mode == "boom":
                raise Boom("getattr a")
        return object.__getattribute__(self, name)


@dataclasses.dataclass
class DCDict(dict):
    """A dataclass that is a dict, with an overridable dict protocol."""

    a: Any = None
    b: Any = None
    mode: Any = dataclasses.field(default="plain", metadata={"static": True})

    def __post_init__(self) -> None:
        dict.__setitem__(self, "a", self.a)
        if self.mode != "missing":
            dict.__setitem__(self, "b", self.b)
        if self.mode == "extra":
            dict.__setitem__(self, "zz", 1)

    def keys(self) -> Any:
        return ["a"] if self.mode == "keys" else dict.keys(self)

    def __iter__(self) -> Any:
        return iter(["b", "a", "c"]) if self.mode == "iter" else dict.__iter__(self)

    def __getitem__(self, k: Any) -> Any:
        return "x" if self.mode == "getitem" else dict.__getitem__(self, k)


@attrs.define
class AttrsCls:
    p: Any
    q: Any = None


class Meta(type):
    """Attribute lookups on the class itself raise (``mode`` picks which)."""

    def __getattr__(cls, name: str) -> Any:
        mode = type.__getattribute__(cls, "mode")
        if name == mode:
            raise Boom(f"metaclass getattr {name}")
        raise AttributeError(name)


class MetaObj(metaclass=Meta):
    mode = "__tree_flatten__"


class MetaObjDC(metaclass=Meta):
    mode = "__dataclass_fields__"


class MetaObjAttrs(metaclass=Meta):
    mode = "__attrs_attrs__"


class Truthy:
    """What an is_leaf may answer: its truth raises or changes (``mode``)."""

    def __init__(self, mode: str) -> None:
        self.mode = mode

    def __bool__(self) -> bool:
        if self.mode == "raises":
            raise Boom("bool")
        return self.mode == "true"


class Leaf:
    """An opaque leaf."""

    def __init__(self, v: int) -> None:
        self.v = v

    def __repr__(self) -> str:
        return f"Leaf({self.v})"


# -- building a case ----------------------------------------------------------

KEY_MODES = ["hash-raises", "hash-lies", "eq-raises", "eq-lies", "collide", "lt-raises"]
KEY_MODES += ["lt-lies", "lt-mutates", "plain"]
AUX_MODES = ["hash-raises", "unhashable", "eq-raises", "unflatten-raises", "plain"]


class Ctx:
    """One build: its random choices, and the lists and dicts it made."""

    def __init__(self, seed: int) -> None:
        self.rng = random.Random(seed)
        self.lists: list = []
        self.dicts: list = []
        self.nodes: list = []  # every container built, for shared subtrees and cycles
        self.plan: dict = {}  # mutation number -> (what, which, how), drawn up front
        self.huge = self.rng.random() < 0.03

    def pick(self, seq: Any) -> Any:
        return seq[self.rng.randrange(len(seq))]

    def mutate(self, n: int) -> None:
        """Change one of the tree's lists or dicts (the plan for mutation ``n``)."""
        what, which, how = self.plan.get(n, ("list", 0, 0))
        pool = self.lists if what == "list" else self.dicts
        if not pool:
            return
        c = pool[which % len(pool)]
        if what == "list":
            [c.clear, lambda: c.append(Leaf(99)), lambda: c.pop() if c else None,
             lambda: c.insert(0, [Leaf(98)]), lambda: c.__setitem__(slice(None), [1, {"n": 2}]),
             lambda: c.extend(range(5))][how % 6]()  # fmt: skip
        else:
            keys = list(c)
            [c.clear, lambda: c.__setitem__("zz-new", [Leaf(97)]),
             lambda: c.pop(keys[0]) if keys else None,
             lambda: c.__setitem__(keys[-1], {"deep": [1]}) if keys else None,
             lambda: c.update({i: i for i in range(4)})][how % 5]()  # fmt: skip


def _leaf(ctx: Ctx) -> Any:
    r = ctx.rng.randrange(8)
    if r < 3:
        return ctx.rng.randrange(-3, 10)
    if r == 3:
        return ctx.pick(["a", "b", "", "ü"])
    if r == 4:
        return Leaf(ctx.rng.randrange(100))
    if r == 5:
        return None
    if r == 6:
        return _sub(ctx.pick([ListSub, TupleSub]), [1, 2], ctx.pick(SUB_MODES))
    return ctx.pick([1.5, b"x", frozenset({1}), (), [], {}])


def _keys(ctx: Ctx, n: int) -> list:
    r = ctx.rng.randrange(5)
    if r == 0:
        return [f"k{i}" for i in ctx.rng.sample(range(3 * n + 1), n)]
    if r == 1:
        return ctx.rng.sample(range(-5, 3 * n + 5), n)
    if r == 2:  # mixed, not mutually orderable
        return [ctx.pick([f"m{i}", i, (i,), None if i == 0 else i + 0.5]) for i in range(n)]
    if n > 64:  # hostile keys that collide make a dict quadratic to build: ints
        return list(range(n))
    mode = ctx.pick(KEY_MODES)
    return [Key(ctx.rng.randrange(50) + 100 * i, mode, ctx.rng.randrange(6), ctx) for i in range(n)]


def _kids(ctx: Ctx, depth: int) -> list:
    if ctx.huge and ctx.rng.random() < 0.2:
        ctx.huge = False
        return [ctx.rng.randrange(5) for _ in range(ctx.pick([2_000, 30_000]))]
    return [_tree(ctx, depth + 1) for _ in range(ctx.rng.randrange(4))]


def _aux(ctx: Ctx) -> Any:
    r = ctx.rng.randrange(4)
    if r == 0:
        return Aux(ctx.rng.randrange(3), ctx.pick(AUX_MODES))
    return ctx.pick([None, "tag", 3, ("t", 1)])


def _dict(ctx: Ctx, depth: int) -> dict:
    kids = _kids(ctx, depth)
    d: dict = {}
    for k, v in zip(_keys(ctx, len(kids)), kids):
        try:
            d[k] = v
        except Boom:
            pass
    return d


def _tree(ctx: Ctx, depth: int = 0) -> Any:
    rng = ctx.rng
    if depth > 4 or rng.random() < 0.3:
        return _leaf(ctx)
    if ctx.nodes and rng.random() < 0.04:
        return ctx.pick(ctx.nodes)  # shared, or (when an ancestor) a cycle
    try:
        return _container(ctx, depth, rng.randrange(25))
    except Boom:  # a hostile key refused to go into a dict: a leaf here instead
        return "refused"


def _container(ctx: Ctx, depth: int, kind: int) -> Any:
    rng = ctx.rng
    obj: Any
    if kind <= 3:
        obj = _kids(ctx, depth)
        ctx.lists.append(obj)
    elif kind <= 6:
        obj = _dict(ctx, depth)
        ctx.dicts.append(obj)
    elif kind == 7:
        obj = tuple(_kids(ctx, depth))
    elif kind == 8:
        obj = NT(_tree(ctx, depth + 1), _tree(ctx, depth + 1))
    elif kind == 9:
        obj = NTOverrides(_tree(ctx, depth + 1), _leaf(ctx))
        obj.mode = ctx.pick(SUB_MODES)
    elif kind == 10:
        obj = Proto(_kids(ctx, depth), _aux(ctx), ctx.pick(ANSWERS), ctx, rng.randrange(1, 4))
    elif kind == 11:
        obj = Opaque(_kids(ctx, depth), _aux(ctx), ctx.pick(ANSWERS), ctx, rng.randrange(1, 4))
    elif kind == 12:
        obj = DC(_tree(ctx, depth + 1), _tree(ctx, depth + 1))
    elif kind == 13:
        obj = DCStatic(_tree(ctx, depth + 1), _aux(ctx) if rng.random() < 0.7 else [1])
    elif kind == 14:
        obj = DCProperty(_tree(ctx, depth + 1), ctx.pick(["attr", "boom", "plain"]))
    elif kind == 15:
        mode = ctx.pick(["plain", "missing", "extra", "keys", "iter", "getitem"])
        obj = DCDict(_tree(ctx, depth + 1), _leaf(ctx), mode)
    elif kind == 16:
        obj = AttrsCls(_tree(ctx, depth + 1), _leaf(ctx))
    elif kind == 17:
        obj = ctx.pick([MetaObj, MetaObjDC, MetaObjAttrs])()
    elif kind == 18:
        obj = OrderedDict(zip(_keys(ctx, 2), _kids(ctx, depth)))
        ctx.dicts.append(obj)
    elif kind == 19:
        factory = ctx.pick([list, None, Aux(1, "unhashable"), Aux(2, "eq-raises")])
        obj = defaultdict(factory, _dict(ctx, depth))
        ctx.dicts.append(obj)
    elif kind == 20:
        obj = deque(_kids(ctx, depth), ctx.pick([None, 2, 10]))
        ctx.nodes.append(obj)
    elif kind == 21:
        obj = ctx.pick([ProtoNotCallable, ProtoFlattenAttr])()
    elif kind == 22:  # a namedtuple whose length is not its number of fields
        obj = tuple.__new__(NT, tuple(_kids(ctx, depth)))
    elif kind == 23:
        obj = time.struct_time([_tree(ctx, depth + 1) for _ in range(9)])
    else:
        obj = [_tree(ctx, depth + 1), DC(_leaf(ctx), _leaf(ctx))]
        ctx.lists.append(obj)
    if isinstance(obj, (list, dict, Proto, Opaque, DC)):
        ctx.nodes.append(obj)
    return obj


def _is_leaf(ctx: Ctx) -> Any:
    """None, or an is_leaf that raises, mutates, or answers oddly at its k-th call."""
    r = ctx.rng.randrange(8)
    if r < 3:
        return None
    calls = Counter()
    k = ctx.rng.randrange(1, 12)
    if r == 3:

        def is_leaf(x: Any) -> Any:
            if calls.tick() == k:
                raise Boom("is_leaf")
            return False

    elif r == 4:

        def is_leaf(x: Any) -> Any:
            if calls.tick() == k:
                ctx.mutate(k)
            return False

    elif r == 5:
        answer = ctx.pick(["raises", "true", "false"])

        def is_leaf(x: Any) -> Any:
            return Truthy(answer) if calls.tick() == k else None

    elif r == 6:

        def is_leaf(x: Any) -> Any:
            return isinstance(x, (tuple, Proto)) or (calls.tick() == k and isinstance(x, list))

    else:

        def is_leaf(x: Any) -> Any:
            return type(x) is dict and dict.__len__(x) > 1

    return is_leaf


def _leaves_arg(ctx: Ctx, leaves: list) -> Any:
    """The leaves given to unflatten: often not a plain list."""
    n = len(leaves)
    r = ctx.rng.randrange(11)
    if r == 0:
        return list(leaves)
    if r == 1:
        return tuple(leaves)
    if r == 2:
        return (x for x in leaves)
    if r == 3:
        return iter(leaves)
    if r == 4:
        return itertools.count()  # endless
    if r == 5:

        def raising() -> Any:
            yield from leaves[: ctx.rng.randrange(n + 1)]
            raise Boom("leaves iterator")

        return raising()
    if r == 6:
        return _sub(ListSub, leaves, ctx.pick(SUB_MODES))
    if r == 7:
        return _sub(TupleSub, leaves, ctx.pick(SUB_MODES))
    if r == 8:
        return [*leaves, 0][: n + ctx.rng.randrange(-2, 2)]
    if r == 9:
        return range(n)
    return {i: None for i in range(n)}


def _build(seed: int) -> tuple:
    ctx = Ctx(seed)
    tree = _tree(ctx)
    ctx.plan = {
        n: (ctx.pick(["list", "dict"]), ctx.rng.randrange(8), ctx.rng.randrange(6))
        for n in range(1, 13)
    }
    if ctx.lists and ctx.nodes and ctx.rng.random() < 0.15:
        # Share a container a second time, or (when it holds the list) make a cycle.
        ctx.pick(ctx.lists).append(ctx.pick(ctx.nodes))
    rules = RULES if ctx.rng.random() < 0.8 else None
    return ctx, tree, _is_leaf(ctx), rules


# -- running a case and recording what happened --------------------------------

_ADDRESS = re.compile(r"0x[0-9a-fA-F]+")


def canon(x: Any) -> Any:
    """A comparable, id-free picture of ``x`` that calls none of its methods."""
    seen: set = set()

    def go(x: Any, depth: int) -> Any:
        t = type(x)
        if x is None or t in (bool, int, str, bytes):
            return x
        if t is float:
            return repr(x)
        if depth > 60:
            return "..."
        if isinstance(x, type):
            return ("type", x.__qualname__)
        if id(x) in seen:
            return ("cycle", t.__qualname__)
        if isinstance(x, BaseException):
            return ("raise", t.__qualname__, _ADDRESS.sub("0x?", str(x)))
        if isinstance(x, pk.TreeSpec):
            return ("spec", go(x._nodes, depth + 1), go(x._orders, depth + 1), x.num_leaves)
        seen.add(id(x))
        try:
            if isinstance(x, tuple):
                return (t.__qualname__, [go(v, depth + 1) for v in tuple.__iter__(x)])
            if isinstance(x, list):
                return (t.__qualname__, [go(v, depth + 1) for v in list.__iter__(x)])
            if isinstance(x, dict):
                items = [(go(k, depth + 1), go(v, depth + 1)) for k, v in dict.items(x)]
                return (t.__qualname__, items, go(_vars(x), depth + 1))
            if isinstance(x, deque):
                return (t.__qualname__, x.maxlen, [go(v, depth + 1) for v in x])
            if isinstance(x, (frozenset, set)):
                return (t.__qualname__, sorted(map(repr, x)))
            if callable(x) and hasattr(x, "__qualname__"):
                return ("callable", x.__qualname__)
            return (t.__qualname__, go(_vars(x), depth + 1))
        finally:
            seen.discard(id(x))

    return go(x, 0)


def _vars(x: Any) -> Any:
    try:
        d = object.__getattribute__(x, "__dict__")
    except AttributeError:
        d = {}
    out = {k: v for k, v in dict.items(d) if k not in ("ctx", "calls")}
    for cls in type(x).__mro__:
        for s in cls.__dict__.get("__slots__", ()):
            try:
                out[s] = object.__getattribute__(x, s)
            except AttributeError:
                pass
    return sorted(out.items(), key=lambda kv: kv[0])


def _outcome(fn: Callable, *args: Any) -> Any:
    try:
        return ("ok", fn(*args))
    except Exception as e:  # every exception type is compared, so catch them all
        return ("raise", type(e).__qualname__, _ADDRESS.sub("0x?", str(e)))


def run_case(engine: Any, seed: int) -> list:
    """Build case ``seed`` afresh and run every operation on it with ``engine``."""
    ctx, tree, is_leaf, rules = _build(seed)
    record = []
    first = _outcome(engine.flatten, tree, is_leaf, rules)
    record.append(canon(first))
    record.append(canon(_outcome(engine.leaves, tree, is_leaf, rules)))
    record.append(canon(_outcome(engine.flatten_with_path, tree, is_leaf, rules)))
    if first[0] == "ok":
        leaves, spec = first[1]
        record.append(canon(_outcome(engine.unflatten, spec, _leaves_arg(ctx, leaves))))
        record.append(canon(_outcome(engine.flatten_up_to, spec, tree)))
        _, other, _, _ = _build(seed + ctx.rng.randrange(2))  # the same tree, or another
        record.append(canon(_outcome(engine.flatten_up_to, spec, other, "tree", "rest[0]")))
    else:
        # A spec made by the pure engine from a calmer tree, for unflatten.
        calm = _outcome(_pure.flatten, tree, None, rules)
        if calm[0] == "ok":
            leaves, spec = calm[1]
            record.append(canon(_outcome(engine.unflatten, spec, _leaves_arg(ctx, leaves))))
    return record
