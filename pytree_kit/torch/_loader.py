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
