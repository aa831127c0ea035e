"""Distributed training on arbitrary nested trees: DDP and bucketed collectives.

torch's ``DistributedDataParallel`` finds the tensors of a model's output with
``torch.utils._pytree``, which sees a dataclass or a class of your own as one
opaque leaf. The tensors inside never pass through DDP's autograd sink, so
``static_graph=True`` never synchronises gradients and
``find_unused_parameters=True`` marks the wrong parameters, with no error.
:class:`DistributedDataParallel` hands DDP the output's tensors as a flat tuple
and rebuilds the output afterwards, so every container pytree_kit understands
works in every mode.

:func:`all_reduce_tree`, :func:`broadcast_tree` and :func:`all_gather_tree`
flatten a tree, pack its tensors into one buffer per dtype and device (split
into buckets of at most ``bucket_cap_mb``, as DDP's reducer does), issue one
collective per bucket and unpack the results into the tree's structure.
Before any data moves, every rank checks that the others hold the same
structure, dtypes and shapes, so a mismatch raises ``ValueError`` naming the
first differing path instead of hanging or mixing up tensors.
"""

from __future__ import annotations

import hashlib
import re
import weakref
from typing import Any, Callable, Mapping, Optional

import torch
import torch.distributed as dist
from torch.distributed import ReduceOp

from .. import api
from .._errors import StructureError
from .._keys import where
from .._kinds import Rule
from ._hidden import check_leaves, first_hidden, hidden_message

__all__ = [
    "DistributedDataParallel",
    "TreeWork",
    "all_gather_tree",
    "all_reduce_tree",
    "broadcast_tree",
]

Rules = Optional[Mapping[type, Rule]]

_MB = 1024 * 1024


# --------------------------------------------------------------------------
# DistributedDataParallel


class DistributedDataParallel(torch.nn.parallel.DistributedDataParallel):
    """``torch.nn.parallel.DistributedDataParallel`` for nested inputs and outputs.

    A drop-in replacement: it takes the same constructor arguments and keeps
    ``module``, ``no_sync()``, ``state_dict()`` (keys start with ``module.``)
    and every DDP mode (default, ``find_unused_parameters=True``,
    ``static_graph=True``, ``gradient_as_bucket_view=True``). ``forward``
    accepts and returns any tree pytree_kit understands (dicts, lists,
    dataclasses, attrs classes, namedtuples, protocol classes, ModelOutput-style
    dict subclasses, with ``rules=`` for classes you cannot edit) and returns
    the model's own output types. Nothing needs registering.

    What it changes from torch's DDP:

    - The output's tensors reach DDP's reducer as one flat tuple, whatever
      containers hold them, so gradients are synchronised in every mode.
    - With ``device_ids`` set, every tensor of the inputs moves to the module's
      device, whatever containers hold it (torch's DDP leaves tensors inside a
      dataclass where they are and rejects a ``defaultdict``). Batches packed by
      :func:`pytree_kit.torch.pin_memory` move with one copy per buffer.
    - Under ``static_graph=True``, torch raises or fails to synchronise when
      the loss leaves some outputs out (pytorch#97030). Here every output that
      requires grad but is left out of the loss receives a zero gradient, so
      the reduction always completes and the gradients are those of the loss
      that was computed. The parameters behind such an output get a zero
      gradient instead of ``None``.

    Args:
        module: the module to replicate.
        *args: torch's DDP positional arguments.
        rules: local flattening rules for output and input classes that
            pytree_kit cannot read by structure (see :func:`pytree_kit.flatten`).
        strict: raise TypeError, naming the path, on an input or output leaf
            that holds tensors pytree_kit does not see (an object of a class it
            does not see into, such as a model's cache), instead of leaving its
            tensors unmoved and out of the reducer; False keeps them as they are.
        **kwargs: torch's DDP keyword arguments.

    Examples:
        >>> import dataclasses, torch, torch.distributed as dist
        >>> import pytree_kit.torch as pkt
        >>> @dataclasses.dataclass
        ... class Out:
        ...     loss: torch.Tensor
        ...     n: int
        >>> class Model(torch.nn.Module):
        ...     def __init__(self):
        ...         super().__init__()
        ...         self.lin = torch.nn.Linear(2, 1)
        ...     def forward(self, batch):
        ...         return Out(self.lin(batch["x"]).sum(), len(batch["x"]))
        >>> dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
        >>> ddp = pkt.DistributedDataParallel(Model(), static_graph=True)
        >>> out = ddp({"x": torch.ones(3, 2)})
        >>> type(out).__name__, out.n
        ('Out', 3)
        >>> out.loss.backward()
        >>> ddp.module.lin.weight.grad
        tensor([[3., 3.]])
        >>> dist.destroy_process_group()
    """

    def __init__(
        self,
        module: torch.nn.Module,
        *args: Any,
        rules: Rules = None,
        strict: bool = True,
        **kwargs: Any,
    ):
        super().__init__(module, *args, **kwargs)
        self._pk_rules = rules
        self._pk_strict = strict

    def forward(self, *inputs: Any, **kwargs: Any) -> Any:
        with torch.autograd.profiler.record_function("pytree_kit.DistributedDataParallel.forward"):
            inputs, kwargs = self._pk_move_inputs(inputs, kwargs)
            # torch's own steps before forward, given a stand-in for the
            # inputs, which were moved above, where every container is
            # understood. Not given none: with device_ids set, torch indexes
            # the first of the moved inputs, and an empty call has none.
            self._pre_forward(None)
            if self._delay_all_reduce_all_params:
                output = self.module.forward(*inputs, **kwargs)
            else:
                output = self._run_ddp_forward(*inputs, **kwargs)
            leaves, spec = api.flatten(output, rules=self._pk_rules)
            check_leaves(
                leaves, output, self._pk_rules, "DistributedDataParallel", "output", self._pk_strict
            )
            where_tensors = [i for i, x in enumerate(leaves) if isinstance(x, torch.Tensor)]
            tensors = tuple(leaves[i] for i in where_tensors)
            if self.static_graph and _needs_fill(tensors):
                tensors = _ZeroFill.apply(*tensors)
            if (
                not self.static_graph
                and not self.find_unused_parameters
                and torch.is_grad_enabled()
                and self.require_backward_grad_sync
                and not self._use_python_reducer
                and not self._delay_all_reduce_all_params
            ):
                _check_after_backward(self, tensors)
            synced = self._post_forward(tensors)
            for i, t in zip(where_tensors, synced):
                leaves[i] = t
            return spec.unflatten(leaves)

    def _pk_move_inputs(self, inputs: tuple, kwargs: dict) -> tuple[tuple, dict]:
        if self._use_python_reducer:
            return inputs, kwargs
        dtype = getattr(self.mixed_precision, "param_dtype", None)
        if not self.device_ids and dtype is None:
            return inputs, kwargs
        moved: tuple[tuple, dict] = (inputs, kwargs)
        if self.device_ids:
            from ._transfer import to_device

            device = torch.device(self.device_type, self.device_ids[0])
            moved = to_device(
                moved, device, non_blocking=True, rules=self._pk_rules, strict=self._pk_strict
            )
        if dtype is not None:

            def cast(x: Any) -> Any:
                if isinstance(x, torch.Tensor) and torch.is_floating_point(x):
                    return x if x.dtype == dtype else x.to(dtype)
                return x

            moved = api.tree_map(cast, moved, rules=self._pk_rules)
        return moved


def _check_after_backward(ddp: DistributedDataParallel, tensors: tuple) -> None:
    """Make the backward through these outputs raise if DDP's reduction did not finish.

    In DDP's default mode, a parameter that gets no gradient (it is unused, or
    only feeds outputs the loss leaves out) stops the reducer from finishing:
    torch then leaves the gradients of this iteration unsynchronised and
    raises only at the next forward. Checking at the end of backward raises
    before an optimizer can step on them.
    """
    needing = [t for t in tensors if t.requires_grad]
    if not needing:
        return
    ref = weakref.ref(ddp)
    engine = torch.autograd.Variable._execution_engine  # type: ignore[attr-defined]

    def check() -> None:
        model = ref()
        if model is None:
            return
        try:
            model.reducer._check_reducer_finalized()
        except RuntimeError as e:
            raise RuntimeError(
                "pytree_kit.DistributedDataParallel: this backward pass did not "
                "synchronise the gradients, because some parameters got no gradient "
                "(unused parameters, or outputs left out of the loss). Pass "
                "find_unused_parameters=True (such parameters keep grad None) or "
                "static_graph=True (they get zero gradients). torch says: " + str(e).splitlines()[0]
            ) from None

    def on_first_gradient(_grads: Any) -> None:
        # DDP's reducer queues its own end-of-backward work while backward
        # runs; a callback queued from a callback runs after it. The reducer
        # complains only if this backward started a reduction (some parameter
        # got a gradient) and left it unfinished, so torch.autograd.grad with
        # respect to inputs (a gradient penalty, say) passes.
        engine.queue_callback(lambda: engine.queue_callback(check))

    torch.autograd.graph.register_multi_grad_hook(needing, on_first_gradient, mode="any")


def _needs_fill(tensors: tuple) -> bool:
    return torch.is_grad_enabled() and any(t.requires_grad for t in tensors)


class _ZeroFill(torch.autograd.Function):
    """A copy whose backward turns a missing gradient into zeros.

    Used under ``static_graph=True``, where DDP expects every parameter it saw
    take part in the first iteration to get a gradient in every iteration: an
    output left out of the loss still sends a (zero) gradient to the
    parameters behind it, instead of leaving the reducer waiting for gradients
    that never come. It copies, as DDP's own sink does, so that the outputs
    may be modified in place.
    """

    @staticmethod
    def forward(ctx: Any, *tensors: torch.Tensor) -> tuple:  # type: ignore[override]
        ctx.set_materialize_grads(True)
        return tuple(t.clone() for t in tensors)

    @staticmethod
    def backward(ctx: Any, *grads: torch.Tensor) -> tuple:  # type: ignore[override]
        return grads


# --------------------------------------------------------------------------
# Bucketed collectives


class _Packed:
    """A tree's tensors packed into flat buckets, and how to put them back."""

    def __init__(self, tree: Any, rules: Rules, what: str, strict: bool = True) -> None:
        self.tree = tree
        self.rules = rules
        self.what = what
        self.leaves, self.spec = api.flatten(tree, rules=rules)
        self.slots = [i for i, x in enumerate(self.leaves) if isinstance(x, torch.Tensor)]
        # the first leaf that holds tensors unseen (strict): part of the
        # signature, so the ranks agree on it before any of them raises
        self.hidden = first_hidden(self.leaves) if strict else None
        for i in self.slots:
            if self.leaves[i].layout != torch.strided:
                raise TypeError(
                    f"{what}: {self.paths()[i]} is a {self.leaves[i].layout} tensor; "
                    "only dense (strided) tensors can be packed"
                )

    def buckets(self, cap_bytes: Optional[int]) -> list[list[int]]:
        """Leaf indices per bucket: one dtype and device each, at most ``cap_bytes``.

        Buckets follow leaf order within each (dtype, device). A tensor larger
        than the cap gets a bucket of its own; tensors are never split.
        ``cap_bytes=None`` means one bucket per dtype and device.
        """
        done: list[list[int]] = []
        open_: dict[tuple[torch.dtype, torch.device], tuple[list[int], list[int]]] = {}
        order: list[tuple[torch.dtype, torch.device]] = []
        for i in self.slots:
            t = self.leaves[i]
            key = (t.dtype, t.device)
            n = t.nbytes
            entry = open_.get(key)
            if entry is None:
                open_[key] = entry = ([], [0])
                order.append(key)
            current, size = entry
            if current and cap_bytes is not None and size[0] + n > cap_bytes:
                done.append(list(current))
                current.clear()
                size[0] = 0
            current.append(i)
            size[0] += n
        # full buckets in the order they filled, then what is left of each group
        by_group: dict[tuple[torch.dtype, torch.device], list[list[int]]] = {k: [] for k in order}
        for b in done:
            t = self.leaves[b[0]]
            by_group[(t.dtype, t.device)].append(b)
        out: list[list[int]] = []
        for key in order:
            out += by_group[key]
            if open_[key][0]:
                out.append(open_[key][0])
        return out

    def pack(self, bucket: list[int]) -> torch.Tensor:
        """A new flat tensor holding the bucket's tensors (never the caller's memory)."""
        tensors = [self.leaves[i] for i in bucket]
        with torch.no_grad():
            if len(tensors) == 1:
                return tensors[0].reshape(-1).clone()
            return _flatten_dense(tensors)

    def unpack(self, bucket: list[int], flat: torch.Tensor, leaves: list) -> None:
        """Put views of ``flat``, shaped as the bucket's tensors, into ``leaves``."""
        parts = _unflatten_dense(flat, [self.leaves[i] for i in bucket])
        for i, part in zip(bucket, parts):
            leaves[i] = part

    def _shown_spec(self) -> str:
        # Object addresses differ between processes; they are not structure.
        return _ADDRESS.sub("", repr(self.spec))

    def signature(self) -> bytes:
        """A digest of the structure and every tensor's position, dtype and shape."""
        h = hashlib.blake2b(digest_size=16)
        h.update(self._shown_spec().encode())
        h.update(
            repr([(i, self.leaves[i].dtype, self.leaves[i].shape) for i in self.slots]).encode()
        )
        h.update(repr(None if self.hidden is None else self.hidden[0]).encode())
        return h.digest()

    def raise_hidden(self) -> None:
        """Raise TypeError for a leaf that holds tensors (every rank has it:
        called after the ranks compared their signatures)."""
        if self.hidden is not None:
            i, found = self.hidden
            x = self.leaves[i]
            raise TypeError(hidden_message(self.what, self.paths()[i], x, found))

    def paths(self) -> list[str]:
        return [where(p) for p, _ in api.flatten_with_path(self.tree, rules=self.rules)[0]]

    def describe(self) -> list:
        """What :meth:`signature` digests, in a form other ranks can compare."""
        paths = self.paths()
        tensors = {
            paths[i]: (str(self.leaves[i].dtype), tuple(self.leaves[i].shape)) for i in self.slots
        }
        if self.hidden is not None:
            tensors[paths[self.hidden[0]]] = (_HOLDS, ())
        return [self._shown_spec(), paths, tensors]


_HOLDS = "holds tensors"


_ADDRESS = re.compile(r" at 0x[0-9a-fA-F]+")


def _flatten_dense(tensors: list[torch.Tensor]) -> torch.Tensor:
    try:
        from torch._utils import _flatten_dense_tensors
    except ImportError:  # pragma: no cover - present in every torch since 0.4
        return torch.cat([t.reshape(-1) for t in tensors])
    return _flatten_dense_tensors(tensors)


def _unflatten_dense(flat: torch.Tensor, tensors: list[torch.Tensor]) -> list[torch.Tensor]:
    parts = torch.split_with_sizes(flat, [t.numel() for t in tensors])
    # A view per part only where the shape is not already right (1-D leaves).
    return [p if p.shape == t.shape else p.view(t.shape) for p, t in zip(parts, tensors)]


def _group_device(group: Any) -> torch.device:
    backend = dist.get_backend(group)
    if backend == "nccl":
        return torch.device("cuda", torch.cuda.current_device())
    return torch.device("cpu")


def _check_same(packed: _Packed, group: Any) -> None:
    """Raise ValueError, on every rank at once, unless all ranks hold the same tree.

    One all_gather of a 16-byte digest. On a mismatch, the ranks exchange
    their descriptions (a slow path, taken only to write the error) so the
    message names the first path that differs.
    """
    world = dist.get_world_size(group)
    if world == 1:
        return
    device = _group_device(group)
    mine = torch.frombuffer(bytearray(packed.signature()), dtype=torch.int64).to(device)
    got = [torch.empty_like(mine) for _ in range(world)]
    dist.all_gather(got, mine, group=group)
    if all(torch.equal(g, got[0]) for g in got):
        return
    descriptions: list[Any] = [None] * world
    dist.all_gather_object(descriptions, packed.describe(), group=group)
    error, text = _first_difference(descriptions)
    raise error(f"{packed.what}: {text}")


def _first_difference(descriptions: list) -> tuple[type, str]:
    """The exception class and text for the first difference between ranks:
    StructureError (a ValueError) where their trees differ in structure,
    ValueError where a tensor's dtype, shape or device differs."""
    spec0, paths0, tensors0 = descriptions[0]
    for r, (spec, paths, tensors) in enumerate(descriptions[1:], start=1):
        if spec != spec0:
            for i in range(max(len(paths0), len(paths))):
                a = paths0[i] if i < len(paths0) else "nothing"
                b = paths[i] if i < len(paths) else "nothing"
                if a != b:
                    return StructureError, (
                        f"the ranks hold trees of different structures: leaf {i} is "
                        f"{a} on rank 0 but {b} on rank {r}"
                    )
            return StructureError, (
                "the ranks hold trees of different structures: "
                f"rank 0 has {_short(spec0)}, rank {r} has {_short(spec)}"
            )
        for p in paths0:
            a, b = tensors0.get(p), tensors.get(p)
            if a == b:
                continue
            show = [_show_leaf(x) for x in (a, b)]
            return ValueError, (
                f"{p} differs between ranks: rank 0 has {show[0]}, rank {r} has {show[1]}"
            )
    return ValueError, "the ranks hold different trees"


def _short(text: str, limit: int = 300) -> str:
    return text if len(text) <= limit else text[: limit - 3] + "..."


def _show_leaf(meta: Optional[tuple]) -> str:
    if meta is None:
        return "a leaf that is not a tensor"
    dtype, shape = meta
    if dtype == _HOLDS:
        return "a leaf that holds tensors"
    return f"a {dtype} tensor of shape {list(shape)}"


def _is_avg(op: Any) -> bool:
    return op == ReduceOp.AVG


def _cap(bucket_cap_mb: float) -> int:
    if not bucket_cap_mb > 0:
        raise ValueError(f"bucket_cap_mb must be positive, got {bucket_cap_mb!r}")
    return max(1, int(bucket_cap_mb * _MB))


class TreeWork:
    """The handle :func:`all_reduce_tree` returns with ``async_op=True``.

    ``wait()`` blocks until every bucket's collective has finished, and returns
    the reduced tree; calling it again returns the same tree.
    ``is_completed()`` tells whether all of them have finished, without waiting.
    """

    def __init__(self, works: list, finish: Callable[[], Any]) -> None:
        self._works = works
        self._finish = finish
        self._result: Any = None
        self._done = False

    def is_completed(self) -> bool:
        return self._done or all(w.is_completed() for w in self._works)

    def wait(self) -> Any:
        if not self._done:
            for w in self._works:
                w.wait()
            self._result = self._finish()
            self._done = True
            self._works = []
        return self._result


def all_reduce_tree(
    tree: Any,
    op: Any = ReduceOp.SUM,
    *,
    group: Any = None,
    bucket_cap_mb: float = 25,
    async_op: bool = False,
    rules: Rules = None,
    strict: bool = True,
) -> Any:
    """All-reduce every tensor of a tree, with one collective per bucket.

    The tensors are grouped by dtype and device and packed, in leaf order,
    into buckets of at most ``bucket_cap_mb`` megabytes (a larger tensor gets
    a bucket of its own); each bucket is one ``all_reduce``. The result has
    the tree's structure and container types, with new tensors: unlike
    ``torch.distributed.all_reduce``, the tree you pass is not modified. The
    results are views into the bucket they travelled in, detached from
    autograd.

    Leaves that are not tensors (numbers, strings, anything else; ``None`` is
    an empty node) take no part: each rank gets its own back unchanged. To
    reduce a Python number, make it a tensor. A leaf that holds tensors
    pytree_kit does not see (an object of a class it does not see into) raises
    TypeError on every rank, naming its path: pass ``rules=`` for its class, or
    ``strict=False`` to let it take no part. The same holds for
    :func:`broadcast_tree` and :func:`all_gather_tree`.

    ``ReduceOp.AVG`` works on every backend: where the backend lacks it (gloo),
    the buckets are summed and divided by the group's size. Every rank must
    pass a tree of the same structure, dtypes and shapes; otherwise every
    rank raises ``ValueError`` naming the first path that differs.

    Args:
        tree: the tree to reduce.
        op: a ``torch.distributed.ReduceOp``.
        group: the process group; the default group when None.
        bucket_cap_mb: the largest bucket, in megabytes (2**20 bytes).
        async_op: return a :class:`TreeWork` whose ``wait()`` gives the tree.
        rules: local flattening rules (see :func:`pytree_kit.flatten`).
        strict: raise on a leaf that holds tensors (see above).

    Examples:
        >>> import torch, torch.distributed as dist
        >>> from pytree_kit.torch import all_reduce_tree
        >>> dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
        >>> all_reduce_tree({"loss": torch.tensor(2.0), "counts": [torch.tensor([1, 2])]})
        {'loss': tensor(2.), 'counts': [tensor([1, 2])]}
        >>> all_reduce_tree({"loss": torch.tensor(2.0)}, async_op=True).wait()
        {'loss': tensor(2.)}
        >>> dist.destroy_process_group()
    """
    cap = _cap(bucket_cap_mb)
    packed = _Packed(tree, rules, "all_reduce_tree", strict)
    _check_same(packed, group)
    packed.raise_hidden()
    avg = _is_avg(op) and dist.get_backend(group) != "nccl"
    if avg:
        for i in packed.slots:
            t = packed.leaves[i]
            if not (t.is_floating_point() or t.is_complex()):
                path = packed.paths()[i]
                raise TypeError(
                    f"all_reduce_tree: ReduceOp.AVG needs floating-point tensors, "
                    f"but {path} is {t.dtype}"
                )
    buckets = packed.buckets(cap)
    flats = [packed.pack(b) for b in buckets]
    reduce_op = ReduceOp.SUM if avg else op
    works = [dist.all_reduce(f, op=reduce_op, group=group, async_op=async_op) for f in flats]
    world = dist.get_world_size(group)

    def finish() -> Any:
        leaves = list(packed.leaves)
        for b, f in zip(buckets, flats):
            if avg:
                f.div_(world)
            packed.unpack(b, f, leaves)
        return packed.spec.unflatten(leaves)

    if async_op:
        return TreeWork(works, finish)
    return finish()


def broadcast_tree(
    tree: Any,
    src: int,
    *,
    group: Any = None,
    bucket_cap_mb: float = 25,
    rules: Rules = None,
    strict: bool = True,
) -> Any:
    """Every rank gets rank ``src``'s tensors, in its own tree's structure.

    Like ``torch.distributed.broadcast``, every rank passes a tree of the same
    structure, dtypes and shapes (the others' tensor values do not matter);
    the tensors travel packed into buckets of at most ``bucket_cap_mb``, one
    ``broadcast`` each. Leaves that are not tensors are each rank's own,
    unchanged; use ``torch.distributed.broadcast_object_list`` for Python
    objects. The tree you pass is not modified.

    Examples:
        >>> import torch, torch.distributed as dist
        >>> from pytree_kit.torch import broadcast_tree
        >>> dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
        >>> broadcast_tree({"w": torch.ones(2)}, src=0)
        {'w': tensor([1., 1.])}
        >>> dist.destroy_process_group()
    """
    cap = _cap(bucket_cap_mb)
    packed = _Packed(tree, rules, "broadcast_tree", strict)
    _check_same(packed, group)
    packed.raise_hidden()
    leaves = list(packed.leaves)
    for b in packed.buckets(cap):
        flat = packed.pack(b)
        dist.broadcast(flat, src=src, group=group)
        packed.unpack(b, flat, leaves)
    return packed.spec.unflatten(leaves)


def all_gather_tree(
    tree: Any, *, group: Any = None, rules: Rules = None, strict: bool = True
) -> list:
    """Gather every rank's tensors: a list of trees, one per rank, in rank order.

    The tensors travel packed, one ``all_gather`` per dtype and device. Every
    rank passes a tree of the same structure, dtypes and shapes. In the tree of
    rank ``r``, the tensors are rank ``r``'s; leaves that are not tensors are
    the calling rank's own, since only tensors travel.

    Examples:
        >>> import torch, torch.distributed as dist
        >>> from pytree_kit.torch import all_gather_tree
        >>> dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
        >>> all_gather_tree({"pred": torch.arange(3)})
        [{'pred': tensor([0, 1, 2])}]
        >>> dist.destroy_process_group()
    """
    packed = _Packed(tree, rules, "all_gather_tree", strict)
    _check_same(packed, group)
    packed.raise_hidden()
    world = dist.get_world_size(group)
    per_rank = [list(packed.leaves) for _ in range(world)]
    for b in packed.buckets(None):
        flat = packed.pack(b)
        got = [torch.empty_like(flat) for _ in range(world)]
        dist.all_gather(got, flat, group=group)
        for r in range(world):
            packed.unpack(b, got[r], per_rank[r])
    return [packed.spec.unflatten(leaves) for leaves in per_rank]
