"""Path keys: the steps of a path from the root of a tree to one of its places.

A path is a tuple of keys. :func:`keystr` renders it the way every error
message of pytree_kit names a place in a tree, for example
``['targets'][3].boxes``.
"""

from __future__ import annotations

from typing import Any, Callable, Iterable, Optional, SupportsIndex, overload

from . import _interface

__all__ = ["Accessor", "DictKey", "GetAttrKey", "SequenceKey", "keystr"]


class _Key:
    __slots__ = ()

    def __setattr__(self, name: str, value: object) -> None:
        raise AttributeError(f"{type(self).__name__} is immutable")

    def __delattr__(self, name: str) -> None:
        raise AttributeError(f"{type(self).__name__} is immutable")


class DictKey(_Key):
    """A mapping key: the child ``obj[key]``. Rendered as ``[repr(key)]``.

    Examples:
        >>> str(DictKey("boxes"))
        "['boxes']"
    """

    __slots__ = ("key",)
    __match_args__ = ("key",)  # case DictKey(x): as jax's keys
    key: Any

    def __init__(self, key: Any) -> None:
        object.__setattr__(self, "key", key)

    def __str__(self) -> str:
        return f"[{self.key!r}]"

    def __repr__(self) -> str:
        return f"DictKey(key={self.key!r})"

    def __eq__(self, other: object) -> bool:
        return type(other) is DictKey and self.key == other.key

    def __hash__(self) -> int:
        return hash((DictKey, self.key))

    def __reduce__(self) -> tuple[Any, ...]:
        return (DictKey, (self.key,))


class SequenceKey(_Key):
    """A position in a sequence: the child ``obj[idx]``. Rendered as ``[idx]``.

    Examples:
        >>> str(SequenceKey(3))
        '[3]'
    """

    __slots__ = ("idx",)
    __match_args__ = ("idx",)  # case SequenceKey(x): as jax's keys
    idx: int

    def __init__(self, idx: int) -> None:
        object.__setattr__(self, "idx", idx)

    def __str__(self) -> str:
        return f"[{self.idx}]"

    def __repr__(self) -> str:
        return f"SequenceKey(idx={self.idx})"

    def __eq__(self, other: object) -> bool:
        return type(other) is SequenceKey and self.idx == other.idx

    def __hash__(self) -> int:
        return hash((SequenceKey, self.idx))

    def __reduce__(self) -> tuple[Any, ...]:
        return (SequenceKey, (self.idx,))


class GetAttrKey(_Key):
    """A named field (namedtuple, structseq, dataclass, attrs): ``obj.name``.

    Examples:
        >>> str(GetAttrKey("boxes"))
        '.boxes'
    """

    __slots__ = ("name",)
    __match_args__ = ("name",)  # case GetAttrKey(x): as jax's keys
    name: str

    def __init__(self, name: str) -> None:
        object.__setattr__(self, "name", name)

    def __str__(self) -> str:
        return f".{self.name}"

    def __repr__(self) -> str:
        return f"GetAttrKey(name={self.name!r})"

    def __eq__(self, other: object) -> bool:
        return type(other) is GetAttrKey and self.name == other.name

    def __hash__(self) -> int:
        return hash((GetAttrKey, self.name))

    def __reduce__(self) -> tuple[Any, ...]:
        return (GetAttrKey, (self.name,))


def keystr(path: Iterable[Any], *, simple: bool = False, separator: str | None = None) -> str:
    """Render a path (a tuple of keys) as text.

    By default each key is written as Python would index with it, so the text
    reads back unambiguously (:func:`pytree_kit.parse_keystr`). With
    ``simple=True`` a key is written bare (``targets``, ``3``, ``boxes``): more
    compact, as jax's ``keystr(..., simple=True)``, but ``3`` may then be a
    position or a mapping key, and a key may contain the separator.
    ``separator`` goes between the keys (default: nothing).

    Examples:
        >>> path = (DictKey("targets"), SequenceKey(3), GetAttrKey("boxes"))
        >>> keystr(path)
        "['targets'][3].boxes"
        >>> keystr(path, simple=True, separator="/")
        'targets/3/boxes'
        >>> keystr(())
        ''
    """
    if separator is None and not simple:
        # the engine's: the C engine writes the three key classes' text in C
        return _interface.engine.keystr(path)
    text = _simple if simple else str
    if separator is None:
        return "".join(map(text, path))
    if type(separator) is not str:
        raise TypeError(f"keystr: separator must be a str, got {type(separator).__name__}")
    return separator.join(map(text, path))


def _simple(key: Any) -> str:
    t = type(key)
    if t is DictKey:
        return str(key.key)
    if t is SequenceKey:
        return str(key.idx)
    if t is GetAttrKey:
        return key.name
    return str(key)


_KEY_TYPES = (DictKey, SequenceKey, GetAttrKey)


class Accessor(tuple[Any, ...]):
    """A path that fetches what stands at it: ``acc(tree)`` is
    :func:`pytree_kit.tree_get` of ``tree`` at ``acc``. optree's
    ``PyTreeAccessor``; ``spec.accessors()`` and
    :func:`pytree_kit.flatten_with_accessor` give one per leaf.

    An accessor is a tuple of :class:`DictKey`, :class:`SequenceKey` and
    :class:`GetAttrKey`, the path :func:`pytree_kit.flatten_with_path`
    gives for the same place, and it is equal to that path (and hashes as
    it does), so either finds the other in a dict or a set. A slice of an
    accessor, and an accessor joined to a path with ``+``, are accessors.
    ``str(acc)`` is ``keystr(acc)``. Immutable, hashable and picklable.

    ``acc(tree, is_leaf=..., rules=...)`` takes the arguments of
    ``tree_get``: a class flattened by a rule needs the rule again. A path
    that is not in the tree raises as ``tree_get`` does, naming the part
    of the path that exists.

    Examples:
        >>> import pytree_kit as pk
        >>> acc = pk.structure({"a": [0, (0, 0)]}).accessors()[2]
        >>> acc
        Accessor(['a'][1][1])
        >>> acc({"a": ["x", ("y", "z")]})
        'z'
        >>> acc == (pk.DictKey("a"), pk.SequenceKey(1), pk.SequenceKey(1)), str(acc[:1])
        (True, "['a']")
        >>> acc({"a": ["x"]})
        Traceback (most recent call last):
        ...
        IndexError: tree_get: tree['a'] is a list of 1, which has no [1]
    """

    __slots__ = ()

    def __new__(cls, keys: Iterable[Any] = ()) -> Accessor:
        keys = tuple(keys)
        for key in keys:
            if type(key) not in _KEY_TYPES:
                raise TypeError(
                    "Accessor: a path's keys are DictKey, SequenceKey or GetAttrKey, "
                    f"got {type(key).__name__}"
                )
        return tuple.__new__(cls, keys)

    def __call__(
        self, tree: Any, *, is_leaf: Optional[Callable[[Any], bool]] = None, rules: Any = None
    ) -> Any:
        return _interface.engine.tree_get(tree, tuple(self), is_leaf, rules)

    @overload
    def __getitem__(self, index: SupportsIndex) -> Any: ...

    @overload
    def __getitem__(self, index: slice) -> Accessor: ...

    def __getitem__(self, index: Any) -> Any:
        got = tuple.__getitem__(self, index)
        return tuple.__new__(Accessor, got) if type(index) is slice else got

    def __add__(self, other: Any) -> Accessor:
        if not isinstance(other, tuple):
            return NotImplemented
        return Accessor((*self, *other))

    def __radd__(self, other: Any) -> Accessor:
        if not isinstance(other, tuple):
            return NotImplemented
        return Accessor((*other, *self))

    def __str__(self) -> str:
        return keystr(self)

    def __repr__(self) -> str:
        return f"Accessor({keystr(self)})"

    def __reduce__(self) -> tuple[Any, ...]:
        return (Accessor, (tuple(self),))


def accessor(path: tuple) -> Accessor:
    """The accessor of a path the engines made (its keys are not checked again)."""
    return tuple.__new__(Accessor, path)


def where(path: Iterable[Any]) -> str:
    """The place a path names, as error messages write it: ``tree['a'][0]``."""
    return "tree" + keystr(path)
