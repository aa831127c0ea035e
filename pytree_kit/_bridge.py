"""Rules read from other libraries' registries: ``optree_rules`` and
``jax_rules`` here, ``pytree_kit.torch.torch_rules`` on top of this module.

A bridge builds :class:`Rule` values, which the caller passes as ``rules=``:
nothing is registered anywhere, and importing pytree_kit changes nothing. A
rule looks its class up in the other library's registry each time it runs, so
a spec made with it works in another process that has made the same
registration (a DataLoader worker, a fresh process loading a saved spec).

Each rule is a pair of small callables that compare equal when they name the
same library, class and namespace: two calls of a bridge give equal rules, so
the specs they make are equal. The other library's context (aux data) is kept
as it is, wrapped in :class:`Foreign` where it is not hashable (torch's
contexts are often lists). Children come back named by the other library's
keys where each key is a distinct string (paths then read
``cache['key_cache'][0]``), and by position otherwise.
"""

from __future__ import annotations

import collections
import functools
import sys
from typing import Any, Callable, Iterable, Optional

from ._kinds import Rule

__all__ = [
    "Foreign",
    "bridge_rule",
    "context_names",
    "jax_rules",
    "optree_rules",
    "rules_fix",
    "torch_node",
]

# Classes pytree_kit reads by itself: a bridge never makes a rule for them
NATIVE: frozenset = frozenset(
    {
        type(None),
        tuple,
        list,
        dict,
        collections.OrderedDict,
        collections.defaultdict,
        collections.deque,
    }
)


class Foreign:
    """Another library's aux data (context, metadata, treedef) as hashable aux
    data: equal when the values are ``==``; the hash is the value's own, or one
    computed from its parts when the value is a list, dict or set."""

    __slots__ = ("_hash", "value")
    value: Any
    _hash: int

    def __init__(self, value: Any) -> None:
        object.__setattr__(self, "value", value)
        object.__setattr__(self, "_hash", _hash_of(value))

    def __setattr__(self, name: str, value: object) -> None:
        raise AttributeError("Foreign is immutable")

    def __eq__(self, other: object) -> bool:
        if type(other) is not Foreign:
            return NotImplemented
        if self.value is other.value:
            return True
        try:
            return bool(self.value == other.value)
        except Exception:
            return False

    def __hash__(self) -> int:
        return self._hash

    def __repr__(self) -> str:
        return repr(self.value)

    def __reduce__(self) -> tuple[Any, ...]:
        return (Foreign, (self.value,))


def _hash_of(value: Any) -> int:
    """A hash consistent with ``==`` for the plain data contexts are made of."""
    try:
        return hash(value)
    except TypeError:
        pass
    if isinstance(value, (list, tuple)):
        return hash((list, tuple(_hash_of(v) for v in value)))
    if isinstance(value, dict):
        return hash((dict, frozenset((_hash_of(k), _hash_of(v)) for k, v in value.items())))
    if isinstance(value, (set, frozenset)):
        return hash((set, frozenset(_hash_of(v) for v in value)))
    return hash(type(value))  # equal values share a type; a weak hash, still a valid one


def named(keys: Optional[list], children: list) -> tuple[Any, Optional[tuple]]:
    """``children`` as a dict keyed by ``keys`` when those are distinct strings
    (with the key order to give back), else as a list (and None)."""
    if keys is not None and all(type(k) is str for k in keys) and len(set(keys)) == len(keys):
        return dict(zip(keys, children)), tuple(keys)
    return list(children), None


def in_order(children: Any, keys: Optional[tuple]) -> list:
    """The children as the other library gave them: a list in its order."""
    if keys is None:
        return list(children)
    return [children[k] for k in keys]


class _Half:
    """One half (flatten or unflatten) of a bridged rule: equal to another when
    both name the same library, class and namespace."""

    __slots__ = ("cls", "library", "namespace")
    role = ""
    library: str
    cls: type
    namespace: str

    def __init__(self, library: str, cls: type, namespace: str = "") -> None:
        object.__setattr__(self, "library", library)
        object.__setattr__(self, "cls", cls)
        object.__setattr__(self, "namespace", namespace)

    def __setattr__(self, name: str, value: object) -> None:
        raise AttributeError(f"{type(self).__name__} is immutable")

    def _key(self) -> tuple:
        return (type(self), self.library, self.cls, self.namespace)

    def __eq__(self, other: object) -> bool:
        return isinstance(other, _Half) and self._key() == other._key()

    def __hash__(self) -> int:
        return hash(self._key())

    def __repr__(self) -> str:
        ns = f", namespace={self.namespace!r}" if self.namespace else ""
        return f"<{self.role} of {self.cls.__qualname__} from {self.library}{ns}>"

    def __reduce__(self) -> tuple[Any, ...]:
        return (type(self), (self.library, self.cls, self.namespace))


class BridgeFlatten(_Half):
    role = "flatten"

    def __call__(self, obj: Any) -> tuple[Any, Any]:
        return LIBRARIES[self.library][0](self.cls, self.namespace, obj)


class BridgeUnflatten(_Half):
    role = "unflatten"

    def __call__(self, aux: Any, children: Any) -> Any:
        return LIBRARIES[self.library][1](self.cls, self.namespace, aux, children)


# library name -> (flatten(cls, namespace, obj), unflatten(cls, namespace, aux, children))
LIBRARIES: dict[str, tuple[Callable[..., Any], Callable[..., Any]]] = {}

# library name -> names(cls, namespace): the {"module:qualname": object} its
# registration of cls may hold in a context that a saved spec names
CONTEXT_NAMES: dict[str, Callable[[type, str], dict[str, Any]]] = {}


def context_names(rules: Any) -> dict[str, Any]:
    """``{"module:qualname": object}`` that a JSON document may name inside the
    contexts of the bridged rules among ``rules`` (a ``{cls: Rule}`` mapping):
    the classes and functions defined in the modules that hold the other
    library's registered functions for each class, and, for torch, its
    ``device``, ``Size`` and dtypes. The registering library's code already
    runs when such a rule unflattens; nothing here imports a module."""
    out: dict[str, Any] = {}
    values = getattr(rules, "values", None)
    if not callable(values):  # None, or not a mapping (its own error comes later)
        return out
    for rule in values():
        half = getattr(rule, "flatten", None)
        if isinstance(half, BridgeFlatten) and half.library in CONTEXT_NAMES:
            out.update(CONTEXT_NAMES[half.library](half.cls, half.namespace))
    return out


def _defined_in(functions: Iterable[Any]) -> dict[str, Any]:
    """The classes and functions defined at the top of the (already imported)
    modules that define ``functions``, by ``"module:qualname"``."""
    out: dict[str, Any] = {}
    for name in {getattr(f, "__module__", None) for f in functions if f is not None}:
        module = sys.modules.get(name) if isinstance(name, str) else None
        if module is None:
            continue
        for attr, obj in list(vars(module).items()):
            if (
                (isinstance(obj, type) or callable(obj))
                and getattr(obj, "__module__", None) == name
                and getattr(obj, "__qualname__", None) == attr
            ):
                out[f"{name}:{attr}"] = obj
    return out


def bridge_rule(library: str, cls: type, namespace: str = "") -> Rule:
    """The rule for ``cls`` that reads ``library``'s registration (one of
    :data:`LIBRARIES`) each time it runs."""
    return Rule(BridgeFlatten(library, cls, namespace), BridgeUnflatten(library, cls, namespace))


def rules_for(
    library: str,
    types: Iterable[Any],
    registered: Callable[[type], bool],
    namespace: str = "",
    native: Callable[[type], bool] = NATIVE.__contains__,
) -> dict[type, Rule]:
    """``{cls: rule}`` for ``types``, each of which must be registered, and
    none of which pytree_kit reads by itself (``native``)."""
    out: dict[type, Rule] = {}
    for t in types:
        if not isinstance(t, type):
            raise TypeError(f"{library}_rules: expected classes, got {t!r}")
        if native(t):
            raise TypeError(
                f"{library}_rules: {t.__qualname__} is a container pytree_kit reads by "
                "itself; it needs no rule"
            )
        if not registered(t):
            where = f" in namespace {namespace!r}" if namespace else ""
            raise TypeError(
                f"{library}_rules: {t.__qualname__} is not registered with {library}{where}"
            )
        out[t] = bridge_rule(library, t, namespace)
    return out


# --------------------------------------------------------------------------
# torch (pytree_kit.torch.torch_rules makes these rules; they live here so that
# a spec that holds one works wherever it is unpickled)


def torch_node(cls: Any) -> Any:
    """``torch.utils._pytree``'s registration of ``cls``, or None; never
    imports torch (a class registered there was registered by someone who did)."""
    pytree = sys.modules.get("torch.utils._pytree")
    return None if pytree is None else pytree.SUPPORTED_NODES.get(cls)


def rules_fix(cls: Any, name: str, rule: str) -> str:
    """The ``rules=`` an error suggests for ``cls``: ``{name: rule}``, and first
    ``torch_rules(name)`` when torch's pytree has the class registered."""
    fix = f"rules={{{name}: {rule}}}"
    if torch_node(cls) is not None:
        torch_fix = f"rules=pytree_kit.torch.torch_rules({name})"
        return f"{torch_fix} (it is registered with torch.utils._pytree), or {fix}"
    return fix


def _torch_node(cls: type) -> Any:
    import torch.utils._pytree  # noqa: F401  (registered classes need it loaded)

    node = torch_node(cls)
    if node is None:
        raise TypeError(f"{cls.__qualname__} is no longer registered with torch.utils._pytree")
    return node


def _torch_key_name(key: Any) -> Any:
    """A torch KeyEntry's name: MappingKey's str key, GetAttrKey's name."""
    import torch.utils._pytree as torch_pytree

    if type(key) is torch_pytree.MappingKey and type(key.key) is str:
        return key.key
    if type(key) is torch_pytree.GetAttrKey:
        return key.name
    return None


def _torch_flatten(cls: type, namespace: str, obj: Any) -> tuple[Any, Any]:
    node = _torch_node(cls)
    # children and context from flatten_fn, as torch's own specs take them:
    # unflatten_fn reads that context, which flatten_with_keys_fn's may not be
    # (register_dataclass's holds the field names alone); the keys only name
    # the children
    children, context = node.flatten_fn(obj)
    children = list(children)
    names = None
    if node.flatten_with_keys_fn is not None:
        pairs = list(node.flatten_with_keys_fn(obj)[0])
        if len(pairs) == len(children):
            children, names = named([_torch_key_name(k) for k, _ in pairs], children)
    return children, (Foreign(context), names)


def _torch_unflatten(cls: type, namespace: str, aux: Any, children: Any) -> Any:
    context, keys = aux
    return _torch_node(cls).unflatten_fn(in_order(children, keys), context.value)


def _torch_context_names(cls: type, namespace: str) -> dict[str, Any]:
    node = torch_node(cls)
    if node is None:
        return {}
    out = _defined_in((node.flatten_fn, node.unflatten_fn, node.flatten_with_keys_fn))
    out.update(_torch_values())
    return out


@functools.lru_cache(maxsize=1)
def _torch_values() -> dict[str, Any]:
    """torch's ``device``, ``Size`` and dtypes, by ``"torch:name"`` (read once:
    torch's module holds about 1,500 names)."""
    torch = sys.modules["torch"]  # loaded: a class is registered with its pytree
    out = {"torch:device": torch.device, "torch:Size": torch.Size}
    for attr, value in vars(torch).items():
        if isinstance(value, torch.dtype):
            out[f"torch:{attr}"] = value
    return out


LIBRARIES["torch"] = (_torch_flatten, _torch_unflatten)
CONTEXT_NAMES["torch"] = _torch_context_names


# --------------------------------------------------------------------------
# optree


def _optree_entry(cls: type, namespace: str) -> Any:
    import optree

    entry = optree.register_pytree_node.get(cls, namespace=namespace)
    if entry is None:
        raise TypeError(f"{cls.__qualname__} is no longer registered with optree")
    return entry


def _optree_flatten(cls: type, namespace: str, obj: Any) -> tuple[Any, Any]:
    out = _optree_entry(cls, namespace).flatten_func(obj)
    children, metadata = list(out[0]), out[1]
    entries = list(out[2]) if len(out) > 2 and out[2] is not None else None
    kids, keys = named(entries, children)
    return kids, (Foreign(metadata), keys)


def _optree_unflatten(cls: type, namespace: str, aux: Any, children: Any) -> Any:
    metadata, keys = aux
    return _optree_entry(cls, namespace).unflatten_func(metadata.value, in_order(children, keys))


def _optree_context_names(cls: type, namespace: str) -> dict[str, Any]:
    optree = sys.modules.get("optree")
    entry = None if optree is None else optree.register_pytree_node.get(cls, namespace=namespace)
    if entry is None:
        return {}
    return _defined_in((entry.flatten_func, entry.unflatten_func))


LIBRARIES["optree"] = (_optree_flatten, _optree_unflatten)
CONTEXT_NAMES["optree"] = _optree_context_names


def optree_rules(namespace: str = "", *types: type) -> dict[type, Rule]:
    """Rules for classes registered with optree, to pass as ``rules=``.

    With no ``types``, a rule for every class registered with optree in
    ``namespace`` (and globally) at call time, but those pytree_kit reads by
    itself (builtin containers, namedtuples, structseqs). Each rule calls
    optree's registered functions; nothing is registered anywhere. Children
    are named by optree's entries when those are distinct strings.

    Examples:
        >>> import optree, pytree_kit as pk
        >>> class Pair:
        ...     def __init__(self, a, b):
        ...         self.a, self.b = a, b
        >>> _ = optree.register_pytree_node(
        ...     Pair, lambda p: ((p.a, p.b), None, ("a", "b")), lambda _, ch: Pair(*ch),
        ...     namespace="doc")
        >>> pairs, spec = pk.flatten_with_path([Pair(1, 2)], rules=pk.optree_rules("doc", Pair))
        >>> [(pk.keystr(p), x) for p, x in pairs]
        [("[0]['a']", 1), ("[0]['b']", 2)]
    """
    import optree

    if not isinstance(namespace, str):
        raise TypeError(
            f"optree_rules(namespace, *types): namespace must be a str, got {namespace!r}"
        )
    if not types:
        table: dict = optree.register_pytree_node.get(None, namespace=namespace)  # type: ignore[arg-type, assignment]
        types = tuple(t for t in table if isinstance(t, type) and not _optree_native(t))
    return rules_for(
        "optree",
        types,
        lambda t: optree.register_pytree_node.get(t, namespace=namespace) is not None,
        namespace,
        _optree_native,
    )


def _optree_native(t: type) -> bool:
    import optree

    return t in NATIVE or t is optree.typing.StructSequence


# --------------------------------------------------------------------------
# jax


#: jax's own tree_flatten_with_path, bound by the first jax_rules (or the
#: first rule run in a process that unpickled one), so that code that puts
#: pytree_kit behind jax's public names does not make the rules call
#: themselves: the function where jax defines it (``jax._src.tree_util``,
#: which such code leaves alone), else the public one.
_jax_flatten_with_path: Any = None


def _bind_jax() -> Any:
    global _jax_flatten_with_path
    if _jax_flatten_with_path is None:
        try:
            from jax._src.tree_util import tree_flatten_with_path as own
        except ImportError:  # a jax that defines it elsewhere
            from jax.tree_util import tree_flatten_with_path as own
        _jax_flatten_with_path = own
    return _jax_flatten_with_path


def _jax_flatten(cls: type, namespace: str, obj: Any) -> tuple[Any, Any]:
    # one level: everything below obj is a leaf (in every jax this project
    # supports; flatten_one_level_with_keys is newer than 3.10's jax)
    pairs, treedef = _bind_jax()(obj, is_leaf=lambda x: x is not obj)
    if len(pairs) == 1 and pairs[0][0] == ():
        raise TypeError(f"{cls.__qualname__} is not registered with jax.tree_util")
    keys = [_jax_key_name(path[0]) for path, _ in pairs]
    kids, names = named(keys, [c for _, c in pairs])
    return kids, (Foreign(treedef), names)


def _jax_key_name(key: Any) -> Any:
    for attr in ("name", "key"):  # GetAttrKey.name, DictKey.key
        if hasattr(key, attr) and type(getattr(key, attr)) is str:
            return getattr(key, attr)
    return None


def _jax_unflatten(cls: type, namespace: str, aux: Any, children: Any) -> Any:
    treedef, keys = aux
    return treedef.value.unflatten(in_order(children, keys))


LIBRARIES["jax"] = (_jax_flatten, _jax_unflatten)


def jax_rules(*types: type) -> dict[type, Rule]:
    """Rules for classes registered with ``jax.tree_util``, to pass as ``rules=``.

    ``jax.tree_util`` has no public list of its registrations, so the classes
    are named; one that is not registered raises TypeError when its rule first
    runs. Each rule calls jax's registered functions; nothing is
    registered anywhere. Children are named by jax's keys when they are
    distinct strings (``GetAttrKey``, ``DictKey`` of a str).

    Examples:
        >>> import jax, pytree_kit as pk
        >>> class Box:
        ...     def __init__(self, v):
        ...         self.v = v
        >>> jax.tree_util.register_pytree_node(
        ...     Box, lambda b: ((b.v,), None), lambda _, ch: Box(*ch))
        >>> pk.leaves({"b": [Box(1.0)]}, rules=pk.jax_rules(Box))
        [1.0]
    """
    if not types:
        raise TypeError(
            "jax_rules(*types): name the classes (jax.tree_util has no public list of "
            "its registrations)"
        )
    _bind_jax()
    # jax can only say whether an instance is a node: a class that is not
    # registered raises TypeError when its rule first runs
    return rules_for("jax", types, lambda t: True)
