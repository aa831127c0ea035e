"""pytree_kit: nested containers to flat leaves and back, with no registry.

Examples:
    >>> import pytree_kit as pk
    >>> leaves, spec = pk.flatten({"x": [1, 2], "y": None})
    >>> leaves
    [1, 2]
    >>> pk.unflatten(spec, [10, 20])
    {'x': [10, 20], 'y': None}
"""

from __future__ import annotations

from ._engine import ENGINE
from ._keys import DictKey, GetAttrKey, SequenceKey, keystr
from ._kinds import Rule
from ._spec import TreeSpec
from .api import (
    flatten,
    flatten_with_path,
    leaves,
    structure,
    tree_flatten,
    tree_leaves,
    tree_map,
    tree_map_with_path,
    tree_structure,
    tree_unflatten,
    unflatten,
)

__version__ = "0.1.0"

__all__ = [
    "ENGINE",
    "DictKey",
    "GetAttrKey",
    "Rule",
    "SequenceKey",
    "TreeSpec",
    "flatten",
    "flatten_with_path",
    "keystr",
    "leaves",
    "structure",
    "tree_flatten",
    "tree_leaves",
    "tree_map",
    "tree_map_with_path",
    "tree_structure",
    "tree_unflatten",
    "unflatten",
]
