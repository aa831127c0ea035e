"""PyTorch adapters for arbitrary nested batches (the ``torch`` extra).

Importing this module imports torch; ``import pytree_kit`` alone never does.
"""

from __future__ import annotations

from ._data import PinnedLoader, PinnedPool, collate, default_pool, pin_memory, to_device

__all__ = ["PinnedLoader", "PinnedPool", "collate", "default_pool", "pin_memory", "to_device"]
