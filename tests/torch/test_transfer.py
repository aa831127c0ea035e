"""``to_device`` and ``pin_memory`` by default (``coalesce=None``): which way
each batch goes, and that every way gives every tensor back, its own, and
leaves none behind. (The ways themselves, forced, are tested in
tests/torch/test_loading.py; pytree_kit/torch/_transfer.py holds the rule.)"""

from __future__ import annotations

import dataclasses
import random
import threading
import warnings
from typing import Any, NamedTuple

import pytest

torch = pytest.importorskip("torch")

import pytree_kit as pk  # noqa: E402
from pytree_kit.torch import (  # noqa: E402
    PinnedLoader,
    PinnedPool,
    _loader,
    _pool,
    _staging,
    _transfer,
    pin_memory,
    to_device,
)
from pytree_kit.torch._transfer import (  # noqa: E402
    COALESCE_MIN,
    NO_DMA_COALESCE_MIN,
    NO_DMA_STAGE_LIMIT,
    RETRY_AFTER,
    STAGE_LIMIT,
)


@pytest.fixture(autouse=True)
def no_refusals_remembered():
    """Each test starts with no structure remembered as refused by staging."""
    _transfer._refused.clear()
    yield
    _transfer._refused.clear()


@dataclasses.dataclass
class Target:
    boxes: Any
    labels: Any


class Pair(NamedTuple):
    left: Any
    right: Any


def plain_pool() -> PinnedPool:
    return PinnedPool(allocator=lambda n, dtype: torch.empty(n, dtype=dtype))


def tensors(tree: Any) -> list:
    return [x for x in pk.leaves(tree) if isinstance(x, torch.Tensor)]


class Calls:
    """Counts the staging buffer's copies (made on the CPU, so values can be
    read back) and the tensors moved with a ``.to`` of their own (with
    ``own_on_cpu``, those to ``meta`` are made on the CPU too)."""

    def __init__(self, monkeypatch: Any, own_on_cpu: bool = False) -> None:
        self.staged: list[int] = []
        self.own = 0
        real_to = torch.Tensor.to

        def copy(flat: Any, device: Any, non_blocking: bool) -> Any:
            self.staged.append(flat.nbytes)
            return flat.clone()

        def to(x: Any, *args: Any, **kwargs: Any) -> Any:
            self.own += 1
            if own_on_cpu and args and str(args[0]) == "meta":
                return x.clone()
            return real_to(x, *args, **kwargs)

        monkeypatch.setattr(_staging, "_copy", copy)
        monkeypatch.setattr(torch.Tensor, "to", to)


def small(n: int, seed: int = 0) -> dict:
    return {f"t{i}": torch.arange(3) + seed + i for i in range(n)}


@pytest.mark.parametrize("dma", [False, True])
def test_the_default_moves_a_few_tensors_each_and_many_with_one_copy(monkeypatch, dma):
    calls = Calls(monkeypatch)
    least = NO_DMA_COALESCE_MIN  # the meta device has no DMA engine
    if dma:  # as it would go to CUDA: the staging and its copies as they would run there
        monkeypatch.setattr(_transfer, "DMA_DEVICES", frozenset({"meta"}))
        least = COALESCE_MIN
    pool = plain_pool()
    to_device(small(least - 1), "meta", pool=pool)
    assert calls.staged == [] and calls.own == least - 1
    calls.own = 0
    out = to_device(small(least, seed=5), "meta", pool=pool)
    assert len(calls.staged) == 1 and calls.own == 0
    assert all(torch.equal(out[f"t{i}"], torch.arange(3) + 5 + i) for i in range(least))
    # forced either way, whatever the count
    calls.staged.clear()
    to_device(small(2), "meta", pool=pool, coalesce=True)
    assert len(calls.staged) == 1
    calls.own = 0
    to_device(small(least), "meta", pool=pool, coalesce=False)
    assert len(calls.staged) == 1 and calls.own == least


@pytest.mark.parametrize("non_blocking", [False, True])
def test_the_default_streams_a_large_tensor_to_a_dma_device_and_a_blocking_call_waits(
    monkeypatch, non_blocking
):
    """A DMA engine reads pinned memory 2.6 times as fast as ordinary memory,
    so a tensor over STAGE_LIMIT goes through the pinned buffer with a copy of
    its own, the small ones with it, blocking or not; a blocking call then
    waits for those copies, as a blocking ``.to`` would. Elsewhere (meta):
    a ``.to`` each."""
    calls = Calls(monkeypatch)
    waits: list = []
    monkeypatch.setattr(_pool, "wait", lambda device: waits.append(device))
    pool = plain_pool()
    big = torch.zeros(STAGE_LIMIT // 4 + 1)
    batch = {"big": big, "a": torch.ones(2), "b": torch.ones(3)}
    leaves = pk.leaves(batch)
    idx, _ = _staging.tensors_in(leaves)
    assert _transfer.choose(leaves, idx)
    assert not _transfer.choose(leaves, idx, dma=False)
    assert not _transfer.choose([torch.ones(2), torch.ones(3)], [0, 1])  # a few, small
    # the meta device has no DMA engine: nothing to gain from pinned memory
    to_device(batch, "meta", pool=pool, non_blocking=non_blocking)
    assert calls.staged == [] and calls.own == 3 and waits == []
    # to CUDA it would be: the staging and its copies as they would run there
    # (the copies made on the CPU), the big one streamed with a copy of its own
    monkeypatch.setattr(_transfer, "DMA_DEVICES", frozenset({"meta"}))
    calls.own = 0
    out = to_device(batch, "meta", pool=pool, non_blocking=non_blocking)
    assert len(calls.staged) == 2 and calls.own == 0
    assert torch.equal(out["big"], big) and torch.equal(out["b"], torch.ones(3))
    assert waits == ([] if non_blocking else [torch.device("meta")])
    # a batch of a few small tensors: a .to each, and nothing to wait for
    calls.staged.clear()
    to_device({"a": torch.ones(2)}, "meta", pool=pool, non_blocking=non_blocking)
    assert calls.staged == [] and calls.own == 1
    assert len(waits) == (0 if non_blocking else 1)


def test_to_a_device_without_dma_only_tensors_up_to_its_limit_are_packed(monkeypatch):
    calls = Calls(monkeypatch)
    over = NO_DMA_STAGE_LIMIT // 8 + 1  # int64 elements: just over the limit
    batch = {
        "images": [torch.full((over,), i) for i in range(3)],
        "labels": [torch.tensor([i, i + 1]) for i in range(NO_DMA_COALESCE_MIN)],
    }
    out = to_device(batch, "meta", pool=plain_pool())
    assert len(calls.staged) == 1 and calls.own == 3  # the labels in one copy
    assert calls.staged[0] < NO_DMA_STAGE_LIMIT
    assert [int(t[0]) for t in out["labels"]] == list(range(NO_DMA_COALESCE_MIN))
    # the same to a DMA device: all in the one buffer
    monkeypatch.setattr(_transfer, "DMA_DEVICES", frozenset({"meta"}))
    calls.staged.clear()
    calls.own = 0
    out = to_device(batch, "meta", pool=plain_pool())
    assert len(calls.staged) == 1 and calls.own == 0
    assert all(torch.equal(out["images"][i], batch["images"][i]) for i in range(3))


def test_pin_memory_by_default_packs_many_tensors_and_pins_a_few_each(monkeypatch):
    monkeypatch.setattr(_pool, "pinning_available", lambda: True)
    pinned_each = []

    def pin(x: Any) -> Any:
        pinned_each.append(x.numel())
        return x.clone()

    monkeypatch.setattr(torch.Tensor, "pin_memory", pin)
    pool = plain_pool()
    few = pin_memory(small(COALESCE_MIN - 1), pool=pool)
    assert len(pinned_each) == COALESCE_MIN - 1 and pool.allocations == 0
    many = pin_memory(small(COALESCE_MIN, seed=3), pool=pool)
    assert len(pinned_each) == COALESCE_MIN - 1 and pool.allocations == 1
    assert all(pool.buffer_of(t) is not None for t in many.values())
    assert all(pool.buffer_of(t) is None for t in few.values())
    assert all(torch.equal(many[f"t{i}"], torch.arange(3) + 3 + i) for i in range(COALESCE_MIN))


def test_pinned_loader_uses_the_default_rule(monkeypatch):
    monkeypatch.setattr(_pool, "pinning_available", lambda: True)
    monkeypatch.setattr(torch.Tensor, "pin_memory", lambda x: x.clone())
    pool = plain_pool()
    batches = [small(COALESCE_MIN, seed=s) for s in range(3)] + [small(2, seed=9)]
    out = list(PinnedLoader(batches, pool=pool))
    assert [pool.buffer_of(b["t0"]) is not None for b in out] == [True, True, True, False]
    assert all(torch.equal(b["t1"], batches[k]["t1"]) for k, b in enumerate(out))


@pytest.mark.parametrize("non_blocking", [False, True])
def test_a_batch_packed_in_pinned_memory_already_moves_as_it_lies(monkeypatch, non_blocking):
    """What a PinnedLoader hands over (a pool buffer, pinned) goes to a DMA
    device with one copy of the part its batch uses: packing it again would
    copy every byte once more on the host. A batch of tensors of their own,
    or one in memory that is not pinned, is staged as before."""
    monkeypatch.setattr(_pool, "pinning_available", lambda: True)
    monkeypatch.setattr(torch.Tensor, "pin_memory", lambda x: x.clone())
    monkeypatch.setattr(_transfer, "DMA_DEVICES", frozenset({"meta"}))
    pool = plain_pool()
    pinned_storages: set = set()
    real_is_pinned = torch.Tensor.is_pinned
    monkeypatch.setattr(
        torch.Tensor,
        "is_pinned",
        lambda x: x.untyped_storage().data_ptr() in pinned_storages or real_is_pinned(x),
    )
    calls = Calls(monkeypatch, own_on_cpu=True)
    for k in range(3):  # fresh batches: each packed, then moved
        batch = {"x": [torch.arange(4) + k * 100 + i for i in range(COALESCE_MIN)], "n": k}
        packed = pin_memory(batch, pool=pool)
        buf = pool.buffer_of(packed["x"][0])
        assert buf is not None
        pinned_storages.add(buf.data.data_ptr())
        calls.staged.clear()
        calls.own = 0
        out = to_device(packed, "meta", pool=pool, non_blocking=non_blocking)
        assert calls.staged == [] and calls.own == 1  # the buffer's used part, one copy
        assert out["n"] == k
        for i, t in enumerate(out["x"]):
            assert torch.equal(t, torch.arange(4) + k * 100 + i) and t._base is None
            assert t.untyped_storage().data_ptr() != buf.data.data_ptr()
        # the same batch in memory that is not pinned: staged, as any batch
        pinned_storages.clear()
        calls.own = 0
        out = to_device(packed, "meta", pool=pool, non_blocking=non_blocking)
        assert len(calls.staged) == 1 and calls.own == 0
        assert all(torch.equal(t, torch.arange(4) + k * 100 + i) for i, t in enumerate(out["x"]))
        # forced: coalesce=True stages it still
        pinned_storages.add(buf.data.data_ptr())
        calls.staged.clear()
        to_device(packed, "meta", pool=pool, coalesce=True)
        assert len(calls.staged) == 1
        pinned_storages.clear()


@pytest.mark.parametrize("coalesce", [None, True])
@pytest.mark.parametrize("non_blocking", [False, True])
def test_a_large_tensor_pinned_already_moves_as_it_lies(monkeypatch, coalesce, non_blocking):
    """torch's loader pins a batch's stacked images; packing them again on the
    way to the device would copy every byte once more on the host. A tensor
    over PINNED_OWN that is pinned goes with a copy of its own, the small
    ones packed; the same tensor not pinned is packed with them."""
    monkeypatch.setattr(_transfer, "DMA_DEVICES", frozenset({"meta"}))
    calls = Calls(monkeypatch, own_on_cpu=True)
    pinned: set = set()
    monkeypatch.setattr(torch.Tensor, "is_pinned", lambda x: x.data_ptr() in pinned)
    pool = plain_pool()
    n = _staging.PINNED_OWN // 8 + 1  # int64 elements: just over
    for k in range(3):
        images = torch.arange(n) + k
        just_under = torch.arange(_staging.PINNED_OWN // 8) - k  # pinned too, but small
        batch = {
            "images": images,
            "under": just_under,
            "targets": [Target(torch.rand(i + 1, 4), torch.arange(i + 1) + k) for i in range(16)],
        }
        pinned.update((images.data_ptr(), just_under.data_ptr()))
        calls.staged.clear()
        calls.own = 0
        out = to_device(batch, "meta", pool=pool, non_blocking=non_blocking, coalesce=coalesce)
        assert calls.own == 1 and len(calls.staged) == 1  # the images, and the rest packed
        assert just_under.nbytes < calls.staged[0] < images.nbytes + just_under.nbytes
        assert torch.equal(out["images"], images) and out["images"] is not images
        assert torch.equal(out["under"], just_under)
        for t, u in zip(out["targets"], batch["targets"]):
            assert torch.equal(t.boxes, u.boxes) and torch.equal(t.labels, u.labels)
        pinned.clear()  # not pinned: packed with the rest
        calls.staged.clear()
        calls.own = 0
        out = to_device(batch, "meta", pool=pool, non_blocking=non_blocking, coalesce=coalesce)
        assert calls.own == 0 and len(calls.staged) == 1 and calls.staged[0] > images.nbytes
        assert torch.equal(out["images"], images)


def test_pinned_loader_pins_on_one_thread_as_torchs_loader_does(monkeypatch):
    """A copy into pinned memory runs on the pinning thread alone: a parallel
    copy's threads spin on after it and take the cores that the workers and
    the consumer need (torch's own pinning thread sets one thread too)."""
    monkeypatch.setattr(_pool, "pinning_available", lambda: True)
    monkeypatch.setattr(torch.Tensor, "pin_memory", lambda x: x.clone())
    seen = []
    real = _loader.pin_memory

    def pin(batch: Any, **kw: Any) -> Any:
        seen.append(torch.get_num_threads())
        return real(batch, **kw)

    monkeypatch.setattr(_loader, "pin_memory", pin)
    main_threads = torch.get_num_threads()
    batches = [small(3, seed=s) for s in range(4)]
    loader = PinnedLoader(batches, pool=plain_pool())
    for _ in range(2):  # two epochs: a new thread each
        seen.clear()
        out = list(loader)
        assert seen == [1, 1, 1, 1]
        assert torch.get_num_threads() == main_threads  # the consumer's own is left alone
        assert [int(b["t0"][0]) for b in out] == [0, 1, 2, 3]
        for b in out:
            b["t0"].add_(100)  # the caller's copies are the caller's
    assert all(torch.equal(b["t0"], torch.arange(3) + s) for s, b in enumerate(batches))


def test_pinned_loader_pins_for_the_consumers_device_and_starts_no_accelerator(monkeypatch):
    """The thread takes the consumer's current device (cuda:1, say), as
    torch's pinning thread does; where the accelerator has not been started
    in this process, it is not asked (asking would start it before the
    loader forks its workers) and the thread keeps the default device."""
    monkeypatch.setattr(_pool, "pinning_available", lambda: True)
    monkeypatch.setattr(torch.Tensor, "pin_memory", lambda x: x.clone())
    accelerator = torch.accelerator
    asked: list = []
    monkeypatch.setattr(accelerator, "is_available", lambda: True)
    monkeypatch.setattr(accelerator, "current_accelerator", lambda *a: torch.device("cuda"))
    monkeypatch.setattr(accelerator, "current_device_index", lambda: asked.append(1) or 1)
    set_in: list = []
    monkeypatch.setattr(
        _loader, "_set_device_index", lambda i: set_in.append((i, threading.current_thread()))
    )
    batches = [small(3, seed=s) for s in range(3)]
    for started in (False, True):
        monkeypatch.setattr(torch.cuda, "is_initialized", lambda s=started: s)
        asked.clear()
        set_in.clear()
        out = list(PinnedLoader(batches, pool=plain_pool()))
        assert [int(b["t1"][0]) for b in out] == [1, 2, 3]
        if started:
            assert asked == [1] and [i for i, _ in set_in] == [1]
            assert set_in[0][1] is not threading.main_thread()
        else:
            assert asked == [] and set_in == []


DTYPES = [torch.float32, torch.float16, torch.int64, torch.int32, torch.bool, torch.uint8]


def mixed(seed: int) -> Any:
    """A fresh batch of one of the shapes the benchmark covers: mixed dtypes
    and shapes, 0-d tensors, views of one storage, empty tensors, a bare
    tensor, a dataclass and a namedtuple; sometimes fewer tensors than
    COALESCE_MIN, sometimes more."""
    rnd = random.Random(seed)
    g = torch.Generator().manual_seed(seed)
    n = rnd.choice([1, 3, COALESCE_MIN - 1, COALESCE_MIN, NO_DMA_COALESCE_MIN, 60])

    def tensor() -> Any:
        shape = [rnd.randint(0, 4) for _ in range(rnd.randint(0, 3))]
        x = (torch.randn(shape, generator=g) * 50).to(rnd.choice(DTYPES))
        if rnd.random() < 0.2 and x.dim() == 2:
            x = x.t()
        return x

    kind = seed % 5
    if kind == 0:
        return torch.randn(rnd.randint(1, 5), 3, generator=g)  # a bare tensor
    if kind == 1:
        base = torch.randn(2 * n + 2, 3, generator=g)
        return [base[2 * i : 2 * i + 2] for i in range(n)]  # views of one storage
    if kind == 2:
        return {f"m{i}": torch.tensor(float(i + seed)) for i in range(n)}  # 0-d
    if kind == 3:
        return [torch.zeros(0, 3) if i % 2 else torch.ones(i, 3) for i in range(n)]  # empty
    return {
        "mixed": [tensor() for _ in range(n)],
        "targets": [Target(tensor(), f"s{i}") for i in range(rnd.randint(0, 4))],
        "pair": Pair(tensor(), seed),
        "big": torch.full((NO_DMA_STAGE_LIMIT // 4 + 1,), float(seed)),
    }


@pytest.mark.parametrize("dma", [False, True])
def test_the_default_over_many_fresh_batches_leaves_nothing_behind(monkeypatch, dma):
    """Every tensor comes back equal, moved (not the caller's, nor sharing its
    memory), its own (no base: its own version counter), and the caller's
    batch is untouched; batches kept alive keep their values while the pool
    reuses buffers for later ones."""
    Calls(monkeypatch)
    if dma:
        monkeypatch.setattr(_transfer, "DMA_DEVICES", frozenset({"meta"}))
    pool = plain_pool()
    kept = []
    for seed in range(60):
        batch = mixed(seed)
        before = [t.clone() for t in tensors(batch)]
        out = to_device(batch, "meta", pool=pool, non_blocking=seed % 3 == 0)
        assert pk.structure(out) == pk.structure(batch)
        ins = tensors(batch)
        memory = {t.untyped_storage().data_ptr() for t in ins if t.numel()}
        for x, y in zip(ins, tensors(out)):
            assert y is not x and y._base is None
            if y.device.type == "cpu" and y.numel():  # staged: cut from the copy
                assert y.untyped_storage().data_ptr() not in memory
        assert all(torch.equal(a, b) for a, b in zip(before, ins))  # untouched
        kept.append((before, out))
    for before, out in kept:
        for a, b in zip(before, tensors(out)):
            assert a.dtype == b.dtype and a.shape == b.shape
            if b.device.type == "cpu":
                assert torch.equal(a, b)
    # an in-place change to one moved tensor shows in no other
    out = to_device(small(NO_DMA_COALESCE_MIN), "meta", pool=pool, coalesce=True)
    versions = [t._version for t in out.values()]
    out["t0"].add_(1)
    assert [t._version for t in out.values()][1:] == versions[1:]


@pytest.mark.parametrize("dma", [False, True])
def test_tensors_of_many_shapes_are_staged_only_where_a_copy_each_costs_more(monkeypatch, dma):
    """One dtype in a shape per tensor packs into a flat group: each tensor
    flattened on the way in and reshaped on the way out, a torch call or two
    a tensor. To a DMA device that still beats a copy each; elsewhere not."""
    calls = Calls(monkeypatch)
    if dma:
        monkeypatch.setattr(_transfer, "DMA_DEVICES", frozenset({"meta"}))
    batch = [torch.ones(1, i + 1, dtype=torch.int64) * i for i in range(NO_DMA_COALESCE_MIN + 2)]
    out = to_device(batch, "meta", pool=plain_pool())
    if dma:  # staged: cut from the copy, made on the CPU here
        assert len(calls.staged) == 1 and calls.own == 0
        assert all(torch.equal(a, b) for a, b in zip(batch, out))
    else:
        assert calls.staged == [] and calls.own == len(batch)
        assert all(b.device.type == "meta" and b.shape == a.shape for a, b in zip(batch, out))
    assert all(t._base is None for t in out)


def test_a_structure_staging_refused_moves_by_tensor_until_it_is_tried_again(monkeypatch):
    """Without a DMA engine, one dtype in a shape per tensor is not staged.
    The plan that finds out costs about a microsecond a tensor, so batches of
    that structure then move by tensor unasked, for ``RETRY_AFTER`` batches;
    then staging is asked again, and packs a batch it can."""
    calls = Calls(monkeypatch)
    asked = []
    real_stage = _staging.stage

    def stage(*args: Any, **kwargs: Any) -> Any:
        asked.append(1)
        return real_stage(*args, **kwargs)

    monkeypatch.setattr(_staging, "stage", stage)
    n = NO_DMA_COALESCE_MIN + 2

    def ragged(seed: int) -> list:  # a shape per tensor: a flat group
        return [torch.full((1, i + 1), seed + i) for i in range(n)]

    def even(seed: int) -> list:  # the same structure, one shape: stageable
        return [torch.full((1, n + 1), seed + i) for i in range(n)]

    pool = plain_pool()
    for k in range(RETRY_AFTER + 1):
        batch = ragged(k)
        out = to_device(batch, "meta", pool=pool)
        assert [t.shape for t in out] == [t.shape for t in batch]
        assert all(t.device.type == "meta" for t in out)
    assert len(asked) == 1 and calls.staged == [] and calls.own == n * (RETRY_AFTER + 1)
    # asked again now, with a batch it can pack: one copy, the values right
    batch = even(7)
    out = to_device(batch, "meta", pool=pool)
    assert len(asked) == 2 and len(calls.staged) == 1
    assert all(torch.equal(a, b) for a, b in zip(batch, out))
    # a refusal is remembered per structure and per kind of device
    monkeypatch.setattr(_transfer, "DMA_DEVICES", frozenset({"meta"}))
    to_device(ragged(0), "meta", pool=pool)
    assert len(asked) == 3 and len(calls.staged) == 2  # to a DMA device: a flat group


def test_without_dma_many_shapes_among_the_large_tensors_do_not_stop_the_small_ones(
    monkeypatch,
):
    """The large tensors are not packed, so their shapes do not make a flat
    group: the small ones are still staged."""
    calls = Calls(monkeypatch)
    over = NO_DMA_STAGE_LIMIT // 4 + 1  # float32 elements: just over the limit
    batch = {
        "large": [torch.full((1, over + i), float(i)) for i in range(3)],
        "small": [torch.tensor([i, i + 1]) for i in range(NO_DMA_COALESCE_MIN)],
    }
    leaves = pk.leaves(batch)
    with pytest.raises(_staging.NeedsFlat):
        _staging.plan(leaves, list(range(len(leaves))), exact=True, flat=False)
    out = to_device(batch, "meta", pool=plain_pool())
    assert len(calls.staged) == 1 and calls.own == 3
    assert [int(t[0]) for t in out["small"]] == list(range(NO_DMA_COALESCE_MIN))
    assert [t.shape for t in out["large"]] == [t.shape for t in batch["large"]]


def _layouts(seed: int) -> dict:
    """A tensor of each layout and kind that staging cannot pack, fresh."""
    g = torch.Generator().manual_seed(seed)
    dense = torch.rand(3, 4, generator=g)
    dense[dense < 0.5] = 0
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # "prototype", "beta": torch's own notices
        return {
            "sparse_coo": dense.to_sparse(),
            "sparse_csr": dense.to_sparse_csr(),
            "jagged": torch.nested.nested_tensor(
                [torch.rand(2, generator=g), torch.rand(3, generator=g)], layout=torch.jagged
            ),
            "nested": torch.nested.nested_tensor(
                [torch.rand(2, generator=g), torch.rand(3, generator=g)]
            ),
            "conj": torch.complex(dense, dense).conj(),
        }


def _same(a: Any, b: Any) -> bool:
    if a.is_nested:
        return all(torch.equal(x, y) for x, y in zip(a.unbind(), b.unbind()))
    if a.layout != torch.strided:
        return torch.equal(a.to_dense(), b.to_dense())
    return torch.equal(a.resolve_conj(), b.resolve_conj())


@pytest.mark.parametrize("kind", ["sparse_coo", "sparse_csr", "jagged", "nested", "conj"])
@pytest.mark.parametrize("many", [False, True])
@pytest.mark.parametrize("dma", [False, True])
def test_every_layout_moves_every_way_with_a_pool_in_use(monkeypatch, kind, many, dma):
    """A sparse, nested or conjugate tensor among plain ones: each moves with
    a ``.to`` of its own, its layout kept, whichever way the batch goes (a
    few tensors or many; blocking or not; by default or forced), to a
    device with a DMA engine or not, and with a pool that holds buffers in
    use (so the tensors' memory is looked up in it). Staging reads sizes and
    storages that these tensors do not have."""
    calls = Calls(monkeypatch, own_on_cpu=True)
    if dma:
        monkeypatch.setattr(_transfer, "DMA_DEVICES", frozenset({"meta"}))
    pool = plain_pool()
    held = pin_memory_into(pool, small(COALESCE_MIN))  # a buffer in use
    for seed in range(3):
        for non_blocking in (False, True):
            for coalesce in (None, True, False):
                odd = _layouts(seed)[kind]
                batch = {"odd": odd, "x": ragged(seed) if many else small(2, seed)}
                before = [t.clone() for t in tensors(batch)]
                out = to_device(
                    batch, "meta", pool=pool, non_blocking=non_blocking, coalesce=coalesce
                )
                assert out["odd"] is not odd and out["odd"].layout == odd.layout
                assert type(out["odd"]) is type(odd) and _same(odd, out["odd"])
                for a, b in zip(tensors(batch["x"]), tensors(out["x"])):
                    assert b is not a and torch.equal(a, b)
                assert all(_same(a, b) for a, b in zip(before, tensors(batch)))
    assert calls.own > 0 and held


def ragged(seed: int) -> dict:
    """Enough small tensors to be staged to any device, in shapes that make
    a flat group (which staging refuses without a DMA engine)."""
    return {f"t{i}": torch.full((1, i + 1), seed + i) for i in range(NO_DMA_COALESCE_MIN + 2)}


def pin_memory_into(pool: PinnedPool, batch: dict) -> list:
    """The tensors of ``batch`` packed into a buffer of ``pool``, kept alive."""
    leaves = pk.leaves(batch)
    out = list(leaves)
    _staging.stage(leaves, list(range(len(leaves))), out, pool)
    assert pool.buffer_of(out[0]) is not None
    return out


def test_a_blocking_move_of_a_few_tensors_to_cuda_queues_up_to_the_last_copy_that_waits(
    monkeypatch,
):
    """Which copies a blocking call of a few tensors to CUDA queues, seen on
    any machine (``.to`` stood in for, the copy made on the CPU): each CPU
    tensor before the last plain dense tensor with bytes is queued
    (``non_blocking=True``); that one blocks, which synchronizes the stream
    and so waits for those before it; every tensor after it (empty, sparse,
    jagged: a copy that may not synchronize) blocks too. With no such tensor,
    all block. (On a GPU: test_gpu_a_blocking_move_of_a_few_tensors_has_finished_when_it_returns.)"""
    calls: list = []
    real_to = torch.Tensor.to

    def to(x: Any, *args: Any, **kwargs: Any) -> Any:
        if not (args and str(args[0]) == "cuda"):  # torch's own calls (making a jagged tensor)
            return real_to(x, *args, **kwargs)
        calls.append((x.layout, kwargs.get("non_blocking", False)))
        return x.clone()

    monkeypatch.setattr(torch.Tensor, "to", to)
    for seed in range(3):
        odd = _layouts(seed)
        batch = {
            "a_ids": torch.arange(5) + seed,
            "b_coo": odd["sparse_coo"],
            "c_mask": torch.ones(7),
            "d_empty": torch.zeros(0),
            "e_jagged": odd["jagged"],
            "f_label": "text",
        }
        calls.clear()
        out = to_device(batch, "cuda")
        assert calls == [
            (torch.strided, True),  # queued
            (torch.sparse_coo, True),  # queued: the last copy waits for it
            (torch.strided, False),  # the last with bytes: it waits
            (torch.strided, False),  # empty, after it: a blocking call of its own
            (torch.jagged, False),
        ]
        assert out["f_label"] == "text" and torch.equal(out["a_ids"], batch["a_ids"])
        calls.clear()
        to_device({"coo": odd["sparse_coo"], "empty": torch.zeros(0)}, "cuda")
        assert calls == [(torch.sparse_coo, False), (torch.strided, False)]  # none waits: all block
