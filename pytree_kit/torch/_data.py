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


def _pinned_empty(numel: int, dtype: torch.dtype) -> torch.Tensor:
    return torch.empty(numel, dtype=dtype, pin_memory=True)


def _storage_users(t: torch.Tensor) -> int:
    """How many tensors (and storage objects) hold t's storage; -1 if unknown."""
    use_count = getattr(torch._C, "_storage_Use_Count", None)
    if use_count is None:  # pragma: no cover - private API gone: never reuse
        return -1
    return int(use_count(t.untyped_storage()._cdata))


def _copy_all(views: list, sources: list) -> None:
    """``views[k].copy_(sources[k])`` for every k: one call for plain tensors
    (``torch._foreach_copy_``, where this torch has it), one each for the rest
    (a subclass's own ``copy_`` runs as it would)."""
    foreach = getattr(torch, "_foreach_copy_", None)
    plain = [k for k, x in enumerate(sources) if type(x) is torch.Tensor]
    if foreach is not None and len(plain) > 1:
        foreach([views[k] for k in plain], [sources[k] for k in plain])
        done = set(plain)
    else:
        done = set()
    for k, (view, x) in enumerate(zip(views, sources)):
        if k not in done:
            view.copy_(x)


class _Buffer:
    __slots__ = ("baseline", "data", "used")

    def __init__(self, data: torch.Tensor) -> None:
        self.data = data
        self.used = 0
        self.baseline = _storage_users(data)  # holders when no view is out

    def free(self) -> bool:
        users = _storage_users(self.data)
        return users != -1 and users <= self.baseline


class PinnedPool:
    """Buffers that ``pin_memory(..., coalesce=True)`` packs tensors into.

    Each batch gets one buffer per dtype; its tensors become views into it. A
    buffer is reused for a later batch only when no view into it (nor any view
    of a view) is still alive, so memory a previous batch still uses is never
    handed out again. At most ``max_buffers`` idle buffers are kept per dtype.

    ``allocator(numel, dtype)`` makes a buffer; the default allocates pinned
    memory. ``allocations`` counts the buffers made.
    """

    def __init__(
        self,
        *,
        max_buffers: int = 4,
        allocator: Callable[[int, torch.dtype], torch.Tensor] = _pinned_empty,
        alignment: int = 128,
    ) -> None:
        self.max_buffers = max_buffers
        self.allocator = allocator
        self.alignment = alignment  # bytes between the starts of two tensors
        self.allocations = 0
        self._buffers: dict[torch.dtype, list[_Buffer]] = {}
        self._by_ptr: dict[int, _Buffer] = {}
        self._lock = threading.Lock()

    def _take(self, dtype: torch.dtype, numel: int) -> _Buffer:
        buffers = self._buffers.setdefault(dtype, [])
        free = [b for b in buffers if b.free()]
        fitting = [b for b in free if b.data.numel() >= numel]
        if fitting:
            return min(fitting, key=lambda b: b.data.numel())
        # Keep at most max_buffers: forget idle ones, smallest first.
        for b in sorted(free, key=lambda b: b.data.numel()):
            if len(buffers) < self.max_buffers:
                break
            buffers.remove(b)
            self._by_ptr.pop(b.data.data_ptr(), None)
        capacity = 1 << max(0, math.ceil(math.log2(max(numel, 1))))  # room to grow
        buf = _Buffer(self.allocator(capacity, dtype))
        self.allocations += 1
        buffers.append(buf)
        self._by_ptr[buf.data.data_ptr()] = buf
        return buf

    def pack(self, leaves: list) -> list:
        """Copy every dense CPU tensor of ``leaves`` into one buffer per dtype;
        return the leaves with those tensors replaced by views."""
        groups: dict[torch.dtype, list[int]] = {}
        for i, x in enumerate(leaves):
            if (
                isinstance(x, torch.Tensor)
                and x.layout == torch.strided
                and x.is_cpu
                and not x.is_pinned()
            ):
                groups.setdefault(x.dtype, []).append(i)
        out = list(leaves)
        with self._lock, torch.no_grad():
            for dtype, positions in groups.items():
                step = max(1, self.alignment // torch.empty((), dtype=dtype).element_size())
                # the buffer cut in one call: each tensor's run, and after it the
                # padding up to the next aligned start, where there is any
                sizes: list[int] = []
                runs: list[int] = []  # which of the pieces is the tensor's
                for i in positions:
                    n = leaves[i].numel()
                    runs.append(len(sizes))
                    sizes.append(n)
                    pad = -n % step
                    if pad:
                        sizes.append(pad)
                total = sum(sizes)
                buf = self._take(dtype, total)
                buf.used = total
                pieces = torch.split_with_sizes(buf.data[:total], sizes)
                views, sources = [], []
                for i, run in zip(positions, runs):
                    x = leaves[i]
                    view = pieces[run]
                    if x.dim() != 1:
                        view = view.view(x.shape)
                    out[i] = view
                    views.append(view)
                    sources.append(x)
                _copy_all(views, sources)
        return out

    def buffer_of(self, t: torch.Tensor) -> Optional[_Buffer]:
        """The pool buffer a tensor is a view into, if any."""
        if t.device.type != "cpu":
            return None
        with self._lock:
            return self._by_ptr.get(t.untyped_storage().data_ptr())


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
    """The leaves with every CPU tensor pinned: a storage the tensors share
    (a consolidated batch) with one pinned allocation and one copy."""
    whole, singles = storage_groups(leaves)
    out = list(leaves)
    for idx in whole:
        if leaves[idx[0]].device.type == "cpu" and not leaves[idx[0]].is_pinned():
            move_storage(leaves, idx, _pin_storage, out)
    if coalesce:
        packed = (pool or default_pool()).pack([leaves[i] for i in singles])
        for i, x in zip(singles, packed):
            out[i] = x
    else:
        for i in singles:
            out[i] = leaves[i].pin_memory()
    return out


def to_device(
    batch: Any,
    device: Union[str, torch.device],
    *,
    non_blocking: bool = False,
    rules: Rules = None,
    pool: Optional[PinnedPool] = None,
    strict: bool = True,
) -> Any:
    """Move every tensor of a batch to ``device``, keeping structure and types.

    Non-tensor leaves are untouched; one that holds tensors (an object of a
    class pytree_kit does not see into, such as a cache or a TensorDict) raises
    TypeError naming its path: pass ``rules=`` for its class, or
    ``strict=False`` to leave it where it is. Tensors that ``pin_memory(...,
    coalesce=True)`` packed into one buffer move with one copy per buffer
    (per dtype), and come out as views of the buffer's copy on the device.

    Examples:
        >>> import torch
        >>> from pytree_kit.torch import to_device
        >>> moved = to_device({"x": torch.ones(2), "n": 3}, "meta")
        >>> moved["x"].device.type, moved["n"]
        ('meta', 3)
    """
    device = torch.device(device)
    pool = pool or _default_pool
    leaves, spec = api.flatten(batch, rules=rules)
    check_leaves(leaves, batch, rules, "to_device", "tree", strict)
    whole, singles = storage_groups(leaves)
    out = list(leaves)

    def move(t: torch.Tensor) -> torch.Tensor:
        return t.to(device, non_blocking=non_blocking)

    for idx in whole:
        x0 = leaves[idx[0]]
        if x0.device != device:
            # a pool buffer moves only the part its batch uses
            buf = pool.buffer_of(x0) if pool is not None else None
            used = None if buf is None else buf.used * buf.data.element_size()
            move_storage(leaves, idx, move, out, used)
    copies: dict[int, torch.Tensor] = {}
    for i in singles:
        x = leaves[i]
        buf = pool.buffer_of(x) if pool is not None else None
        if buf is None:
            out[i] = x.to(device, non_blocking=non_blocking)
            continue
        copy = copies.get(id(buf))
        if copy is None:
            copy = copies[id(buf)] = buf.data[: buf.used].to(device, non_blocking=non_blocking)
        # its own tensor, not a view of the copy: see move_storage
        out[i] = copy.as_strided(x.shape, x.stride(), x.storage_offset()).data
    return spec.unflatten(out)


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
            batch = to_device(batch, "cuda", non_blocking=True)

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
