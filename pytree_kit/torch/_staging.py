"""Many small tensors into one byte buffer and back, in a few C++ calls.

This is how ``pin_memory(coalesce=True)`` packs a batch into a pinned buffer
and how ``to_device(coalesce=True)`` moves one with a single copy. The work in
Python is a pass over the tensors to read their dtype and shape; the copying
and the making of tensors happen in one torch call per group:

- ``plan(leaves, idx)`` groups the tensors ``leaves[idx]`` by dtype and shape
  past the first dimension (so sequences of varying length share a group) and
  gives each group an aligned place in one byte buffer;
- ``write(groups, leaves, buf)`` copies each group with one
  ``torch.cat(..., out=)`` (``torch.stack`` for 0-d tensors). A tensor ``cat``
  refuses (on another device, sparse, nested, requiring grad while grad is
  enabled) makes it raise; the caller then keeps only the tensors
  ``stageable`` accepts, and plans again;
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
from itertools import compress, repeat
from operator import attrgetter, eq
from typing import Any, Optional

import torch

__all__ = ["ALIGNMENT", "Group", "plan", "read", "stageable", "tensors_in", "write"]

#: bytes between the starts of two groups in a buffer
ALIGNMENT = 128

_Tensor = torch.Tensor
_dtype_and_shape = attrgetter("dtype", "shape")
_unsafe_split = getattr(torch, "unsafe_split_with_sizes", None)


class Group:
    """Tensors of one dtype and one shape past the first dimension (``rest``;
    None for 0-d tensors), at ``offset`` in the buffer, ``nbytes`` long.
    ``where[j]`` is the position in the leaves of the group's j-th tensor, and
    ``sizes[j]`` its first dimension."""

    __slots__ = ("dtype", "nbytes", "offset", "rest", "rows", "sizes", "where")

    def __init__(self, dtype: torch.dtype, rest: Optional[tuple]) -> None:
        self.dtype = dtype
        self.rest = rest
        self.where: list[int] = []
        self.sizes: list[int] = []
        self.rows = 0
        self.offset = 0
        self.nbytes = 0

    def region(self, flat: torch.Tensor) -> torch.Tensor:
        """The group's place in the byte buffer ``flat``, typed and shaped."""
        typed = flat[self.offset : self.offset + self.nbytes].view(self.dtype)
        return typed if self.rest is None else typed.view(self.rows, *self.rest)

    def row_bytes(self) -> int:
        return (1 if self.rest is None else math.prod(self.rest)) * self.dtype.itemsize


def tensors_in(leaves: list) -> tuple[list[int], list[int]]:
    """The positions of the plain tensors of ``leaves``, and of the other
    tensors (subclasses: packing would lose their class)."""
    types = list(map(type, leaves))
    if types.count(_Tensor) == len(types):  # a batch of tensors alone
        return list(range(len(types))), []
    plain = [i for i, t in enumerate(types) if t is _Tensor]
    others = [i for i, t in enumerate(types) if t is not _Tensor and issubclass(t, _Tensor)]
    return plain, others


def plan(leaves: list, idx: list[int], alignment: int = ALIGNMENT) -> tuple[list[Group], int]:
    """The groups of the tensors ``leaves[idx]``, each starting on a multiple
    of ``alignment`` bytes and of its dtype's size, and the bytes they take in all."""
    tensors = leaves if len(idx) == len(leaves) else [leaves[i] for i in idx]
    keys = list(map(_dtype_and_shape, tensors))
    by_key: dict[tuple, list[int]] = {}
    distinct = dict.fromkeys(keys) if keys and keys.count(keys[0]) != len(keys) else None
    if distinct is None:
        if keys:
            by_key[keys[0]] = idx  # one dtype and shape: the usual batch
    elif len(distinct) <= 8:  # a few: one pass in C for each
        for key in distinct:
            by_key[key] = list(compress(idx, map(eq, keys, repeat(key))))
    else:
        for i, key in zip(idx, keys):
            positions = by_key.get(key)
            if positions is None:
                by_key[key] = [i]
            else:
                positions.append(i)
    groups: dict[tuple, Group] = {}
    merged = False
    for (dtype, shape), positions in by_key.items():
        rest = tuple(shape[1:]) if shape else None
        g = groups.get((dtype, rest))
        if g is None:
            g = groups[(dtype, rest)] = Group(dtype, rest)
        else:
            merged = True
        g.where.extend(positions)
        g.sizes.extend([shape[0] if shape else 1] * len(positions))
    total = 0
    for g in groups.values():
        if merged:  # positions ascending in every group (_members relies on it)
            pairs = sorted(zip(g.where, g.sizes))
            g.where, g.sizes = [i for i, _ in pairs], [n for _, n in pairs]
        step = math.lcm(alignment, g.dtype.itemsize)  # a dtype's view needs its own too
        total = -(-total // step) * step
        g.rows = sum(g.sizes)
        g.offset = total
        g.nbytes = g.rows * g.row_bytes()
        total += g.nbytes
    return list(groups.values()), total


def _members(g: Group, leaves: list) -> list:
    """The group's tensors, in its order."""
    if len(g.where) == len(leaves) and g.where[0] == 0 and g.where[-1] == len(leaves) - 1:
        return leaves  # every leaf, in order (positions are distinct and ascending)
    return [leaves[i] for i in g.where]


def write(groups: list[Group], leaves: list, buf: torch.Tensor) -> None:
    """Copy each group's tensors into its region of the byte buffer ``buf``."""
    for g in groups:
        region = g.region(buf)
        if g.rest is None:
            torch.stack(_members(g, leaves), out=region)
        else:
            torch.cat(_members(g, leaves), out=region)


def read(groups: list[Group], flat: torch.Tensor, out: list) -> None:
    """Put each group's tensors, cut from the byte buffer ``flat``, into ``out``."""
    for g in groups:
        if g.rest is None:  # 0-d tensors: each one's own (.data: no base, its own counter)
            pieces = [p.data for p in g.region(flat).unbind(0)]
        else:
            pieces = split(g.region(flat), g.sizes)
        if len(g.where) == len(out) and g.where[0] == 0 and g.where[-1] == len(out) - 1:
            out[:] = pieces
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
