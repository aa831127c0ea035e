"""dm-tree's ``tree`` module on pytree_kit, as ``docs/migration/dmtree.md`` maps it.

Each function is the guide's equivalent call, with the guide's recipes for
dm-tree's semantics: ``None`` is a leaf (``is_leaf=lambda x: x is None``,
"None is a node"), paths are tuples of raw keys ("Paths"), and
``map_structure`` checks the structures first with ``pk.assert_same_structure``
("tree_map takes a prefix"). ``check_types`` is taken and has no effect:
pytree_kit always compares the node types. Anything else the peer's tests do
reaches pytree_kit as it is, so a difference fails the test.

dm-tree's private helpers (``_is_attrs``, ``_assert_shallow_structure``,
...) are not in pytree_kit: a test reaching them is not applicable. dm-tree's
constants (its message templates among them) are copied, so its tests
compare pytree_kit's messages with them.
"""

from __future__ import annotations

import sys
import types
from typing import Any, Callable

from peer_shims import mapped, missing

import pytree_kit as pk


def _none_leaf(x: Any) -> bool:
    return x is None


def _raw(path: tuple) -> tuple:
    """A pytree_kit path as dm-tree's tuple of raw keys (the guide's "Paths")."""
    return tuple(getattr(k, "key", getattr(k, "idx", getattr(k, "name", None))) for k in path)


def flatten(structure: Any) -> list:
    return pk.leaves(structure, is_leaf=_none_leaf)


def unflatten_as(structure: Any, flat_sequence: Any) -> Any:
    return pk.unflatten(pk.structure(structure, is_leaf=_none_leaf), flat_sequence)


def is_nested(structure: Any) -> bool:
    return not pk.structure(structure, is_leaf=_none_leaf).is_leaf()


def assert_same_structure(a: Any, b: Any, check_types: bool = True) -> None:
    pk.assert_same_structure(a, b, is_leaf=_none_leaf)


def _same_structures(structures: tuple) -> None:
    for other in structures[1:]:
        pk.assert_same_structure(structures[0], other, is_leaf=_none_leaf)


def map_structure(func: Callable, *structures: Any, check_types: bool = True, **kwargs: Any) -> Any:
    _same_structures(structures)
    return pk.tree_map(func, *structures, is_leaf=_none_leaf, **kwargs)


def map_structure_with_path(
    func: Callable, *structures: Any, check_types: bool = True, **kwargs: Any
) -> Any:
    _same_structures(structures)
    return pk.tree_map_with_path(
        lambda path, *xs: func(_raw(path), *xs), *structures, is_leaf=_none_leaf, **kwargs
    )


def flatten_with_path(structure: Any) -> list:
    pairs, _ = pk.flatten_with_path(structure, is_leaf=_none_leaf)
    return [(_raw(path), x) for path, x in pairs]


def flatten_up_to(shallow_structure: Any, input_structure: Any, check_types: bool = True) -> list:
    return pk.structure(shallow_structure, is_leaf=_none_leaf).flatten_up_to(input_structure)


def flatten_with_path_up_to(
    shallow_structure: Any, input_structure: Any, check_types: bool = True
) -> list:
    spec = pk.structure(shallow_structure, is_leaf=_none_leaf)
    values = spec.flatten_up_to(input_structure)
    return list(zip(map(_raw, spec.paths()), values))


def map_structure_up_to(
    shallow_structure: Any,
    func: Callable,
    *structures: Any,
    check_types: bool = True,
    **kwargs: Any,
) -> Any:
    return pk.tree_map(
        lambda _, *xs: func(*xs), shallow_structure, *structures, is_leaf=_none_leaf, **kwargs
    )


def map_structure_with_path_up_to(
    shallow_structure: Any,
    func: Callable,
    *structures: Any,
    check_types: bool = True,
    **kwargs: Any,
) -> Any:
    return pk.tree_map_with_path(
        lambda path, _, *xs: func(_raw(path), *xs),
        shallow_structure,
        *structures,
        is_leaf=_none_leaf,
        **kwargs,
    )


def traverse(fn: Callable, structure: Any, top_down: bool = True) -> Any:
    return pk.traverse(fn, structure, top_down)


def traverse_with_path(fn: Callable, structure: Any, top_down: bool = True) -> Any:
    return pk.traverse_with_path(lambda path, x: fn(_raw(path), x), structure, top_down)


MAPPED = {
    f.__name__: f
    for f in (
        flatten,
        unflatten_as,
        is_nested,
        assert_same_structure,
        map_structure,
        map_structure_with_path,
        flatten_with_path,
        flatten_up_to,
        flatten_with_path_up_to,
        map_structure_up_to,
        map_structure_with_path_up_to,
        traverse,
        traverse_with_path,
    )
}

MISSING: dict[str, str] = {}

PRIVATE = "a dm-tree internal, not its API"


def install() -> None:
    import tree as real

    shim = types.ModuleType("tree", __doc__)
    for name in dir(real):
        if name.startswith("__"):
            continue
        value = getattr(real, name)
        if isinstance(value, types.ModuleType):
            continue  # its modules (the C extension among them) stay dm-tree's
        if isinstance(value, (types.FunctionType, types.BuiltinFunctionType)):
            if name in MAPPED:
                value = mapped(MAPPED[name])
            elif name in MISSING:
                value = missing(name, MISSING[name])
            elif name.startswith("_"):
                value = missing(name, PRIVATE)
            else:
                raise AssertionError(f"dm-tree's {name} is neither mapped nor missing")
        setattr(shim, name, value)
    shim.MAP_TO_NONE = pk.MAP_TO_NONE
    sys.modules["tree"] = shim


def patched_modules() -> list[types.ModuleType]:
    """The modules ``install`` put pytree_kit behind (for the check that
    leaves no function to dm-tree)."""
    return [sys.modules["tree"]]
