"""pytree_kit.torch data loading: collate, pin_memory, to_device, PinnedLoader.

CPU tests cover everything that runs without an accelerator (the coalescing
logic runs on an ordinary allocator); the GPU tests skip cleanly without CUDA.
"""

from __future__ import annotations

import collections
import dataclasses
import gc
import itertools
import math
import random
import threading
import warnings
from typing import Any, Optional

import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

torch = pytest.importorskip("torch")

import pytree_kit as pk  # noqa: E402
from pytree_kit.torch import (  # noqa: E402
    PinnedLoader,
    PinnedPool,
    _loader,
    _pool,
    _staging,
    collate,
    consolidate,
    pin_memory,
    to_device,
)
from pytree_kit.torch._storage import move_storage  # noqa: E402


def pack(pool: PinnedPool, leaves: list) -> list:
    """The leaves with their plain CPU tensors packed into one buffer of ``pool``."""
    out = list(leaves)
    _staging.stage(leaves, _staging.tensors_in(leaves)[0], out, pool)
    return out


CUDA = torch.cuda.is_available()


def _spawn(workers: int) -> dict:
    # Workers start with spawn: forking a process in which jax (imported by other
    # tests) runs threads can deadlock. Spawn also checks that batches pickle.
    return {"multiprocessing_context": "spawn"} if workers else {}


needs_cuda = pytest.mark.skipif(not CUDA, reason="needs CUDA")


# -- batch types (module level: DataLoader workers pickle them) -------------------


@dataclasses.dataclass
class Target:
    boxes: Any
    labels: Any


@dataclasses.dataclass
class Sample:
    image: Any
    target: Target
    name: str
    weight: float
    extra: Any = None


Pair = collections.namedtuple("Pair", "left right")


class Boxes:
    def __init__(self, xy, fmt="xyxy"):
        self.xy, self.fmt = xy, fmt

    def __tree_flatten__(self):
        return {"xy": self.xy}, self.fmt

    @classmethod
    def __tree_unflatten__(cls, fmt, children):
        return cls(children["xy"], fmt)


def make_sample(i: int) -> Sample:
    return Sample(
        image=torch.full((3, 4), float(i)),
        target=Target(boxes=torch.tensor([[i, i, i + 1, i + 1]]), labels=torch.tensor([i])),
        name=f"img{i}",
        weight=0.5 * i,
    )


class Dataset(torch.utils.data.Dataset):
    def __init__(self, kind: str, n: int = 8) -> None:
        self.kind, self.n = kind, n

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int) -> Any:
        if self.kind == "dataclass":
            return make_sample(i)
        if self.kind == "namedtuple":
            return Pair(torch.tensor([i]), {"k": i, "s": None})
        return {"boxes": Boxes(torch.ones(2) * i, "cxcy"), "i": i}


# -- collate ---------------------------------------------------------------------


def test_collate_keeps_types_stacks_tensors_and_lists_the_rest():
    batch = collate([make_sample(0), make_sample(1), make_sample(2)])
    assert type(batch) is Sample and type(batch.target) is Target
    assert batch.image.shape == (3, 3, 4) and batch.image[2, 0, 0] == 2
    assert batch.target.boxes.shape == (3, 1, 4)
    assert batch.name == ["img0", "img1", "img2"]
    assert batch.weight.dtype == torch.float32 or batch.weight.dtype == torch.float64
    torch.testing.assert_close(
        batch.weight, torch.tensor([0.0, 0.5, 1.0], dtype=batch.weight.dtype)
    )
    assert batch.extra is None


def test_collate_namedtuple_and_protocol():
    pairs = collate([Pair(torch.zeros(2), {"n": 1}), Pair(torch.ones(2), {"n": 2})])
    assert (
        type(pairs) is Pair and pairs.left.shape == (2, 2) and pairs.right["n"].tolist() == [1, 2]
    )
    boxes = collate([Boxes(torch.zeros(2), "cxcy"), Boxes(torch.ones(2), "cxcy")])
    assert type(boxes) is Boxes and boxes.fmt == "cxcy" and boxes.xy.shape == (2, 2)


def test_collate_structure_mismatch_names_the_path():
    a, b = make_sample(0), make_sample(1)
    b.target = Target(boxes=[torch.zeros(4)], labels=torch.tensor([1]))
    with pytest.raises(
        ValueError, match=r"sample 1 does not have the structure of sample 0: tree\.target\.boxes"
    ):
        collate([a, b])
    c = make_sample(2)
    c.name = {"nested": "dict"}
    with pytest.raises(ValueError, match=r"sample 1 .*tree\.name: sample 0 has a leaf of type str"):
        collate([make_sample(0), c])
    with pytest.raises(ValueError, match=r"tree\.target: structure mismatch"):
        collate([make_sample(0), Sample(torch.zeros(3, 4), None, "x", 1.0)])


def test_collate_unstackable_shapes_name_the_path():
    a, b = make_sample(0), make_sample(1)
    b.target.boxes = torch.zeros(2, 4)
    with pytest.raises(
        ValueError, match=r"tree\.target\.boxes: cannot stack tensors .*\(1, 4\).*\(2, 4\)"
    ):
        collate([a, b])


def test_collate_mixed_kinds_and_empty():
    with pytest.raises(
        ValueError,
        match=r"tree\['x'\]: the samples hold different kinds of values here \(Tensor, int\)",
    ):
        collate([{"x": torch.zeros(1)}, {"x": 1}])
    with pytest.raises(ValueError, match="no samples"):
        collate([])


@pytest.mark.parametrize("workers", [0, 2])
@pytest.mark.parametrize("kind", ["dataclass", "namedtuple", "protocol"])
@pytest.mark.timeout(120)
def test_collate_with_a_real_dataloader(kind, workers):
    loader = torch.utils.data.DataLoader(
        Dataset(kind), batch_size=4, collate_fn=collate, num_workers=workers, **_spawn(workers)
    )
    batches = list(loader)
    assert len(batches) == 2
    first = batches[0]
    if kind == "dataclass":
        assert type(first) is Sample and first.image.shape == (4, 3, 4)
        assert first.name == ["img0", "img1", "img2", "img3"]
        assert batches[1].target.labels.flatten().tolist() == [4, 5, 6, 7]
    elif kind == "namedtuple":
        assert type(first) is Pair and first.right["s"] is None
        assert first.right["k"].tolist() == [0, 1, 2, 3]
    else:
        assert type(first["boxes"]) is Boxes and first["boxes"].fmt == "cxcy"
        assert first["boxes"].xy.shape == (4, 2)


# -- pinning: without an accelerator, as torch does -------------------------------


@pytest.mark.skipif(CUDA, reason="CPU-only behaviour")
def test_pin_memory_without_accelerator_warns_and_returns_the_batch():
    batch = make_sample(1)
    with pytest.warns(UserWarning, match="no accelerator is available"):
        out = pin_memory(batch, coalesce=True)
    assert out is batch


# -- the coalescing pool, on an ordinary allocator ---------------------------------


def plain_pool(**kw: Any) -> PinnedPool:
    return PinnedPool(allocator=lambda n, dtype: torch.empty(n, dtype=dtype), **kw)


def small_batch(n: int = 1000, seed: int = 0) -> dict:
    g = torch.Generator().manual_seed(seed)
    return {
        "feats": [torch.randn(64, generator=g) for _ in range(n)],
        "ids": [torch.tensor([i]) for i in range(n)],
        "meta": Target(
            boxes=torch.randn(2, 3, generator=g).t(), labels="keep me"
        ),  # non-contiguous
    }


def test_pack_copies_a_batch_into_one_buffer_group_by_group():
    pool = plain_pool()
    batch = small_batch(100)
    leaves, spec = pk.flatten(batch)
    packed = spec.unflatten(pack(pool, leaves))
    assert pool.allocations == 1  # float32 and int64 alike: one byte buffer per batch
    for a, b in zip(pk.leaves(batch), pk.leaves(packed)):
        if isinstance(a, torch.Tensor):
            torch.testing.assert_close(a, b)
            assert a.dtype == b.dtype and a.shape == b.shape and b.is_contiguous()
        else:
            assert a is b
    storages = {
        t.untyped_storage().data_ptr() for t in pk.leaves(packed) if isinstance(t, torch.Tensor)
    }
    assert len(storages) == 1
    assert type(packed["meta"]) is Target and packed["meta"].labels == "keep me"
    # a group's tensors lie end to end; each group starts on a 128-byte boundary
    feats = [t.data_ptr() for t in packed["feats"]]
    assert [b - a for a, b in itertools.pairwise(feats)] == [64 * 4] * 99
    start = storages.pop()
    for first in (packed["feats"][0], packed["ids"][0], packed["meta"].boxes):
        assert (first.data_ptr() - start) % 128 == 0
    assert packed["ids"][1].data_ptr() - packed["ids"][0].data_ptr() == 8


def test_pack_leaves_what_it_cannot_copy_as_it_is():
    pool = plain_pool()
    leaves = [
        torch.ones(3, requires_grad=True),  # cat refuses it (grad is on): kept
        torch.zeros(2).to_sparse(),
        torch.arange(4),
        torch.ones(2, device="meta"),
        "text",
    ]
    out = pack(pool, leaves)
    assert [a is b for a, b in zip(leaves, out)] == [True, True, False, True, True]
    assert torch.equal(out[2], leaves[2]) and pool.buffer_of(out[2]) is not None
    with torch.no_grad():  # as Tensor.to under no_grad: copied without its history
        out = pack(pool, leaves)
    assert out[0] is not leaves[0] and not out[0].requires_grad


def test_buffers_are_reused_only_when_no_tensor_of_their_batch_is_alive():
    pool = plain_pool()
    leaves, spec = pk.flatten(small_batch(50))
    first = pack(pool, leaves)
    buf_ptr = first[0].untyped_storage().data_ptr()
    second = pack(pool, leaves)  # the first batch is alive: a new buffer
    second_ptr = second[0].untyped_storage().data_ptr()
    assert second_ptr != buf_ptr and pool.allocations == 2
    survivor = first[60][1:]  # a view of one of its tensors keeps the buffer in use
    del first
    gc.collect()
    third = pack(pool, leaves)
    assert third[0].untyped_storage().data_ptr() not in (buf_ptr, second_ptr)
    assert pool.allocations == 3
    before = survivor.clone()
    del second
    gc.collect()
    fourth = pack(pool, leaves)  # the second batch's buffer is free again
    assert fourth[0].untyped_storage().data_ptr() == second_ptr
    assert pool.allocations == 3
    torch.testing.assert_close(survivor, before)  # never overwritten
    del survivor, third, fourth
    gc.collect()
    for _ in range(10):
        pack(pool, leaves)  # each result dropped at once: always reused
    assert pool.allocations == 3


def test_many_small_tensors_cost_one_allocation_per_batch():
    pool = plain_pool()
    leaves, spec = pk.flatten(small_batch(1000))
    for _ in range(20):
        packed = spec.unflatten(pack(pool, leaves))
        del packed
    assert pool.allocations == 1  # vs 20 * 2001 host allocations tensor by tensor


def test_pool_keeps_at_most_max_buffers_idle():
    pool = plain_pool(max_buffers=2)
    sizes = [10, 1000, 100_000, 10, 1000]
    for n in sizes:
        pack(pool, [torch.zeros(n)])
    assert len(pool._buffers) <= 2


def test_pin_memory_coalesce_uses_the_pool(monkeypatch):
    monkeypatch.setattr(_pool, "pinning_available", lambda: True)
    pool = plain_pool()
    batch = make_sample(3)
    out = pin_memory(batch, coalesce=True, pool=pool)
    assert type(out) is Sample and type(out.target) is Target and out.name == "img3"
    torch.testing.assert_close(out.image, batch.image)
    assert pool.buffer_of(out.image) is pool.buffer_of(out.target.boxes) is not None
    assert pool.buffer_of(out.target.labels) is pool.buffer_of(out.image)  # int64 too


def test_pin_memory_coalesce_pins_what_it_cannot_pack_on_its_own(monkeypatch):
    monkeypatch.setattr(_pool, "pinning_available", lambda: True)
    pinned = []

    def fake_pin(self):
        pinned.append(type(self))
        return self.clone()

    monkeypatch.setattr(torch.Tensor, "pin_memory", fake_pin)

    class Marked(torch.Tensor):
        pass

    batch = {"plain": torch.ones(3), "marked": torch.ones(2).as_subclass(Marked), "n": 1}
    out = pin_memory(batch, coalesce=True, pool=plain_pool())
    assert pinned == [Marked] and type(out["marked"]) is Marked and out["n"] == 1


def test_pin_memory_per_tensor_pins_every_tensor(monkeypatch):
    monkeypatch.setattr(_pool, "pinning_available", lambda: True)
    pinned = []

    def fake_pin(self):
        pinned.append(self)
        return self.clone()

    monkeypatch.setattr(torch.Tensor, "pin_memory", fake_pin)
    batch = {"a": [torch.zeros(1), Boxes(torch.ones(2))], "n": 3}
    out = pin_memory(batch)
    assert len(pinned) == 2 and type(out["a"][1]) is Boxes and out["n"] == 3


# -- to_device ------------------------------------------------------------------------


@pytest.mark.parametrize("device", ["cpu", "meta"])
def test_to_device_moves_every_tensor_and_keeps_types(device):
    batch = {"s": make_sample(1), "p": Pair(torch.zeros(2), 7), "b": Boxes(torch.ones(3))}
    out = to_device(batch, device)
    assert type(out["s"]) is Sample and type(out["p"]) is Pair and type(out["b"]) is Boxes
    assert out["s"].name == "img1" and out["p"].right == 7 and out["b"].fmt == "xyxy"
    tensors = [t for t in pk.leaves(out) if isinstance(t, torch.Tensor)]
    assert len(tensors) == 5 and all(t.device.type == device for t in tensors)
    assert out["s"].target.boxes.shape == (1, 4)


@pytest.mark.parametrize("device", ["cpu", "meta"])
def test_to_device_from_a_coalesced_batch_copies_once_per_buffer(device, monkeypatch):
    pool = plain_pool()
    batch = small_batch(200)
    leaves, spec = pk.flatten(batch)
    packed = spec.unflatten(pack(pool, leaves))
    copies = []
    real_to = torch.Tensor.to

    def counting_to(self, *args, **kwargs):
        copies.append(tuple(self.shape))
        return real_to(self, *args, **kwargs)

    monkeypatch.setattr(torch.Tensor, "to", counting_to)
    out = to_device(packed, device, pool=pool, non_blocking=True)
    monkeypatch.undo()
    # one for the batch's buffer, not 401 (to the device they are on: none)
    assert len(copies) == 1 if device == "meta" else len(copies) <= 1
    assert out["meta"].labels == "keep me" and type(out["meta"]) is Target
    for a, b in zip(pk.leaves(batch), pk.leaves(out)):
        if isinstance(a, torch.Tensor):
            assert b.device.type == device and b.shape == a.shape and b.dtype == a.dtype
            if device == "cpu":
                torch.testing.assert_close(a, b)


def test_to_device_moves_only_the_part_of_a_pool_buffer_its_batch_uses(monkeypatch):
    pool = plain_pool()
    leaves, spec = pk.flatten({"feats": [torch.randn(64) for _ in range(200)]})
    packed = spec.unflatten(pack(pool, leaves))
    buf = pool.buffer_of(packed["feats"][0])
    assert buf is not None and buf.used == 200 * 64 * 4 < buf.data.numel()  # room to grow
    moved_bytes = []
    real_to = torch.Tensor.to

    def counting_to(self, *args, **kwargs):
        moved_bytes.append(self.nbytes)
        return real_to(self, *args, **kwargs)

    monkeypatch.setattr(torch.Tensor, "to", counting_to)
    out = to_device(packed, "meta", pool=pool)
    monkeypatch.undo()
    assert moved_bytes == [200 * 64 * 4]  # one copy, of the used part alone
    assert [t.shape for t in out["feats"]] == [(64,)] * 200


def test_tensors_moved_together_are_not_views_of_one_another():
    """An in-place change to one moved tensor leaves the others' version
    counters alone (views of one base share theirs, and a backward that saved
    one would then fail after an in-place change to another)."""
    pool = plain_pool()
    leaves, spec = pk.flatten([torch.randn(8) for _ in range(4)])
    packed = spec.unflatten(pack(pool, leaves))
    for batch, coalesce in [
        (packed, False),
        (consolidate(spec.unflatten(leaves)), False),
        (spec.unflatten(leaves), True),
        (packed, True),
    ]:
        out = to_device(batch, "meta", pool=pool, coalesce=coalesce)
        assert all(t._base is None for t in out)
        before = [t._version for t in out]
        out[0].add_(1)
        assert [t._version for t in out[1:]] == before[1:]
    # and pin_memory's packed tensors, on the host
    before = [t._version for t in packed]
    packed[1].mul_(2)
    assert [t._version for k, t in enumerate(packed) if k != 1] == [
        v for k, v in enumerate(before) if k != 1
    ]


# -- to_device(coalesce=True): one staging buffer, one copy ---------------------------


class Marked(torch.Tensor):
    """A tensor subclass: never packed (it would come back a plain tensor)."""


def copied_on_the_cpu(monkeypatch: Any) -> list:
    """Make the staging buffer's one copy on the CPU instead of a device (none
    here), so the values cut from it can be read back; returns the copies' sizes."""
    copies: list = []

    def transfer(flat: Any, device: Any, non_blocking: bool) -> Any:
        copies.append(flat.nbytes)
        return flat.clone()

    monkeypatch.setattr(_staging, "_copy", transfer)
    return copies


DTYPES = [torch.float32, torch.int64, torch.bool, torch.float16, torch.uint8, torch.complex64]


def mixed_batch(seed: int) -> tuple[Any, list]:
    """A fresh batch of tensors of every kind staging meets, and its tensors' clones."""
    g = torch.Generator().manual_seed(seed)
    rnd = random.Random(seed)

    def tensor() -> Any:
        dtype = rnd.choice(DTYPES)
        shape = tuple(rnd.randint(0, 4) for _ in range(rnd.randint(0, 3)))
        x = (torch.randn(shape, generator=g) * 10).to(dtype)
        kind = rnd.random()
        if kind < 0.15 and x.dim() == 2:
            x = x.t()  # not contiguous
        elif kind < 0.2 and x.dim() >= 1:
            x = x[::2]  # a strided view of a larger storage
        return x

    seqs = [torch.arange(rnd.randint(0, 6)) + seed for _ in range(rnd.randint(0, 5))]
    batch = {
        "seqs": seqs,  # one group: lengths differ
        "mixed": [tensor() for _ in range(rnd.randint(1, 12))],
        "target": Target(boxes=tensor(), labels=f"s{seed}"),
        "pair": Pair(torch.tensor(float(seed)), rnd.randint(0, 9)),  # 0-d
        "marked": torch.ones(2).as_subclass(Marked),
        "grad": torch.ones(3, requires_grad=True),
        "big": torch.full((_staging.STAGE_LIMIT // 4 + 1,), float(seed)),
    }
    return batch, [t.clone() for t in pk.leaves(batch) if isinstance(t, torch.Tensor)]


def test_staged_transfer_over_many_fresh_batches_gives_every_tensor_back(monkeypatch):
    copies = copied_on_the_cpu(monkeypatch)
    pool = plain_pool()
    kept = []
    for seed in range(150):
        batch, originals = mixed_batch(seed)
        out = to_device(batch, "meta", coalesce=True, pool=pool, non_blocking=seed % 2 == 0)
        kept.append((seed, out))
        assert type(out["target"]) is Target and type(out["pair"]) is Pair
        assert out["target"].labels == f"s{seed}" and out["pair"].right == batch["pair"].right
        assert type(out["marked"]) is Marked and out["marked"].device.type == "meta"
        # over STAGE_LIMIT: non-blocking, through the buffer with a copy of its
        # own (here to the CPU); blocking, moved on its own
        assert out["big"].device.type == ("cpu" if seed % 2 == 0 else "meta")
        assert out["grad"].device.type == "meta" and out["grad"].requires_grad
        # the caller's batch is untouched
        now = [t for t in pk.leaves(batch) if isinstance(t, torch.Tensor)]
        assert all(torch.equal(a.detach(), b.detach()) for a, b in zip(now, originals))
    # one copy a batch, and one more for the big tensor when non-blocking;
    # buffers are reused: a few sizes in all (a batch with a tensor cat refuses
    # is planned again, which may take a larger one), not one per batch
    assert len(copies) == 150 + 75 and pool.allocations <= 3
    # every batch's staged tensors still hold their values after later batches
    for seed, out in kept:
        _, originals = mixed_batch(seed)
        got = [t for t in pk.leaves(out) if isinstance(t, torch.Tensor)]
        assert len(got) == len(originals)
        for a, b in zip(originals, got):
            assert a.dtype == b.dtype and a.shape == b.shape
            if b.device.type == "cpu":  # staged: cut from the copy
                assert torch.equal(a.detach(), b) and b.is_contiguous() and b._base is None


def test_staged_transfer_copies_once_and_keeps_big_tensors_apart(monkeypatch):
    copies = copied_on_the_cpu(monkeypatch)
    moved = []
    real_to = torch.Tensor.to

    def counting_to(self: Any, *args: Any, **kwargs: Any) -> Any:
        moved.append(self.nbytes)
        return real_to(self, *args, **kwargs)

    monkeypatch.setattr(torch.Tensor, "to", counting_to)
    batch = {
        "feats": [torch.randn(64) for _ in range(1000)],
        "ids": [torch.arange(n) for n in range(1, 200)],
        "big": torch.zeros(_staging.STAGE_LIMIT // 4 + 1),
    }
    out = to_device(batch, "meta", coalesce=True, pool=plain_pool())
    assert len(copies) == 1 and moved == [batch["big"].nbytes]
    assert copies[0] >= 1000 * 64 * 4 + sum(range(1, 200)) * 8
    assert [t.shape[0] for t in out["ids"]] == list(range(1, 200))
    assert out["big"].device.type == "meta"


def test_staging_tensors_of_one_dtype_and_many_shapes_and_nested_ones(monkeypatch):
    """A dtype's tensors that differ past the first dimension (boxes and
    scores, in samples) and one empty 1-d tensor among 2-d ones: over fresh
    batches, each comes back equal in dtype, shape and values from one copy,
    no view; the pool's buffers serve a second epoch without a new one, though
    grouping by shape can take more bytes than the first plan. A nested
    tensor, which has no shape, is packed around (``pin_memory``'s way; torch
    cannot move one to meta)."""
    copies = copied_on_the_cpu(monkeypatch)
    pool = plain_pool()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # nested tensors are a prototype
        nested = torch.nested.nested_tensor([torch.ones(2), torch.ones(3)])
    allocations = []
    for seed in [*range(40), *range(40)]:  # two epochs
        g = torch.Generator().manual_seed(seed)
        samples = [
            {
                "boxes": torch.randn(n, 4, generator=g),
                "scores": torch.randn(n, generator=g),
                "labels": torch.randint(0, 9, (n,), generator=g),
            }
            for n in torch.randint(1, 6, (1 + seed % 7,), generator=g).tolist()
        ]
        # an empty float32 tensor makes float32's shapes be read at once; an
        # empty int64 one leaves float32 to cat, which refuses boxes beside
        # scores: refine splits them, and packing goes on
        empty = torch.zeros(0, dtype=torch.float32 if seed % 2 else torch.int64)
        batch = {"samples": samples, "empty": empty, "grid": torch.ones(2, 4)}
        originals = [t.clone() for t in pk.leaves(batch)]
        del copies[:]
        out = to_device(batch, "meta", coalesce=True, pool=pool, non_blocking=seed % 2 == 0)
        assert len(copies) == 1
        for a, b in zip(originals, pk.leaves(out), strict=True):
            assert a.dtype == b.dtype and a.shape == b.shape and torch.equal(a, b)
            assert b._base is None
        leaves = [*pk.leaves(batch), nested]
        packed = pack(pool, leaves)
        assert packed[-1] is nested
        for a, b in zip(originals, packed):
            assert torch.equal(a, b) and pool.buffer_of(b) is not None
        assert all(map(torch.equal, originals, pk.leaves(batch)))  # the caller's, untouched
        del out, packed
        allocations.append(pool.allocations)
    # a few buffers for the batches' sizes, then none: the second epoch reuses them
    assert allocations[39] == allocations[-1] <= len(allocations) // 8


def test_non_blocking_staging_streams_big_tensors_each_with_a_copy_of_its_own(monkeypatch):
    """Over STAGE_LIMIT, non-blocking: each big tensor is packed after the small
    ones' copy has been queued and gets its own copy, in order, so that packing
    the next overlaps the copy of the one before; what comes out is no view."""
    copies = copied_on_the_cpu(monkeypatch)
    pool = plain_pool()
    n = _staging.STAGE_LIMIT // 4 + 1
    for seed in range(4):  # fresh batches, one buffer reused
        g = torch.Generator().manual_seed(seed)
        big = [
            torch.randn(n, generator=g),
            torch.randn(3, n, generator=g)[:, ::3],  # strided: packed contiguous
            torch.randint(0, 9, (n,), generator=g),
        ]
        batch = {"small": [torch.randn(8, generator=g) for _ in range(50)], "big": big}
        originals = [t.clone() for t in big]
        del copies[:]
        out = to_device(batch, "meta", coalesce=True, non_blocking=True, pool=pool)
        assert copies == [50 * 8 * 4] + [t.nbytes for t in big]
        for a, b, orig in zip(big, out["big"], originals):
            assert torch.equal(a, orig)  # the caller's tensors are untouched
            assert b.dtype == a.dtype and b.shape == a.shape and torch.equal(a, b)
            assert b._base is None and b.is_contiguous()
        before = [t._version for t in out["big"]]
        out["big"][0].add_(1)  # its own version counter: the others' do not move
        assert [t._version for t in out["big"]][1:] == before[1:]
        # blocking: big tensors are moved as they are, with to()
        out = to_device(batch, "meta", coalesce=True, pool=pool)
        assert all(t.device.type == "meta" for t in out["big"])
    assert pool.allocations == 1


def test_staged_tensors_keep_a_backward_after_an_in_place_change_to_another(monkeypatch):
    copied_on_the_cpu(monkeypatch)
    pool = plain_pool()
    emb = torch.nn.Embedding(50, 4)
    for _ in range(3):
        batch = {"input_ids": torch.randint(0, 50, (2, 6)), "labels": torch.randint(0, 50, (2, 6))}
        out = to_device(batch, "meta", coalesce=True, pool=pool)
        loss = emb(out["input_ids"]).sum()  # saves input_ids for its backward
        out["labels"].masked_fill_(out["labels"] == 0, -100)  # in place, on its neighbour
        loss.backward()  # a view of one base would fail here: version mismatch


ALL_DTYPES = [
    torch.float32,
    torch.float64,
    torch.float16,
    torch.bfloat16,
    torch.int8,
    torch.int16,
    torch.int32,
    torch.int64,
    torch.uint8,
    torch.bool,
    torch.complex64,
]


_SPEC = st.tuples(
    st.sampled_from(ALL_DTYPES),
    st.lists(st.integers(0, 3), max_size=3),
    st.booleans(),
)


def _sequences(lengths: list, rest: list, odd: Optional[int], empty: Optional[list]) -> list:
    """Sequences of three dtypes, of one shape past the first dimension
    (``rest``), but one of another shape (at ``odd``), and one empty first
    (of shape ``empty``: ``[0, *rest]``, or ``[0]``, which ``cat`` skips)."""
    specs = [(dtype, [n, *rest], False) for dtype, n in lengths]
    if specs and odd is not None:
        specs[odd % len(specs)] = (specs[odd % len(specs)][0], [2, 2], False)
    if specs and empty is not None:
        specs[0] = (specs[0][0], empty, False)
    return specs


_SEQUENCES = st.sampled_from([[], [3]]).flatmap(
    lambda rest: st.builds(
        _sequences,
        st.lists(st.tuples(st.sampled_from(ALL_DTYPES[:3]), st.integers(1, 5)), max_size=40),
        st.just(rest),
        st.none() | st.integers(0, 40),
        st.none() | st.sampled_from([[0, *rest], [0]]),
    )
)
# a batch of lists, field after field: each field's tensors of one dtype and
# one shape past the first dimension, of varying lengths; a dtype in several
# fields, of several shapes, next to each other or not
_FIELDS = st.lists(
    st.tuples(
        st.sampled_from(ALL_DTYPES[:2]),
        st.sampled_from([[], [3], [2, 2]]),
        st.lists(st.integers(1, 4), min_size=1, max_size=8),
    ),
    max_size=6,
).map(lambda fields: [(d, [n, *rest], False) for d, rest, ns in fields for n in ns])
# the orders of dtypes plan has a way for: any; each dtype in one run (a batch
# of lists, field after field); repeating with a period (a list of samples of
# a few fields), the last sample maybe cut short; sequences of varying length;
# fields of a batch of lists
_LAYOUTS = st.one_of(
    st.lists(_SPEC, max_size=40),
    _SEQUENCES,
    _FIELDS,
    st.lists(_SPEC, max_size=40).map(lambda xs: sorted(xs, key=lambda x: str(x[0]))),
    st.builds(
        lambda sample, times, cut: (sample * times)[: max(0, len(sample) * times - cut)],
        st.lists(_SPEC, min_size=1, max_size=5),
        st.integers(1, 8),
        st.integers(0, 4),
    ),
)


# 40 tensors of three dtypes in 27 runs, with no period
_NO_PERIOD = [(ALL_DTYPES[int(k)], [2], False) for k in "1012002012020001100021020022202210002011"]
# 160 tensors in 20 runs of 8, of two dtypes: more runs than plan takes a run at a time
_LONG_RUNS = [(ALL_DTYPES[k % 2], [1], False) for k in range(20) for _ in range(8)]


@settings(max_examples=150, deadline=None)
@given(_LAYOUTS, st.sampled_from([1, 8, 64, 128]), st.booleans(), st.booleans())
# cat skips an empty 1-d tensor, first or not, among 2-d ones; lengths differ
@example(
    [(torch.float32, [0], False), (torch.float32, [2, 3], False), (torch.float32, [1, 3], False)],
    8,
    False,
    False,
)
@example(
    [(torch.float32, [2, 3], False), (torch.float32, [0], False), (torch.float32, [1, 3], False)],
    8,
    False,
    False,
)
@example(
    [(torch.float32, [2], False), (torch.float32, [5], False), (torch.int64, [3], False)],
    1,
    True,
    False,
)
@example(
    [
        (torch.float32, [2, 3], False),
        (torch.float32, [4, 3], False),
        (torch.float32, [1, 3], False),
    ],
    8,
    False,
    False,
)
@example(
    [(torch.float32, [2, 3], False), (torch.float32, [2, 3], False), (torch.float32, [2], False)],
    64,
    False,
    False,
)
# three shapes of one dtype past the first dimension, one each: a flat group
@example(
    [
        (torch.float64, [1], False),
        (torch.float64, [1, 3], False),
        (torch.float64, [1, 2, 2], False),
    ],
    1,
    False,
    True,
)
# three dtypes in many runs and no period: sorted by dtype one by one
@example(_NO_PERIOD, 8, True, False)
@example(_NO_PERIOD, 8, False, False)
@example(_LONG_RUNS, 8, False, False)
def test_plan_write_read_give_every_tensor_back(
    specs: list, alignment: int, other_leaf: bool, exact: bool
) -> None:
    """_staging on its own, over many dtypes (more than the grouping's fast
    paths take) and shapes: every tensor comes back equal, in one group, whose
    positions ascend; groups start aligned and do not overlap. A plan that
    did not read every shape makes write stop exactly at each group whose
    tensors differ past the first dimension, and nowhere else; refined there,
    all come back."""
    from pytree_kit.torch import _staging

    leaves: list = ["not a tensor"] if other_leaf else []  # plan's two ways in
    for k, (dtype, shape, transposed) in enumerate(specs):
        x = (torch.arange(math.prod(shape), dtype=torch.float64) + k).view(shape).to(dtype)
        leaves.append(x.t() if transposed and x.dim() == 2 else x)
    idx, others = _staging.tensors_in(leaves)
    assert idx == list(range(int(other_leaf), len(leaves))) and others == []
    groups, total = _staging.plan(leaves, idx, alignment, exact=exact)

    def check(groups: list, total: int) -> None:
        assert sorted(i for g in groups for i in g.where) == idx
        for g in groups:
            assert len(g.members) == len(g.where)
            assert all(leaves[i] is x for i, x in zip(g.where, g.members))
            if g.span is not None:  # read assigns the slice: it must be where
                assert list(range(len(leaves))[g.span]) == g.where
        end = 0
        for g in groups:
            assert g.where == sorted(g.where) and g.offset % alignment == 0 and g.offset >= end
            end = g.offset + g.nbytes
            if g.span is not None and g.span.step not in (None, 1):  # a period: seen twice
                assert 2 * g.span.step <= len(idx)
        assert end == total

    def differ(g: Any) -> bool:  # a flat group holds shapes that differ, by design
        if g.shapes is not None:
            assert g.exact and g.rest == () and g.shapes == [x.shape for x in g.members]
            return False
        return len({(x.dim(), tuple(x.shape[1:])) for x in g.members}) > 1

    check(groups, total)
    assert all(g.exact or not exact for g in groups)
    assert all(not g.exact for g in groups if differ(g))
    buf = torch.empty(total, dtype=torch.uint8)
    k = _staging.write(groups, buf)
    while k < len(groups):  # stopped at a group of tensors that differ
        assert differ(groups[k]) and not any(map(differ, groups[:k]))
        placed = [(g.offset, g.nbytes) for g in groups[:k]]
        groups, total = _staging.refine(groups, k, alignment)
        check(groups, total)
        assert [(g.offset, g.nbytes) for g in groups[:k]] == placed  # written stay put
        if total > buf.numel():
            grown = torch.empty(total, dtype=torch.uint8)
            grown[: buf.numel()] = buf
            buf = grown
        k = _staging.write(groups, buf, k)
    assert all(g.exact and not differ(g) for g in groups)
    out = list(leaves)
    _staging.read(groups, buf, out)
    if other_leaf:
        assert out[0] == "not a tensor"
    for a, b in zip(leaves[int(other_leaf) :], out[int(other_leaf) :]):
        assert a.dtype == b.dtype and a.shape == b.shape and torch.equal(a, b) and b._base is None


class HeldStream:
    """A copy engine held back: each queued copy reads its source only when
    ``run()`` lets it, as a DMA engine reads pinned memory after the host has
    gone on. A staging buffer refilled too early shows in the values."""

    def __init__(self, pool: PinnedPool) -> None:
        self.pool = pool
        self.queued: list = []
        self.runs = 0

    def transfer(self, flat: Any, device: Any, non_blocking: bool) -> Any:
        # what a real copy holds of its source is its address, not a tensor: the
        # pool's own tensor is used to read it, so the buffer's holders stay as
        # they would be with a copy in flight on a device
        buf = self.pool.buffer_of(flat)
        assert buf is not None
        start, dest = flat.storage_offset(), torch.empty_like(flat)
        self.queued.append((buf.data, start, flat.nbytes, dest))
        return dest

    def fence(self, device: Any, non_blocking: bool) -> Any:
        stream, runs = self, self.runs

        class Event:  # passes once the stream has run after it was recorded
            def query(self) -> bool:
                return stream.runs > runs

        return Event()

    def run(self) -> None:
        for data, start, nbytes, dest in self.queued:
            dest.copy_(data[start : start + nbytes])
        self.queued.clear()
        self.runs += 1


def test_a_staging_buffer_is_not_refilled_while_a_copy_from_it_may_run(monkeypatch):
    pool = plain_pool()
    stream = HeldStream(pool)
    monkeypatch.setattr(_staging, "_copy", stream.transfer)
    monkeypatch.setattr(_pool, "fence", stream.fence)

    big = _staging.STAGE_LIMIT // 4 + 1  # over the limit: a copy of its own, same buffer

    def batch(value: float) -> dict:
        return {
            "x": [torch.full((64,), value) for _ in range(100)],
            "big": [torch.full((big,), value), torch.full((big // 2 + 1,), value).double()],
        }

    def check(out: dict, v: float) -> bool:
        return all(bool((t == v).all()) for t in out["x"] + out["big"])

    for epoch in range(3):
        outs = [
            to_device(batch(v), "meta", coalesce=True, non_blocking=True, pool=pool)
            for v in (1, 2, 3)
        ]
        # three batches' copies in flight: three buffers, none refilled before its copies ran
        assert pool.allocations == 3 and len(stream.queued) == 9
        stream.run()
        for v, out in zip((1, 2, 3), outs):
            assert check(out, v), (epoch, v)
    # copies done: the buffers are reused, with no new allocation
    for v in range(5):
        out = to_device(batch(v), "meta", coalesce=True, non_blocking=True, pool=pool)
        stream.run()
        assert check(out, v)
    assert pool.allocations == 3


def test_a_buffer_whose_copy_was_queued_before_an_error_waits_for_it(monkeypatch):
    pool = plain_pool()
    stream = HeldStream(pool)
    monkeypatch.setattr(_staging, "_copy", stream.transfer)
    monkeypatch.setattr(_pool, "fence", stream.fence)
    streamed = _staging._streamed

    def fails(*args: Any) -> None:
        raise RuntimeError("a large tensor could not be packed")

    batch = {"x": [torch.ones(64) for _ in range(10)]}
    monkeypatch.setattr(_staging, "_streamed", fails)
    with pytest.raises(RuntimeError, match="could not be packed"):
        to_device(batch, "meta", coalesce=True, non_blocking=True, pool=pool)
    monkeypatch.setattr(_staging, "_streamed", streamed)
    assert len(stream.queued) == 1  # the small tensors' copy was queued
    to_device(batch, "meta", coalesce=True, non_blocking=True, pool=pool)
    assert pool.allocations == 2  # the first buffer waits for its copy
    stream.run()
    to_device(batch, "meta", coalesce=True, non_blocking=True, pool=pool)
    assert pool.allocations == 2


def test_a_pinned_pool_buffer_is_not_refilled_while_its_copy_may_run(monkeypatch):
    """pin_memory(coalesce=True) then to_device(non_blocking=True): the batch may
    be dropped at once, but its buffer waits for the copy."""
    pool = plain_pool()
    stream = HeldStream(pool)
    monkeypatch.setattr(_pool, "fence", stream.fence)
    leaves, spec = pk.flatten({"x": [torch.full((64,), 1.0) for _ in range(100)]})
    packed = spec.unflatten(pack(pool, leaves))
    to_device(packed, "meta", non_blocking=True, pool=pool)
    del packed
    gc.collect()
    pack(pool, leaves)
    assert pool.allocations == 2  # the first buffer's copy has not run
    stream.run()
    pack(pool, leaves)
    assert pool.allocations == 2


@pytest.mark.parametrize("given_flat", [False, True])
def test_move_storage_moves_the_whole_storage_when_a_tensor_reaches_past_the_bytes_given(
    given_flat,
):
    """Also with the storage's bytes given (``flat``, as a pool buffer's are)
    and tensors of two dtypes in it: each moved tensor has its own dtype,
    shape, offset and values, and no base."""
    base = torch.arange(32, dtype=torch.float32)
    as_int = base.view(torch.int32)
    leaves = [base[:4], as_int[4:8], base.as_strided((6,), (1,), 26)]  # the last ends at 32
    out = [None] * 3
    moves = []

    def move(t):
        moves.append(t.nbytes)
        return t.clone()

    flat = base.view(torch.uint8) if given_flat else None
    move_storage(leaves, [0, 1, 2], move, out, nbytes=8 * 4, flat=flat)
    assert moves == [32, 128]  # the first try, then the whole storage
    for a, b in zip(leaves, out):
        assert a.dtype == b.dtype and a.storage_offset() == b.storage_offset()
        assert torch.equal(a, b) and b.untyped_storage().data_ptr() != base.data_ptr()
        assert b._base is None
    out = [None] * 2
    move_storage(leaves, [0, 1], move, out, nbytes=8 * 4, flat=flat)  # all within the bytes
    assert moves[2:] == [32] and all(torch.equal(a, b) for a, b in zip(leaves, out))


# -- PinnedLoader ------------------------------------------------------------------------


@pytest.mark.timeout(120)
def test_pinned_loader_pins_off_the_main_thread_in_order(monkeypatch):
    threads = []

    def fake_pin(batch, **kw):
        threads.append(threading.current_thread())
        return ("pinned", batch)

    monkeypatch.setattr(_loader, "pin_memory", fake_pin)
    loader = torch.utils.data.DataLoader(
        Dataset("dataclass"), batch_size=2, collate_fn=collate, num_workers=2, **_spawn(2)
    )
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        out = list(PinnedLoader(loader, coalesce=True))
    assert len(out) == 4 and all(tag == "pinned" for tag, _ in out)
    assert [b.name for _, b in out] == [
        ["img0", "img1"],
        ["img2", "img3"],
        ["img4", "img5"],
        ["img6", "img7"],
    ]
    assert threads and all(t is not threading.main_thread() for t in threads)
    assert len(PinnedLoader(loader)) == 4


@pytest.mark.timeout(60)
def test_pinned_loader_raises_loader_errors_in_the_consumer_and_stops_early():
    def broken():
        yield make_sample(0)
        raise KeyError("bad sample")

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        it = iter(PinnedLoader(broken()))
        assert next(it).name == "img0"
        with pytest.raises(KeyError, match="bad sample"):
            next(it)
        endless = iter(PinnedLoader(make_sample(i) for i in range(10**9)))
        assert next(endless).name == "img0"
        endless.close()  # stops the thread: no hang


# -- GPU (skipped without CUDA) ---------------------------------------------------------------


@needs_cuda
def test_gpu_every_tensor_is_pinned_both_ways():
    batch = {"s": make_sample(0), "b": Boxes(torch.ones(3))}
    for coalesce in (False, True):
        out = pin_memory(batch, coalesce=coalesce)
        assert all(t.is_pinned() for t in pk.leaves(out) if isinstance(t, torch.Tensor))
        moved = to_device(out, "cuda", non_blocking=True)
        torch.cuda.synchronize()
        assert all(t.is_cuda for t in pk.leaves(moved) if isinstance(t, torch.Tensor))
        torch.testing.assert_close(moved["s"].image.cpu(), batch["s"].image)


@needs_cuda
@pytest.mark.timeout(120)
def test_gpu_pinned_loader_delivers_pinned_dataclass_batches():
    loader = torch.utils.data.DataLoader(
        Dataset("dataclass"), batch_size=4, collate_fn=collate, num_workers=2, **_spawn(2)
    )
    for batch in PinnedLoader(loader, coalesce=True):
        assert type(batch) is Sample
        assert all(t.is_pinned() for t in pk.leaves(batch) if isinstance(t, torch.Tensor))


@needs_cuda
def test_gpu_staged_buffer_is_not_refilled_while_a_held_back_copy_runs():
    pool = PinnedPool()
    for _ in range(3):
        torch.cuda._sleep(200_000_000)  # hold the stream back (~0.1 s)
        outs = [
            to_device(
                {
                    "x": [torch.full((64,), float(v)) for _ in range(1000)],
                    # over STAGE_LIMIT: each its own copy, from the same buffer
                    "big": [torch.full((_staging.STAGE_LIMIT // 4 + 1,), float(v))] * 2,
                },
                "cuda",
                non_blocking=True,
                coalesce=True,
                pool=pool,
            )
            for v in range(3)
        ]
        torch.cuda.synchronize()
        for v, out in enumerate(outs):
            assert all(bool((t == v).all()) for t in out["x"] + out["big"])
            assert out["big"][0].data_ptr() != out["big"][1].data_ptr()
    assert pool.allocations == 3


@needs_cuda
def test_gpu_staged_tensors_keep_a_backward_after_an_in_place_change_to_another():
    emb = torch.nn.Embedding(50, 4).cuda()
    for _ in range(3):
        batch = {"input_ids": torch.randint(0, 50, (2, 6)), "labels": torch.randint(0, 50, (2, 6))}
        out = to_device(batch, "cuda", coalesce=True, non_blocking=True)
        loss = emb(out["input_ids"]).sum()
        out["labels"].masked_fill_(out["labels"] == 0, -100)
        loss.backward()
        assert torch.equal(out["input_ids"].cpu(), batch["input_ids"])


@needs_cuda
def test_gpu_a_blocking_move_of_a_few_tensors_has_finished_when_it_returns():
    """A blocking ``to_device`` of a few tensors queues their copies and waits
    once, for the last: when it returns, every copy has finished, as with a
    blocking ``.to`` each. Its control: the same batch moved with
    ``non_blocking=True`` is still queued behind the held-back stream, so the
    check can see a call that does not wait."""
    stream = torch.cuda.current_stream()
    for k in range(3):  # fresh batches; an empty tensor last and a CUDA one among them
        batch = {
            "input_ids": torch.randint(0, 1000, (32, 512)) + k,
            "mask": torch.ones(32, 512, dtype=torch.int64),
            "on_gpu": torch.full((3,), float(k), device="cuda"),
            "label": torch.tensor(k),
            "none": torch.zeros(0, 4),
        }
        kept = {key: t.clone() for key, t in batch.items()}
        # from pinned memory a queued copy returns at once, from ordinary
        # memory once the stream has reached it: both ways, blocking
        pinned = {key: t.pin_memory() if t.is_cpu else t for key, t in batch.items()}
        torch.cuda._sleep(100_000_000)  # hold the stream back
        to_device(pinned, "cuda", non_blocking=True)
        assert not stream.query()  # the control: queued, not finished
        torch.cuda.synchronize()
        for source in (pinned, batch):
            torch.cuda._sleep(100_000_000)
            out = to_device(source, "cuda")
            assert stream.query()  # every copy has finished
            source["input_ids"].add_(1)  # the caller's tensors are the caller's
            for key, t in out.items():
                assert t.is_cuda and t._base is None
                torch.testing.assert_close(t.cpu(), kept[key].cpu())
            assert out["on_gpu"] is batch["on_gpu"]


@needs_cuda
def test_gpu_a_batch_a_pinned_loader_packed_moves_without_a_second_packing(monkeypatch):
    staged: list = []
    real_stage = _staging.stage

    def stage(*args: Any, **kwargs: Any) -> Any:
        staged.append(len(args[1]))
        return real_stage(*args, **kwargs)

    monkeypatch.setattr(_staging, "stage", stage)
    batches = [
        {"x": [torch.full((64,), float(k * 100 + i)) for i in range(40)], "k": k} for k in range(4)
    ]
    for non_blocking in (True, False):
        # (all pinned first: the pinning thread stages them too)
        for k, batch in enumerate(list(PinnedLoader(batches))):
            assert all(t.is_pinned() for t in batch["x"])
            staged.clear()
            out = to_device(batch, "cuda", non_blocking=non_blocking)
            assert staged == []  # moved as it lies: no second packing
            if non_blocking:
                torch.cuda.synchronize()
            for i, t in enumerate(out["x"]):
                assert t.is_cuda and t._base is None and float(t[0]) == k * 100 + i
        assert to_device(batches[0], "cuda")["x"][1].is_cuda  # unpinned: staged
        assert staged == [40]
