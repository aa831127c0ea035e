"""``PinnedLoader``: a loader's batches pinned by a thread of their own.

torch's ``DataLoader(pin_memory=True)`` pins in a thread, but skips any
dataclass or class of your own. ``PinnedLoader`` wraps a loader (made with
``pin_memory=False``) and pins every batch with ``pin_memory`` in a
background thread, a few batches ahead of the consumer.
"""

from __future__ import annotations

import queue
import threading
import warnings
from typing import Any, Iterable, Iterator, Mapping, Optional

import torch

from .._kinds import Rule
from . import _pool
from ._pool import PinnedPool
from ._transfer import pin_memory

__all__ = ["PinnedLoader"]

Rules = Optional[Mapping[type, Rule]]


class PinnedLoader:
    """Iterate a loader with every batch pinned by a background thread.

    torch's ``DataLoader(pin_memory=True)`` pins in a thread, but skips any
    dataclass or class of your own. Wrap the loader instead (with
    ``pin_memory=False``), and every tensor of every batch comes out pinned,
    whatever its containers::

        loader = DataLoader(dataset, batch_size=32, collate_fn=collate, num_workers=4)
        for batch in PinnedLoader(loader):
            batch = to_device(batch, "cuda", non_blocking=True)

    ``coalesce`` is :func:`pin_memory`'s: by default, a batch of many
    tensors is packed into one pinned buffer of ``pool``, a batch of a few
    has each pinned on its own. Up to ``prefetch`` pinned batches wait ahead
    of the consumer. An exception in the loader or in pinning is raised in
    the consumer, at its batch.
    ``rules`` and ``strict`` are :func:`pin_memory`'s too.
    """

    def __init__(
        self,
        loader: Iterable[Any],
        *,
        coalesce: Optional[bool] = None,
        rules: Rules = None,
        pool: Optional[PinnedPool] = None,
        prefetch: int = 2,
        strict: bool = True,
    ) -> None:
        self.loader = loader
        self.coalesce = coalesce
        self.rules = rules
        self.pool = pool
        self.prefetch = prefetch
        self.strict = strict

    def __len__(self) -> int:
        return len(self.loader)  # type: ignore[arg-type]

    def __iter__(self) -> Iterator[Any]:
        q: queue.Queue = queue.Queue(maxsize=max(1, self.prefetch))
        stop = threading.Event()
        done = object()

        def put(item: Any) -> bool:
            while not stop.is_set():
                try:
                    q.put(item, timeout=0.1)
                    return True
                except queue.Full:
                    continue
            return False

        def work() -> None:
            # as torch's own pinning thread does: a copy into pinned memory
            # runs on this thread alone (on many cores, a parallel copy's
            # threads spin on after it, taking the cores the workers and the
            # consumer need), and pinned memory is allocated for the
            # consumer's current device
            torch.set_num_threads(1)
            if device_index is not None:
                _set_device_index(device_index)
            try:
                with warnings.catch_warnings():
                    warnings.simplefilter("ignore")  # warned once below, in the consumer
                    for batch in self.loader:
                        pinned = pin_memory(
                            batch,
                            coalesce=self.coalesce,
                            rules=self.rules,
                            pool=self.pool,
                            strict=self.strict,
                        )
                        if not put((True, pinned)):
                            return
            except BaseException as e:
                put((False, e))
                return
            put((True, done))

        device_index = _current_device_index()
        if not _pool.pinning_available():
            warnings.warn(
                "pytree_kit.torch.PinnedLoader: no accelerator is available, so no "
                "memory is pinned (torch's DataLoader does the same)",
                stacklevel=2,
            )
        thread = threading.Thread(target=work, name="pytree_kit-pin-memory", daemon=True)
        thread.start()
        try:
            while True:
                ok, item = q.get()
                if not ok:
                    raise item
                if item is done:
                    return
                yield item
        finally:
            stop.set()
            thread.join(timeout=5)


def _current_device_index() -> Optional[int]:
    """The consumer's current accelerator index, for the pinning thread to
    take; None where there is no accelerator, or where it has not been
    started in this process yet (then every thread's current device is the
    default one, and asking would start it here before the loader's workers
    are forked: torch's DataLoader asks only after starting them)."""
    accelerator = getattr(torch, "accelerator", None)
    if accelerator is not None and hasattr(accelerator, "current_accelerator"):
        if not accelerator.is_available():
            return None
        kind = accelerator.current_accelerator()
        module = getattr(torch, getattr(kind, "type", ""), None)
        started = getattr(module, "is_initialized", None)
        if started is not None and not started():
            return None
        return int(accelerator.current_device_index())
    if not (torch.cuda.is_available() and torch.cuda.is_initialized()):  # pragma: no cover
        return None  # (older torch)
    return int(torch.cuda.current_device())  # pragma: no cover - older torch


def _set_device_index(index: int) -> None:
    accelerator = getattr(torch, "accelerator", None)
    if accelerator is not None and hasattr(accelerator, "set_device_index"):
        accelerator.set_device_index(index)
    else:  # pragma: no cover - older torch
        torch.cuda.set_device(index)
