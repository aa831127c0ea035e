"""Pinned host buffers that batches are packed into, reused once free.

``pin_memory(..., coalesce=True)`` packs a batch into one of these buffers,
and ``to_device`` stages a batch's small tensors in one before its single
copy to the device (the packing is ``_staging``'s). A buffer is handed out
again only when it is *free*:

- no caller holds it (``take`` reserves it until ``give_back``);
- no tensor of the batch packed there, nor a view of one, is alive (the
  storage's use count is back to what the pool alone holds);
- the copies to a device made from it have read it (an event recorded after
  each non-blocking copy is queried).

The pool's lock guards every change of a buffer's state; nothing outside
this module takes it.
"""

from __future__ import annotations

import math
import threading
from typing import Any, Callable, Optional

import torch

__all__ = [
    "ALIGNMENT",
    "Buffer",
    "PinnedPool",
    "default_pool",
    "fence",
    "pinning_available",
    "wait",
]

#: bytes between the starts of two groups of tensors packed in a buffer
ALIGNMENT = 128


def pinning_available() -> bool:
    """Whether memory can be pinned here (an accelerator is available)."""
    accelerator = getattr(torch, "accelerator", None)
    if accelerator is not None and hasattr(accelerator, "is_available"):
        return bool(accelerator.is_available())
    return bool(torch.cuda.is_available())  # pragma: no cover - older torch


def _pinned_empty(numel: int, dtype: torch.dtype) -> torch.Tensor:
    """Pinned memory; ordinary memory where no accelerator is (nothing can be
    pinned there: a coalesced move to the meta device stages in it)."""
    return torch.empty(numel, dtype=dtype, pin_memory=pinning_available())


def _storage_users(t: torch.Tensor) -> int:
    """How many tensors (and storage objects) hold t's storage; -1 if unknown."""
    use_count = getattr(torch._C, "_storage_Use_Count", None)
    if use_count is None:  # pragma: no cover - private API gone: never reuse
        return -1
    return int(use_count(t.untyped_storage()._cdata))


def fence(device: torch.device, non_blocking: bool) -> Any:
    """An event that passes when the copy to ``device`` just queued has read its
    source, or None when that copy has finished already (a blocking copy, or
    one to the CPU or the meta device)."""
    if not non_blocking or device.type in ("cpu", "meta"):
        return None
    event_type = getattr(torch, "Event", None)
    event = event_type(device=device) if event_type is not None else torch.cuda.Event()
    event.record()
    return event


def wait(device: torch.device) -> None:
    """Return once the copies queued to ``device`` so far have finished (what
    a blocking call owes its caller after non-blocking copies of its own)."""
    event = fence(device, True)
    if event is not None:
        event.synchronize()


class Buffer:
    """One byte buffer of a pool: ``data`` (uint8), of which the last batch
    packed there takes ``used`` bytes."""

    __slots__ = ("_baseline", "_fence", "_reserved", "data", "used")

    def __init__(self, data: torch.Tensor) -> None:
        self.data = data
        self.used = 0
        self._fence: Any = None  # an event a copy from here will pass, until it has
        self._reserved = False  # taken, and being filled or copied from
        self._baseline = _storage_users(data)  # holders when no tensor of a batch is out

    def _free(self) -> bool:
        if self._reserved:
            return False
        if self._fence is not None:
            if not self._fence.query():
                return False  # a copy from this buffer may still be reading it
            self._fence = None
        users = _storage_users(self.data)
        return users != -1 and users <= self._baseline


class PinnedPool:
    """Buffers that ``pin_memory(..., coalesce=True)`` packs batches into, and
    that ``to_device`` stages batches in.

    A batch takes one byte buffer. A buffer is handed out again only when no
    tensor of the batch packed there (nor any view of one) is alive, and when
    the copies to a device made from it have finished (an event recorded
    after each non-blocking copy is queried), so memory a batch or a transfer
    still uses is never overwritten. At most ``max_buffers`` idle buffers are
    kept.

    ``allocator(numel, dtype)`` makes a buffer (it is asked for ``torch.uint8``);
    the default allocates pinned memory where an accelerator is available.
    ``allocations`` counts the buffers made; ``alignment`` is the bytes between
    the starts of two groups of tensors in a buffer.

    Examples:
        >>> import torch
        >>> from pytree_kit.torch import PinnedPool, pin_memory
        >>> pool = PinnedPool(allocator=lambda n, dtype: torch.empty(n, dtype=dtype))
        >>> buf = pool.take(1000)
        >>> buf.data.numel() >= 1000, pool.allocations
        (True, 1)
        >>> pool.give_back(buf)
        >>> pool.take(10) is buf  # free again: reused
        True
    """

    def __init__(
        self,
        *,
        max_buffers: int = 4,
        allocator: Optional[Callable[[int, torch.dtype], torch.Tensor]] = None,
        alignment: int = ALIGNMENT,
    ) -> None:
        self.max_buffers = max_buffers
        self.allocator = allocator or _pinned_empty
        self.alignment = alignment
        self.allocations = 0
        self._buffers: list[Buffer] = []
        self._by_ptr: dict[int, Buffer] = {}
        self._lock = threading.Lock()

    def take(self, nbytes: int) -> Buffer:
        """A free buffer of at least ``nbytes``, reserved for the caller until it
        hands it to ``give_back``."""
        with self._lock:
            free = [b for b in self._buffers if b._free()]
            fitting = [b for b in free if b.data.numel() >= nbytes]
            if fitting:
                buf = min(fitting, key=lambda b: b.data.numel())
            else:
                # Keep at most max_buffers: forget idle ones, smallest first.
                for b in sorted(free, key=lambda b: b.data.numel()):
                    if len(self._buffers) < self.max_buffers:
                        break
                    self._buffers.remove(b)
                    self._by_ptr.pop(b.data.data_ptr(), None)
                capacity = 1 << max(0, math.ceil(math.log2(max(nbytes, 1))))  # room to grow
                buf = Buffer(self.allocator(capacity, torch.uint8))
                self.allocations += 1
                self._buffers.append(buf)
                self._by_ptr[buf.data.data_ptr()] = buf
            buf._reserved = True
            return buf

    def give_back(self, buf: Buffer, copy_fence: Any = None) -> None:
        """End the reservation of ``buf``. ``copy_fence`` (from ``fence``) is an
        event a copy queued from it passes once it has read the buffer; the
        buffer is not handed out before."""
        with self._lock:
            if copy_fence is not None:
                buf._fence = copy_fence
            buf._reserved = False

    def copied_from(self, buf: Buffer, copy_fence: Any) -> None:
        """Note a copy queued from ``buf`` (not reserved: its batch's tensors
        hold it) that passes ``copy_fence`` once it has read the buffer."""
        if copy_fence is not None:
            with self._lock:
                buf._fence = copy_fence

    def buffer_of(self, t: torch.Tensor) -> Optional[Buffer]:
        """The pool buffer a tensor lies in, if any."""
        return self.buffers_of([t])[0]

    def buffers_of(self, tensors: list) -> list[Optional[Buffer]]:
        """The pool buffer each tensor lies in (None for one in none), looked
        up under one hold of the lock (a tensor's storage is read only while
        the pool has buffers).

        Examples:
            >>> import torch
            >>> from pytree_kit.torch import PinnedPool
            >>> pool = PinnedPool(allocator=lambda n, dtype: torch.empty(n, dtype=dtype))
            >>> buf = pool.take(64)
            >>> [b is buf for b in pool.buffers_of([buf.data[:8], torch.ones(2)])]
            [True, False]
        """
        with self._lock:
            get = self._by_ptr.get
            if not self._by_ptr:
                return [None] * len(tensors)
            try:
                return [get(t.untyped_storage().data_ptr()) if t.is_cpu else None for t in tensors]
            except RuntimeError:  # a sparse or jagged tensor: no storage of its own
                return [get(_address(t)) if t.is_cpu else None for t in tensors]


def _address(t: torch.Tensor) -> int:
    """The address of ``t``'s storage; -1 for a tensor with no storage of
    its own (sparse, jagged), which lies in no pool buffer."""
    try:
        return t.untyped_storage().data_ptr()
    except RuntimeError:  # (NotImplementedError for a sparse one is one)
        return -1


_default_pool: Optional[PinnedPool] = None
_default_pool_lock = threading.Lock()


def default_pool() -> PinnedPool:
    """The process's pool, for ``pin_memory`` and ``to_device`` when no
    ``pool`` is given."""
    global _default_pool
    with _default_pool_lock:
        if _default_pool is None:
            _default_pool = PinnedPool()
        return _default_pool


def existing_default_pool() -> Optional[PinnedPool]:
    """The process's pool if it has been made (a batch may lie in it), else None."""
    return _default_pool
