"""PyTorch adapters for arbitrary nested batches (the ``torch`` extra).

Importing this module imports torch; ``import pytree_kit`` alone never does.
"""

from __future__ import annotations

from ._bridge import torch_rules
from ._collate import Padded, SampleList, collate, select, uncollate
from ._data import PinnedLoader, PinnedPool, default_pool, pin_memory, to_device
from ._distributed import (
    DistributedDataParallel,
    TreeWork,
    all_gather_tree,
    all_reduce_tree,
    broadcast_tree,
)
from ._flatspec import FlatSpec
from ._packed import Column, PackedList
from ._storage import consolidate, is_consolidated
from ._testing import assert_close
from ._tracing import TracedModel, TracingAdapter, export, load, save, trace

__all__ = [
    "Column",
    "DistributedDataParallel",
    "FlatSpec",
    "PackedList",
    "Padded",
    "PinnedLoader",
    "PinnedPool",
    "SampleList",
    "TracedModel",
    "TracingAdapter",
    "TreeWork",
    "all_gather_tree",
    "all_reduce_tree",
    "assert_close",
    "broadcast_tree",
    "collate",
    "consolidate",
    "default_pool",
    "export",
    "is_consolidated",
    "load",
    "pin_memory",
    "save",
    "select",
    "to_device",
    "torch_rules",
    "trace",
    "uncollate",
]
