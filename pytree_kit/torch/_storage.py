"""One storage per batch: ``consolidate``, and moving a tree storage by storage.

``consolidate(tree)`` copies every tensor of a tree into one aligned byte
storage, whatever their dtypes, and gives the tree back with views into it.
Pickling such a tree (what a DataLoader worker does to send a batch) then
shares one storage instead of one per tensor, and ``pin_memory`` and
``to_device`` (in ``_data``) move it with one allocation and one copy: they
group a tree's tensors by storage with ``storage_groups``.
"""

from __future__ import annotations

import math
from typing import Any, Callable, Optional

import torch

from .. import api
from .._keys import where
from .._kinds import Rule

__all__ = ["consolidate", "is_consolidated"]

#: bytes between the starts of two groups of tensors in a consolidated storage
ALIGNMENT = 64

_Tensor = torch.Tensor
_strided = torch.strided


def _path_of(tree: Any, rules: Any) -> Callable[[int], str]:
    """``path(i)``: where leaf ``i`` of ``tree`` is (paths are built only when asked)."""

    def path(i: int) -> str:
        pairs, _ = api.flatten_with_path(tree, rules=rules)
        return where(pairs[i][0])

    return path


def _refuse(x: Any, device: torch.device) -> Optional[str]:
    """Why tensor ``x`` cannot go into a consolidated storage on ``device``, if it cannot."""
    if x.is_nested:
        return "is a nested tensor; consolidate copies dense (strided) tensors only"
    if x.layout != _strided:
        return f"is a {x.layout} tensor; consolidate copies dense (strided) tensors only"
    if type(x) is not _Tensor:
        return (
            f"is a {type(x).__qualname__}; consolidate copies plain tensors only "
            "(a subclass would come back as a plain tensor)"
        )
    if x.device != device:
        return f"is on {x.device}, and the tree's first tensor is on {device}"
    if x.requires_grad and torch.is_grad_enabled():
        return (
            "requires grad; autograd cannot follow a copy into a shared storage "
            "(detach it first, or consolidate under torch.no_grad())"
        )
    return None


def pack(
    leaves: list,
    path: Callable[[int], str],
    *,
    shared: Optional[bool] = None,
    what: str = "consolidate",
    stacks: Optional[dict[int, tuple[Any, Callable[[Any, torch.Tensor], Any]]]] = None,
) -> list:
    """Copy every tensor of ``leaves`` into one byte storage; return the leaves
    with those tensors replaced by views into it, in the same order.

    Tensors of one (dtype, shape) lie one after another, so each such group is
    written by one ``torch.stack`` and viewed by one ``unbind``; each group
    starts on an ``ALIGNMENT``-byte boundary. ``shared`` puts the storage in
    shared memory (by default: when running in a DataLoader worker).

    ``stacks`` maps a position of ``leaves`` to ``(column, stack)``: that leaf
    becomes ``stack(column, out)``, a stack of the column's tensors written
    straight into its own region ``out`` of the storage (collate uses it).
    """
    stacks = stacks or {}
    groups: dict[tuple, list[int]] = {}
    for i, x in enumerate(leaves):
        if type(x) is _Tensor:
            key = (x.dtype, x.shape)
            g = groups.get(key)
            if g is None:
                groups[key] = [i]
            else:
                g.append(i)
        elif i in stacks:
            groups[(i,)] = [i]
        elif isinstance(x, _Tensor):
            raise TypeError(f"{what}: {path(i)} {_refuse(x, x.device)}")
    if not groups:
        return list(leaves)
    plan = []
    total = 0
    device: Any = None
    for key, idx in groups.items():
        if len(key) == 1:  # a column to stack
            column = stacks[key[0]][0]
            dtype, shape = column[0].dtype, (len(column), *column[0].shape)
            device = device or column[0].device
        else:
            dtype, shape = key[0], (len(idx), *key[1])
            device = device or leaves[idx[0]].device
        total = -(-total // ALIGNMENT) * ALIGNMENT
        size = math.prod(shape) * dtype.itemsize
        plan.append((key, dtype, shape, idx, total, size))
        total += size
    total = -(-total // ALIGNMENT) * ALIGNMENT
    buf = empty_bytes(total, device, shared)
    out = list(leaves)
    # Each tensor given back is its own (``.data``: no base, its own version
    # counter), not a view of the storage: views share a version counter, and
    # an in-place change to one (``labels.masked_fill_``) would then fail the
    # backward of another that autograd saved (``input_ids`` in an embedding).
    for key, dtype, shape, idx, offset, size in plan:
        region = buf[offset : offset + size].view(dtype).view(shape)
        if len(key) == 1:
            column, stack = stacks[key[0]]
            out[key[0]] = stack(column, region).data
            continue
        try:
            torch.stack([leaves[i] for i in idx], 0, out=region)
        except (RuntimeError, TypeError, ValueError) as e:
            for i in idx:
                why = _refuse(leaves[i], device)
                if why is not None:
                    raise TypeError(f"{what}: {path(i)} {why}") from None
            raise ValueError(
                f"{what}: the tensors could not be copied into one storage: {e}"
            ) from e
        for i, view in zip(idx, region.unbind(0)):
            out[i] = view.data
    return out


def empty_bytes(nbytes: int, device: torch.device, shared: Optional[bool]) -> torch.Tensor:
    """A uint8 tensor of ``nbytes`` on ``device``; in shared memory when ``shared``
    (None: when this process is a DataLoader worker, as default_collate does)."""
    if shared is None:
        shared = device.type == "cpu" and torch.utils.data.get_worker_info() is not None
    if shared and device.type == "cpu" and nbytes:
        storage = torch.UntypedStorage._new_shared(nbytes)
        return torch.empty(0, dtype=torch.uint8).set_(storage)
    return torch.empty(nbytes, dtype=torch.uint8, device=device)


def consolidate(
    tree: Any, *, rules: Optional[dict[type, Rule]] = None, shared: Optional[bool] = None
) -> Any:
    """The same tree, with every tensor a view into one storage, whatever its dtype.

    The tensors are copied (contiguous) into one aligned byte storage, and the
    tree is rebuilt around views of it; other leaves are kept as they are and
    nothing the caller passed is changed. Then:

    - pickling the tree, as a DataLoader worker does to send a batch, shares
      one storage instead of one per tensor (one file descriptor, not 1,000);
    - ``pin_memory`` makes one pinned allocation and one copy, and
      ``to_device`` one copy, for the whole tree.

    The tensors must be dense, on one device, and not require grad (under
    ``torch.no_grad()`` they are copied without their history). In a DataLoader
    worker the storage is allocated in shared memory (``shared=`` overrides).
    What differs from separate tensors is listed in ``docs/loading.md``.

    Examples:
        >>> import torch
        >>> from pytree_kit.torch import consolidate, is_consolidated
        >>> batch = {"x": torch.ones(2, 3), "ids": torch.arange(4), "name": "a"}
        >>> out = consolidate(batch)
        >>> out["x"].untyped_storage().data_ptr() == out["ids"].untyped_storage().data_ptr()
        True
        >>> torch.equal(out["ids"], batch["ids"]), out["name"], is_consolidated(out)
        (True, 'a', True)
    """
    leaves, spec = api.flatten(tree, rules=rules)
    return spec.unflatten(pack(leaves, _path_of(tree, rules), shared=shared))


def is_consolidated(tree: Any, *, rules: Optional[dict[type, Rule]] = None) -> bool:
    """Whether every tensor of ``tree`` lies in one storage (True when it has none).

    Examples:
        >>> import torch
        >>> from pytree_kit.torch import is_consolidated
        >>> is_consolidated([torch.ones(2), torch.ones(2)])
        False
    """
    ptrs = {
        (x.device, x.untyped_storage().data_ptr())
        for x in api.leaves(tree, rules=rules)
        if isinstance(x, _Tensor) and x.layout == _strided and not x.is_nested
    }
    return len(ptrs) <= 1


# --------------------------------------------------------------------------
# Moving a tree storage by storage (pin_memory, to_device)


def storage_groups(leaves: list) -> tuple[list[list[int]], list[int]]:
    """Split the dense tensors of ``leaves`` into storages to move whole, and
    tensors to move one by one.

    A storage is moved whole when at least two leaves are views into it and
    they cover at least half of its bytes: a consolidated tree is one such
    storage. Views of a large storage that the tree uses little of (slices of a
    dataset tensor, say) are moved one by one, so no unused memory is copied.
    """
    by_storage: dict[tuple, list[int]] = {}
    singles: list[int] = []
    for i, x in enumerate(leaves):
        if not isinstance(x, _Tensor):
            continue
        if (
            type(x) is not _Tensor
            or x.layout != _strided
            or x.requires_grad
            or x.is_conj()
            or x.is_neg()
        ):
            # a view rebuilt on a moved storage would lose the subclass, the
            # autograd history, or the conjugate / negative bit: moved one by one
            singles.append(i)
            continue
        storage = x.untyped_storage()
        if storage.data_ptr() == 0:  # empty storages all have address 0; meta tensors too
            singles.append(i)
            continue
        key = storage._cdata  # the storage itself, whatever its device
        g = by_storage.get(key)
        if g is None:
            by_storage[key] = [i]
        else:
            g.append(i)
    whole: list[list[int]] = []
    for idx in by_storage.values():
        if len(idx) >= 2:
            used = sum(leaves[i].nbytes for i in idx)
            if 2 * used >= leaves[idx[0]].untyped_storage().nbytes():
                whole.append(idx)
                continue
        singles.extend(idx)
    singles.sort()
    return whole, singles


def move_storage(
    leaves: list,
    idx: list[int],
    move: Callable[[torch.Tensor], torch.Tensor],
    out: list,
    nbytes: Optional[int] = None,
    flat: Optional[torch.Tensor] = None,
) -> None:
    """Move the storage the tensors ``leaves[idx]`` share with one call of
    ``move`` (on a uint8 tensor over the storage, or over its first ``nbytes``
    bytes when the tensors lie there), and put tensors on the result, with the
    same offsets, sizes and strides, in ``out[idx]``. A tensor that reaches
    past ``nbytes`` fails the bounds check of ``as_strided``, and the whole
    storage is moved instead. ``flat``: a uint8 tensor over the whole
    storage, from its first byte (a pool buffer's ``data``), to move a slice
    of (making one over the storage costs more).

    Each tensor is its own (``.data`` of a strided view: no base, its own
    version counter), not a view of one base: views share a version counter,
    and an in-place change to one (``labels.masked_fill_``) would then fail
    the backward of another saved for it (``input_ids`` in an embedding).
    The tensors moved here never require grad (``storage_groups``)."""
    x0 = leaves[idx[0]]
    storage = x0.untyped_storage()
    size = storage.nbytes() if nbytes is None else min(nbytes, storage.nbytes())
    if flat is not None and flat.storage_offset() == 0 and flat.numel() >= size:
        whole = flat[:size]
    else:
        whole = torch.empty(0, dtype=torch.uint8, device=x0.device).set_(storage, 0, (size,), (1,))
    moved = move(whole)
    bases: dict[torch.dtype, torch.Tensor] = {}  # the moved bytes as one run of each dtype
    try:
        for i in idx:
            x = leaves[i]
            base = bases.get(x.dtype)
            if base is None:
                base = bases[x.dtype] = _typed(moved, x.dtype)
            out[i] = base.as_strided(x.shape, x.stride(), x.storage_offset()).data
    except RuntimeError:
        if size == storage.nbytes():
            raise
        move_storage(leaves, idx, move, out, None, flat)  # a tensor reached past nbytes


def _typed(flat: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """All of ``flat``'s storage as one run of ``dtype`` from its first byte."""
    if flat.storage_offset() == 0:  # (a slice and a view cost less than a tensor set on it;
        # as_strided checks its bounds against the storage, not against this view)
        return flat[: flat.numel() // dtype.itemsize * dtype.itemsize].view(dtype)
    storage = flat.untyped_storage()
    n = storage.nbytes() // dtype.itemsize
    return torch.empty(0, dtype=dtype, device=flat.device).set_(storage, 0, (n,), (1,))
