"""Moving a batch: ``to_device`` and ``pin_memory``.

torch's DataLoader machinery understands tensors, numbers, dicts, lists and
namedtuples; a dataclass or a class of your own is skipped by its
``pin_memory``, and by accelerate's ``send_to_device``. These functions work
on any tree pytree_kit understands, and keep every container's type.

A batch goes one way through this module: flattened, its leaves checked for
hidden tensors (``_hidden``), then moved by one of two ways, and unflattened:

- **staged** (``_staging.stage``): the small tensors packed into one buffer
  of a ``PinnedPool`` (``_pool``) and moved with one copy;
- **by tensor**: each tensor with its own ``.to``, except tensors that share
  one storage (a consolidated batch, or one ``pin_memory`` packed), whose
  storage moves with one copy (``_storage``).

``coalesce=None``, the default, picks per batch (``choose``): staged where at
least ``COALESCE_MIN`` tensors would each pay a copy of their own, by tensor
otherwise. ``coalesce=True`` and ``coalesce=False`` force one way.
(``collate`` and the way back from a batch are in ``_collate``; the loader
thread that pins ahead of the consumer is in ``_loader``.)
"""

from __future__ import annotations

import functools
import inspect
import warnings
from typing import Any, Callable, Mapping, Optional, Union

import torch

from .. import api
from .._kinds import Rule
from . import _pool, _staging
from ._hidden import check_leaves, leaf_path
from ._pool import PinnedPool, default_pool
from ._staging import STAGE_LIMIT
from ._storage import move_storage, storage_groups

__all__ = [
    "COALESCE_MIN",
    "DMA_DEVICES",
    "NO_DMA_COALESCE_MIN",
    "NO_DMA_STAGE_LIMIT",
    "STAGE_LIMIT",
    "choose",
    "pin_memory",
    "to_device",
]

Rules = Optional[Mapping[type, Rule]]

#: the fewest tensors that ``coalesce=None`` packs into one buffer for a
#: device with a DMA engine (each of at most ``STAGE_LIMIT`` bytes). On an
#: H200 (benchmarks/results/gpu_h200/transfer_peers.md) packing 128-byte
#: tensors pays from 8 of them, against a copy each as ``_to_each`` makes
#: it; larger tensors need more (4 x 128 KB: 0.109 ms packed, 0.073 ms a
#: copy each), and counts between were not measured for them: 16 is kept.
COALESCE_MIN = 16
#: the device types a copy to which runs faster from pinned memory than from
#: pageable memory (a DMA engine reads it): there, packing into a pinned buffer
#: pays for its extra host copy at any size up to ``STAGE_LIMIT``
#: (benchmarks/results/gpu_h200/pinning.md: 10 x float32[1M] moved 2.6x faster
#: through pinned memory than from pageable memory)
DMA_DEVICES = frozenset({"cuda", "xpu", "hpu", "mtia", "privateuseone"})
#: to any other device (the meta device, where a copy each is a ``.to`` of 2-3
#: µs), the fewest tensors packing pays for, and the most bytes of a tensor it
#: packs (it adds a second copy of every byte, and nothing reads pinned
#: memory faster): measured by ``benchmarks/transfer_peers.py --thresholds``
NO_DMA_COALESCE_MIN = 48
NO_DMA_STAGE_LIMIT = 16 << 10
#: batches of a structure that ``coalesce=None`` moves by tensor without
#: asking staging again, once staging has packed none of its tensors (too
#: few small ones, or, without a DMA engine, one dtype in many shapes):
#: a loader repeats its structures, and a refused plan costs about a
#: microsecond a tensor. (Only for batches of up to ``EXACT_UP_TO`` (256)
#: leaves: a larger structure's hash costs as much as a plan.)
RETRY_AFTER = 32

#: (structure, to a DMA device) -> batches left before staging is tried again
_refused: dict = {}

_Tensor = torch.Tensor
_device = torch.device
_strided = torch.strided


def choose(leaves: list, idx: list[int], dma: bool = True) -> bool:
    """Whether ``coalesce=None`` stages the plain CPU tensors ``leaves[idx]``
    on their way to a device with a DMA engine (``dma``) or not: when there
    are at least ``COALESCE_MIN`` of them (``NO_DMA_COALESCE_MIN``), or, to a
    DMA device, when one is over ``STAGE_LIMIT`` bytes: it is streamed
    through pinned memory, which a DMA engine reads 2.6 times as fast as
    ordinary memory (an H200: benchmarks/results/gpu_h200/pinning.md), and
    the small ones go with it. (Staging still leaves the small ones to a
    copy each where fewer of them than that are under its size limit:
    ``STAGE_LIMIT``, or ``NO_DMA_STAGE_LIMIT``.)"""
    if len(idx) >= (COALESCE_MIN if dma else NO_DMA_COALESCE_MIN):
        return True
    return dma and _any_large(leaves, idx)


def _any_large(leaves: list, idx: list[int]) -> bool:
    return any(n > STAGE_LIMIT for n in _staging.sizes(leaves, idx))


def to_device(
    batch: Any,
    device: Union[str, torch.device],
    *,
    non_blocking: bool = False,
    coalesce: Optional[bool] = None,
    rules: Rules = None,
    pool: Optional[PinnedPool] = None,
    strict: bool = True,
) -> Any:
    """Move every tensor of a batch to ``device``, keeping structure and types.

    Non-tensor leaves are untouched; one that holds tensors (an object of a
    class pytree_kit does not see into, such as a cache or a TensorDict) raises
    TypeError naming its path: pass ``rules=`` for its class, or
    ``strict=False`` to leave it where it is.

    How the tensors move (``coalesce``):

    - ``None`` (the default) picks per batch. With ``COALESCE_MIN`` (16) or
      more plain CPU tensors, the small ones are staged as with ``True``:
      one copy pays for them all (to a device without a DMA engine, such as
      ``meta``: ``NO_DMA_COALESCE_MIN`` (48) or more, only those of at most
      ``NO_DMA_STAGE_LIMIT`` (16 KiB) bytes, and not where one dtype's
      tensors come in many shapes).
      With fewer, each moves with a ``.to`` of its own (to a CUDA device,
      a blocking call queues those copies and waits once, for the last).
      To a DMA device (cuda, xpu, ...), a tensor over ``STAGE_LIMIT``
      (1 MiB) is streamed through pinned memory, blocking or not (a
      blocking call waits for its copies before it returns), and a batch
      that lies packed in pinned memory already (from ``pin_memory`` or a
      ``PinnedLoader``) moves as it lies, its storage with one copy;
    - ``True``: the batch's small CPU tensors (up to ``STAGE_LIMIT`` bytes
      each; plain, dense) are packed into one pinned staging buffer from
      ``pool`` (by default the process's), moved with a single copy, and cut
      apart on the device: a few torch calls in all, not one per tensor. The
      buffer is reused once that copy has finished (an event is queried).
      Tensors over ``STAGE_LIMIT`` go through the same buffer with a copy
      each, so that packing one overlaps the copy of the one before: to a
      DMA device always, to another with ``non_blocking=True``;
    - ``False``: each tensor moves on its own, except tensors that share one
      storage (a consolidated batch, or one ``pin_memory(..., coalesce=True)``
      packed): that storage moves with one copy.

    Every tensor that comes out is its own: it may share the device memory
    of its batch, but is not a view, and has its own version counter.

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
    if type(device) is not _device:
        device = _device(device)
    if type(batch) is _Tensor and not non_blocking and not coalesce:
        return batch.to(device)  # a batch that is one tensor: its own .to, as the rule says
    leaves, spec = api.flatten(batch, rules=rules)
    movers = check_leaves(leaves, batch, rules, "to_device", "tree", strict, "to")
    out: Optional[list] = None
    if coalesce is None and len(leaves) < COALESCE_MIN:
        # fewer leaves than staging needs, none to stream (a tokenizer batch): a .to each
        if not non_blocking:
            out = _few(leaves, device)
        elif device.type != "cpu":  # (_moved leaves CPU tensors as they are)
            idx, others = _staging.tensors_in(leaves)
            if device.type not in DMA_DEVICES or not _any_large(leaves, idx):
                out = list(leaves)
                _each(leaves, idx + others, device, non_blocking, pool, out)
    if out is None:
        out = _moved(leaves, device, non_blocking, coalesce, pool, spec)
    if movers:
        move = functools.partial(_own_to, device=device, non_blocking=non_blocking)
        _move_themselves(leaves, movers, out, move, "to_device", ".to", batch, rules)
    return spec.unflatten(out)


def _own_to(x: Any, device: torch.device, non_blocking: bool) -> Any:
    """``x.to(device, non_blocking=...)``, as accelerate calls it; ``x.to(device)``
    where its ``.to`` takes no ``non_blocking`` (Lightning's call for an object
    that is no tensor): the same copy when ``non_blocking`` is False, and a
    blocking one, which is safe, when it is True."""
    if _takes_non_blocking(type(x).to):
        return x.to(device, non_blocking=non_blocking)
    return x.to(device)


def _takes_non_blocking(fn: Any) -> bool:
    """Whether the function ``fn`` takes a ``non_blocking`` keyword (or any
    keyword); True where its signature cannot be read (a builtin's)."""
    try:
        return _signature_takes(fn, "non_blocking")
    except TypeError:  # an unhashable callable: read each time
        return _signature_takes.__wrapped__(fn, "non_blocking")


@functools.lru_cache(maxsize=256)
def _signature_takes(fn: Any, name: str) -> bool:
    try:
        params = inspect.signature(fn).parameters.values()
    except (TypeError, ValueError):
        return True
    keyword = (inspect.Parameter.POSITIONAL_OR_KEYWORD, inspect.Parameter.KEYWORD_ONLY)
    return any(
        p.kind is inspect.Parameter.VAR_KEYWORD or (p.name == name and p.kind in keyword)
        for p in params
    )


def _move_themselves(
    leaves: list,
    at: list[int],
    out: list,
    move: Callable[[Any], Any],
    who: str,
    method: str,
    tree: Any,
    rules: Rules,
) -> None:
    """``out[i] = move(leaves[i])`` for each leaf ``i`` of ``at``, an object
    that moves itself (``.to()``, ``.pin_memory()``): its result takes its
    place, or, where it returns None (it moved in place, as Lightning
    accepts), the object itself. An exception its method raises propagates
    unchanged, with a note naming the path; a result of another class than
    the object's raises TypeError naming the path."""
    for i in at:
        x = leaves[i]
        try:
            got = move(x)
        except Exception as e:
            where = "tree" + leaf_path(tree, rules, i)
            _note(e, f"{who}: raised by the {method}() of the {_name(x)} at {where}")
            raise
        if got is None:
            got = x
        elif not isinstance(got, type(x)):
            raise TypeError(
                f"{who}: tree{leaf_path(tree, rules, i)} is a {_name(x)} whose {method}() "
                f"returned a {_name(got)}: a {method}() returns the moved object, of its own "
                f"class (or None, having moved it in place); fix its {method}(), or pass "
                "rules= for its class so that its tensors are moved as a tree's"
            )
        out[i] = got


def _name(x: Any) -> str:
    t = type(x)
    return f"{t.__module__}.{t.__qualname__}" if t.__module__ != "builtins" else t.__qualname__


def _note(e: BaseException, text: str) -> None:
    """Add ``text`` to ``e``'s notes (PEP 678: shown with its traceback from
    Python 3.11; kept in ``__notes__`` on 3.10 too)."""
    add = getattr(e, "add_note", None)
    if add is not None:
        add(text)
        return
    notes = getattr(e, "__notes__", None)
    try:
        e.__notes__ = [*(notes or ()), text]  # type: ignore[attr-defined]
    except AttributeError:  # pragma: no cover - an exception that takes no attribute
        pass


#: whether each device met has a DMA engine, ``(DMA_DEVICES, device.type in
#: DMA_DEVICES)`` (the set it was asked of: a test, or a user, may put another
#: in its place): a dict lookup takes 36 ns, ``torch.device.type`` 224 ns (3.11,
#: torch 2.13)
_DMA: dict = {}


def _dma_of(device: torch.device) -> tuple:
    if len(_DMA) >= 64:
        _DMA.clear()
    found = _DMA[device] = (DMA_DEVICES, device.type in DMA_DEVICES)
    return found


def _few(leaves: list, device: torch.device) -> Optional[list]:
    """The leaves moved as a blocking call of ``coalesce=None`` moves a batch
    of fewer than ``COALESCE_MIN`` of them, a ``.to`` each as ``_to_each``
    makes them, found in one pass over the leaves (three passes did it
    before: on a tokenizer batch to CUDA, the copies stood in for, the host
    work went from 5.0 to 3.9 µs); None where a tensor over ``STAGE_LIMIT``
    is to be streamed to a DMA device (``_moved``)."""
    found = _DMA.get(device)
    if found is None or found[0] is not DMA_DEVICES:
        found = _dma_of(device)
    if not found[1]:  # nothing to stream, and no copy is queued: a .to each, in
        # leaf order, in one pass (tensors_in and _queued took 1.1 µs more
        # on a 4-tensor batch, on 3.11)
        return [x.to(device) if isinstance(x, _Tensor) else x for x in leaves]
    out = list(leaves)
    cuda = device.type == "cuda"
    at: list[int] = []
    last = -1
    for i, x in enumerate(leaves):
        if not isinstance(x, _Tensor):
            continue
        if type(x) is _Tensor and x.layout is _strided:
            n = x.nbytes
            if n > STAGE_LIMIT:
                return None
            if cuda and n and x.is_cpu:  # (_waits)
                last = len(at)
        at.append(i)
    _queued(leaves, at, last, device, out)
    return out


def _moved(
    leaves: list,
    device: torch.device,
    non_blocking: bool,
    coalesce: Optional[bool],
    pool: Optional[PinnedPool],
    spec: Any = None,
) -> list:
    """The leaves moved to ``device``: staged or by tensor, as ``coalesce``
    says (None: as ``choose`` says, unless staging refused the last batch
    of structure ``spec``: ``RETRY_AFTER``, or the batch lies packed in
    pinned memory already: ``_packed_already``)."""
    out = list(leaves)
    if device.type == "cpu":  # nothing to stage; tensors there already stay as they are
        idx, others = _staging.tensors_in(leaves)
        if all(leaves[i].is_cpu for i in idx) and all(leaves[i].is_cpu for i in others):
            return out
        _by_tensor(leaves, device, non_blocking, pool, out)
        return out
    if coalesce is False:
        _by_tensor(leaves, device, non_blocking, pool, out)
        return out
    dma = device.type in DMA_DEVICES
    idx, others = _staging.tensors_in(leaves)
    if coalesce is None and dma and idx and _packed_already(leaves[idx[0]]):
        _by_tensor(leaves, device, non_blocking, pool, out)  # no second packing
        return out
    # (a spec's hash reads all its nodes: remembered only for batches planned exactly)
    key = (spec, dma) if spec is not None and len(leaves) <= _staging.EXACT_UP_TO else None
    if coalesce is None and (not choose(leaves, idx, dma) or _skip(key)):
        _each(leaves, idx + others, device, non_blocking, pool, out)
        return out
    # large tensors are streamed to a DMA device, and, when asked, to any other;
    # a blocking call then waits for the copies, as a blocking .to would
    stream = dma or (non_blocking and bool(coalesce))
    left = _staging.stage(
        leaves,
        idx,
        out,
        pool or default_pool(),
        device,
        stream,
        min_tensors=1 if coalesce else COALESCE_MIN if dma else NO_DMA_COALESCE_MIN,
        limit=STAGE_LIMIT if coalesce or dma else NO_DMA_STAGE_LIMIT,
        flat=bool(coalesce) or dma,
    )
    if coalesce is None and left is idx and key is not None:  # staging packed nothing
        if len(_refused) >= 256:
            _refused.clear()
        _refused[key] = RETRY_AFTER
    _each(leaves, left + others, device, non_blocking, pool, out)
    if stream and not non_blocking and left is not idx:
        _pool.wait(device)
    return out


def _packed_already(x: torch.Tensor) -> bool:
    """Whether the CPU tensor ``x`` lies in pinned memory that holds more than
    it: a batch that ``pin_memory`` or a ``PinnedLoader`` packed into a pool
    buffer, or a consolidated batch pinned whole. Its storage then goes to a
    DMA device with one copy (``_by_tensor``): packing it again would copy
    every byte once more on the host (the first tensor stands for the
    batch; ``_by_tensor`` moves any others one by one)."""
    return (
        x.is_cpu
        and x.layout is _strided
        and x.untyped_storage().nbytes() > x.nbytes
        and x.is_pinned()
    )


def _skip(key: Optional[tuple]) -> bool:
    """Whether staging refused the last batch of this structure (and is not
    to be tried again yet)."""
    if key is None:
        return False
    left = _refused.get(key)
    if left is None:
        return False
    if left <= 1:
        _refused.pop(key, None)
    else:
        _refused[key] = left - 1
    return True


def _each(
    leaves: list,
    at: list[int],
    device: torch.device,
    non_blocking: bool,
    pool: Optional[PinnedPool],
    out: list,
) -> None:
    """Move the tensors ``leaves[at]`` into ``out``, each with a copy of its
    own: blocking, a ``.to`` each (sharing a storage saves few copies, and
    costs a look at each); non-blocking, by ``_by_tensor``, since one may lie
    in a pool buffer that must not be reused while a copy reads it."""
    if not non_blocking:
        _to_each(leaves, at, device, out)
        return
    if not at:
        return
    sub = [leaves[i] for i in at]
    moved = list(sub)
    _by_tensor(sub, device, non_blocking, pool, moved)
    for i, x in zip(at, moved):
        out[i] = x


def _to_each(leaves: list, at: list[int], device: torch.device, out: list) -> None:
    """A blocking ``.to`` of each tensor ``leaves[at]`` into ``out``, waiting
    once. To a CUDA device, the copies from the CPU are queued without
    waiting, on the device's current stream, up to the last copy with bytes
    of a plain dense tensor (``_waits``), which is blocking: it waits for
    that stream (torch's blocking copy synchronizes it), and so for every
    copy queued before it; any after it are blocking too. A copy from
    ordinary memory returns once the driver has taken its bytes, so each
    starts while the one before is on its way; a blocking copy each waits
    for each (4 x 128 KB on an H200: 0.070 ms queued with the last blocking,
    0.091 ms a wait each: benchmarks/results/gpu_h200/transfer_bound.md).
    When this returns, every copy has finished, as with a blocking ``.to``
    each."""
    last = -1
    if device.type == "cuda":
        for k, i in enumerate(at):
            if _waits(leaves[i]):
                last = k
    _queued(leaves, at, last, device, out)


def _waits(x: Any) -> bool:
    """Whether a blocking copy of ``x`` to a CUDA device surely synchronizes
    the stream: a plain dense CPU tensor with bytes (a sparse or jagged
    tensor may copy nothing, and a subclass may copy its own way)."""
    return type(x) is _Tensor and x.layout is _strided and x.is_cpu and x.nbytes > 0


def _queued(leaves: list, at: list[int], last: int, device: torch.device, out: list) -> None:
    """``.to`` of each tensor ``leaves[at]`` into ``out``: those from the CPU
    before ``at[last]`` queued, every other blocking (``last`` -1: all)."""
    if last < 0:  # (no keyword: a call of .to parses one in about 0.3 µs)
        for i in at:
            out[i] = leaves[i].to(device)
        return
    for k, i in enumerate(at):
        x = leaves[i]
        out[i] = x.to(device, non_blocking=k < last and x.is_cpu)


def _by_tensor(
    leaves: list,
    device: torch.device,
    non_blocking: bool,
    pool: Optional[PinnedPool],
    out: list,
) -> None:
    """Move the tensors among ``leaves`` into ``out`` one by one, a
    storage they share whole. A pool buffer moves only the part its batch
    uses (one copy for the tensors that lie in it), and is not handed out
    again before that copy has read it."""
    pool = pool or _pool.existing_default_pool()
    whole, singles = storage_groups(leaves)

    def move(t: torch.Tensor) -> torch.Tensor:
        return t.to(device, non_blocking=non_blocking)

    def move_buffer(at: list[int], buf: Optional[_pool.Buffer]) -> None:
        if buf is None or pool is None:
            move_storage(leaves, at, move, out)
            return
        move_storage(leaves, at, move, out, buf.used, buf.data)
        pool.copied_from(buf, _pool.fence(device, non_blocking))

    for at in whole:
        x0 = leaves[at[0]]
        if x0.device != device:
            move_buffer(at, pool.buffer_of(x0) if pool is not None else None)
    in_buffers: dict[int, tuple[_pool.Buffer, list[int]]] = {}
    singles_at = [leaves[i] for i in singles]
    # (a CPU tensor sent to the CPU stays as it is, in a pool buffer or not)
    bufs: list[Optional[_pool.Buffer]] = [None] * len(singles)
    if pool is not None and device.type != "cpu":
        bufs = pool.buffers_of(singles_at)
    for i, x, buf in zip(singles, singles_at, bufs):
        if buf is None:
            out[i] = x.to(device, non_blocking=non_blocking)
        else:  # a few tensors of a large pool buffer: still one copy
            in_buffers.setdefault(id(buf), (buf, []))[1].append(i)
    for buf, at in in_buffers.values():
        move_buffer(at, buf)


def pin_memory(
    batch: Any,
    *,
    coalesce: Optional[bool] = None,
    rules: Rules = None,
    pool: Optional[PinnedPool] = None,
    strict: bool = True,
) -> Any:
    """Pin every tensor of a batch, keeping its structure and types.

    With ``coalesce=True`` all plain tensors are copied into one pinned
    buffer (from ``pool``, by default the process's pool) and the batch gets
    tensors cut from it: one host allocation in all, and none when a buffer
    of a finished batch can be reused. With ``coalesce=False`` each tensor
    is pinned on its own (a storage tensors share, whole). ``None``, the
    default, packs where there are at least ``COALESCE_MIN`` tensors, as
    ``to_device`` does.

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
    movers = check_leaves(leaves, batch, rules, "pin_memory", "tree", strict, "pin_memory")
    if not _pool.pinning_available():
        warnings.warn(
            "pytree_kit.torch.pin_memory: no accelerator is available, so no memory "
            "is pinned (torch's DataLoader does the same)",
            stacklevel=2,
        )
        return batch
    out = _pinned(leaves, coalesce, pool)
    if movers:
        _move_themselves(leaves, movers, out, _own_pin, "pin_memory", ".pin_memory", batch, rules)
    return spec.unflatten(out)


def _own_pin(x: Any) -> Any:
    """``x.pin_memory()``, as torch's own ``pin_memory`` calls it."""
    return x.pin_memory()


def _pin_storage(whole: torch.Tensor) -> torch.Tensor:
    return whole.pin_memory()


def _pinned(leaves: list, coalesce: Optional[bool], pool: Optional[PinnedPool]) -> list:
    """The leaves with every CPU tensor pinned. Packed: the plain dense ones
    in one pool buffer, any other pinned on its own. Not packed: a storage
    the tensors share (a consolidated batch) with one pinned allocation and
    one copy, every other tensor on its own."""
    out = list(leaves)
    if coalesce is not False:
        idx, _ = _staging.tensors_in(leaves)
        if coalesce or len(idx) >= COALESCE_MIN:
            _staging.stage(leaves, idx, out, pool or default_pool())
            for i, x in enumerate(leaves):
                if out[i] is x and isinstance(x, _Tensor) and x.device.type == "cpu":
                    out[i] = x.pin_memory()  # a subclass, sparse or nested tensor
            return out
    whole, singles = storage_groups(leaves)
    for at in whole:
        if leaves[at[0]].device.type == "cpu" and not leaves[at[0]].is_pinned():
            move_storage(leaves, at, _pin_storage, out)
    for i in singles:
        out[i] = leaves[i].pin_memory()
    return out
