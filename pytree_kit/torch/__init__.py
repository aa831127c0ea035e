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
from ._flatspec import FlatSpec
from ._tracing import TracedModel, TracingAdapter, export, load, save, trace

__all__ = [
    "DistributedDataParallel",
    "FlatSpec",
    "PinnedLoader",
    "PinnedPool",
    "TracedModel",
    "TracingAdapter",
    "TreeWork",
    "all_gather_tree",
    "all_reduce_tree",
    "broadcast_tree",
    "collate",
    "default_pool",
    "export",
    "load",
    "pin_memory",
    "save",
    "to_device",
    "trace",
]
