"""``jax.tree_util``, ``jax.tree`` and ``jax.flatten_util`` on pytree_kit, as
``docs/migration/jax.md`` maps them.

The public modules are patched in place (``from jax import tree_util`` then
finds pytree_kit behind jax's names); ``jax._src`` is left alone, so jit,
vmap and jax's own internals keep jax's tree functions.

- The tree functions call pytree_kit with ``rules=pk.jax_rules(...)`` naming
  every class registered with jax so far (the guide's bridge for classes
  registered with ``jax.tree_util``).
- The registration functions stay jax's (user setup: the classes must stay
  registered with jax for jit and for the bridge); the shim only notes each
  class they register, to name it to ``pk.jax_rules``.
- ``pk.jax_rules`` runs a registered class's flatten through jax's own
  ``tree_flatten_with_path`` (bound where jax defines it), so the shim needs
  nothing to keep pytree_kit's bridge from calling back into it.
- Specs are pytree_kit's ``TreeSpec`` behind :class:`PyTreeDef`, which only
  renames: jax's method names, and its class name in the repr.
- Kept as jax's: ``Partial`` (a class registered with jax, named to the
  bridge), ``jax.tree.static`` (a ``dataclasses.field`` with the
  ``metadata={"static": True}`` marker pytree_kit reads), and the typing
  aliases ``KeyEntry`` and ``KeyPath``. The key classes are pytree_kit's, as
  the guide maps them (``FlattenedIndexKey`` is ``pk.SequenceKey``).
"""

from __future__ import annotations

import functools
import inspect
import sys
import types
from typing import Any, Callable, Iterable

import pytest
from peer_shims import SpecWrapper, kept, mapped, missing, not_applicable, registry

import pytree_kit as pk

#: classes registered with jax through its public functions, for pk.jax_rules
REGISTERED: list[type] = []

_UNSET: Any = object()


def _rules() -> Any:
    return pk.jax_rules(*REGISTERED) if REGISTERED else None


def _path_arg() -> bool:
    """Whether pytree_kit takes jax's ``is_leaf_takes_path=``."""
    return "is_leaf_takes_path" in inspect.signature(pk.flatten_with_path).parameters


class PyTreeDef(SpecWrapper):
    """A ``pk.TreeSpec`` under jax's names."""

    __slots__ = ()

    def __init__(self, spec: pk.TreeSpec) -> None:
        object.__setattr__(self, "spec", spec)

    @mapped
    def children(self) -> list[PyTreeDef]:
        return [PyTreeDef(c) for c in self.spec.children()]

    @mapped
    def compose(self, inner: Any) -> PyTreeDef:
        return PyTreeDef(self.spec.compose(_spec(inner)))

    node_data = staticmethod(missing("PyTreeDef.node_data"))
    walk = staticmethod(missing("PyTreeDef.walk"))
    serialize_using_proto = staticmethod(missing("PyTreeDef.serialize_using_proto"))
    deserialize_using_proto = staticmethod(missing("PyTreeDef.deserialize_using_proto"))
    from_iterable_tree = staticmethod(missing("PyTreeDef.from_iterable_tree"))
    from_node_data_and_children = staticmethod(missing("PyTreeDef.from_node_data_and_children"))

    def __repr__(self) -> str:
        return "PyTreeDef" + repr(self.spec).removeprefix("TreeSpec")


_spec = PyTreeDef.unwrap


def _path_leaf(is_leaf: Any, is_leaf_takes_path: bool) -> dict[str, Any]:
    if not is_leaf_takes_path:
        return {"is_leaf": is_leaf}
    if not _path_arg():
        not_applicable("is_leaf_takes_path: being added to pytree_kit")
    return {"is_leaf": is_leaf, "is_leaf_takes_path": True}


# -- jax.tree_util's functions ----------------------------------------------


def tree_flatten(tree: Any, is_leaf: Any = None) -> tuple[list[Any], PyTreeDef]:
    leaves, spec = pk.flatten(tree, is_leaf=is_leaf, rules=_rules())
    return leaves, PyTreeDef(spec)


def tree_unflatten(treedef: Any, leaves: Iterable[Any]) -> Any:
    return pk.unflatten(_spec(treedef), leaves)


def tree_leaves(tree: Any, is_leaf: Any = None) -> list[Any]:
    return pk.leaves(tree, is_leaf=is_leaf, rules=_rules())


def tree_structure(tree: Any, is_leaf: Any = None) -> PyTreeDef:
    return PyTreeDef(pk.structure(tree, is_leaf=is_leaf, rules=_rules()))


def tree_map(f: Callable[..., Any], tree: Any, *rest: Any, is_leaf: Any = None) -> Any:
    return pk.tree_map(f, tree, *rest, is_leaf=is_leaf, rules=_rules())


def tree_flatten_with_path(
    tree: Any, is_leaf: Any = None, is_leaf_takes_path: bool = False
) -> tuple[list[tuple[tuple, Any]], PyTreeDef]:
    pairs, spec = pk.flatten_with_path(
        tree, **_path_leaf(is_leaf, is_leaf_takes_path), rules=_rules()
    )
    return pairs, PyTreeDef(spec)


def tree_leaves_with_path(
    tree: Any, is_leaf: Any = None, is_leaf_takes_path: bool = False
) -> list[tuple[tuple, Any]]:
    return pk.flatten_with_path(tree, **_path_leaf(is_leaf, is_leaf_takes_path), rules=_rules())[0]


def tree_map_with_path(
    f: Callable[..., Any],
    tree: Any,
    *rest: Any,
    is_leaf: Any = None,
    is_leaf_takes_path: bool = False,
) -> Any:
    return pk.tree_map_with_path(
        f, tree, *rest, **_path_leaf(is_leaf, is_leaf_takes_path), rules=_rules()
    )


def tree_reduce(
    function: Callable[[Any, Any], Any], tree: Any, initializer: Any = _UNSET, is_leaf: Any = None
) -> Any:
    initial = () if initializer is _UNSET else (initializer,)
    return pk.tree_reduce(function, tree, *initial, is_leaf=is_leaf, rules=_rules())


def tree_reduce_associative(
    operation: Callable[[Any, Any], Any], tree: Any, *, identity: Any = _UNSET, is_leaf: Any = None
) -> Any:
    initial = () if identity is _UNSET else (identity,)
    return pk.tree_reduce(operation, tree, *initial, is_leaf=is_leaf, rules=_rules())


def tree_all(tree: Any, *, is_leaf: Any = None) -> bool:
    return pk.tree_all(tree, is_leaf, rules=_rules())


def tree_transpose(outer_treedef: Any, inner_treedef: Any, pytree_to_transpose: Any) -> Any:
    inner = None if inner_treedef is None else _spec(inner_treedef)
    return pk.tree_transpose(_spec(outer_treedef), inner, pytree_to_transpose, rules=_rules())


def tree_broadcast(prefix_tree: Any, full_tree: Any, is_leaf: Any = None) -> Any:
    return pk.tree_broadcast_prefix(prefix_tree, full_tree, is_leaf, rules=_rules())


def all_leaves(iterable: Iterable[Any], is_leaf: Any = None) -> bool:
    return pk.all_leaves(iterable, is_leaf, rules=_rules())


def keystr(keys: Any, *, simple: bool = False, separator: str = "") -> str:
    return pk.keystr(keys, simple=simple, separator=separator)


def flatten_one_level(tree: Any) -> tuple[list[Any], PyTreeDef]:
    children, spec = pk.flatten_one_level(tree, rules=_rules())
    return children, PyTreeDef(spec)


def treedef_children(treedef: Any) -> list[PyTreeDef]:
    return [PyTreeDef(c) for c in _spec(treedef).children()]


def treedef_is_leaf(treedef: Any) -> bool:
    return _spec(treedef).is_leaf()


def treedef_tuple(treedefs: Iterable[Any]) -> PyTreeDef:
    return PyTreeDef(pk.TreeSpec.from_collection(tuple(_spec(t) for t in treedefs)))


def ravel_pytree(pytree: Any) -> tuple[Any, Callable[[Any], Any]]:
    return pk.ravel(pytree, rules=_rules())


def _shim(fn: Callable[..., Any]) -> Callable[..., Any]:
    """``fn``, counted as a call into pytree_kit."""
    call = mapped(fn)
    call.__peer_mapped__ = True  # type: ignore[attr-defined]
    return call


MAPPED = {
    f.__name__: f
    for f in (
        tree_flatten,
        tree_unflatten,
        tree_leaves,
        tree_structure,
        tree_map,
        tree_flatten_with_path,
        tree_leaves_with_path,
        tree_map_with_path,
        tree_reduce,
        tree_reduce_associative,
        tree_all,
        tree_transpose,
        tree_broadcast,
        all_leaves,
        keystr,
        flatten_one_level,
        treedef_children,
        treedef_is_leaf,
        treedef_tuple,
    )
}
MISSING = {
    "flatten_one_level_with_keys": missing("flatten_one_level_with_keys"),
    "is_tree_node": missing("is_tree_node"),
}

#: jax.tree's names for the same functions
TREE = {
    "all": "tree_all",
    "broadcast": "tree_broadcast",
    "flatten": "tree_flatten",
    "flatten_with_path": "tree_flatten_with_path",
    "leaves": "tree_leaves",
    "leaves_with_path": "tree_leaves_with_path",
    "map": "tree_map",
    "map_with_path": "tree_map_with_path",
    "reduce": "tree_reduce",
    "reduce_associative": "tree_reduce_associative",
    "structure": "tree_structure",
    "transpose": "tree_transpose",
    "unflatten": "tree_unflatten",
}

REGISTRATION = (
    "register_dataclass",
    "register_pytree_node",
    "register_pytree_node_class",
    "register_pytree_with_keys",
    "register_pytree_with_keys_class",
    "register_static",
)

#: left as jax's (see the module docstring)
KEPT = {"Partial", "KeyEntry", "KeyPath", "static"}


def _noting(register: Callable[..., Any]) -> Callable[..., Any]:
    """jax's ``register``, noting the class it registers for ``pk.jax_rules``."""

    @functools.wraps(register)
    def call(nodetype: type, *args: Any, **kwargs: Any) -> Any:
        out = register(nodetype, *args, **kwargs)
        if nodetype not in REGISTERED:
            REGISTERED.append(nodetype)
        return out

    call.__peer_kept__ = True  # type: ignore[attr-defined]
    return call


class _Registry:
    """``default_registry``: a registry, which pytree_kit does not have."""

    def __getattr__(self, name: str) -> Any:
        if name.startswith("__"):
            raise AttributeError(name)
        return registry(f"default_registry.{name}")


def _absent(name: str, version: str) -> types.ModuleType:
    """A stand-in for a module of jax that the installed jax lacks (the test
    file is newer): using it skips the test, as it cannot run on either."""
    module = types.ModuleType(name)

    def __getattr__(attr: str) -> Any:
        if attr.startswith("__"):
            raise AttributeError(attr)
        raise pytest.skip.Exception(
            f"{name} is not in the installed jax {version}", _use_item_location=True
        )

    module.__getattr__ = __getattr__  # type: ignore[method-assign]
    return module


def prepare() -> None:
    """Let the test file import ``jax._src.flattree`` where the installed jax
    has none (for the baseline run on jax itself too)."""
    import importlib

    import jax
    import jax._src

    try:
        importlib.import_module("jax._src.flattree")
    except ImportError:
        stub = _absent("jax._src.flattree", jax.__version__)
        sys.modules["jax._src.flattree"] = stub
        jax._src.flattree = stub  # type: ignore[attr-defined]


def install() -> None:
    import jax
    import jax.flatten_util
    import jax.tree
    import jax.tree_util as jtu

    prepare()
    REGISTERED.append(jtu.Partial)  # jax registers it itself
    # jax versions differ in what tree_util has: a name it lacks is not patched
    shims = {name: _shim(fn) for name, fn in MAPPED.items()}
    for name in dir(jtu):
        if name.startswith("_") or name in KEPT:
            continue
        value = getattr(jtu, name)
        if name in shims:
            setattr(jtu, name, shims[name])
        elif name in MISSING:
            setattr(jtu, name, MISSING[name])
        elif name in REGISTRATION:
            setattr(jtu, name, _noting(value))
        elif name in ("DictKey", "SequenceKey", "GetAttrKey"):
            setattr(jtu, name, getattr(pk, name))
        elif name == "FlattenedIndexKey":
            jtu.FlattenedIndexKey = pk.SequenceKey
        elif name == "PyTreeDef":
            jtu.PyTreeDef = PyTreeDef
        elif name == "default_registry":
            jtu.default_registry = _Registry()
        elif callable(value):
            setattr(jtu, name, missing(name))
    for name in dir(jax.tree):
        if name.startswith("_") or name in KEPT:
            continue
        if name in TREE:
            setattr(jax.tree, name, shims[TREE[name]])
        elif callable(getattr(jax.tree, name)):
            setattr(jax.tree, name, missing(f"jax.tree.{name}"))
    if hasattr(jax.tree, "static"):  # a dataclasses.field with pytree_kit's marker
        jax.tree.static = kept(jax.tree.static)
    jax.flatten_util.ravel_pytree = mapped(ravel_pytree)


def patched_modules() -> list[types.ModuleType]:
    """The modules ``install`` put pytree_kit behind (for the check that
    leaves no function to jax)."""
    import jax.flatten_util
    import jax.tree
    import jax.tree_util

    return [jax.tree_util, jax.tree, jax.flatten_util]
