"""optree's tree functions on pytree_kit, as ``docs/migration/optree.md`` maps them.

``install()`` replaces the public functions of ``optree`` (and the
``optree.treespec`` aliases) with pytree_kit calls: ``none_is_leaf=True`` is
``is_leaf`` composed with ``x is None``, ``namespace=`` is
``rules=pk.optree_rules(namespace)`` (global registrations included), raw
paths are the keys' fields, ``dict_insertion_ordered`` is the guide's
``rules={dict: insertion_order}``, the ``treespec_<container>`` constructors
are ``pk.TreeSpec.from_collection`` of that container. Specs come back in
:class:`PyTreeSpec`, a wrapper that only renames ``pk.TreeSpec``'s methods to
optree's (``kind``'s names become ``PyTreeKind`` members; ``len`` and
``is_leaf(strict=...)`` are pytree_kit's own, with optree's meaning).

Kept as optree's: the registry (``register_pytree_node``,
``register_pytree_node_class``, ``unregister_pytree_node``: the user's setup,
which ``pk.optree_rules`` reads), the constants, ``PyTreeKind``, the entry
classes and ``PyTreeAccessor`` (types a user keeps), ``optree.typing``,
``optree.utils`` and ``optree.functools``.
"""

from __future__ import annotations

import collections
import contextlib
import types
from typing import Any, Callable, Iterator

from peer_shims import CALLS, kept, mapped, missing, not_applicable

import pytree_kit as pk

_NO_DEFAULT = object()
_FIELD = {pk.DictKey: "key", pk.SequenceKey: "idx", pk.GetAttrKey: "name"}

#: dict_insertion_ordered's modes, by namespace (optree's global one included)
_ORDERED: dict = {}


def _raw(path: tuple) -> tuple:
    """optree's raw path: the fields of the keys (the guide's Paths recipe)."""
    return tuple(getattr(k, _FIELD[type(k)]) for k in path)


def _dict_children(d: dict) -> tuple:
    return d, None


def _dict_rebuild(aux: Any, children: dict) -> dict:
    return dict(children)


#: the guide's dict_insertion_ordered recipe
_INSERTION_ORDER = pk.Rule(_dict_children, _dict_rebuild)


def _opts(is_leaf: Any = None, none_is_leaf: bool = False, namespace: str = "") -> dict:
    """is_leaf= and rules= for optree's is_leaf, none_is_leaf and namespace."""
    if none_is_leaf:
        user = is_leaf

        def is_leaf(x: Any) -> bool:
            return (user is not None and bool(user(x))) or x is None

    rules = dict(pk.optree_rules(namespace))
    import optree.registry

    glob = optree.registry.__dict__["__GLOBAL_NAMESPACE"]
    if _ORDERED.get(glob) or (namespace and _ORDERED.get(namespace)):
        rules[dict] = _INSERTION_ORDER
    return {"is_leaf": is_leaf, "rules": rules or None}


def _wrap(spec: pk.TreeSpec) -> PyTreeSpec:
    out = object.__new__(PyTreeSpec)
    out._spec = spec
    return out


def _unwrap(spec: Any) -> Any:
    return spec._spec if isinstance(spec, PyTreeSpec) else spec


_KINDS: dict = {}


def _kind(name: str) -> Any:
    import optree

    if not _KINDS:
        k = optree.PyTreeKind
        _KINDS.update(
            leaf=k.LEAF,
            none=k.NONE,
            tuple=k.TUPLE,
            list=k.LIST,
            dict=k.DICT,
            ordereddict=k.ORDEREDDICT,
            defaultdict=k.DEFAULTDICT,
            deque=k.DEQUE,
            namedtuple=k.NAMEDTUPLE,
            structseq=k.STRUCTSEQUENCE,
            dataclass=k.CUSTOM,
            attrs=k.CUSTOM,
            custom=k.CUSTOM,
            rule=k.CUSTOM,
        )
    return _KINDS[name]


def _na_property(name: str) -> property:
    def get(self: PyTreeSpec) -> Any:
        not_applicable(f"PyTreeSpec.{name}: pytree_kit has no counterpart")

    return property(get)


class PyTreeSpec:
    """A ``pk.TreeSpec`` under optree's method names."""

    __slots__ = ("_spec",)
    _spec: pk.TreeSpec

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        pk.TreeSpec(*args, **kwargs)  # raises TypeError: specs are not built directly

    num_leaves = property(mapped(lambda self: self._spec.num_leaves))
    num_nodes = property(mapped(lambda self: self._spec.num_nodes))
    num_children = property(mapped(lambda self: self._spec.num_children))
    type = property(mapped(lambda self: self._spec.type))
    kind = property(mapped(lambda self: _kind(self._spec.kind)))
    namespace = _na_property("namespace")
    none_is_leaf = _na_property("none_is_leaf")

    @mapped
    def unflatten(self, leaves: Any) -> Any:
        return self._spec.unflatten(leaves)

    @mapped
    def flatten_up_to(self, tree: Any) -> list:
        return self._spec.flatten_up_to(tree)

    @mapped
    def is_leaf(self, strict: bool = True) -> bool:
        return self._spec.is_leaf(strict=strict)

    @mapped
    def entries(self) -> list:
        return self._spec.entries()

    @mapped
    def entry(self, index: int) -> Any:
        return self._spec.entries()[index]

    @mapped
    def children(self) -> list:
        return [_wrap(c) for c in self._spec.children()]

    @mapped
    def child(self, index: int) -> PyTreeSpec:
        return _wrap(self._spec.children()[index])

    @mapped
    def paths(self) -> list:
        return [_raw(p) for p in self._spec.paths()]

    @mapped
    def accessors(self) -> list:
        return self._spec.accessors()

    @mapped
    def compose(self, inner: Any) -> PyTreeSpec:
        return _wrap(self._spec.compose(_unwrap(inner)))

    @mapped
    def is_prefix(self, other: Any, strict: bool = False) -> bool:
        return self._spec.is_prefix(_unwrap(other), strict=strict)

    @mapped
    def is_suffix(self, other: Any, strict: bool = False) -> bool:
        return self._spec.is_suffix(_unwrap(other), strict=strict)

    @mapped
    def transform(self, f_node: Any = None, f_leaf: Any = None) -> PyTreeSpec:
        def call(f: Any) -> Any:
            return None if f is None else (lambda spec: _unwrap(f(_wrap(spec))))

        return _wrap(self._spec.transform(call(f_node), call(f_leaf)))

    one_level = missing("PyTreeSpec.one_level")
    is_one_level = missing("PyTreeSpec.is_one_level")
    walk = missing("PyTreeSpec.walk")
    traverse = missing("PyTreeSpec.traverse")
    broadcast_to_common_suffix = missing("PyTreeSpec.broadcast_to_common_suffix")
    __getstate__ = missing("PyTreeSpec.__getstate__", "pickles by __reduce__, no state")
    __setstate__ = missing("PyTreeSpec.__setstate__", "pickles by __reduce__, no state")

    @mapped
    def __len__(self) -> int:
        return len(self._spec)

    def _compare(op: str) -> Callable[..., Any]:  # type: ignore[misc]
        def method(self: PyTreeSpec, other: Any) -> Any:
            if not isinstance(other, PyTreeSpec):
                return NotImplemented
            CALLS[0] += 1
            return getattr(self._spec, op)(other._spec)

        method.__name__ = op
        return method

    __eq__ = _compare("__eq__")
    __ne__ = _compare("__ne__")
    __lt__ = _compare("__lt__")
    __le__ = _compare("__le__")
    __gt__ = _compare("__gt__")
    __ge__ = _compare("__ge__")
    del _compare

    def __hash__(self) -> int:
        CALLS[0] += 1
        return hash(self._spec)

    def __repr__(self) -> str:
        CALLS[0] += 1
        return "Py" + repr(self._spec)

    def __reduce__(self) -> tuple:
        return (_wrap, (self._spec,))

    def __copy__(self) -> PyTreeSpec:
        return self

    def __deepcopy__(self, memo: Any) -> PyTreeSpec:
        return self


# -- flatten, unflatten and the like -------------------------------------------


def _tree_fn(pk_fn: Callable, out: Callable = lambda result: result) -> Callable:
    """optree's ``(tree, is_leaf=None, *, none_is_leaf=False, namespace="")``
    function: ``pk_fn`` with the is_leaf= and rules= of :func:`_opts`, its
    result through ``out``."""

    def call(
        tree: Any, is_leaf: Any = None, *, none_is_leaf: bool = False, namespace: str = ""
    ) -> Any:
        return out(pk_fn(tree, **_opts(is_leaf, none_is_leaf, namespace)))

    return call


def _one_level(result: tuple) -> tuple:
    # (children, spec) here: the spec stands for optree's metadata, and
    # spec.unflatten for its unflatten function
    children, spec = result
    return children, _wrap(spec), tuple(spec.entries()), lambda metadata, kids: spec.unflatten(kids)


tree_flatten = _tree_fn(pk.flatten, lambda r: (r[0], _wrap(r[1])))
tree_flatten_with_path = _tree_fn(
    pk.flatten_with_path, lambda r: ([_raw(p) for p, _ in r[0]], [x for _, x in r[0]], _wrap(r[1]))
)
tree_flatten_with_accessor = _tree_fn(
    pk.flatten_with_accessor, lambda r: ([a for a, _ in r[0]], [x for _, x in r[0]], _wrap(r[1]))
)
tree_iter = _tree_fn(pk.tree_iter)
tree_leaves = _tree_fn(pk.leaves)
tree_structure = _tree_fn(pk.structure, _wrap)
tree_paths = _tree_fn(pk.flatten_with_path, lambda r: [_raw(p) for p, _ in r[0]])
tree_accessors = _tree_fn(pk.structure, lambda spec: spec.accessors())
tree_is_leaf = _tree_fn(pk.tree_is_leaf)
tree_flatten_one_level = _tree_fn(pk.flatten_one_level, _one_level)


def all_leaves(
    iterable: Any, is_leaf: Any = None, *, none_is_leaf: bool = False, namespace: str = ""
) -> bool:
    return pk.all_leaves(iterable, **_opts(is_leaf, none_is_leaf, namespace))


def tree_unflatten(treespec: Any, leaves: Any) -> Any:
    return pk.unflatten(_unwrap(treespec), leaves)


# -- maps ----------------------------------------------------------------------


def _map_fn(as_path: Callable | None = None) -> Callable:
    """optree's ``tree_map`` (``as_path`` None), or a ``_with_path`` or
    ``_with_accessor`` one: ``pk.tree_map_with_path``, ``func`` given each path
    as ``as_path`` makes it."""

    def call(
        func: Callable,
        tree: Any,
        *rests: Any,
        is_leaf: Any = None,
        none_is_leaf: bool = False,
        namespace: str = "",
    ) -> Any:
        opts = _opts(is_leaf, none_is_leaf, namespace)
        if as_path is None:
            return pk.tree_map(func, tree, *rests, **opts)

        def by_path(path: tuple, *xs: Any) -> Any:
            return func(as_path(path), *xs)

        return pk.tree_map_with_path(by_path, tree, *rests, **opts)

    return call


tree_map = _map_fn()
tree_map_with_path = _map_fn(_raw)
tree_map_with_accessor = _map_fn(pk.Accessor)


def tree_replace_nones(sentinel: Any, tree: Any, namespace: str = "") -> Any:
    return pk.tree_replace_nones(sentinel, tree, rules=_opts(namespace=namespace)["rules"])


def tree_partition(
    predicate: Callable,
    tree: Any,
    is_leaf: Any = None,
    *,
    fillvalue: Any = None,
    none_is_leaf: bool = False,
    namespace: str = "",
) -> tuple:
    opts = _opts(is_leaf, none_is_leaf, namespace)
    return pk.tree_partition(predicate, tree, fillvalue=fillvalue, **opts)


def tree_transpose(outer_treespec: Any, inner_treespec: Any, tree: Any, is_leaf: Any = None) -> Any:
    # no namespace argument: optree's global registrations, as rules=
    return pk.tree_transpose(
        _unwrap(outer_treespec),
        _unwrap(inner_treespec),
        tree,
        is_leaf=is_leaf,
        rules=_opts()["rules"],
    )


def tree_broadcast_prefix(
    prefix_tree: Any,
    full_tree: Any,
    is_leaf: Any = None,
    *,
    none_is_leaf: bool = False,
    namespace: str = "",
) -> Any:
    return pk.tree_broadcast_prefix(
        prefix_tree, full_tree, **_opts(is_leaf, none_is_leaf, namespace)
    )


def broadcast_prefix(
    prefix_tree: Any,
    full_tree: Any,
    is_leaf: Any = None,
    *,
    none_is_leaf: bool = False,
    namespace: str = "",
) -> list:
    opts = _opts(is_leaf, none_is_leaf, namespace)
    full = pk.tree_broadcast_prefix(prefix_tree, full_tree, **opts)
    return pk.structure(full_tree, **opts).flatten_up_to(full)


# -- reductions ----------------------------------------------------------------


def tree_reduce(
    func: Callable,
    tree: Any,
    initial: Any = _NO_DEFAULT,
    *,
    is_leaf: Any = None,
    none_is_leaf: bool = False,
    namespace: str = "",
) -> Any:
    args = () if initial is _NO_DEFAULT else (initial,)
    return pk.tree_reduce(func, tree, *args, **_opts(is_leaf, none_is_leaf, namespace))


def tree_sum(
    tree: Any,
    start: Any = 0,
    *,
    is_leaf: Any = None,
    none_is_leaf: bool = False,
    namespace: str = "",
) -> Any:
    return pk.tree_sum(tree, start, **_opts(is_leaf, none_is_leaf, namespace))


def _extremum(fn: Callable) -> Callable:
    def extremum(
        tree: Any,
        *,
        default: Any = _NO_DEFAULT,
        key: Any = None,
        is_leaf: Any = None,
        none_is_leaf: bool = False,
        namespace: str = "",
    ) -> Any:
        kwargs = {} if default is _NO_DEFAULT else {"default": default}
        return fn(tree, key=key, **kwargs, **_opts(is_leaf, none_is_leaf, namespace))

    return extremum


def _truth(fn: Callable) -> Callable:
    def truth(
        tree: Any, *, is_leaf: Any = None, none_is_leaf: bool = False, namespace: str = ""
    ) -> bool:
        return fn(tree, **_opts(is_leaf, none_is_leaf, namespace))

    return truth


# -- treespec functions --------------------------------------------------------


def treespec_paths(treespec: Any) -> list:
    return [_raw(p) for p in _unwrap(treespec).paths()]


def treespec_accessors(treespec: Any) -> list:
    return _unwrap(treespec).accessors()


def treespec_entries(treespec: Any) -> list:
    return _unwrap(treespec).entries()


def treespec_entry(treespec: Any, index: int) -> Any:
    return _unwrap(treespec).entries()[index]


def treespec_children(treespec: Any) -> list:
    return [_wrap(c) for c in _unwrap(treespec).children()]


def treespec_child(treespec: Any, index: int) -> Any:
    return _wrap(_unwrap(treespec).children()[index])


def treespec_transform(treespec: Any, f_node: Any = None, f_leaf: Any = None) -> Any:
    return _wrap(_unwrap(treespec)).transform(f_node, f_leaf)


def treespec_is_leaf(treespec: Any, *, strict: bool = True) -> bool:
    return _wrap(_unwrap(treespec)).is_leaf(strict=strict)


def treespec_is_strict_leaf(treespec: Any) -> bool:
    return _unwrap(treespec).is_leaf()


def treespec_is_prefix(treespec: Any, other_treespec: Any, *, strict: bool = False) -> bool:
    return _unwrap(treespec).is_prefix(_unwrap(other_treespec), strict=strict)


def treespec_is_suffix(treespec: Any, other_treespec: Any, *, strict: bool = False) -> bool:
    return _unwrap(treespec).is_suffix(_unwrap(other_treespec), strict=strict)


def treespec_leaf(*, none_is_leaf: bool = False, namespace: str = "") -> Any:
    return _wrap(pk.TreeSpec.leaf())


def treespec_none(*, none_is_leaf: bool = False, namespace: str = "") -> Any:
    return _wrap(pk.structure(None, **_opts(None, none_is_leaf, namespace)))


def _collection(collection: Any, namespace: str) -> Any:
    """pk.TreeSpec.from_collection of a collection of wrapped specs."""
    rules = _opts(namespace=namespace)["rules"]
    inner = pk.tree_map(_unwrap, collection, rules=rules)
    return _wrap(pk.TreeSpec.from_collection(inner, rules=rules))


def treespec_from_collection(
    collection: Any, *, none_is_leaf: bool = False, namespace: str = ""
) -> Any:
    return _collection(collection, namespace)


def treespec_tuple(iterable: Any = (), *, none_is_leaf: bool = False, namespace: str = "") -> Any:
    return _collection(tuple(iterable), namespace)


def treespec_list(iterable: Any = (), *, none_is_leaf: bool = False, namespace: str = "") -> Any:
    return _collection(list(iterable), namespace)


def treespec_dict(
    mapping: Any = (), *, none_is_leaf: bool = False, namespace: str = "", **kwargs: Any
) -> Any:
    return _collection(dict(mapping, **kwargs), namespace)


def treespec_ordereddict(
    mapping: Any = (), *, none_is_leaf: bool = False, namespace: str = "", **kwargs: Any
) -> Any:
    return _collection(collections.OrderedDict(mapping, **kwargs), namespace)


def treespec_defaultdict(
    default_factory: Any = None,
    mapping: Any = (),
    *,
    none_is_leaf: bool = False,
    namespace: str = "",
    **kwargs: Any,
) -> Any:
    return _collection(collections.defaultdict(default_factory, mapping, **kwargs), namespace)


def treespec_deque(
    iterable: Any = (), maxlen: Any = None, *, none_is_leaf: bool = False, namespace: str = ""
) -> Any:
    return _collection(collections.deque(iterable, maxlen), namespace)


def treespec_namedtuple(namedtuple: Any, *, none_is_leaf: bool = False, namespace: str = "") -> Any:
    return _collection(namedtuple, namespace)


def treespec_structseq(structseq: Any, *, none_is_leaf: bool = False, namespace: str = "") -> Any:
    return _collection(structseq, namespace)


@contextlib.contextmanager
def dict_insertion_ordered(mode: bool, *, namespace: str) -> Iterator[None]:
    """The mode, for the calls of the shim to read (no pytree_kit call)."""
    previous = _ORDERED.get(namespace, False)
    _ORDERED[namespace] = bool(mode)
    try:
        yield
    finally:
        _ORDERED[namespace] = previous


NOT_IN_PYTREE_KIT = {
    "tree_map_": "in place: pytree_kit's maps build new trees",
    "tree_map_with_path_": "in place: pytree_kit's maps build new trees",
    "tree_map_with_accessor_": "in place: pytree_kit's maps build new trees",
    "tree_transpose_map": "pytree_kit has no counterpart",
    "tree_transpose_map_with_path": "pytree_kit has no counterpart",
    "tree_transpose_map_with_accessor": "pytree_kit has no counterpart",
    "tree_broadcast_common": "pytree_kit has no counterpart",
    "broadcast_common": "pytree_kit has no counterpart",
    "tree_broadcast_map": "pytree_kit has no counterpart",
    "tree_broadcast_map_with_path": "pytree_kit has no counterpart",
    "tree_broadcast_map_with_accessor": "pytree_kit has no counterpart",
    "prefix_errors": "pytree_kit has no counterpart",
    "treespec_one_level": "pytree_kit has no counterpart",
    "treespec_is_one_level": "pytree_kit has no counterpart",
    "treespec_frozendict": "frozendict is not a container in pytree_kit",
    "namedtuple_fields": "pytree_kit has no counterpart",
    "structseq_fields": "pytree_kit has no counterpart",
}

REGISTRY = ("register_pytree_node", "register_pytree_node_class", "unregister_pytree_node")


def install() -> None:
    import optree
    import optree.treespec

    shim = globals()
    table: dict[str, Any] = {
        "tree_max": _extremum(pk.tree_max),
        "tree_min": _extremum(pk.tree_min),
        "tree_all": _truth(pk.tree_all),
        "tree_any": _truth(pk.tree_any),
        "is_namedtuple": pk.is_namedtuple,
        "is_namedtuple_class": pk.is_namedtuple_class,
        "is_namedtuple_instance": pk.is_namedtuple_instance,
        "is_structseq": pk.is_structseq,
        "is_structseq_class": pk.is_structseq_class,
        "is_structseq_instance": pk.is_structseq_instance,
    }
    for name in optree.__all__:
        value = getattr(optree, name)
        if name in REGISTRY or isinstance(value, type) or not callable(value):
            continue  # the registry, kinds, entries, accessors, typing, constants
        if name == "dict_insertion_ordered":
            setattr(optree, name, dict_insertion_ordered)
        elif name in NOT_IN_PYTREE_KIT:
            setattr(optree, name, missing(name, NOT_IN_PYTREE_KIT[name]))
        elif name in table:
            setattr(optree, name, mapped(table[name]))
        elif name in shim:
            fn = mapped(shim[name])
            fn.__name__ = fn.__qualname__ = name  # (_tree_fn's functions are all "call")
            setattr(optree, name, fn)
        else:
            raise AssertionError(f"optree.{name} is neither mapped nor missing")
    for name in REGISTRY:  # the user's setup, which pk.optree_rules reads
        setattr(optree, name, kept(getattr(optree, name)))
    optree.PyTreeSpec = optree.PyTreeDef = PyTreeSpec
    for name in optree.treespec.__all__:
        setattr(optree.treespec, name, getattr(optree, f"treespec_{name}"))


def patched_modules() -> list[types.ModuleType]:
    """The modules ``install`` put pytree_kit behind (for the check that
    leaves no function to optree)."""
    import optree
    import optree.treespec

    return [optree, optree.treespec]
