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

from ._bridge import jax_rules, optree_rules
from ._compare import assert_same_structure, tree_equal
from ._engine import ENGINE, engine_info
from ._keys import DictKey, GetAttrKey, SequenceKey, keystr
from ._kinds import Rule
from ._paths import (
    flatten_keystr,
    parse_keystr,
    tree_at,
    tree_get,
    tree_set,
    unflatten_keystr,
)
from ._spec import TreeSpec
from ._version import __version__
from .api import (
    flatten,
    flatten_one_level,
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

__all__ = [
    "ENGINE",
    "DictKey",
    "GetAttrKey",
    "Rule",
    "SequenceKey",
    "TreeSpec",
    "__version__",
    "assert_same_structure",
    "engine_info",
    "flatten",
    "flatten_keystr",
    "flatten_one_level",
    "flatten_with_path",
    "jax_rules",
    "keystr",
    "leaves",
    "optree_rules",
    "parse_keystr",
    "structure",
    "tree_at",
    "tree_equal",
    "tree_flatten",
    "tree_get",
    "tree_leaves",
    "tree_map",
    "tree_map_with_path",
    "tree_set",
    "tree_structure",
    "tree_unflatten",
    "unflatten",
    "unflatten_keystr",
]
