"""Node kinds of the spec format, the fields a record node holds, and :class:`Rule`.

These integers are part of the spec format shared by every engine; see
``docs/design.md``. Never renumber them: pickles hold them.
"""

from __future__ import annotations

import dataclasses
from collections import OrderedDict, UserDict, UserList, defaultdict
from enum import EnumMeta
from typing import Any, Callable, ClassVar

LEAF = 0
NONE = 1
TUPLE = 2
LIST = 3
DICT = 4
ORDEREDDICT = 5
DEFAULTDICT = 6
DEQUE = 7
NAMEDTUPLE = 8
STRUCTSEQ = 9
DATACLASS = 10
ATTRS = 11
CUSTOM = 12
RULE = 13
MAPPING = 14
SEQUENCE = 15

#: The name of each kind, as ``to_json`` writes it; index = kind.
KIND_NAMES = (
    "leaf",
    "none",
    "tuple",
    "list",
    "dict",
    "ordereddict",
    "defaultdict",
    "deque",
    "namedtuple",
    "structseq",
    "dataclass",
    "attrs",
    "custom",
    "rule",
    "mapping",
    "sequence",
)


def user_tail(kind: int, aux: Any) -> tuple:
    """What ``__tree_flatten__`` or a rule's ``flatten`` gave a custom or rule
    node's aux data: ``(aux, keys or None)``, or ``(aux, None, entries)`` for
    optree's triple. A rule node's aux data holds the rule before it.

    Examples:
        >>> user_tail(CUSTOM, ("a", None)), user_tail(RULE, ("rule", "a", None, (1, 2)))
        (('a', None), ('a', None, (1, 2)))
    """
    return aux if kind == CUSTOM else aux[1:]  # type: ignore[no-any-return]


def record_fields(t: Any) -> tuple:
    """``((name, static), ...)`` of the dataclass or attrs class ``t``: a fact
    about the class alone, which torch.compile's tracer takes as a constant
    (``_pure.CLASS_FACTS``): dynamo 2.9-2.11 cannot follow the reads of
    ``dataclasses.fields`` and of each field's ``metadata``.

    Examples:
        >>> import dataclasses
        >>> @dataclasses.dataclass
        ... class P:
        ...     x: int
        ...     k: str = dataclasses.field(default="a", metadata={"static": True})
        >>> record_fields(P)
        (('x', False), ('k', True))
    """
    if hasattr(t, "__dataclass_fields__"):
        fields: Any = dataclasses.fields(t)
    else:
        fields = t.__attrs_attrs__
    return tuple((f.name, bool((f.metadata or {}).get("static", False))) for f in fields)


def fields_info(t: Any, cache: dict, obj: Any = None) -> tuple:
    """:func:`record_fields` of ``t``, memoised per call (``obj``, an
    instance of ``t``, is not read). The pure engine reads records with it,
    and ``from_json`` checks them.
    """
    info = cache.get(t)
    if info is None:
        info = cache[t] = record_fields(t)
    return info


class Carried:
    """What a ``mapping`` or ``sequence`` node carries to its rebuild that is
    no part of the structure: the insertion order of a mapping's keys (None
    when it is their leaf order) and the instance's own attributes.

    ``state`` is ``((name, how, value), ...)`` in the order the instance
    holds them: ``how`` is ``ATTR`` (an entry of its ``__dict__``, ``value``
    kept by reference), ``MIRROR`` (an entry of its ``__dict__`` that is the
    mapping's item of that key: rebuilt from the new item), ``DATA`` (a
    ``UserDict``'s or ``UserList``'s ``data``: rebuilt from the children) or
    ``SLOT`` (a set slot, ``value`` kept).

    Every ``Carried`` equals every other and hashes alike, so that specs
    compare by structure alone, as they ignore a dict's insertion order:
    two tokenizer batches of the same keys have equal specs, and each spec
    rebuilds its own batch's attributes.

    Examples:
        >>> Carried(("b", "a"), ()) == Carried(None, (("n", ATTR, 1),))
        True
    """

    __slots__ = ("order", "state")

    def __init__(self, order: Any, state: tuple) -> None:
        self.order = order
        self.state = state

    def __eq__(self, other: object) -> bool:
        return type(other) is Carried

    def __ne__(self, other: object) -> bool:
        return type(other) is not Carried

    def __hash__(self) -> int:
        return 0x5EC0DE  # one value for all: no part of the structure

    def __repr__(self) -> str:
        names = ", ".join(name for name, _how, _value in self.state)
        return f"Carried(order={self.order!r}, state=[{names}])"

    def __reduce__(self) -> tuple[Any, ...]:
        return (Carried, (self.order, self.state))


#: how an entry of ``Carried.state`` is rebuilt
ATTR, MIRROR, DATA, SLOT = 0, 1, 2, 3

#: the ``Carried`` of an instance with no attributes whose keys are in leaf order
NOTHING_CARRIED = Carried(None, ())


HEAPTYPE = 1 << 9  # Py_TPFLAGS_HEAPTYPE: a class a class statement made

#: the builtin class a subclass stands on (the first class of its MRO that no
#: class statement made), by the name its nodes give it
_SOLID = {
    dict: "dict",
    OrderedDict: "OrderedDict",
    defaultdict: "defaultdict",
    tuple: "tuple",
    list: "list",
}
#: the bases whose storage is an attribute, ``data``
_USER = {UserDict: "UserDict", UserList: "UserList"}
#: what each base's instances are made with: the builtin class's ``__new__``
NEW: dict[str, Any] = {
    "dict": dict,
    "OrderedDict": OrderedDict,
    "defaultdict": defaultdict,
    "UserDict": object,
    "tuple": tuple,
    "list": list,
    "UserList": object,
}
#: the methods that set a base's items: a class that defines its own may keep
#: attributes that follow its items (a sorted dict's index of its keys)
_SETTERS = {
    "dict": ("__setitem__", "__delitem__"),
    "OrderedDict": ("__setitem__", "__delitem__"),
    "defaultdict": ("__setitem__", "__delitem__"),
    "UserDict": ("__setitem__", "__delitem__"),
    "list": ("__setitem__", "__delitem__", "append", "extend", "insert"),
    "UserList": ("__setitem__", "__delitem__", "append", "extend", "insert"),
    "tuple": (),
}
_BASE_CLASS = {
    "dict": dict,
    "OrderedDict": OrderedDict,
    "defaultdict": defaultdict,
    "UserDict": UserDict,
    "tuple": tuple,
    "list": list,
    "UserList": UserList,
}
MAPPING_BASES = frozenset({"dict", "OrderedDict", "defaultdict", "UserDict"})


def subclass_base(t: Any) -> str:
    """The builtin container that instances of the class ``t`` are, as the
    ``mapping`` and ``sequence`` kinds read them: ``"dict"``,
    ``"OrderedDict"``, ``"defaultdict"``, ``"UserDict"`` (for ``UserDict``
    itself too), ``"tuple"``, ``"list"`` or ``"UserList"``; ``""`` for any
    other class.

    Only a class a class statement made counts (``torch.Size``, a class of
    an extension module, is a leaf), whose first builtin base is that
    container (``object`` for ``UserDict`` and ``UserList``, found in the
    MRO itself, never by ``register``); an ``Enum`` is a value, never a
    container. A fact about the class alone (one of ``_pure.CLASS_FACTS``).

    Examples:
        >>> import collections
        >>> class Batch(dict): ...
        >>> class Encoding(collections.UserDict): ...
        >>> subclass_base(Batch), subclass_base(Encoding), subclass_base(dict)
        ('dict', 'UserDict', '')
    """
    if not t.__flags__ & HEAPTYPE or isinstance(t, EnumMeta):
        return ""
    for c in t.__mro__:
        # (the builtin bases by identity first: from 3.12 defaultdict is a
        # heap type, as a class of an extension module with multi-phase init is)
        solid = _SOLID.get(c)
        if solid is not None:
            return solid
        if not c.__flags__ & HEAPTYPE:
            if c is object:
                for user, name in _USER.items():
                    if user in t.__mro__:
                        return name
            return ""
    return ""  # pragma: no cover - every MRO ends with object


def own_setters(t: Any, base: str) -> tuple:
    """The methods of ``_SETTERS`` that the class ``t`` (of ``base``, a
    :func:`subclass_base`) defines for itself, where its base's own would
    set the items. A fact about the class alone (one of ``_pure.CLASS_FACTS``)."""
    cls = _BASE_CLASS[base]
    own = []
    for n in _SETTERS[base]:
        if getattr(t, n, None) is not getattr(cls, n, None):
            own.append(n)
    return tuple(own)


#: The node of every leaf: (kind, type, arity, aux). Specs hold this object
#: itself, except the C engine's on a free-threaded build, which hold an equal
#: tuple of the thread that made them (two threads' references to one object
#: would be atomic adds to one count; _core.h's IS_LEAF_NODE).
LEAF_NODE = (LEAF, None, 0, None)
NONE_NODE = (NONE, None, 0, None)


class Rule:
    """How to flatten instances of one class the caller cannot edit.

    ``flatten(obj)`` returns ``(children, aux)``: ``children`` is a list or
    tuple of child values, or a dict whose keys then name the paths; ``aux``
    is hashable data that goes into the spec. ``unflatten(aux, children)``
    rebuilds the object, and gets the children back in the form ``flatten``
    gave them (a tuple, or a dict with the same keys).

    Rules are passed per call, as ``rules={SomeType: Rule(...)}``; they apply
    to instances of exactly that type, and a spec made with a rule carries it,
    so ``unflatten`` needs nothing more. ``rules={SomeType: Rule.LEAF}`` makes
    that type's instances leaves in the call, whatever they are (a dict
    subclass, a dataclass: kept whole, as ``is_leaf`` would keep them, where
    a call takes no ``is_leaf``, as ``to_device`` and ``collate`` do).

    Examples:
        >>> import pytree_kit as pk
        >>> class Pair:  # a class we pretend we cannot edit
        ...     def __init__(self, a, b):
        ...         self.a, self.b = a, b
        >>> rule = pk.Rule(lambda p: ((p.a, p.b), None), lambda aux, ch: Pair(*ch))
        >>> leaves, spec = pk.flatten({"p": Pair(1, 2)}, rules={Pair: rule})
        >>> leaves
        [1, 2]
        >>> pk.unflatten(spec, [3, 4])["p"].b
        4
        >>> class Batch(dict): ...
        >>> pk.leaves([Batch(a=1)]), pk.leaves([Batch(a=1)], rules={Batch: pk.Rule.LEAF})
        ([1], [{'a': 1}])
    """

    __slots__ = ("flatten", "unflatten")
    flatten: Callable[[Any], tuple[Any, Any]]
    unflatten: Callable[[Any, Any], Any]
    #: the rule that makes a type's instances leaves (set below: ``_AsLeaf``)
    LEAF: ClassVar[Any]

    def __init__(
        self,
        flatten: Callable[[Any], tuple[Any, Any]],
        unflatten: Callable[[Any, Any], Any],
    ) -> None:
        if not callable(flatten) or not callable(unflatten):
            raise TypeError("Rule(flatten, unflatten) takes two callables")
        object.__setattr__(self, "flatten", flatten)
        object.__setattr__(self, "unflatten", unflatten)

    def __setattr__(self, name: str, value: object) -> None:
        raise AttributeError("Rule is immutable")

    def __eq__(self, other: object) -> bool:
        return (
            type(other) is Rule
            and self.flatten == other.flatten
            and self.unflatten == other.unflatten
        )

    def __hash__(self) -> int:
        return hash((Rule, self.flatten, self.unflatten))

    def __repr__(self) -> str:
        return f"Rule(flatten={self.flatten!r}, unflatten={self.unflatten!r})"

    def __reduce__(self) -> tuple[Any, ...]:
        return (Rule, (self.flatten, self.unflatten))


class _AsLeaf:
    """``Rule.LEAF``, the one rule that makes a type's instances leaves. It
    pickles by name, so a pickled ``rules=`` keeps it."""

    __slots__ = ()

    def __repr__(self) -> str:
        return "pytree_kit.Rule.LEAF"

    def __reduce__(self) -> str:
        return "AS_LEAF"


#: ``Rule.LEAF`` (the C engine reads it from here)
AS_LEAF = _AsLeaf()
Rule.LEAF = AS_LEAF


def check_rules(rules: Any) -> Any:
    """Validate a ``rules=`` argument; returns it, or None when empty."""
    if not rules:
        return None
    if type(rules) is not dict:
        try:
            rules = dict(rules)
        except (TypeError, ValueError):
            raise TypeError(
                f"rules must be a mapping from a type to a Rule, got {type(rules).__name__}"
            ) from None
    for key, value in rules.items():
        if not isinstance(key, type):
            raise TypeError(f"rules keys must be types, got {key!r}")
        if type(value) is not Rule and value is not AS_LEAF:
            raise TypeError(
                f"rules[{key.__qualname__}] must be a pytree_kit.Rule or pytree_kit.Rule.LEAF, "
                f"got {type(value).__name__}"
            )
    return rules
