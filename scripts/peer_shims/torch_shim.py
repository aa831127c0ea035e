"""``torch.utils._pytree`` and ``torch.utils._cxx_pytree`` on pytree_kit, as
``docs/migration/torch.md`` maps them.

Both modules are patched in place (``import torch.utils._pytree as pytree``
then finds pytree_kit behind torch's names). torch's modules that the test
harness loads (``common_utils``, and dynamo, which ``TestCase.run`` loads)
are imported first, so their import-time calls stay torch's; the functions
they imported by name stay torch's too.

- The tree functions call pytree_kit with torch's leaves, the guide's recipe
  ("torch's leaves with pytree_kit"): ``None`` is a leaf (``is_leaf``), and
  dicts and defaultdicts give their leaves in insertion order (two rules), plus
  ``pytree_kit.torch.torch_rules()`` for every class registered with torch at
  the time of the call (the guide's bridge).
- The registration functions stay torch's (user setup: the bridge reads
  torch's registrations), behind a wrapper marked ``__peer_kept__``; so do
  the key classes (``MappingKey``,
  ``SequenceKey``, ``GetAttrKey``: the ones a ``flatten_with_keys_fn`` makes,
  which the bridge reads), ``KeyEntry``, ``NodeDef``, ``ConstantNode``,
  ``EnumEncoder`` and ``structseq``.
- Specs are pytree_kit's ``TreeSpec`` behind :class:`TreeSpec`, which only
  renames (torch's ``children_specs``, ``child(i)``); ``TreeSpec(type,
  context, children)`` builds the node torch describes around the children's
  specs, and reads it with ``pk.TreeSpec.from_collection`` (the guide's
  recipe); ``LeafSpec()`` is ``pk.TreeSpec.leaf()``.
- What pytree_kit does not have is :func:`peer_shims.missing`, with the
  reason the guide's "Not in pytree_kit" gives.
"""

from __future__ import annotations

import collections
import functools
import sys
import types
from typing import Any, Callable, Iterable

from peer_shims import SpecWrapper, mapped, missing, registry

import pytree_kit as pk

# -- torch's leaves (the guide's recipe) ---------------------------------------


def dict_children(d: Any) -> tuple[Any, None]:
    return d, None  # a dict of children: leaves in its own order


def dict_rebuild(aux: Any, children: Any) -> dict:
    return dict(children)


def defaultdict_children(d: Any) -> tuple[Any, Any]:
    return dict(d), d.default_factory


def defaultdict_rebuild(default_factory: Any, children: Any) -> collections.defaultdict:
    return collections.defaultdict(default_factory, children)


TORCH_ORDER = {
    dict: pk.Rule(dict_children, dict_rebuild),
    collections.defaultdict: pk.Rule(defaultdict_children, defaultdict_rebuild),
}


def is_none(x: Any) -> bool:
    return x is None


def _rules() -> dict:
    import pytree_kit.torch as pkt

    return {**pkt.torch_rules(), **TORCH_ORDER}


def _leaf(is_leaf: Callable[[Any], bool] | None) -> Callable[[Any], bool]:
    if is_leaf is None:
        return is_none
    return lambda x: x is None or bool(is_leaf(x))


# -- specs -----------------------------------------------------------------------


class TreeSpec(SpecWrapper):
    """A ``pk.TreeSpec`` under torch's names; ``TreeSpec(type, context,
    children_specs)`` is pytree_kit's spec of that node over those children."""

    __slots__ = ()

    def __new__(cls, type: Any, context: Any, children_specs: Iterable[Any] = ()) -> TreeSpec:
        return _literal(type, context, [_spec(c) for c in children_specs])

    @property
    def type(self) -> Any:
        return self.spec.type

    @property
    def context(self) -> Any:
        return missing("TreeSpec.context", "no one attribute; spec.type, spec.entries()")()

    @property
    def num_children(self) -> int:
        return self.spec.num_children

    @property
    def children_specs(self) -> list[TreeSpec]:
        return [_wrap(c) for c in self.spec.children()]

    @mapped
    def children(self) -> list[TreeSpec]:
        return [_wrap(c) for c in self.spec.children()]

    @mapped
    def child(self, index: int) -> TreeSpec:
        return _wrap(self.spec.children()[index])

    @mapped
    def is_leaf(self) -> bool:
        return self.spec.is_leaf()

    def __repr__(self) -> str:
        return repr(self.spec)


_wrap = TreeSpec.wrap
_spec = TreeSpec.unwrap


@mapped
def _literal(node_type: Any, context: Any, children: list) -> TreeSpec:
    """torch's node ``(node_type, context)`` built around the children's specs
    by torch's own unflatten function for that node type (``[a, b]`` for
    ``list``, ``dict(zip(context, children))`` for ``dict``, ...), read back
    by ``pk.TreeSpec.from_collection``."""
    import torch.utils._pytree as real

    node = real.SUPPORTED_NODES.get(node_type)
    if node is None:
        raise ValueError(f"{node_type!r} is not a node type torch knows")
    return _wrap(pk.TreeSpec.from_collection(node.unflatten_fn(children, context), rules=_rules()))


@mapped
def LeafSpec() -> TreeSpec:
    return _wrap(pk.TreeSpec.leaf())


# -- the functions ------------------------------------------------------------------


@mapped
def tree_flatten(tree: Any, is_leaf: Any = None) -> tuple[list, TreeSpec]:
    leaves, spec = pk.flatten(tree, is_leaf=_leaf(is_leaf), rules=_rules())
    return leaves, _wrap(spec)


@mapped
def tree_unflatten(leaves: Iterable[Any], treespec: Any) -> Any:
    return pk.unflatten(_spec(treespec), leaves)


@mapped
def tree_leaves(tree: Any, is_leaf: Any = None) -> list:
    return pk.leaves(tree, is_leaf=_leaf(is_leaf), rules=_rules())


@mapped
def tree_iter(tree: Any, is_leaf: Any = None) -> Any:
    return pk.tree_iter(tree, _leaf(is_leaf), rules=_rules())


@mapped
def tree_structure(tree: Any, is_leaf: Any = None) -> TreeSpec:
    return _wrap(pk.structure(tree, is_leaf=_leaf(is_leaf), rules=_rules()))


@mapped
def tree_is_leaf(tree: Any, is_leaf: Any = None) -> bool:
    return pk.tree_is_leaf(tree, _leaf(is_leaf), rules=_rules())


@mapped
def tree_map(func: Callable[..., Any], tree: Any, *rests: Any, is_leaf: Any = None) -> Any:
    return pk.tree_map(func, tree, *rests, is_leaf=_leaf(is_leaf), rules=_rules())


@mapped
def tree_map_only(type_or_pred: Any, /, func: Any, tree: Any, is_leaf: Any = None) -> Any:
    return pk.tree_map_only(type_or_pred, func, tree, _leaf(is_leaf), rules=_rules())


@mapped
def tree_all(pred: Callable[[Any], Any], tree: Any, is_leaf: Any = None) -> bool:
    rules = _rules()
    results = pk.tree_map(pred, tree, is_leaf=_leaf(is_leaf), rules=rules)
    return pk.tree_all(results, is_none, rules=rules)


@mapped
def tree_any(pred: Callable[[Any], Any], tree: Any, is_leaf: Any = None) -> bool:
    rules = _rules()
    results = pk.tree_map(pred, tree, is_leaf=_leaf(is_leaf), rules=rules)
    return pk.tree_any(results, is_none, rules=rules)


@mapped
def tree_all_only(types: Any, /, pred: Any, tree: Any, is_leaf: Any = None) -> bool:
    return pk.tree_all_only(types, pred, tree, _leaf(is_leaf), rules=_rules())


@mapped
def tree_any_only(types: Any, /, pred: Any, tree: Any, is_leaf: Any = None) -> bool:
    return pk.tree_any_only(types, pred, tree, _leaf(is_leaf), rules=_rules())


@mapped
def tree_flatten_with_path(tree: Any, is_leaf: Any = None) -> tuple[list, TreeSpec]:
    pairs, spec = pk.flatten_with_path(tree, is_leaf=_leaf(is_leaf), rules=_rules())
    return pairs, _wrap(spec)


@mapped
def tree_leaves_with_path(tree: Any, is_leaf: Any = None) -> list:
    return pk.flatten_with_path(tree, is_leaf=_leaf(is_leaf), rules=_rules())[0]


@mapped
def tree_map_with_path(func: Any, tree: Any, *rests: Any, is_leaf: Any = None) -> Any:
    return pk.tree_map_with_path(func, tree, *rests, is_leaf=_leaf(is_leaf), rules=_rules())


@mapped
def keystr(kp: Any) -> str:
    return pk.keystr(kp)


@mapped
def key_get(obj: Any, kp: Any) -> Any:
    return pk.tree_get(obj, kp, is_leaf=is_none, rules=_rules())


@mapped
def arg_tree_leaves(*args: Any, **kwargs: Any) -> list:
    return pk.leaves((args, kwargs), is_leaf=is_none, rules=_rules())


@mapped
def treespec_leaf() -> TreeSpec:
    return _wrap(pk.TreeSpec.leaf())


@mapped
def treespec_tuple(iterable: Iterable[Any] = ()) -> TreeSpec:
    specs = tuple(_spec(s) for s in iterable)
    return _wrap(pk.TreeSpec.from_collection(specs, rules=_rules()))


@mapped
def treespec_dict(mapping: Any = (), /, **kwargs: Any) -> TreeSpec:
    specs = {k: _spec(s) for k, s in dict(mapping, **kwargs).items()}
    return _wrap(pk.TreeSpec.from_collection(specs, rules=_rules()))


@mapped
def treespec_dumps(treespec: Any, protocol: Any = None) -> str:
    # to_json has one format: ``protocol`` is not read (torch raises on any but 1)
    return _spec(treespec).to_json()


@mapped
def treespec_loads(serialized: str) -> TreeSpec:
    return _wrap(pk.TreeSpec.from_json(serialized, rules=_rules()))


@mapped
def treespec_pprint(treespec: Any) -> str:
    return repr(_spec(treespec)).removeprefix("TreeSpec(")[:-1]  # the repr, unnamed


@mapped
def broadcast_prefix(prefix_tree: Any, full_tree: Any, is_leaf: Any = None) -> list:
    rules = _rules()
    spec = pk.structure(full_tree, is_leaf=_leaf(is_leaf), rules=rules)
    broadcast = pk.tree_broadcast_prefix(prefix_tree, full_tree, _leaf(is_leaf), rules=rules)
    return spec.flatten_up_to(broadcast)


@mapped
def _broadcast_to_and_flatten(tree: Any, treespec: Any, is_leaf: Any = None) -> list | None:
    spec = _spec(treespec)
    full = spec.unflatten([object() for _ in range(spec.num_leaves)])
    try:
        broadcast = pk.tree_broadcast_prefix(tree, full, _leaf(is_leaf), rules=_rules())
    except ValueError:
        return None  # torch's answer when ``tree`` is not a prefix
    return spec.flatten_up_to(broadcast)


MAPPED: dict[str, Any] = {
    "TreeSpec": TreeSpec,
    "PyTreeSpec": TreeSpec,
    "LeafSpec": LeafSpec,
    "tree_flatten": tree_flatten,
    "tree_unflatten": tree_unflatten,
    "tree_leaves": tree_leaves,
    "tree_iter": tree_iter,
    "tree_structure": tree_structure,
    "tree_is_leaf": tree_is_leaf,
    "tree_map": tree_map,
    "tree_map_only": tree_map_only,
    "tree_all": tree_all,
    "tree_any": tree_any,
    "tree_all_only": tree_all_only,
    "tree_any_only": tree_any_only,
    "tree_flatten_with_path": tree_flatten_with_path,
    "tree_leaves_with_path": tree_leaves_with_path,
    "tree_map_with_path": tree_map_with_path,
    "keystr": keystr,
    "key_get": key_get,
    "arg_tree_leaves": arg_tree_leaves,
    "treespec_leaf": treespec_leaf,
    "treespec_tuple": treespec_tuple,
    "treespec_dict": treespec_dict,
    "treespec_dumps": treespec_dumps,
    "treespec_loads": treespec_loads,
    "pytree_to_str": treespec_dumps,  # torch's deprecated names of the two
    "str_to_pytree": treespec_loads,
    "treespec_pprint": treespec_pprint,
    "broadcast_prefix": broadcast_prefix,
    "_broadcast_to_and_flatten": _broadcast_to_and_flatten,
    "is_namedtuple": mapped(pk.is_namedtuple),
    "is_namedtuple_class": mapped(pk.is_namedtuple_class),
    "is_namedtuple_instance": mapped(pk.is_namedtuple_instance),
    "is_structseq": mapped(pk.is_structseq),
    "is_structseq_class": mapped(pk.is_structseq_class),
    "is_structseq_instance": mapped(pk.is_structseq_instance),
}

MISSING: dict[str, Callable[..., Any]] = {
    "tree_map_": missing("tree_map_", "no in-place map; a loop over pk.tree_iter(tree)"),
    "tree_map_only_": missing("tree_map_only_", "no in-place map; a loop over pk.tree_iter(tree)"),
    "map_only": missing("map_only", "not a tree function; pk.tree_map_only"),
    "enum_object_hook": missing("enum_object_hook", "torch's JSON format; spec.to_json()"),
    "is_constant_class": registry("is_constant_class"),
}

#: torch's own, kept: registration (user setup, read by torch_rules) and classes
REGISTRATION = ("register_pytree_node", "register_dataclass", "register_constant")
KEPT = {
    *REGISTRATION,
    "MappingKey",
    "SequenceKey",
    "GetAttrKey",
    "KeyEntry",
    "NodeDef",
    "ConstantNode",
    "EnumEncoder",
    "structseq",
    "LeafSpecMeta",
}


def _kept(register: Callable[..., Any]) -> Callable[..., Any]:
    """torch's ``register``, as it is (user setup), marked ``__peer_kept__``:
    neither a call into pytree_kit nor missing."""

    @functools.wraps(register)
    def call(*args: Any, **kwargs: Any) -> Any:
        return register(*args, **kwargs)

    call.__peer_kept__ = True  # type: ignore[attr-defined]
    return call


def _patch(module: Any) -> None:
    for name in dir(module):
        value = getattr(module, name)
        if name.startswith("_") or name in KEPT or not callable(value):
            continue
        if not (getattr(value, "__module__", "") or "").startswith(("torch", "optree")):
            continue  # typing names, collections, ...
        if name not in MAPPED and name not in MISSING:
            raise RuntimeError(f"torch_shim: {module.__name__}.{name}: neither mapped nor missing")
    for name, value in {**MAPPED, **MISSING}.items():
        if hasattr(module, name):
            setattr(module, name, value)
    for name in REGISTRATION:
        if hasattr(module, name):
            setattr(module, name, _kept(getattr(module, name)))


MODULES = ("torch.utils._pytree", "torch.utils._cxx_pytree")


def install() -> None:
    # torch's test harness (TestCase.run sets a torch.compiler stance, which
    # imports dynamo) and the modules it loads call torch's tree functions
    # as they are imported: import them first, so that torch's own uses stay
    # torch's, and only the calls made after this go through the shim.
    import torch._dynamo
    import torch.utils._pytree as python_pytree

    try:  # needs expecttest, which torch's test files need anyway
        import torch.testing._internal.common_utils  # noqa: F401
    except ImportError:
        pass

    modules = [python_pytree]
    try:
        import torch.utils._cxx_pytree as cxx_pytree
    except ImportError:  # optree missing or too old: torch's tests skip it
        pass
    else:
        modules.append(cxx_pytree)
    for module in modules:
        _patch(module)


def patched_modules() -> list[types.ModuleType]:
    """The modules ``install`` put pytree_kit behind (for the check that
    leaves no function to torch)."""
    return [m for m in (sys.modules.get(n) for n in MODULES) if m is not None]
