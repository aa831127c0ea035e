"""PyTorch adapters for arbitrary nested batches (the ``torch`` extra).

Importing this module imports torch; ``import pytree_kit`` alone never does.
"""

from __future__ import annotations

from ._data import PinnedLoader, PinnedPool, collate, default_pool, pin_memory, to_device
from ._distributed import (
    DistributedDataParallel,
    TreeWork,
    all_gather_tree,
    all_reduce_tree,
    broadcast_tree,
)

__all__ = [
    "DistributedDataParallel",
    "PinnedLoader",
    "PinnedPool",
    "TreeWork",
    "all_gather_tree",
    "all_reduce_tree",
    "broadcast_tree",
    "collate",
    "default_pool",
    "pin_memory",
    "to_device",
]
