"""Data loading for arbitrary nested batches: collate, pin_memory, to_device.

torch's DataLoader machinery understands tensors, numbers, dicts, lists and
namedtuples. A dataclass or a class of your own batch is skipped by
``pin_memory`` and rejected by ``default_collate``. These functions work on any
tree pytree_kit understands, and keep every container's type.
"""

from __future__ import annotations

import math
import queue
import threading
import warnings
from typing import Any, Callable, Iterable, Iterator, Mapping, Optional, Union

import torch

from .. import api
from .._keys import where
from .._kinds import Rule

__all__ = ["PinnedLoader", "PinnedPool", "collate", "pin_memory", "to_device"]

Rules = Optional[Mapping[type, Rule]]

_NUMBERS = (bool, int, float, complex)


# --------------------------------------------------------------------------
# collate


def collate(samples: Iterable[Any], *, rules: Rules = None) -> Any:
    """Turn a list of samples of one structure into one batch of the same types.

    Tensors are stacked along a new first dimension; numbers become a tensor;
    strings and any other leaves become a list; None stays None. Dataclasses,
    namedtuples, protocol classes and dicts keep their type. A structure
    mismatch, or tensors that cannot be stacked, raise ValueError naming the
    path. Use it as ``DataLoader(dataset, collate_fn=collate)``.

    Examples:
        >>> import dataclasses, torch
        >>> from pytree_kit.torch import collate
        >>> @dataclasses.dataclass
        ... class Sample:
        ...     image: torch.Tensor
        ...     label: int
        ...     name: str
        ...     mask: object = None
        >>> batch = collate([Sample(torch.zeros(3), 1, "a"), Sample(torch.ones(3), 0, "b")])
        >>> type(batch).__name__, tuple(batch.image.shape), batch.label, batch.name, batch.mask
        ('Sample', (2, 3), tensor([1, 0]), ['a', 'b'], None)
    """
    samples = list(samples)
    if not samples:
        raise ValueError("collate: no samples")
    pairs, spec = api.flatten_with_path(samples[0], rules=rules)
    columns: list[list] = [[leaf] for _, leaf in pairs]
    for k in range(1, len(samples)):
        try:
            leaves = spec.flatten_up_to(samples[k])
        except ValueError as e:
            raise ValueError(
                f"collate: sample {k} does not have the structure of sample 0: {e}"
            ) from None
        for column, leaf in zip(columns, leaves):
            column.append(leaf)
    return spec.unflatten(
        [_collate_leaf(path, col, rules) for (path, _), col in zip(pairs, columns)]
    )


def _category(x: Any) -> str:
    if isinstance(x, torch.Tensor):
        return "tensor"
    if isinstance(x, _NUMBERS):
        return "number"
    return "other"


def _collate_leaf(path: tuple, values: list, rules: Rules) -> Any:
    kinds = {_category(v) for v in values}
    if len(kinds) > 1 or "other" in kinds:
        # Sample 0 has a leaf here; so must every other sample (not a subtree).
        for k, v in enumerate(values[1:], 1):
            if not api.structure(v, rules=rules).is_leaf():
                raise ValueError(
                    f"collate: sample {k} does not have the structure of sample 0: "
                    f"{where(path)}: sample 0 has a leaf of type {type(values[0]).__qualname__}, "
                    f"sample {k} has a {type(v).__qualname__} container"
                )
    if len(kinds) > 1:
        found = ", ".join(sorted({type(v).__qualname__ for v in values}))
        raise ValueError(
            f"collate: {where(path)}: the samples hold different kinds of values here ({found})"
        )
    kind = kinds.pop()
    if kind == "number":
        return torch.tensor(values)
    if kind == "other":
        return values
    first = values[0]
    shapes = {tuple(v.shape) for v in values}
    if len(shapes) > 1 or len({v.dtype for v in values}) > 1 or len({v.device for v in values}) > 1:
        detail = ", ".join(f"{tuple(v.shape)} {v.dtype} {v.device}" for v in values[:8])
        raise ValueError(
            f"collate: {where(path)}: cannot stack tensors of differing shape, dtype "
            f"or device: {detail}"
        )
    out = None
    if torch.utils.data.get_worker_info() is not None and first.layout == torch.strided:
        # In a worker process, stack straight into shared memory, as default_collate
        # does, to save a copy when the batch is sent to the main process.
        try:
            numel = sum(v.numel() for v in values)
            storage = first.untyped_storage()._new_shared(numel * first.element_size())
            out = first.new(storage).resize_(len(values), *first.shape)
        except Exception:  # pragma: no cover - private API changed: plain stack
            out = None
    return torch.stack(values, 0, out=out)


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
                and x.device.type == "cpu"
                and not x.is_pinned()
            ):
                groups.setdefault(x.dtype, []).append(i)
        out = list(leaves)
        with self._lock, torch.no_grad():
            for dtype, positions in groups.items():
                step = max(1, self.alignment // torch.empty((), dtype=dtype).element_size())
                offsets = []
                total = 0
                for i in positions:
                    offsets.append(total)
                    total += -(-leaves[i].numel() // step) * step
                buf = self._take(dtype, total)
                buf.used = total
                for i, offset in zip(positions, offsets):
                    x = leaves[i]
                    view = buf.data[offset : offset + x.numel()].view(x.shape)
                    view.copy_(x)
                    out[i] = view
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
    batch: Any, *, coalesce: bool = False, rules: Rules = None, pool: Optional[PinnedPool] = None
) -> Any:
    """Pin every tensor of a batch, keeping its structure and types.

    With ``coalesce=True`` all tensors of one dtype are copied into one pinned
    buffer (from ``pool``, by default the process's pool) and the batch gets
    views into it: one host allocation per dtype instead of one per tensor,
    and none at all when a buffer of a finished batch can be reused.

    On a build with no accelerator, pinning is impossible: as torch's
    DataLoader does, this warns and returns the batch unpinned.

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
    if not _pinning_available():
        warnings.warn(
            "pytree_kit.torch.pin_memory: no accelerator is available, so no memory "
            "is pinned (torch's DataLoader does the same)",
            stacklevel=2,
        )
        return batch
    leaves, spec = api.flatten(batch, rules=rules)
    if coalesce:
        new = (pool or default_pool()).pack(leaves)
    else:
        new = [x.pin_memory() if isinstance(x, torch.Tensor) else x for x in leaves]
    return spec.unflatten(new)


def to_device(
    batch: Any,
    device: Union[str, torch.device],
    *,
    non_blocking: bool = False,
    rules: Rules = None,
    pool: Optional[PinnedPool] = None,
) -> Any:
    """Move every tensor of a batch to ``device``, keeping structure and types.

    Non-tensor leaves are untouched. Tensors that ``pin_memory(...,
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
    copies: dict[int, torch.Tensor] = {}
    out = []
    for x in leaves:
        if not isinstance(x, torch.Tensor):
            out.append(x)
            continue
        buf = pool.buffer_of(x) if pool is not None else None
        if buf is None:
            out.append(x.to(device, non_blocking=non_blocking))
            continue
        copy = copies.get(id(buf))
        if copy is None:
            copy = copies[id(buf)] = buf.data[: buf.used].to(device, non_blocking=non_blocking)
        out.append(copy.as_strided(x.shape, x.stride(), x.storage_offset()))
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
    """

    def __init__(
        self,
        loader: Iterable[Any],
        *,
        coalesce: bool = False,
        rules: Rules = None,
        pool: Optional[PinnedPool] = None,
        prefetch: int = 2,
    ) -> None:
        self.loader = loader
        self.coalesce = coalesce
        self.rules = rules
        self.pool = pool
        self.prefetch = prefetch

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
                            batch, coalesce=self.coalesce, rules=self.rules, pool=self.pool
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
