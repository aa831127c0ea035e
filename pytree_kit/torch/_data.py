"""Moving nested batches: pin_memory, to_device, and PinnedLoader.

torch's DataLoader machinery understands tensors, numbers, dicts, lists and
namedtuples. A dataclass or a class of your own batch is skipped by
``pin_memory``. These functions work on any tree pytree_kit understands, and
keep every container's type. Tensors that share one storage (a consolidated
batch, see ``_storage``) move with one allocation and one copy in all.
(``collate`` and the way back from a batch are in ``_collate``.)
"""

from __future__ import annotations

import math
import queue
import threading
import warnings
from typing import Any, Callable, Iterable, Iterator, Mapping, Optional, Union

import torch

from .. import api
from .._kinds import Rule
from . import _staging
from ._hidden import check_leaves
from ._storage import move_storage, storage_groups

__all__ = ["PinnedLoader", "PinnedPool", "pin_memory", "to_device"]

Rules = Optional[Mapping[type, Rule]]


# --------------------------------------------------------------------------
# pinned memory


def _pinning_available() -> bool:
    accelerator = getattr(torch, "accelerator", None)
    if accelerator is not None and hasattr(accelerator, "is_available"):
        return bool(accelerator.is_available())
    return bool(torch.cuda.is_available())  # pragma: no cover - older torch


_Tensor = torch.Tensor


def _pinned_empty(numel: int, dtype: torch.dtype) -> torch.Tensor:
    """Pinned memory; ordinary memory where no accelerator is (nothing can be
    pinned there: to_device(..., coalesce=True) to the meta device stages in it)."""
    return torch.empty(numel, dtype=dtype, pin_memory=_pinning_available())


def _storage_users(t: torch.Tensor) -> int:
    """How many tensors (and storage objects) hold t's storage; -1 if unknown."""
    use_count = getattr(torch._C, "_storage_Use_Count", None)
    if use_count is None:  # pragma: no cover - private API gone: never reuse
        return -1
    return int(use_count(t.untyped_storage()._cdata))


def _fence(device: torch.device, non_blocking: bool) -> Any:
    """An event that passes when the copy to ``device`` just queued has read its
    source, or None when that copy has finished already (a blocking copy, or
    one to the CPU or the meta device)."""
    if not non_blocking or device.type in ("cpu", "meta"):
        return None
    event_type = getattr(torch, "Event", None)
    event = event_type(device=device) if event_type is not None else torch.cuda.Event()
    event.record()
    return event


class _Buffer:
    __slots__ = ("baseline", "data", "fence", "reserved", "used")

    def __init__(self, data: torch.Tensor) -> None:
        self.data = data  # uint8
        self.used = 0  # bytes the last batch packed here takes
        self.fence: Any = None  # an event a copy from here will pass, until it has
        self.reserved = False  # taken, and being filled or copied from
        self.baseline = _storage_users(data)  # holders when no tensor of a batch is out

    def free(self) -> bool:
        if self.reserved:
            return False
        if self.fence is not None:
            if not self.fence.query():
                return False  # a copy from this buffer may still be reading it
            self.fence = None
        users = _storage_users(self.data)
        return users != -1 and users <= self.baseline


class PinnedPool:
    """Buffers that ``pin_memory(..., coalesce=True)`` packs batches into, and
    that ``to_device(..., coalesce=True)`` stages them in.

    A batch takes one byte buffer: its tensors, grouped by dtype and shape past
    the first dimension, are copied in with one ``torch.cat`` per group (see
    ``_staging``). A buffer is handed out again only when no tensor of the
    batch packed there (nor any view of one) is alive, and when the copies to
    a device made from it have finished (an event recorded after each
    non-blocking copy is queried), so memory a batch or a transfer still uses
    is never overwritten. At most ``max_buffers`` idle buffers are kept.

    ``allocator(numel, dtype)`` makes a buffer (it is asked for ``torch.uint8``);
    the default allocates pinned memory where an accelerator is available.
    ``allocations`` counts the buffers made; ``alignment`` is the bytes between
    the starts of two groups.
    """

    def __init__(
        self,
        *,
        max_buffers: int = 4,
        allocator: Optional[Callable[[int, torch.dtype], torch.Tensor]] = None,
        alignment: int = _staging.ALIGNMENT,
    ) -> None:
        self.max_buffers = max_buffers
        self.allocator = allocator or _pinned_empty
        self.alignment = alignment
        self.allocations = 0
        self._buffers: list[_Buffer] = []
        self._by_ptr: dict[int, _Buffer] = {}
        self._lock = threading.Lock()

    def take(self, nbytes: int) -> _Buffer:
        """A free buffer of at least ``nbytes``, reserved for the caller until it
        sets ``reserved`` back to False."""
        with self._lock:
            free = [b for b in self._buffers if b.free()]
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
                buf = _Buffer(self.allocator(capacity, torch.uint8))
                self.allocations += 1
                self._buffers.append(buf)
                self._by_ptr[buf.data.data_ptr()] = buf
            buf.reserved = True
            return buf

    def pack(self, leaves: list) -> list:
        """Copy every plain dense CPU tensor of ``leaves`` into one buffer; return
        the leaves with those tensors replaced by tensors on the buffer (each its
        own, not a view of another). Other leaves are given back as they are."""
        out = list(leaves)
        idx, _ = _staging.tensors_in(leaves)
        groups, total = _staging.plan(leaves, idx, self.alignment)
        if not groups:
            return out
        groups, total, buf = _packed(self, groups, total, leaves, idx, None)
        try:
            buf.used = total
            _staging.read(groups, buf.data, out)
        finally:
            buf.reserved = False
        return out

    def buffer_of(self, t: torch.Tensor) -> Optional[_Buffer]:
        """The pool buffer a tensor lies in, if any."""
        if t.device.type != "cpu":
            return None
        with self._lock:
            return self._by_ptr.get(t.untyped_storage().data_ptr())


def _packed(
    pool: PinnedPool,
    groups: list,
    total: int,
    leaves: list,
    idx: list[int],
    device: Optional[torch.device],
    extra: int = 0,
) -> tuple[list, int, _Buffer]:
    """Take a buffer from ``pool`` and write the planned groups into it. A
    group whose shapes were not read and whose tensors differ past the first
    dimension is split up (``_staging.refine``). Where ``cat`` refuses a
    tensor (on another device, sparse, nested, requiring grad), plan again
    with the tensors that can be packed and write those; the rest stay where
    they are. The buffer has ``extra`` bytes more, past the groups. Returns
    the groups written, their bytes, and the buffer, reserved: the caller
    sets ``reserved`` back to False."""
    buf = pool.take(total + extra)
    try:
        try:
            k = _staging.write(groups, buf.data)
            while k < len(groups):
                groups, total = _staging.refine(groups, k, pool.alignment)
                if total + extra > buf.data.numel():  # more groups take more bytes
                    buf = _larger(pool, buf, total + extra)
                    k = 0
                k = _staging.write(groups, buf.data, k)
            return groups, total, buf
        except (RuntimeError, NotImplementedError, TypeError):
            kept = [i for i in idx if _staging.stageable(leaves[i], device)]
            groups, total = _staging.plan(leaves, kept, pool.alignment, exact=True)
            if total + extra > buf.data.numel():  # fewer tensors may make more groups
                buf = _larger(pool, buf, total + extra)
            _staging.write(groups, buf.data)
            return groups, total, buf
    except BaseException:
        buf.reserved = False
        raise


def _larger(pool: PinnedPool, buf: _Buffer, nbytes: int) -> _Buffer:
    """A buffer of ``nbytes`` from ``pool`` in place of ``buf``, given back."""
    buf.reserved = False
    return pool.take(nbytes)


_default_pool: Optional[PinnedPool] = None
_default_pool_lock = threading.Lock()


def default_pool() -> PinnedPool:
    """The process's pool for ``pin_memory(..., coalesce=True)``."""
    global _default_pool
    with _default_pool_lock:
        if _default_pool is None:
            _default_pool = PinnedPool()
        return _default_pool


def pin_memory(
    batch: Any,
    *,
    coalesce: bool = False,
    rules: Rules = None,
    pool: Optional[PinnedPool] = None,
    strict: bool = True,
) -> Any:
    """Pin every tensor of a batch, keeping its structure and types.

    With ``coalesce=True`` all tensors of one dtype are copied into one pinned
    buffer (from ``pool``, by default the process's pool) and the batch gets
    views into it: one host allocation per dtype instead of one per tensor,
    and none at all when a buffer of a finished batch can be reused.

    On a build with no accelerator, pinning is impossible: as torch's
    DataLoader does, this warns and returns the batch unpinned.

    A leaf that is not a tensor or a plain value but holds tensors (an object
    of a class pytree_kit does not see into, such as a cache or a TensorDict)
    raises TypeError naming its path: pass ``rules=`` for its class, or
    ``strict=False`` to pass it through unpinned.

    Examples:
        >>> import torch, warnings
        >>> from pytree_kit.torch import pin_memory
        >>> batch = {"x": [torch.zeros(2), torch.ones(3)], "name": "a"}
        >>> with warnings.catch_warnings():
        ...     warnings.simplefilter("ignore")  # no accelerator here: a warning
        ...     pinned = pin_memory(batch, coalesce=True)
        >>> pinned["name"], all(
        ...     t.is_pinned() == torch.cuda.is_available() for t in pinned["x"]
        ... )
        ('a', True)
    """
    leaves, spec = api.flatten(batch, rules=rules)
    # checked with no accelerator too, so a CPU test run sees what a GPU one would
    check_leaves(leaves, batch, rules, "pin_memory", "tree", strict)
    if not _pinning_available():
        warnings.warn(
            "pytree_kit.torch.pin_memory: no accelerator is available, so no memory "
            "is pinned (torch's DataLoader does the same)",
            stacklevel=2,
        )
        return batch
    return spec.unflatten(_pin_leaves(leaves, coalesce, pool))


def _pin_storage(whole: torch.Tensor) -> torch.Tensor:
    return whole.pin_memory()


def _pin_leaves(leaves: list, coalesce: bool, pool: Optional[PinnedPool]) -> list:
    """The leaves with every CPU tensor pinned. Coalesced: the plain dense ones
    packed into one pool buffer, any other pinned on its own. Not coalesced: a
    storage the tensors share (a consolidated batch) with one pinned allocation
    and one copy, every other tensor on its own."""
    if coalesce:
        out = (pool or default_pool()).pack(leaves)
        for i, x in enumerate(leaves):
            if out[i] is x and isinstance(x, _Tensor) and x.device.type == "cpu":
                out[i] = x.pin_memory()  # a subclass, sparse or nested tensor
        return out
    whole, singles = storage_groups(leaves)
    out = list(leaves)
    for idx in whole:
        if leaves[idx[0]].device.type == "cpu" and not leaves[idx[0]].is_pinned():
            move_storage(leaves, idx, _pin_storage, out)
    for i in singles:
        out[i] = leaves[i].pin_memory()
    return out


#: bytes above which ``to_device(..., coalesce=True)`` does not pack a tensor
#: with the others (that would hold its copy back until all are packed) but
#: gives it a copy of its own: through the staging buffer when non-blocking,
#: as it is otherwise
STAGE_LIMIT = 1 << 20


def to_device(
    batch: Any,
    device: Union[str, torch.device],
    *,
    non_blocking: bool = False,
    coalesce: bool = False,
    rules: Rules = None,
    pool: Optional[PinnedPool] = None,
    strict: bool = True,
) -> Any:
    """Move every tensor of a batch to ``device``, keeping structure and types.

    Non-tensor leaves are untouched; one that holds tensors (an object of a
    class pytree_kit does not see into, such as a cache or a TensorDict) raises
    TypeError naming its path: pass ``rules=`` for its class, or
    ``strict=False`` to leave it where it is.

    With ``coalesce=True`` the batch's small CPU tensors (up to ``STAGE_LIMIT``
    bytes each; plain, dense) are packed into one pinned staging buffer from
    ``pool`` (by default the process's), moved with a single copy, and cut
    apart on the device: a few torch calls in all, not one per tensor. The
    buffer is reused once that copy has finished (an event is queried). Every
    tensor that comes out is its own: it shares the device memory of its
    batch, but is not a view, and has its own version counter. Tensors over
    ``STAGE_LIMIT`` go, with ``non_blocking=True``, through the same buffer
    with a copy each, so that packing one overlaps the copy of the one before.
    Other tensors move one by one.

    Without it, each tensor moves on its own, except tensors that share one
    storage (a consolidated batch, or one ``pin_memory(..., coalesce=True)``
    packed): that storage moves with one copy.

    Examples:
        >>> import torch
        >>> from pytree_kit.torch import to_device
        >>> moved = to_device({"x": torch.ones(2), "n": 3}, "meta")
        >>> moved["x"].device.type, moved["n"]
        ('meta', 3)
        >>> batch = {"ids": [torch.arange(n) for n in (3, 5, 2)], "x": torch.ones(4)}
        >>> moved = to_device(batch, "meta", coalesce=True)  # one copy for all four
        >>> [t.shape[0] for t in moved["ids"]], moved["x"].device.type
        ([3, 5, 2], 'meta')
    """
    device = torch.device(device)
    leaves, spec = api.flatten(batch, rules=rules)
    check_leaves(leaves, batch, rules, "to_device", "tree", strict)
    if coalesce:
        out = _staged(leaves, device, non_blocking, pool or default_pool())
    else:
        out = _moved(leaves, device, non_blocking, pool or _default_pool)
    return spec.unflatten(out)


def _small(groups: list, total: int, idx: list[int]) -> tuple[list[int], list[int]]:
    """``idx`` split into the tensors of at most ``STAGE_LIMIT`` bytes and the
    larger ones (``idx`` itself, and no large one, where all are small: the
    ``total`` bytes of the groups are no more than that)."""
    if total <= STAGE_LIMIT:
        return idx, []
    big: set[int] = set()
    for g in groups:
        row = g.row_bytes()
        if max(g.sizes) * row > STAGE_LIMIT:
            big.update(i for i, n in zip(g.where, g.sizes) if n * row > STAGE_LIMIT)
    if not big:
        return idx, []
    return [i for i in idx if i not in big], [i for i in idx if i in big]


def _transfer(flat: torch.Tensor, device: torch.device, non_blocking: bool) -> torch.Tensor:
    """The one copy of a staging buffer to the device (the tests put a copy on
    the CPU in its place, to read the values back on a machine with no GPU)."""
    return flat.to(device, non_blocking=non_blocking)


def _staged(leaves: list, device: torch.device, non_blocking: bool, pool: PinnedPool) -> list:
    """The leaves moved to ``device``: the small CPU tensors through one buffer
    and one copy; with ``non_blocking``, the large ones through the same
    buffer, each with its own copy, so that packing one overlaps the copy of
    the one before."""
    out = list(leaves)
    idx, others = _staging.tensors_in(leaves)
    if device.type == "cpu":  # where CPU tensors are already: nothing to stage
        idx, others = [], others + idx
    groups, total = _staging.plan(leaves, idx, pool.alignment)
    staged, big = _small(groups, total, idx)
    if big:
        groups, total = _staging.plan(leaves, staged, pool.alignment)
    if non_blocking and big:  # pinned ones need no packing: they move as they are
        stageable = _staging.stageable
        big = [i for i in big if stageable(leaves[i], device) and not leaves[i].is_pinned()]
    else:
        big = []
    if groups or big:
        extra = _big_bytes(leaves, big, pool.alignment)
        groups, total, buf = _packed(pool, groups, total, leaves, staged, device, extra)
        try:
            if groups:
                copy = _transfer(buf.data[:total], device, non_blocking)
            _streamed(leaves, big, buf.data, total, device, pool.alignment, out)
        finally:  # a copy queued before an error may still be reading the buffer
            buf.fence = _fence(device, non_blocking)
            buf.reserved = False
        if groups:
            _staging.read(groups, copy, out)
    if len(staged) + len(big) != len(idx) or sum(len(g.where) for g in groups) != len(staged):
        others = others + idx  # some were left out: those not staged move below
    for i in others:
        if out[i] is leaves[i]:
            out[i] = leaves[i].to(device, non_blocking=non_blocking)
    return out


def _aligned(n: int, alignment: int) -> int:
    return -(-n // alignment) * alignment


def _big_bytes(leaves: list, big: list[int], alignment: int) -> int:
    """The bytes the large tensors ``leaves[big]`` take after the groups (each
    on an ``alignment`` boundary), counting the padding before the first."""
    total = 0
    for i in big:
        total = _aligned(total, alignment) + leaves[i].nbytes
    return total + alignment if big else 0


def _streamed(
    leaves: list,
    big: list[int],
    flat: torch.Tensor,
    start: int,
    device: torch.device,
    alignment: int,
    out: list,
) -> None:
    """Copy each large tensor into the byte buffer ``flat`` from ``start`` on,
    and from there to ``device`` with a copy of its own: a non-blocking copy
    from pinned memory returns at once, so the next tensor is packed while
    the one before is on its way (``pin_memory`` then ``to`` packs them all
    first; ``to`` from ordinary memory copies through the driver's own
    staging, waiting for each)."""
    offset = _aligned(start, alignment)
    for i in big:
        x = leaves[i]
        n = x.nbytes
        region = flat[offset : offset + n]
        region.view(x.dtype).view(x.shape).copy_(x)
        moved = _transfer(region, device, True)
        out[i] = moved.view(x.dtype).view(x.shape).data  # no base: its own version counter
        offset = _aligned(offset + n, alignment)


def _moved(
    leaves: list, device: torch.device, non_blocking: bool, pool: Optional[PinnedPool]
) -> list:
    """The leaves moved to ``device`` one by one, storages the tensors share whole."""
    whole, singles = storage_groups(leaves)
    out = list(leaves)

    def move(t: torch.Tensor) -> torch.Tensor:
        return t.to(device, non_blocking=non_blocking)

    def move_buffer(idx: list[int], buf: Optional[_Buffer]) -> None:
        # a pool buffer moves only the part its batch uses, and is not reused
        # before that copy has read it
        move_storage(leaves, idx, move, out, None if buf is None else buf.used)
        if buf is not None:
            with pool._lock:  # type: ignore[union-attr]
                buf.fence = _fence(device, non_blocking)

    for idx in whole:
        x0 = leaves[idx[0]]
        if x0.device != device:
            move_buffer(idx, pool.buffer_of(x0) if pool is not None else None)
    in_buffers: dict[int, tuple[_Buffer, list[int]]] = {}
    for i in singles:
        x = leaves[i]
        buf = pool.buffer_of(x) if pool is not None and x.device != device else None
        if buf is None:
            out[i] = x.to(device, non_blocking=non_blocking)
        else:  # a few tensors of a large pool buffer: still one copy
            in_buffers.setdefault(id(buf), (buf, []))[1].append(i)
    for buf, idx in in_buffers.values():
        move_buffer(idx, buf)
    return out


# --------------------------------------------------------------------------
# DataLoader-style loading with pinning off the main thread


class PinnedLoader:
    """Iterate a loader with every batch pinned by a background thread.

    torch's ``DataLoader(pin_memory=True)`` pins in a thread, but skips any
    dataclass or class of your own. Wrap the loader instead (with
    ``pin_memory=False``), and every tensor of every batch comes out pinned,
    whatever its containers::

        loader = DataLoader(dataset, batch_size=32, collate_fn=collate, num_workers=4)
        for batch in PinnedLoader(loader, coalesce=True):
            batch = to_device(batch, "cuda", non_blocking=True, coalesce=True)

    (``coalesce=True`` in ``to_device`` too: a batch of many small tensors then
    moves with a few torch calls in all, not one or two per tensor.)

    Up to ``prefetch`` pinned batches wait ahead of the consumer. An exception
    in the loader or in pinning is raised in the consumer, at its batch.
    ``strict`` is :func:`pin_memory`'s.
    """

    def __init__(
        self,
        loader: Iterable[Any],
        *,
        coalesce: bool = False,
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

        if not _pinning_available():
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
