"""Many small tensors into one byte buffer and back, in a few C++ calls.

``stage`` is this module's one entry: it packs a batch's tensors into a
buffer of a ``PinnedPool`` and hands back the tensors cut from that buffer
(how ``pin_memory`` coalesces) or from its one copy on a device (how
``to_device`` coalesces). With ``non_blocking=True``, tensors over
``STAGE_LIMIT`` go through the same buffer with a copy each, so that packing
one overlaps the copy of the one before. The work in Python is a pass over
the tensors to read their dtype and element count; the copying and the
making of tensors happen in one torch call per group. Its steps:

- ``plan(leaves, idx)`` groups the tensors ``leaves[idx]`` by dtype and shape
  past the first dimension (so sequences of varying length share a group) and
  gives each group an aligned place in one byte buffer. Where the dtypes come
  in a few long runs (a batch of lists, field after field: a group a run) or
  repeat with a period (a list of samples of a few fields), a group's
  tensors are a slice of the leaves, taken and put back with slicing in C;
  otherwise they are sorted by dtype, a run at a time where the runs are
  few, one by one in Python where they are many. By default it reads each
  tensor's dtype and element count, not its shape (a ``torch.Size`` per
  tensor is a tuple the garbage collector tracks): a group takes the shape
  past the first dimension of its first tensor for all, and is not
  ``exact``. ``plan(..., exact=True)`` reads every shape;
- ``write(groups, buf)`` copies each group with one
  ``torch.cat(..., out=)`` (``torch.stack`` for 0-d tensors). ``cat`` checks
  that a group's tensors agree past the first dimension, so a group that is
  not exact is either right or refused, never written in a wrong layout (no
  tensor in it is empty: ``cat`` would skip an empty 1-d one). ``write``
  stops at a refused group that is not exact; ``refine`` splits it (by the
  tensors' number of dimensions, boxes from scores, else by their shapes),
  and writing goes on from there. A tensor ``cat`` refuses in an exact
  group (on another device, sparse, nested, requiring grad while grad is
  enabled) makes ``write`` raise; the caller then plans again with only the
  tensors ``stageable`` accepts;
- ``read(groups, flat, out)`` puts the tensors back into ``out`` from a buffer:
  the packed one, or its copy on a device. Each group is cut with one
  ``torch.unsafe_split_with_sizes``: its pieces share the buffer's storage but
  are not views of it, and each has its own version counter, so an in-place
  change to one never fails a backward that autograd saved for another
  (``labels.masked_fill_`` after an embedding of ``input_ids``). torch's
  ``comm.broadcast_coalesced`` does the same, for the same reason (its note
  "Version Counter in comm.*_coalesced").

Within a group the tensors lie end to end, as torch's own coalesced
collectives lay them; each group starts on an ``ALIGNMENT``-byte boundary.
"""

from __future__ import annotations

import math
from itertools import groupby, islice
from operator import attrgetter, itemgetter
from typing import Any, Optional

import torch

from . import _pool
from ._pool import ALIGNMENT, Buffer, PinnedPool

__all__ = ["ALIGNMENT", "PINNED_OWN", "STAGE_LIMIT", "stage", "stageable", "tensors_in"]

#: bytes above which ``stage`` does not pack a tensor with the others (that
#: would hold its copy back until all are packed) but gives it a copy of its
#: own: through the buffer when non-blocking, as it is otherwise
STAGE_LIMIT = 1 << 20
#: bytes above which a tensor that is pinned already is not packed on its way
#: to a device: a copy of its own reads it where it lies, and packing would
#: copy it once more on the host. Not measured yet: ``benchmarks/
#: transfer_peers.py --thresholds`` sweeps it on a GPU, but its first run there
#: asked every tensor whether it was pinned (benchmarks/results/gpu_h200/README.md)
PINNED_OWN = 64 << 10
#: runs of one dtype (or shape) from which plan no longer takes the tensors a
#: run at a time (a group a run: a few torch calls each) but looks for a
#: period, or sorts the tensors one by one
MANY_RUNS = 16
#: tensors a run of one dtype holds on average where plan makes a group a run
LONG_RUN = 8
#: where one dtype's tensors come in more than two shapes past the first
#: dimension, and in one shape per fewer than FLAT_SHARE tensors, they make one
#: flat group (each flattened), not a group of a cat and a split per shape
FLAT_SHARE = 4
#: tensors up to which plan reads every shape from the start (``exact``): a
#: group ``cat`` refuses costs more than reading a few shapes
EXACT_UP_TO = 256

_Tensor = torch.Tensor
_dtype = attrgetter("dtype")
_shape = attrgetter("shape")
_numel = _Tensor.numel
_ndim = attrgetter("ndim")
_rest = itemgetter(slice(1, None))  # a shape past its first dimension
_first = itemgetter(0)
_unsafe_split = getattr(torch, "unsafe_split_with_sizes", None)


class Group:
    """Tensors of one dtype and one shape past the first dimension (``rest``;
    None for 0-d tensors), at ``offset`` in the buffer, ``nbytes`` long.
    ``where[j]`` is the position in the leaves of the group's j-th tensor,
    ``members[j]`` that tensor, and ``sizes[j]`` its first dimension;
    ``span``, where not None, is ``where`` as a slice. ``exact`` is False
    where the members' shapes were not read, only the first one's (``cat``
    refuses the group if the others differ past the first dimension); such a
    group keeps its members' element ``counts``, and ``same_ndim`` says
    whether they are known to have one number of dimensions. A *flat* group
    holds tensors of many shapes end to end, each flattened: ``shapes`` is
    their shapes (None for any other group), ``rest`` is ``()``, and
    ``sizes`` their element counts."""

    __slots__ = (
        "counts",
        "dtype",
        "exact",
        "members",
        "nbytes",
        "offset",
        "rest",
        "rows",
        "same_ndim",
        "shapes",
        "sizes",
        "span",
        "where",
    )

    def __init__(self, dtype: torch.dtype, rest: Optional[tuple], exact: bool = True) -> None:
        self.dtype = dtype
        self.rest = rest
        self.exact = exact
        self.counts: Any = None
        self.same_ndim = exact
        self.shapes: Optional[list] = None
        self.where: list[int] = []
        self.sizes: list[int] = []
        self.members: Any = []  # the tensors, in the order of where (a list or tuple)
        self.span: Optional[slice] = None  # where, as a slice of the leaves, if it is one
        self.rows = 0
        self.offset = 0
        self.nbytes = 0

    def region(self, flat: torch.Tensor, typed: Optional[dict] = None) -> torch.Tensor:
        """The group's place in the byte buffer ``flat``, typed and shaped.
        ``typed`` caches ``flat`` as a tensor of each dtype (one call a
        dtype, then one a group, where a slice and two views cost three)."""
        size = self.dtype.itemsize
        whole = None if typed is None else typed.get(self.dtype)
        if whole is None:
            if typed is None or flat.numel() % size or flat.storage_offset() % size:
                view = flat[self.offset : self.offset + self.nbytes].view(self.dtype)
                return view if self.rest is None else view.view(self.rows, *self.rest)
            whole = typed[self.dtype] = flat.view(self.dtype)
        shape = (self.rows,) if self.rest is None else (self.rows, *self.rest)
        strides = contiguous_strides(shape)
        return whole.as_strided(shape, strides, whole.storage_offset() + self.offset // size)

    def row_bytes(self) -> int:
        return (1 if self.rest is None else math.prod(self.rest)) * self.dtype.itemsize


#: contiguous_strides' answers, by shape (batches and datasets repeat a few
#: shapes; ragged data makes many, kept a few thousand at a time)
_STRIDES: dict = {}


def contiguous_strides(shape: tuple) -> tuple:
    """The strides of a contiguous tensor of ``shape`` (a tuple)."""
    found = _STRIDES.get(shape)
    if found is None:
        strides = []
        step = 1
        for size in reversed(shape):
            strides.append(step)
            step *= max(size, 1)
        if len(_STRIDES) >= 4096:
            _STRIDES.clear()
        found = _STRIDES[shape] = tuple(reversed(strides))
    return found


def sizes(leaves: list, at: list[int]) -> list[int]:
    """The bytes of each tensor ``leaves[at]``: 0 for a sparse COO tensor,
    which has no ``nbytes`` (and is never packed: ``cat`` refuses it)."""
    try:
        return [leaves[i].nbytes for i in at]
    except RuntimeError:
        return [0 if leaves[i].is_sparse else leaves[i].nbytes for i in at]


def tensors_in(leaves: list) -> tuple[list[int], list[int]]:
    """The positions of the plain tensors of ``leaves``, and of the other
    tensors (subclasses: packing would lose their class)."""
    types = list(map(type, leaves))
    if types.count(_Tensor) == len(types):  # a batch of tensors alone
        return list(range(len(types))), []
    plain = [i for i, t in enumerate(types) if t is _Tensor]
    others = [i for i, t in enumerate(types) if t is not _Tensor and issubclass(t, _Tensor)]
    return plain, others


class NeedsFlat(Exception):
    """Raised by ``plan(..., flat=False)`` at the first group that would be flat."""


def plan(
    leaves: list,
    idx: list[int],
    alignment: int = ALIGNMENT,
    exact: bool = False,
    flat: bool = True,
) -> tuple[list[Group], int]:
    """The groups of the tensors ``leaves[idx]``, each starting on a multiple
    of ``alignment`` bytes and of its dtype's size, and the bytes they take in all.

    Groups come by dtype (a group per run where the dtypes come in a few
    long runs, one per place in the period where they repeat with one, else
    in the order each dtype first appears), then by shape past the first
    dimension; within a group, positions ascend. Not ``exact``, each of
    those parts is one group with its first tensor's shape past the first
    dimension, unless one is empty or 0-d (their shapes are read then). A
    nested tensor, which has no shape, is left out. With ``flat=False``,
    where a group would be flat this raises ``NeedsFlat`` as soon as it
    finds one (the caller wanted no flat group, and is spared the rest)."""
    try:
        return _plan(leaves, idx, alignment, exact, flat)
    except RuntimeError:  # a nested tensor's shape cannot be read
        kept = [i for i in idx if not leaves[i].is_nested]
        if len(kept) == len(idx):
            raise
        return _plan(leaves, kept, alignment, exact, flat)


def _plan(
    leaves: list, idx: list[int], alignment: int, exact: bool, flat: bool
) -> tuple[list[Group], int]:
    tensors = leaves if len(idx) == len(leaves) else [leaves[i] for i in idx]
    if not tensors:
        return [], 0
    every = tensors is leaves  # idx is range(len(leaves)): a position is its own index
    dtypes = list(map(_dtype, tensors))
    # exact: every shape; otherwise every element count (an int, not a tuple)
    counts = list(map(_shape, tensors)) if exact else list(map(_numel, tensors))
    by = _by_shape if exact else _by_count
    groups: list[Group] = []
    parts = _parts_by_dtype(dtypes)
    if len(parts) == 1:  # one dtype: the usual batch
        by(dtypes[0], idx, tensors, counts, groups, slice(0, len(idx)) if every else None, flat)
        return groups, _place(groups, alignment)
    for part in parts:
        if type(part) is slice:  # a run, or every p-th tensor: slices in C
            by(
                dtypes[part.start],
                idx[part],
                tensors[part],
                counts[part],
                groups,
                part if every else None,
                flat,
            )
        elif len(part) == 1:
            i = part[0]
            by(dtypes[i], [idx[i]], [tensors[i]], [counts[i]], groups, None, flat)
        else:
            get = itemgetter(*part)  # one C call gathers each list
            where = part if every else list(get(idx))
            by(dtypes[part[0]], where, get(tensors), get(counts), groups, None, flat)
    return groups, _place(groups, alignment)


def _parts_by_dtype(dtypes: list) -> list:
    """The positions of ``dtypes`` in parts of one dtype each, where possible
    as slices: the runs of one dtype, where there are fewer than
    ``MANY_RUNS``, each ``LONG_RUN`` long on average (the fields of a batch of
    lists, one after another), or the places in a period the dtypes repeat
    with (a list of samples, each of a few fields); otherwise a list per
    dtype, in order of first appearance. Dtypes are compared by identity, in
    C; only where they come in ``MANY_RUNS`` runs or more and have no period
    does a pass in Python (``_split``) group them."""
    n = len(dtypes)
    first = dtypes[0]
    if dtypes.count(first) == n:
        return [slice(0, n)]
    runs = [len(list(run)) for _, run in islice(groupby(dtypes), MANY_RUNS)]
    if len(runs) < MANY_RUNS and n >= LONG_RUN * len(runs):  # every run was read: a part each
        parts = []
        start = 0
        for length in runs:
            parts.append(slice(start, start + length))
            start += length
        return parts
    period = 0
    for _ in range(8):  # the first few places where the first dtype comes again
        try:
            period = dtypes.index(first, period + 1)
        except ValueError:
            break
        if period > n // 2:  # not a period the tensors repeat with twice
            break
        if dtypes[period:] == dtypes[:-period]:  # every dtype repeats after `period`
            return [slice(j, n, period) for j in range(period)]
    return [places for _, (places,) in _split(dtypes, range(n))]


def _place(groups: list[Group], alignment: int) -> int:
    """Give each group its offset; the bytes they take in all."""
    total = 0
    for g in groups:
        step = math.lcm(alignment, g.dtype.itemsize)  # a dtype's view needs its own too
        total = -(-total // step) * step
        g.rows = sum(g.sizes)
        g.offset = total
        g.nbytes = g.rows * g.row_bytes()
        total += g.nbytes
    return total


def _by_count(
    dtype: torch.dtype,
    where: list[int],
    members: Any,
    numels: Any,
    groups: list[Group],
    span: Optional[slice],
    flat: bool = True,
    same_ndim: bool = False,
) -> None:
    """Append one group of one dtype's tensors ``members`` (of ``numels``
    elements), not exact: shaped past the first dimension as the first one,
    each one's first dimension its element count over a row's. Where one is
    empty or the first is 0-d, read their shapes (``_by_shape``)."""
    shape = members[0].shape
    if not shape or 0 in numels:  # a 0-d tensor is stacked; cat skips an empty 1-d one
        _by_shape(dtype, where, members, list(map(_shape, members)), groups, span, flat)
        return
    rest = tuple(shape[1:])
    row = math.prod(rest)
    n = len(numels)
    if row == 1:
        sizes = list(numels)
    elif numels.count(numels[0]) == n:
        sizes = [numels[0] // row] * n
    else:
        sizes = [k // row for k in numels]
    g = Group(dtype, rest, exact=False)
    g.where, g.members, g.sizes, g.span = where, members, sizes, span
    g.counts, g.same_ndim = numels, same_ndim
    groups.append(g)


def _by_shape(
    dtype: torch.dtype,
    where: list[int],
    members: Any,
    shapes: Any,
    groups: list[Group],
    span: Optional[slice],
    flat: bool = True,
) -> None:
    """Append the groups of one dtype's tensors ``members`` (at ``where``, of
    ``shapes``; at ``span`` of the leaves, if that slice is where they are).
    Raises ``NeedsFlat`` where a flat group is wanted and ``flat`` is False."""
    first = shapes[0]
    if shapes.count(first) == len(shapes):  # one shape
        g = Group(dtype, tuple(first[1:]) if first else None)
        g.where, g.members, g.sizes = where, members, [first[0] if first else 1] * len(where)
        g.span = span
        groups.append(g)
        return
    if not shapes.count(()):  # no 0-d tensor: maybe one shape past the first dimension
        keys: list = list(map(_rest, shapes))
        if keys.count(keys[0]) == len(keys):  # sequences of varying length
            g = Group(dtype, tuple(keys[0]))
            g.where, g.members, g.sizes = where, members, list(map(_first, shapes))
            g.span = span
            groups.append(g)
            return
    else:
        keys = [tuple(shape[1:]) if shape else None for shape in shapes]
    distinct = len(set(keys))
    if distinct > 2 and distinct * FLAT_SHARE > len(keys):  # a group for each few tensors
        if not flat:
            raise NeedsFlat
        g = Group(dtype, ())
        g.where, g.members, g.span = where, members, span
        g.shapes = list(shapes)
        g.sizes = [math.prod(shape) for shape in shapes]
        groups.append(g)
        return
    for key, (at, these, their_shapes) in _split(keys, where, members, shapes):
        g = Group(dtype, None if key is None else tuple(key))
        g.where, g.members = at, these
        g.sizes = [1] * len(at) if key is None else list(map(_first, their_shapes))
        groups.append(g)


def _split(keys: list, *columns: Any) -> list[tuple[Any, list[list]]]:
    """Each key of ``keys``, in order of first appearance, with the items of
    each of ``columns`` (sequences as long as ``keys``) at its places, in
    order. Where the keys come in fewer than ``MANY_RUNS`` runs, the items
    are taken a run at a time, by slicing in C; otherwise one by one."""
    found: dict[Any, list[list]] = {}
    runs = [(key, len(list(run))) for key, run in islice(groupby(keys), MANY_RUNS)]
    if len(runs) < MANY_RUNS:
        start = 0
        for key, length in runs:
            lists = found.get(key)
            if lists is None:
                lists = found[key] = [[] for _ in columns]
            end = start + length
            for items, column in zip(lists, columns):
                items.extend(column[start:end])
            start = end
        return list(found.items())
    places: dict[Any, list[int]] = {}  # each key's places, then each column's items there in C
    for j, key in enumerate(keys):
        at = places.get(key)
        if at is None:
            places[key] = [j]
        else:
            at.append(j)
    parts = []
    for key, at in places.items():
        if len(at) == 1:
            parts.append((key, [[column[at[0]]] for column in columns]))
        else:
            get = itemgetter(*at)
            parts.append((key, [list(get(column)) for column in columns]))
    return parts


def write(groups: list[Group], buf: torch.Tensor, start: int = 0) -> int:
    """Copy each group's tensors, from ``groups[start]`` on, into its region of
    the byte buffer ``buf``. Returns ``len(groups)``, or the index of the first
    group that is not exact and whose tensors ``cat`` refused (``refine``
    it, then write on from there). A group ``cat`` took is exact from then on;
    where ``cat`` refuses an exact group, this raises."""
    typed: dict = {}
    for k in range(start, len(groups)):
        g = groups[k]
        region = g.region(buf, typed)
        if g.rest is None:
            torch.stack(g.members, out=region)
            continue
        if g.shapes is not None:  # flat: exact, so a refusal raises
            torch.cat([x.reshape(-1) for x in g.members], out=region)
            continue
        try:
            torch.cat(g.members, out=region)
        except (RuntimeError, NotImplementedError, TypeError):
            if g.exact:
                raise
            return k
        g.exact = True  # its tensors agree past the first dimension
    return len(groups)


def refine(groups: list[Group], k: int, alignment: int = ALIGNMENT) -> tuple[list[Group], int]:
    """The groups with ``groups[k]``, a group ``cat`` refused, split up, and
    placed again: the groups before it keep their places. A group whose
    tensors differ in their number of dimensions (boxes and scores) is split
    by it (an int a tensor, read now), each part again not exact; otherwise
    by every tensor's shape. Raises where a tensor has no shape (a nested one)."""
    g = groups[k]
    split_up: list[Group] = []
    ndims = None if g.same_ndim else list(map(_ndim, g.members))
    if ndims is not None and ndims.count(ndims[0]) != len(ndims):
        for _, (at, these, counts) in _split(ndims, g.where, g.members, g.counts):
            _by_count(g.dtype, at, these, counts, split_up, None, same_ndim=True)
    else:
        _by_shape(g.dtype, g.where, g.members, list(map(_shape, g.members)), split_up, g.span)
    groups = [*groups[:k], *split_up, *groups[k + 1 :]]
    return groups, _place(groups, alignment)


def read(groups: list[Group], flat: torch.Tensor, out: list) -> None:
    """Put each group's tensors, cut from the byte buffer ``flat``, into ``out``."""
    typed: dict = {}
    for g in groups:
        region = g.region(flat, typed)
        if g.rest is None:  # 0-d tensors: each one's own (.data: no base, its own counter)
            pieces = [p.data for p in region.unbind(0)]
        elif g.shapes is not None:  # flat: each piece shaped (.data: no base)
            pieces = [  # view(*shape): a tuple argument costs twice as much to parse
                (p.view(*s) if s else p.view(())).data
                for p, s in zip(split(region, g.sizes), g.shapes)
            ]
        else:
            pieces = split(region, g.sizes)
        if g.span is not None:  # one slice assignment, in C
            out[g.span] = pieces
            continue
        for i, piece in zip(g.where, pieces):
            out[i] = piece


def split(region: torch.Tensor, sizes: list[int]) -> Any:
    """``region`` cut along its first dimension into tensors that are not views
    of one another (each its own version counter)."""
    if _unsafe_split is not None:
        return _unsafe_split(region, sizes)
    return [p.data for p in region.split(sizes)]  # pragma: no cover - older torch


def stageable(x: Any, device: Optional[torch.device] = None) -> bool:
    """Whether ``write`` can copy tensor ``x`` (a plain dense CPU tensor that
    does not require grad, or does under no_grad), and, given ``device``,
    whether it still has to go there."""
    return (
        type(x) is _Tensor
        and x.layout == torch.strided
        and not x.is_nested
        and x.device.type == "cpu"
        and not (x.requires_grad and torch.is_grad_enabled())
        and (device is None or x.device != device)
    )


# --------------------------------------------------------------------------
# the one entry: a batch's tensors through one buffer


def stage(
    leaves: list,
    idx: list[int],
    out: list,
    pool: PinnedPool,
    device: Optional[torch.device] = None,
    non_blocking: bool = False,
    min_tensors: int = 1,
    limit: int = STAGE_LIMIT,
    flat: bool = True,
) -> list[int]:
    """Pack the plain CPU tensors ``leaves[idx]`` into one buffer of ``pool``
    and put, at their places in ``out``, the tensors cut from that buffer
    (``device`` None: the batch stays in the buffer, which is not reused
    while one of them lives) or from its one copy to ``device``. Returns the
    positions of ``idx`` it left for the caller to move its own way.

    To a device, tensors over ``limit`` bytes are not packed with the
    others: with ``non_blocking``, each goes through the same buffer with a
    copy of its own (unless it is pinned already); otherwise it is left. The
    small ones are packed only if there are at least ``min_tensors`` of them
    and (unless ``flat``) no flat group is needed (a tensor in one costs
    about as many torch calls as a copy of its own), or if the buffer is
    taken anyway, for a large one. A tensor over ``PINNED_OWN`` bytes that
    is pinned already is left (a copy of its own reads it where it lies), as
    is a tensor ``cat`` refuses (on another device, sparse, nested,
    requiring grad).
    Every tensor put in ``out`` is its own: it shares the buffer (or its
    copy) with the others, but is not a view, and has its own version counter.
    """
    if device is not None and not non_blocking and len(idx) < 4 * min_tensors:
        # few enough to count the small ones first: too few, and no plan is needed
        if sum(1 for n in sizes(leaves, idx) if n <= limit) < min_tensors:
            return idx
    alignment = pool.alignment
    exact = len(idx) <= EXACT_UP_TO
    flat = flat or device is None
    own: Any = ()
    try:
        groups, total = plan(leaves, idx, alignment, exact, flat)
        small, big = (idx, []) if device is None else _small(groups, total, idx, limit)
        if device is not None and total > PINNED_OWN:
            own = _pinned_large(groups, leaves)
    except NeedsFlat:  # maybe only among the large ones, which are not packed
        at_sizes = list(zip(idx, sizes(leaves, idx)))
        big = [i for i, n in at_sizes if n > limit]
        if not big:
            return idx
        small = [i for i, n in at_sizes if n <= limit]
    if own:  # left to the caller: each moves as it lies
        small = [i for i in small if i not in own]
        big = [i for i in big if i not in own]
    if big or own:
        try:
            groups, total = plan(leaves, small, alignment, exact, flat)
        except NeedsFlat:
            return idx
        if non_blocking:  # pinned ones need no packing: they move as they are
            big = [i for i in big if stageable(leaves[i], device) and not leaves[i].is_pinned()]
        else:
            big = []
    if not big and len(small) < min_tensors:
        return idx
    if not groups and not big:
        return idx
    extra = _big_bytes(leaves, big, alignment)
    groups, total, buf = _packed(pool, groups, total, leaves, small, device, extra)
    copy_fence = None
    try:
        buf.used = total
        if device is None:
            read(groups, buf.data, out)
        else:
            if groups:  # a whole number of 16-byte words: every dtype views it
                copy = _copy(
                    buf.data[: min(_aligned(total, 16), buf.data.numel())], device, non_blocking
                )
            _streamed(leaves, big, buf.data, total, device, alignment, out)
    finally:  # a copy queued before an error may still be reading the buffer
        if device is not None:
            copy_fence = _pool.fence(device, non_blocking)
        pool.give_back(buf, copy_fence)
    if device is not None and groups:
        read(groups, copy, out)
    if len(small) + len(big) == len(idx) and sum(len(g.where) for g in groups) == len(small):
        return []
    return [i for i in idx if out[i] is leaves[i]]


def _copy(flat: torch.Tensor, device: torch.device, non_blocking: bool) -> torch.Tensor:
    """A copy of the buffer to the device (the tests put a copy on the CPU in
    its place, to read the values back on a machine with no GPU)."""
    return flat.to(device, non_blocking=non_blocking)


def _small(
    groups: list[Group], total: int, idx: list[int], limit: int = STAGE_LIMIT
) -> tuple[list[int], list[int]]:
    """``idx`` split into the tensors of at most ``limit`` bytes and the
    larger ones (``idx`` itself, and no large one, where all are small: the
    ``total`` bytes of the groups are no more than that)."""
    if total <= limit:
        return idx, []
    big = _over(groups, limit)
    if not big:
        return idx, []
    return [i for i in idx if i not in big], [i for i in idx if i in big]


def _over(groups: list[Group], nbytes: int) -> set[int]:
    """The positions of the tensors of ``groups`` over ``nbytes`` bytes."""
    over: set[int] = set()
    for g in groups:
        row = g.row_bytes()
        if max(g.sizes) * row > nbytes:
            over.update(i for i, n in zip(g.where, g.sizes) if n * row > nbytes)
    return over


def _pinned_large(groups: list[Group], leaves: list) -> set[int]:
    """The positions of the tensors of ``groups`` over ``PINNED_OWN`` bytes
    that are pinned already (only those are asked: a look costs about a
    microsecond)."""
    return {i for i in _over(groups, PINNED_OWN) if leaves[i].is_pinned()}


def _packed(
    pool: PinnedPool,
    groups: list[Group],
    total: int,
    leaves: list,
    idx: list[int],
    device: Optional[torch.device],
    extra: int = 0,
) -> tuple[list[Group], int, Buffer]:
    """Take a buffer from ``pool`` and write the planned groups into it. A
    group whose shapes were not read and whose tensors differ past the first
    dimension is split up (``refine``). Where ``cat`` refuses a tensor, plan
    again with the tensors that can be packed and write those; the rest stay
    where they are. The buffer has ``extra`` bytes more, past the groups.
    Returns the groups written, their bytes, and the buffer, reserved: the
    caller gives it back."""
    buf = pool.take(total + extra)
    try:
        try:
            k = write(groups, buf.data)
            while k < len(groups):
                groups, total = refine(groups, k, pool.alignment)
                if total + extra > buf.data.numel():  # more groups take more bytes
                    buf = _larger(pool, buf, total + extra)
                    k = 0
                k = write(groups, buf.data, k)
            return groups, total, buf
        except (RuntimeError, NotImplementedError, TypeError):
            kept = [i for i in idx if stageable(leaves[i], device)]
            groups, total = plan(leaves, kept, pool.alignment, exact=True)
            if total + extra > buf.data.numel():  # fewer tensors may make more groups
                buf = _larger(pool, buf, total + extra)
            write(groups, buf.data)
            return groups, total, buf
    except BaseException:
        pool.give_back(buf)
        raise


def _larger(pool: PinnedPool, buf: Buffer, nbytes: int) -> Buffer:
    """A buffer of ``nbytes`` from ``pool`` in place of ``buf``, given back."""
    pool.give_back(buf)
    return pool.take(nbytes)


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
        moved = _copy(region, device, True)
        out[i] = moved.view(x.dtype).view(x.shape).data  # no base: its own version counter
        offset = _aligned(offset + n, alignment)
