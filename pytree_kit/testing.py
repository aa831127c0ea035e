"""Property testing for your own containers (needs hypothesis: the ``testing`` extra).

Two entry points:

- :func:`trees`, a hypothesis strategy of nested trees of every kind
  pytree_kit understands, to which you can add your own containers and leaves;
- :func:`check_container`, which draws values from a strategy and checks the
  laws every container must obey, raising ``AssertionError`` that names the
  violated law and shows hypothesis's minimal failing example.

Examples:
    >>> from hypothesis import strategies as st
    >>> from pytree_kit.testing import Record, check_container, trees
    >>> check_container(st.builds(Record, trees(max_depth=1), st.integers()), max_examples=20)

A class of your own works the same way. The pickle law runs only when the
spec pickles (the class is defined at module level, the rules are not
lambdas); otherwise :class:`LawSkipped` says so. See ``docs/testing.md``.
"""

from __future__ import annotations

import collections
import dataclasses
import pickle
import typing
import warnings
from collections import OrderedDict, defaultdict, deque
from typing import Any, Callable, Iterable, Mapping, Optional

try:
    from hypothesis import HealthCheck, given, settings
    from hypothesis import strategies as st
except ImportError as e:  # pragma: no cover - exercised only without the extra
    raise ImportError(
        "pytree_kit.testing needs hypothesis: pip install 'pytree-kit[testing]' (or hypothesis)"
    ) from e

from . import api
from ._keys import DictKey, SequenceKey
from ._kinds import DEFAULTDICT, Rule
from ._spec import TreeSpec

__all__ = [
    "LawSkipped",
    "Leaf",
    "Pair",
    "Point",
    "Record",
    "Tagged",
    "check_container",
    "trees",
]

SearchStrategy = st.SearchStrategy
ContainerFactory = Callable[[SearchStrategy], SearchStrategy]


class LawSkipped(UserWarning):
    """:func:`check_container` could not run a law on the values drawn, and says
    which and why: the pickle law needs a spec that pickles, and a spec holding
    a rule of lambdas or a class defined in a function does not. Every other law
    still ran; a container that breaks one still fails."""


# -- containers the default strategy draws (module level: picklable, nameable) --


Point = collections.namedtuple("Point", "x y")
Point.__doc__ = "A collections.namedtuple drawn by :func:`trees`."


class Pair(typing.NamedTuple):
    """A typing.NamedTuple drawn by :func:`trees`."""

    first: Any
    second: Any


@dataclasses.dataclass
class Record:
    """A dataclass drawn by :func:`trees`."""

    a: Any
    b: Any = None


@dataclasses.dataclass(frozen=True)
class Tagged:
    """A frozen dataclass with a static field, drawn by :func:`trees`."""

    value: Any
    tag: str = dataclasses.field(default="x", metadata={"static": True})


class Leaf:
    """An opaque leaf compared by identity: the default leaves of :func:`trees`
    include these, so that a round trip can be checked object by object."""

    __slots__ = ("n",)

    def __init__(self, n: int) -> None:
        self.n = n

    def __repr__(self) -> str:
        return f"Leaf({self.n})"


_default_leaves = st.one_of(
    st.integers(-10, 10),
    st.floats(allow_nan=False),
    st.text(max_size=4),
    st.binary(max_size=3),
    st.builds(Leaf, st.integers(0, 999)),
)


def _dicts(children: SearchStrategy, width: int, cls: Callable = dict) -> SearchStrategy:
    keys = st.one_of(
        st.lists(st.text(max_size=3), max_size=width, unique=True),
        st.lists(st.integers(-5, 20), max_size=width, unique=True),
        # keys that are not mutually orderable: leaves in insertion order
        st.lists(st.one_of(st.text(max_size=2), st.integers(0, 5)), max_size=width, unique=True),
    )
    return keys.flatmap(
        lambda ks: st.lists(children, min_size=len(ks), max_size=len(ks)).map(
            lambda vs: cls(zip(ks, vs))
        )
    )


def _builtin_kinds(children: SearchStrategy, width: int) -> list[SearchStrategy]:
    seq = st.lists(children, max_size=width)
    return [
        seq,
        seq.map(tuple),
        _dicts(children, width),
        _dicts(children, width, OrderedDict),
        _dicts(children, width).map(lambda d: defaultdict(list, d)),
        st.builds(deque, seq, st.sampled_from([None, width, width + 3])),
        st.builds(Pair, children, children),
        st.builds(Point, children, children),
        st.builds(Record, children, children),
        st.builds(Tagged, children, st.sampled_from(["x", "y"])),
    ]


def trees(
    leaves: Optional[SearchStrategy] = None,
    *,
    max_depth: int = 4,
    max_width: int = 5,
    containers: Optional[Iterable[ContainerFactory]] = None,
) -> SearchStrategy:
    """A hypothesis strategy of nested trees.

    It draws every container kind pytree_kit understands (list, tuple, dict
    with orderable and with unorderable keys, OrderedDict, defaultdict, deque,
    namedtuples, dataclasses with and without static fields, None) nested in
    each other up to ``max_depth`` levels, each with at most ``max_width``
    children.

    ``leaves`` replaces the leaf strategy (by default: numbers, strings,
    bytes and opaque :class:`Leaf` objects). ``containers`` adds your own
    kinds: each is a function that takes the strategy of the children and
    returns a strategy of your containers, for example
    ``lambda children: st.builds(MyBox, children, children)``.

    Examples:
        >>> from hypothesis import given
        >>> import pytree_kit as pk
        >>> @given(trees(max_depth=2))
        ... def roundtrip(tree):
        ...     leaves, spec = pk.flatten(tree)
        ...     assert pk.structure(pk.unflatten(spec, leaves)) == spec
        >>> roundtrip()
    """
    if max_depth < 0 or max_width < 0:
        raise ValueError("max_depth and max_width must be >= 0")
    extra = list(containers or ())
    base = st.one_of(leaves if leaves is not None else _default_leaves, st.none())
    level: SearchStrategy = base
    for _ in range(max_depth):
        kids = level
        kinds = _builtin_kinds(kids, max_width) + [make(kids) for make in extra]
        # st.deferred keeps the strategy's repr small however deep it nests.
        level = _deferred(base, kinds)
    return level


def _deferred(base: SearchStrategy, kinds: list) -> SearchStrategy:
    return st.deferred(lambda: st.one_of(base, *kinds))


# -- the laws ----------------------------------------------------------------------


class _Fresh:
    """A distinct sentinel leaf, to see where each leaf lands."""

    __slots__ = ("i",)

    def __init__(self, i: int) -> None:
        self.i = i

    def __repr__(self) -> str:
        return f"<leaf {self.i}>"


class _LawViolation(AssertionError):
    pass


def _law(name: str, ok: bool, detail: str = "") -> None:
    if not ok:
        raise _LawViolation(f"law violated: {name}" + (f": {detail}" if detail else ""))


def _same_state(a: Any, b: Any, depth: int = 0) -> bool:
    """Containers pytree_kit knows are compared child by child; other values
    with ``==`` when their type defines ``__eq__``, else by type and instance
    state (``__dict__`` and slots), recursively."""
    if a is b:
        return True
    if type(a) is not type(b) or depth > 200:
        return False
    if isinstance(a, (list, tuple, deque)):
        if len(a) != len(b) or getattr(a, "maxlen", None) != getattr(b, "maxlen", None):
            return False
        return all(_same_state(x, y, depth + 1) for x, y in zip(a, b))
    fields = _record_fields(a)
    if isinstance(a, dict):
        if list(a.keys()) != list(b.keys()):
            return False
        if getattr(a, "default_factory", None) != getattr(b, "default_factory", None):
            return False
        if fields is None:
            return all(_same_state(a[k], b[k], depth + 1) for k in a)
    if fields is not None:
        missing = object()
        return all(
            _same_state(getattr(a, f, missing), getattr(b, f, missing), depth + 1) for f in fields
        )
    if type(a).__eq__ is not object.__eq__:
        try:
            return bool(a == b)
        except Exception:
            pass  # e.g. arrays: fall back to state
    state_a, state_b = _state(a), _state(b)
    if state_a is None or state_b is None:
        return False
    if state_a.keys() != state_b.keys():
        return False
    return all(_same_state(state_a[k], state_b[k], depth + 1) for k in state_a)


def _record_fields(obj: Any) -> Optional[list]:
    """Field names of a dataclass or attrs instance, else None."""
    t = type(obj)
    if hasattr(t, "__dataclass_fields__"):
        return [f.name for f in dataclasses.fields(obj)]
    if hasattr(t, "__attrs_attrs__"):
        return [f.name for f in t.__attrs_attrs__]
    return None


def _state(obj: Any) -> Optional[dict]:
    state: dict = {}
    found = False
    for cls in type(obj).__mro__:
        slots = cls.__dict__.get("__slots__", ())
        if isinstance(slots, str):
            slots = (slots,)
        for name in slots:
            if name in ("__dict__", "__weakref__"):
                continue
            found = True
            if hasattr(obj, name):
                state["slot:" + name] = getattr(obj, name)
    if hasattr(obj, "__dict__"):
        found = True
        state.update(vars(obj))
    if isinstance(obj, (list, tuple, dict, deque)):
        found = True
        state["items"] = list(obj.items()) if isinstance(obj, dict) else list(obj)
    return state if found else None


def _resolve(tree: Any, path: tuple, rules: Optional[Mapping]) -> Any:
    """Follow a path the way a user reads it, independently of the engine."""
    obj = tree
    for key in path:
        t = type(obj)
        rule = rules.get(t) if rules else None
        if rule is not None or hasattr(t, "__tree_flatten__"):
            children = (rule.flatten(obj) if rule is not None else obj.__tree_flatten__())[0]
            obj = children[key.key if isinstance(key, DictKey) else key.idx]
        elif isinstance(key, DictKey):
            obj = obj[key.key]
        elif isinstance(key, SequenceKey):
            obj = obj[key.idx]
        else:
            obj = getattr(obj, key.name)
    return obj


def _classes(spec: TreeSpec) -> list:
    """Every class and function a spec names, for TreeSpec.from_json(allow=...)."""
    out: list = []
    todo: list = []
    for kind, t, _arity, aux in spec._nodes:
        if t is not None:
            out.append(t)
        if kind == DEFAULTDICT:
            todo.append(aux[0])
        todo.append(aux)
    while todo:
        v = todo.pop()
        if isinstance(v, (tuple, frozenset)):
            todo.extend(v)
        elif isinstance(v, type) or (callable(v) and not isinstance(v, Rule)):
            out.append(v)
    return out


def _check_laws(
    value: Any, rules: Optional[Mapping], check_json: bool, where: str, skipped: dict
) -> None:
    def name(law: str) -> str:
        return law + where

    try:
        leaves, spec = api.flatten(value, rules=rules)
    except TypeError as e:
        law = name("flatten succeeds (aux data is hashable)")
        raise _LawViolation(f"law violated: {law}: {e}") from None

    # each leaf lands in its own place (catches children swapped on unflatten)
    fresh = [_Fresh(i) for i in range(len(leaves))]
    placed = api.leaves(api.unflatten(spec, fresh), rules=rules)
    order = [getattr(p, "i", p) for p in placed]
    _law(name("unflatten puts each leaf in its place"),
         len(placed) == len(fresh) and all(a is b for a, b in zip(placed, fresh)),
         f"leaves 0..{len(fresh) - 1} came back as {order}")  # fmt: skip

    # round trip: types, aux data, leaves by identity, equality or the same state
    rebuilt = api.unflatten(spec, leaves)
    _law(name("round trip keeps the type"), type(rebuilt) is type(value),
         f"{type(value).__qualname__} came back as {type(rebuilt).__qualname__}")  # fmt: skip
    again, spec2 = api.flatten(rebuilt, rules=rules)
    _law(name("round trip keeps the spec (types and aux data)"), spec2 == spec,
         f"{spec!r} came back as {spec2!r}")  # fmt: skip
    _law(name("round trip keeps the leaves, by identity and in order"),
         len(again) == len(leaves) and all(a is b for a, b in zip(again, leaves)))  # fmt: skip
    _law(name("round trip gives an equal value (or the same instance state)"),
         _same_state(rebuilt, value), f"{value!r} came back as {rebuilt!r}")  # fmt: skip

    # spec equality and hash laws
    _law(name("spec equals itself"), spec == spec and not (spec != spec))
    _law(name("equal specs hash equal"), hash(spec2) == hash(spec))
    _law(name("spec is stable across flattens"), api.structure(value, rules=rules) == spec)

    # tree_map identity
    mapped = api.tree_map(lambda x: x, value, rules=rules)
    _law(name("tree_map(identity) gives an equal value"),
         type(mapped) is type(value) and _same_state(mapped, value))  # fmt: skip

    # pickle and JSON round trips of the spec; the pickle law runs only on a
    # spec that pickles (rules of lambdas and local classes do not)
    try:
        data = pickle.dumps(spec)
    except (pickle.PicklingError, AttributeError, TypeError) as e:
        skipped.setdefault("pickle round trip of the spec", f"the spec cannot be pickled: {e}")
    else:
        try:
            back = pickle.loads(data)
        except Exception as e:
            law = name("pickle round trip of the spec")
            raise _LawViolation(f"law violated: {law}: unpickling raised {e!r}") from None
        _law(name("pickle round trip of the spec"),
             back == spec and hash(back) == hash(spec)
             and _same_state(back.unflatten(leaves), value))  # fmt: skip
    if check_json:
        try:
            text = spec.to_json()
            back = TreeSpec.from_json(text, allow=_classes(spec), rules=rules)
        except (TypeError, ValueError) as e:
            raise _LawViolation(
                f"law violated: {name('JSON round trip of the spec')}: {e}"
            ) from None
        _law(name("JSON round trip of the spec"),
             back == spec and _same_state(back.unflatten(leaves), value))  # fmt: skip

    # paths
    pairs, spec3 = api.flatten_with_path(value, rules=rules)
    _law(name("flatten_with_path agrees with flatten"),
         spec3 == spec and len(pairs) == len(leaves)
         and all(a is b for (_, a), b in zip(pairs, leaves)))  # fmt: skip
    for path, leaf in pairs:
        try:
            reached = _resolve(value, path, rules)
        except Exception as e:
            raise _LawViolation(
                f"law violated: {name('every path reaches its leaf')}: {path!r} raised {e!r}"
            ) from None
        _law(name("every path reaches its leaf"), reached is leaf, f"{path!r} reached {reached!r}")

    # flatten_up_to and leaves
    up_to = spec.flatten_up_to(value)
    _law(name("flatten_up_to agrees with flatten"),
         len(up_to) == len(leaves) and all(a is b for a, b in zip(up_to, leaves)))  # fmt: skip
    only = api.leaves(value, rules=rules)
    _law(name("leaves agrees with flatten"),
         len(only) == len(leaves) and all(a is b for a, b in zip(only, leaves)))  # fmt: skip


def check_container(
    strategy: SearchStrategy,
    *,
    rules: Optional[Mapping[type, Rule]] = None,
    max_examples: int = 100,
    check_json: bool = True,
) -> None:
    """Check that the values ``strategy`` draws obey pytree_kit's laws.

    For each value, on its own and nested inside builtin containers:

    - round trip: ``unflatten(flatten(x))`` has the same type, the same spec
      (so the same aux data), the same leaves by identity, and is equal to
      ``x`` when the type defines ``__eq__``, else has the same instance state
      (``__dict__`` and slots, compared recursively);
    - unflatten puts each leaf in its own place;
    - spec equality and hash laws; ``tree_map`` with the identity;
    - pickle and JSON round trips of the spec (``check_json=False`` skips JSON,
      for aux data JSON cannot hold);
    - every path of ``flatten_with_path`` reaches its leaf;
    - ``flatten_up_to`` and ``leaves`` agree with ``flatten``.

    On failure raises ``AssertionError`` naming the violated law, with
    hypothesis's minimal failing example. This catches the usual bugs:
    children swapped on unflatten, aux data dropped, unhashable aux data,
    a child silently lost.

    Examples:
        >>> from hypothesis import strategies as st
        >>> from pytree_kit.testing import Tagged, check_container
        >>> check_container(st.builds(Tagged, st.integers(), st.just("a")), max_examples=10)
    """
    if not isinstance(strategy, SearchStrategy):
        raise TypeError(
            f"check_container expects a hypothesis strategy, got {type(strategy).__name__}"
        )
    nested = st.tuples(strategy, strategy).map(lambda p: [p[0], {"k": (p[1], None)}, p[0]])

    @settings(
        max_examples=max_examples,
        deadline=None,
        database=None,
        suppress_health_check=list(HealthCheck),
    )
    @given(value=strategy, wrapped=nested)
    def laws(value: Any, wrapped: Any) -> None:
        _check_laws(value, rules, check_json, "", skipped)
        _check_laws(wrapped, rules, check_json, " (nested in builtin containers)", skipped)

    skipped: dict = {}
    try:
        laws()
    except _LawViolation as e:
        notes = "\n".join(getattr(e, "__notes__", ()))
        raise AssertionError(f"{e}\n{notes}".rstrip()) from None
    for law, why in skipped.items():
        warnings.warn(LawSkipped(f"check_container skipped the law {law!r}: {why}"), stacklevel=2)
