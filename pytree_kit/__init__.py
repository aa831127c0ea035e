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

from . import _dynamo, _engine
from ._bridge import jax_rules, optree_rules
from ._compare import assert_same_structure, tree_equal
from ._engine import ENGINE, engine_info
from ._errors import StructureError
from ._keys import Accessor, DictKey, GetAttrKey, SequenceKey, keystr
from ._kinds import Rule
from ._paths import (
    flatten_keystr,
    flatten_with_accessor,
    parse_keystr,
    tree_at,
    tree_get,
    tree_set,
    unflatten_keystr,
)
from ._predicates import (
    all_leaves,
    is_namedtuple,
    is_namedtuple_class,
    is_namedtuple_instance,
    is_structseq,
    is_structseq_class,
    is_structseq_instance,
    tree_is_leaf,
)
from ._ravel import ravel
from ._reduce import (
    tree_all,
    tree_all_only,
    tree_any,
    tree_any_only,
    tree_map_only,
    tree_max,
    tree_min,
    tree_reduce,
    tree_sum,
)
from ._restructure import (
    MAP_TO_NONE,
    traverse,
    traverse_with_path,
    tree_broadcast_prefix,
    tree_combine,
    tree_partition,
    tree_replace_nones,
    tree_transpose,
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
    tree_iter,
    tree_leaves,
    tree_map,
    tree_map_with_path,
    tree_structure,
    tree_unflatten,
    unflatten,
)

# torch.compile: while dynamo traces, the pure engine stands in for each of
# the C engine's functions. They are registered when torch._dynamo is
# imported, now or later (a one-shot import hook); nothing here imports
# torch. This is the one call that installs them (_dynamo.py).
_dynamo.install(_engine.c_engine)

__all__ = [
    "Accessor",
    "DictKey",
    "ENGINE",
    "GetAttrKey",
    "MAP_TO_NONE",
    "Rule",
    "SequenceKey",
    "StructureError",
    "TreeSpec",
    "__version__",
    "all_leaves",
    "assert_same_structure",
    "engine_info",
    "flatten",
    "flatten_keystr",
    "flatten_one_level",
    "flatten_with_accessor",
    "flatten_with_path",
    "is_namedtuple",
    "is_namedtuple_class",
    "is_namedtuple_instance",
    "is_structseq",
    "is_structseq_class",
    "is_structseq_instance",
    "jax_rules",
    "keystr",
    "leaves",
    "optree_rules",
    "parse_keystr",
    "ravel",
    "structure",
    "traverse",
    "traverse_with_path",
    "tree_all",
    "tree_all_only",
    "tree_any",
    "tree_any_only",
    "tree_at",
    "tree_broadcast_prefix",
    "tree_combine",
    "tree_equal",
    "tree_flatten",
    "tree_get",
    "tree_is_leaf",
    "tree_iter",
    "tree_leaves",
    "tree_map",
    "tree_map_only",
    "tree_map_with_path",
    "tree_max",
    "tree_min",
    "tree_partition",
    "tree_reduce",
    "tree_replace_nones",
    "tree_set",
    "tree_structure",
    "tree_sum",
    "tree_transpose",
    "tree_unflatten",
    "unflatten",
    "unflatten_keystr",
]
