"""PyTorch adapters for arbitrary nested batches (the ``torch`` extra).

Importing this module imports torch; ``import pytree_kit`` alone never does.
It first checks that torch is one this package supports (2.9 and newer):
an older one gets an ImportError that says so, before any adapter loads.
"""
# ruff: noqa: E402  (the adapters are imported after the check of torch's version)

from __future__ import annotations

import torch as _torch

from .._dynamo import OLDEST_TORCH as _OLDEST
from .._dynamo import torch_version as _torch_version


def _check_torch(version: str) -> None:
    """Refuse a torch older than the oldest this package supports.

    Examples:
        >>> _check_torch("2.9.1+cu128")
        >>> _check_torch("2.6.0")  # doctest: +ELLIPSIS
        Traceback (most recent call last):
        ...
        ImportError: pytree_kit.torch supports torch 2.9 and newer ...; this is torch 2.6.0: ...
    """
    if _torch_version(version) < _OLDEST:
        raise ImportError(
            f"pytree_kit.torch supports torch {'.'.join(map(str, _OLDEST))} and newer "
            f"(tested: 2.9 to 2.15); this is torch {version}: "
            "pip install -U 'torch>=2.9' (see docs/compatibility.md)"
        )


_check_torch(_torch.__version__)

from ._bridge import torch_rules
from ._collate import Padded, SampleList, collate, select, uncollate
from ._distributed import (
    DistributedDataParallel,
    TreeWork,
    all_gather_tree,
    all_reduce_tree,
    broadcast_tree,
)
from ._flatspec import FlatSpec
from ._loader import PinnedLoader
from ._packed import Column, PackedList
from ._pool import PinnedPool, default_pool
from ._storage import consolidate, is_consolidated
from ._testing import assert_close
from ._tracing import TracedModel, TracingAdapter, export, load, save, trace
from ._transfer import pin_memory, to_device

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
