"""Node kinds of the spec format, the fields a record node holds, and :class:`Rule`.

These integers are part of the spec format shared by every engine; see
``docs/design.md``. Never renumber them: pickles hold them.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Callable

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


#: The one node every leaf shares: (kind, type, arity, aux).
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
    so ``unflatten`` needs nothing more.

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
    """

    __slots__ = ("flatten", "unflatten")
    flatten: Callable[[Any], tuple[Any, Any]]
    unflatten: Callable[[Any, Any], Any]

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
        if type(value) is not Rule:
            raise TypeError(
                f"rules[{key.__qualname__}] must be a pytree_kit.Rule, got {type(value).__name__}"
            )
    return rules
