"""pytree_kit.torch.PackedList: round trips (hypothesis, on whichever engine
runs), indexing, columns, errors naming the sample and the path, pickling
through shared memory, real DataLoader workers (fork and spawn), files cut
short or damaged, and what a forked worker's reads cost in private memory."""

from __future__ import annotations

import collections
import copy
import dataclasses
import functools
import json
import math
import os
import pickle
import subprocess
import sys
import typing
import warnings
from multiprocessing.reduction import ForkingPickler
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

torch = pytest.importorskip("torch")
np = pytest.importorskip("numpy")

import pytree_kit as pk  # noqa: E402
from pytree_kit import _interface, _rows  # noqa: E402
from pytree_kit.testing import Leaf, trees  # noqa: E402
from pytree_kit.torch import Column, PackedList  # noqa: E402

TESTS = Path(__file__).resolve().parents[1]


def same(a: Any, b: Any, where: str = "tree") -> None:
    """``a`` is ``b`` rebuilt: the same types, the same dict order, equal values
    (NaN equal to NaN, -0.0 apart from 0.0), tensors equal in dtype and shape."""
    assert type(a) is type(b), f"{where}: {type(a).__name__} is not {type(b).__name__}"
    if isinstance(a, torch.Tensor):
        assert a.dtype == b.dtype and a.shape == b.shape, where
        assert torch.equal(a, b) or (a.is_floating_point() and torch.allclose(a, b, equal_nan=True))
    elif isinstance(a, (np.ndarray, np.generic)):
        assert a.dtype == b.dtype and a.shape == b.shape, where
        assert np.array_equal(a, b, equal_nan=a.dtype.kind in "fc"), where
    elif type(a) is float:
        assert repr(a) == repr(b) or (math.isnan(a) and math.isnan(b)), where
    elif isinstance(a, dict):
        assert list(a) == list(b), f"{where}: keys {list(a)} and {list(b)}"
        if isinstance(a, collections.defaultdict):
            assert a.default_factory is b.default_factory
        for k in a:
            same(a[k], b[k], f"{where}[{k!r}]")
    elif isinstance(a, (list, tuple, collections.deque)):
        assert len(a) == len(b), where
        if isinstance(a, collections.deque):
            assert a.maxlen == b.maxlen, where
        for k, (x, y) in enumerate(zip(a, b)):
            same(x, y, f"{where}[{k}]")
    elif dataclasses.is_dataclass(a):
        for f in dataclasses.fields(a):
            same(getattr(a, f.name), getattr(b, f.name), f"{where}.{f.name}")
    elif type(a) is Leaf:
        assert a.n == b.n, where
    else:
        assert a == b, f"{where}: {a!r} != {b!r}"


storable = st.one_of(
    st.integers(-(2**63), 2**63 - 1),
    st.floats(),
    st.booleans(),
    st.text(max_size=5),
    st.binary(max_size=4),
    st.lists(st.floats(), min_size=1, max_size=4),
    st.lists(st.integers(-(2**63), 2**63 - 1), min_size=1, max_size=4),
    st.builds(
        lambda n, d: torch.arange(n, dtype=torch.float64).to(d).reshape(-1, 1),
        st.integers(0, 4),
        st.sampled_from([torch.float32, torch.int64, torch.bool, torch.uint8, torch.bfloat16]),
    ),
    st.builds(lambda n: np.arange(n, dtype=np.int16), st.integers(0, 3)),
    st.builds(np.float32, st.floats(width=32)),
)


@settings(max_examples=60)
@given(st.lists(trees(storable, max_depth=3, max_width=3), max_size=6))
def test_samples_come_back_as_they_were(samples: list) -> None:
    before = copy.deepcopy(samples)
    packed = PackedList(samples)
    assert len(packed) == len(samples)
    for i, sample in enumerate(samples):
        same(packed[i], sample)
        same(packed[i - len(samples)], sample)
    for got, sample in zip(packed, samples):
        same(got, sample)
    for a, b in zip(samples, before):  # nothing packed is changed
        same(a, b)


@settings(max_examples=40)
@given(st.lists(trees(max_depth=3, max_width=3), max_size=5))
def test_any_leaf_with_the_pickle_fallback(samples: list) -> None:
    packed = PackedList(samples, fallback="pickle")
    for i, sample in enumerate(samples):
        same(packed[i], sample)
    opaque = sum(type(x) is Leaf for s in samples for x in pk.leaves(s))
    assert packed.pickled == opaque
    assert (f"{opaque} leaves pickled" in repr(packed)) == bool(opaque)


def coco(n: int) -> list:
    """Small COCO-like samples: a path, a size and 0 to 3 annotations."""
    out = []
    for i in range(n):
        anns = [
            {
                "bbox": [float(i), float(k), 10.0 + k, 20.5],
                "category_id": (i * 7 + k) % 80,
                "iscrowd": k == 2,
                "segmentation": [[0.5 * i, 1.0, 2.0, 3.5, 4.0 + k, 5.0][: 4 + 2 * ((i + k) % 2)]],
            }
            for k in range(i % 4)
        ]
        out.append({"file_name": f"{i:06d}.jpg", "height": 400 + i % 3, "annotations": anns})
    return out


def test_index_kinds() -> None:
    samples = coco(12)
    packed = PackedList(samples)
    for sel in (slice(2, 9, 3), slice(None, None, -1), [5, 0, 5], torch.tensor([3, 1])):
        picked = packed[sel]
        assert isinstance(picked, PackedList)
        want = samples[sel] if type(sel) is slice else [samples[int(i)] for i in sel]
        assert len(picked) == len(want)
        for got, w in zip(picked, want):
            same(got, w)
    mask = torch.tensor([i % 5 == 0 for i in range(12)])
    assert [x["file_name"] for x in packed[mask]] == ["000000.jpg", "000005.jpg", "000010.jpg"]
    assert len(packed[[]]) == 0 and len(packed[5:5]) == 0
    assert packed[np.int64(3)] == samples[3]
    assert packed.__getitems__([4, 1]) == [samples[4], samples[1]]
    for bad in (12, -13):
        with pytest.raises(IndexError, match="out of range"):
            packed[bad]
    with pytest.raises(TypeError, match="not str"):
        packed["3"]
    with pytest.raises(TypeError, match="integers or bools"):
        packed[torch.tensor([1.0])]
    with pytest.raises(IndexError, match="bool mask"):
        packed[torch.tensor([True])]


gatherable = st.one_of(  # tensors of a few shapes, so that many share one
    st.builds(
        lambda v, d: torch.tensor(v).to(d),
        st.integers(-3, 3),
        st.sampled_from([torch.float32, torch.int64, torch.bool, torch.float16]),
    ),
    st.builds(lambda n: torch.arange(n), st.sampled_from([0, 1, 3])),
    st.builds(lambda n: torch.ones(n, 2, dtype=torch.int32), st.sampled_from([1, 2])),
    st.builds(lambda n: torch.arange(n) % 7, st.just(1025)),  # past GATHER_UP_TO
    st.builds(lambda v: np.arange(v, dtype=np.int16), st.integers(0, 2)),
    st.integers(-5, 5),
    st.text(max_size=2),
)


@settings(max_examples=60)
@given(
    st.lists(trees(gatherable, max_depth=2, max_width=3), min_size=1, max_size=4),
    st.integers(1, 12),
    st.data(),
)
def test_reading_many_samples_at_once_reads_each_as_alone(
    kinds: list, copies: int, data: st.DataObject
) -> None:
    """``__getitems__`` (the DataLoader's fetch) gathers the tensors of one
    dtype and shape across samples; what it gives is what ``packed[i]`` gives,
    sample by sample, and every tensor is its own."""
    kinds = [{"ids": torch.arange(4), "tree": kind} for kind in kinds]  # a tensor to gather
    samples = [  # each sample's tensors hold its number, so a misplaced one shows
        pk.tree_map(functools.partial(numbered, i=k, ragged=False), kinds[k % len(kinds)])
        for k in range(copies * len(kinds))
    ]
    packed = PackedList(samples)
    n = len(samples)
    at = data.draw(st.lists(st.integers(-n, n - 1), max_size=2 * n), label="indices")
    got = packed.__getitems__(at)
    assert len(got) == len(at)
    for g, i in zip(got, at):
        same(g, packed[i])
        same(g, samples[i])
    each_its_own(got)
    for g, i in zip(packed.__getitems__(at), at):
        same(g, samples[i])
    with pytest.raises(IndexError, match="out of range"):
        packed.__getitems__([0, n])


def each_its_own(got: list) -> None:
    """Every tensor of the samples ``got`` is its own: no view, and a change
    to one changes no other, nor what is stored."""
    tensors = [x for sample in got for x in pk.leaves(sample) if isinstance(x, torch.Tensor)]
    assert all(t._base is None for t in tensors)
    for t in tensors:
        versions = [u._version for u in tensors]
        before = [u.clone() for u in tensors]
        t.zero_()
        for u, v, b in zip(tensors, versions, before):
            if u is not t:
                assert u._version == v and torch.equal(u, b)


def numbered(x: Any, i: int, ragged: bool) -> Any:
    """Leaf ``x`` of sample ``i``: a tensor or array holding ``i`` (so samples
    differ), 1-D ones ``i % 3`` longer when ``ragged``; other leaves as they are."""
    if isinstance(x, torch.Tensor):
        if ragged and x.dim() == 1:
            x = torch.arange(len(x) + i % 3).to(x.dtype)
        return (x.to(torch.int64) * 0 + i).to(x.dtype)
    if isinstance(x, np.ndarray):
        return (x * 0 + i).astype(x.dtype)
    return x


#: ways a sample may differ from its neighbours while keeping some columns
#: alike: its tensors of another dtype, numpy arrays in their place, or a
#: tensor more (so samples hold different numbers of leaves)
VARIANTS = {
    "dtype": lambda t: pk.tree_map(
        lambda x: (
            x.to(torch.int32 if x.dtype == torch.float64 else torch.float64)
            if isinstance(x, torch.Tensor)
            else x
        ),
        t,
    ),
    "array": lambda t: pk.tree_map(lambda x: x.numpy() if isinstance(x, torch.Tensor) else x, t),
    "longer": lambda t: [t, torch.tensor(7)],
}


@settings(max_examples=80)
@given(
    trees(gatherable, max_depth=2, max_width=4),
    st.integers(4, 40),
    st.booleans(),
    st.lists(st.sampled_from(sorted(VARIANTS)), max_size=3),
    st.data(),
)
def test_samples_of_one_structure_are_read_column_by_column(
    kind: Any, copies: int, ragged: bool, variants: list, data: st.DataObject
) -> None:
    """Samples that hold as many tensors each are read a column at a time
    (the j-th tensor of every sample, when they share a dtype and shape):
    each sample still gets its own values, in its place. Ragged columns,
    columns of mixed dtypes or of tensors and arrays, and samples holding
    different numbers of leaves are read as the others are."""
    kind = {"ids": torch.arange(5), "tree": kind, "label": torch.tensor(1)}  # columns to read
    ways = [lambda t: t] + [VARIANTS[v] for v in variants]
    samples = [
        ways[i % len(ways)](pk.tree_map(functools.partial(numbered, i=i, ragged=ragged), kind))
        for i in range(copies)
    ]
    packed = PackedList(samples)
    at = data.draw(st.permutations(range(copies)), label="order")  # every way mixed
    at += data.draw(st.lists(st.integers(0, copies - 1), max_size=24), label="more")
    got = packed.__getitems__(at)
    for g, i in zip(got, at, strict=True):
        same(g, samples[i])
    each_its_own(got)


@pytest.mark.parametrize("context", ["spawn", "forkserver"])
def test_workers_read_batches_a_column_at_a_time_epoch_after_epoch(context: str) -> None:
    """Real DataLoader workers (spawn and forkserver, persistent, shuffled)
    fetch batches through ``__getitems__``, which reads these samples a
    column at a time: over two epochs every sample arrives once an epoch, as
    it was packed, though the main process changes each one it gets; the
    list still holds what was packed afterwards."""
    n = 96
    samples = [
        {
            "input_ids": torch.arange(16) + i,
            "attention_mask": torch.ones(16, dtype=torch.int64) * i,
            "label": torch.tensor(i),
            "meta": {"a": torch.tensor(float(i)), "b": torch.tensor(i % 2 == 0)},
        }
        for i in range(n)
    ]
    packed = PackedList(samples)
    loader = torch.utils.data.DataLoader(
        packed,
        batch_size=8,
        shuffle=True,
        num_workers=2,
        collate_fn=list,
        multiprocessing_context=context,
        persistent_workers=True,
        timeout=120,
        generator=torch.Generator().manual_seed(0),
    )
    for _ in range(2):
        seen = []
        for batch in loader:
            for got in batch:
                i = int(got["label"])
                same(got, samples[i])
                seen.append(i)
                got["input_ids"].add_(1000)  # the caller's own tensors
                got["meta"]["a"].zero_()
        assert sorted(seen) == list(range(n))
    for i in range(n):
        same(packed[i], samples[i])


def test_a_batch_with_nothing_to_gather_sends_the_next_ones_sample_by_sample(
    monkeypatch: Any,
) -> None:
    """Ragged samples (a shape per few tensors) give the gather nothing to do:
    after such a batch, the next GATHER_RETRY are read sample by sample, then
    a batch is looked at again; the samples are right either way."""
    from pytree_kit.torch import _packed

    ragged = [{"boxes": torch.ones(1 + i % 9, 4) * i} for i in range(40)]
    packed = PackedList(ragged)
    looks = []
    real = _packed._Store.made
    monkeypatch.setattr(
        _packed._Store, "made", lambda self, w, per=0: looks.append(1) or real(self, w, per)
    )
    batch = [0, 1, 2, 3]  # four shapes: nothing to gather
    for k in range(_packed.GATHER_RETRY + 2):
        got = packed.__getitems__(batch)
        for g, i in zip(got, batch):
            same(g, ragged[i])
        assert len(looks) == (1 if k <= _packed.GATHER_RETRY else 2), k
    even = PackedList([{"x": torch.arange(3) + i} for i in range(8)])
    assert len(even.__getitems__(range(8))) == 8 and even._alone == 0


def test_what_it_returns_is_its_own() -> None:
    samples = [{"t": torch.zeros(3), "xs": [1.0, 2.0], "a": np.zeros(2)}]
    packed = PackedList(samples)
    got = packed[0]
    got["t"] += 1
    got["xs"].append(3.0)
    got["a"][0] = 5
    same(packed[0], samples[0])
    samples[0]["t"] += 7  # the input is copied, not kept
    assert packed[0]["t"].tolist() == [0.0, 0.0, 0.0]


@dataclasses.dataclass
class Instance:
    boxes: Any
    segmentation: Any


class Box:
    """Not a container pytree_kit reads by itself: a rule opens it."""

    def __init__(self, xy: Any) -> None:
        self.xy = xy

    def __eq__(self, other: Any) -> bool:
        return type(other) is Box and other.xy == self.xy


BOX_RULES = {Box: pk.Rule(lambda b: ((b.xy,), None), lambda aux, ch: Box(ch[0]))}


def test_a_leaf_it_cannot_store_is_named() -> None:
    samples = [{"annotations": [Instance([1.0], [[1.0]])] * 4} for _ in range(20)]
    samples[17]["annotations"] = [Instance([1.0], [[1.0]])] * 3 + [Instance([1.0], object())]
    with pytest.raises(
        TypeError, match=r"samples\[17\]\['annotations'\]\[3\]\.segmentation is a object"
    ):
        PackedList(samples)
    with pytest.raises(TypeError, match=r"samples\[1\]\['n'\] is an int outside int64's range"):
        PackedList([{"n": 1}, {"n": 2**63}])
    with pytest.raises(TypeError, match=r"samples\[0\]\['ids'\]\[2\] is an int outside"):
        PackedList([{"ids": [1, 2, -(2**64)]}])
    bad = {
        "grad": torch.zeros(2, requires_grad=True),
        "param": torch.nn.Parameter(torch.zeros(2)),
        "sparse": torch.zeros(2).to_sparse(),
        "meta": torch.zeros(2, device="meta"),
        "strings": np.array(["a"]),
        "objects": np.array([object()]),
    }
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # ComplexHalf support is experimental
        bad["complex32"] = torch.zeros(2, dtype=torch.complex32)
    for key, leaf in bad.items():
        with pytest.raises(TypeError, match=rf"samples\[0\]\['{key}'\] (is|has|requires)"):
            PackedList([{key: leaf}])
    packed = PackedList([{"n": 2**70, "o": object, "ids": [2**64]}], fallback="pickle")
    assert packed[0] == {"n": 2**70, "o": object, "ids": [2**64]}
    assert packed.pickled == 3
    with pytest.raises(ValueError, match="fallback"):
        PackedList([], fallback="json")


class Span:
    """A class that opts in with the protocol."""

    def __init__(self, lo: Any, hi: Any, unit: str) -> None:
        self.lo, self.hi, self.unit = lo, hi, unit

    def __tree_flatten__(self) -> tuple:
        return (self.lo, self.hi), self.unit

    @classmethod
    def __tree_unflatten__(cls, unit: str, children: Any) -> Span:
        return cls(*children, unit)

    def __eq__(self, other: Any) -> bool:
        return type(other) is Span and vars(other) == vars(self)


def test_rules_and_records() -> None:
    samples = [
        {"box": Box([1.0, 2.0]), "inst": Instance([0.5], [[1.0, 2.0]]), "span": Span(i, "x", "s")}
        for i in range(3)
    ]
    with pytest.raises(TypeError, match=r"samples\[0\]\['box'\] is a Box"):
        PackedList(samples)
    packed = PackedList(samples, rules=BOX_RULES)
    for i in range(3):
        same(packed[i], samples[i])
    assert len(packed.specs) == 1


def test_columns() -> None:
    samples = coco(30)
    packed = PackedList(samples)
    col = packed.column("['height']")
    assert isinstance(col, Column)
    assert col.values.tolist() == [s["height"] for s in samples]
    assert col.indices.tolist() == list(range(30)) and col.missing.tolist() == []
    first = packed.column((pk.DictKey("annotations"), pk.SequenceKey(0), pk.DictKey("category_id")))
    have = [i for i, s in enumerate(samples) if s["annotations"]]
    assert first.indices.tolist() == have
    assert first.missing.tolist() == [i for i in range(30) if i not in have]
    assert first.values.tolist() == [samples[i]["annotations"][0]["category_id"] for i in have]
    crowd = packed.column("['annotations'][2]['iscrowd']")
    assert crowd.values.dtype == torch.bool and crowd.values.all()
    names = packed.column("['file_name']")
    assert names.values == [s["file_name"] for s in samples]
    boxes = packed.column("['annotations'][1]['bbox']")  # every bbox has 4 numbers
    assert boxes.values.shape == (len(boxes.indices), 4)
    assert boxes.values[0].tolist() == samples[int(boxes.indices[0])]["annotations"][1]["bbox"]
    y = packed.column("['annotations'][0]['segmentation'][0][5]")  # an item, when there
    polys = {i: samples[i]["annotations"][0]["segmentation"][0] for i in have}
    assert y.indices.tolist() == [i for i in have if len(polys[i]) > 5]
    assert y.values.tolist() == [polys[i][5] for i in have if len(polys[i]) > 5]
    seg = packed.column("['annotations'][1]['segmentation'][0]")  # of two lengths
    assert isinstance(seg.values, list)
    assert seg.values == [samples[i]["annotations"][1]["segmentation"][0] for i in seg.indices]
    with pytest.raises(ValueError, match="is a container"):
        packed.column("['annotations'][0]")
    none = packed.column("['nothing']")
    assert none.values == [] and none.missing.tolist() == list(range(30))
    part = packed[10:20].column("['height']")
    assert part.values.tolist() == [s["height"] for s in samples[10:20]]
    mixed = PackedList([{"v": 1}, {"v": 2.5}, {"v": True}]).column("['v']")
    assert mixed.values.dtype == torch.float64 and mixed.values.tolist() == [1.0, 2.5, 1.0]
    objs = PackedList([{"v": "a"}, {"v": 3}, {"v": torch.ones(2)}]).column("['v']")
    assert objs.values[:2] == ["a", 3] and torch.equal(objs.values[2], torch.ones(2))
    tens = PackedList([{"t": torch.full((2,), i)} for i in range(3)]).column("['t']")
    assert torch.equal(tens.values, torch.tensor([[0, 0], [1, 1], [2, 2]]))


def test_column_scan_matches_reading_every_sample() -> None:
    samples = coco(50)
    packed = PackedList(samples)
    for i in (0, 1, 2):
        col = packed.column(f"['annotations'][{i}]['bbox'][3]")
        want = {
            k: s["annotations"][i]["bbox"][3]
            for k, s in enumerate(packed)
            if len(s["annotations"]) > i
        }
        assert dict(zip(col.indices.tolist(), col.values.tolist())) == want


def test_pickling_moves_the_buffers_through_shared_memory() -> None:
    samples = coco(3000)
    packed = PackedList(samples)
    plain = pickle.dumps(packed)
    assert len(plain) > packed.nbytes * 0.9  # the bytes themselves
    shared = bytes(ForkingPickler.dumps(packed))
    assert len(shared) < 20_000 < packed.nbytes  # handles, not bytes
    back = pickle.loads(shared)
    assert len(back) == 3000
    same(back[2999], samples[2999])
    same(pickle.loads(plain)[7], samples[7])
    assert repr(back) == repr(packed)


def _first(batch: list) -> Any:
    return batch


def _fresh(*args: str, timeout: int = 200) -> str:
    """What a script run in a fresh process prints (no jax threads there to fork)."""
    out = subprocess.run(
        [sys.executable, *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        env={**os.environ, "PYTHONPATH": str(TESTS.parent)},
    )
    assert out.returncode == 0, out.stderr[-3000:]
    return out.stdout


# -- a PackedList's life: epochs, processes, copies ----------------------------------
#
# tests/support/packed_lifecycle.py runs each in a fresh process and reads every sample
# of every list the main process kept, after each epoch and each journey. A
# list's buffers used to be read through bare addresses that pickling through
# ForkingPickler (a spawn or forkserver DataLoader, an mp.Queue) left pointing
# at freed memory: 2,967 of 3,000 reads failed after one spawn epoch, and a
# store of 100,000 samples crashed the main process.

LIFECYCLE = str(TESTS / "support" / "packed_lifecycle.py")
SIZES = [600, 100_000]


def _lifecycle(*args: str, timeout: int) -> dict:
    return json.loads(_fresh(LIFECYCLE, *args, timeout=timeout).splitlines()[-1])


def _size(n: int) -> int:
    """``n``, when this engine reads that many samples in CI's time (the pure
    engine reads the 100,000-sample store's 920,000 samples far slower; what
    is tested, memory that nothing moves, is the same for both engines)."""
    if n > 10_000 and pk.ENGINE != "c":
        pytest.skip("the 100,000-sample lifecycle runs with the C engine")
    return n


def _views(n: int) -> list:
    """How many samples each list of packed_lifecycle.views holds."""
    return [n, len(range(1, n, 3)), min(n, 5), len(range(0, n, 5))]


# Every start method on the small store; the large one with spawn, the method
# whose workers unpickle the list (freed memory and the crash showed there and
# under forkserver, which sends it the same way: two more large runs cost CI
# 80 s and test nothing the small forkserver run and the large spawn run miss).
LOADER_RUNS = [("fork", 600), ("spawn", 600), ("forkserver", 600), ("spawn", 100_000)]


@pytest.mark.timeout(900)
@pytest.mark.parametrize(("context", "n"), LOADER_RUNS)
def test_dataloader_epochs_then_every_sample_reads_right(context: str, n: int) -> None:
    """3 epochs with persistent workers off, then 3 with them on, over the
    list, a slice, an index list and a mask: each epoch's workers see every
    sample once, the main process then reads every sample of each right, and
    no file descriptor or shared memory is left behind by an epoch."""
    r = _lifecycle("loader", context, str(_size(n)), timeout=880)
    assert r["epochs"] == 6 and r["read"] == 6 * sum(_views(n))
    # after each epoch, once the last workers are gone: no more than after the first
    for kept in (r["fds"][:3], r["fds"][3:], r["shm"][:3], r["shm"][3:]):
        assert max(kept[1:]) <= kept[0], r


@pytest.mark.timeout(600)
@pytest.mark.parametrize("n", SIZES)
def test_a_list_travels_every_way_and_both_ends_read_right(n: int) -> None:
    """An mp.Queue round trip to a spawned process; ForkingPickler then memory
    churn; copy.deepcopy; torch.save and torch.load; a caller's own
    share_memory_() of every buffer: for the list, a slice, an index list and
    a mask, every sample of the original and of the copy read right."""
    r = _lifecycle("paths", str(_size(n)), timeout=580)
    sizes = _views(n)
    assert r.pop("queue") == 2 * n and r.pop("original") == n
    for k, m in enumerate(sizes):
        for way in ("pickler", "deepcopy", "torch.save"):
            assert r.pop(f"{way}{k}") == 2 * m
        assert r.pop(f"share_memory_{k}") == m
    assert not r


@pytest.mark.timeout(600)
@pytest.mark.parametrize("n", SIZES)
def test_a_mapped_file_reaches_spawned_workers_by_its_path(n: int, tmp_path: Path) -> None:
    """A list loaded with mmap=True is mapped again in each spawned worker,
    from its path: its bytes are not copied into shared memory."""
    r = _lifecycle("mapped", str(_size(n)), str(tmp_path), timeout=580)
    assert r["read"] == n + len(range(0, n, 2))
    assert r["shm_growth"] < max(r["file_bytes"] / 20, 64 << 10), r


def test_a_mapped_file_changed_after_loading_is_refused_in_another_process(
    tmp_path: Path,
) -> None:
    path = tmp_path / "store.pk"
    PackedList(coco(20)).save(path)
    packed = PackedList.load(path)
    sent = bytes(ForkingPickler.dumps(packed))
    PackedList(coco(21)).save(tmp_path / "new.pk")
    os.replace(tmp_path / "new.pk", path)  # another file at the path
    with pytest.raises(ValueError, match="changed after it was loaded"):
        ForkingPickler.loads(sent)
    assert len(packed) == 20  # the list that was loaded still reads its own mapping
    for got, want in zip(packed, coco(20)):
        same(got, want)


def test_no_reader_keeps_an_address_into_memory_it_does_not_own() -> None:
    """Each buffer a PackedList reads through a bare address is in shared
    memory (which nothing moves), or a mapped file's or a bytearray's that
    the list keeps."""
    packed = PackedList(coco(30))
    for part in (packed, packed[::2], packed[[3, 1]], copy.deepcopy(packed)):
        buffers = [
            t for t in (*part._store.tensors.values(), *part._store.data.values()) if t.numel()
        ]
        assert all(t.is_shared() for t in buffers)
        assert len({t.untyped_storage().data_ptr() for t in buffers}) == 1  # one storage
        index_view = part._bufs[0]
        assert type(index_view.obj) is bytearray or part._index.is_shared()
    fds = len(os.listdir("/proc/self/fd"))
    kept = [PackedList(coco(3)) for _ in range(40)]
    assert len(os.listdir("/proc/self/fd")) - fds <= len(kept)  # a file descriptor a store


@pytest.mark.timeout(120)
def test_forked_dataloader_workers() -> None:
    """Forked workers give back every sample, equal to the one packed."""
    assert _fresh(str(TESTS / "support" / "packed_worker.py"), "500").split() == ["checked=500"]


def _growth(store: str) -> tuple[float, float]:
    """(the largest growth of a worker's private memory over one epoch with 2
    forked workers, the packed size), MiB: benchmarks/packed.py's --epoch."""
    script = str(TESTS.parent / "benchmarks" / "packed.py")
    out = _fresh(script, "--epoch", store, "30000", "fork", "2")
    r = json.loads(out.splitlines()[-1])[store]
    grown = max(r["end"][w]["uss"] - r["start"][w]["uss"] for w in r["start"] if w != "main")
    return grown, r["nbytes"] / 2**20


@pytest.mark.timeout(420)
def test_forked_workers_read_without_copying() -> None:
    """2 forked DataLoader workers read every sample of 30,000 COCO-like ones:
    the private memory each gains stays under 5% of the packed size, where
    those of a list of dicts (the contrast) copy what they read."""
    grown, packed_mb = _growth("PackedList")
    assert grown < 0.05 * packed_mb, (grown, packed_mb)
    listed, _ = _growth("list")  # the check can fail: a list's pages are copied
    assert listed > 0.5 * packed_mb, (listed, packed_mb)


def test_save_and_load(tmp_path: Path) -> None:
    samples = coco(40)
    samples[3]["extra"] = {"t": torch.arange(6).view(2, 3), "a": np.ones(3, np.float16)}
    samples[4]["inst"] = Instance([1.0], [[2.0]])
    samples[5]["box"] = Box([3.0])
    samples[6]["odd"] = collections.OrderedDict(b=1, a=(2, None))
    packed = PackedList(samples, rules=BOX_RULES)
    path = tmp_path / "coco.pk"
    packed.save(path)
    for mapped in (True, False):
        back = PackedList.load(path, mmap=mapped, allow=[Instance], rules=BOX_RULES)
        assert len(back) == 40 and len(back.specs) == len(packed.specs)
        for i in range(40):
            same(back[i], samples[i])
        back.verify()
        same(back.column("['height']").values, packed.column("['height']").values)
    with pytest.raises(ValueError):  # a class the document names, not allowed
        PackedList.load(path, rules=BOX_RULES)
    view = packed[[39, 4]]
    view.save(tmp_path / "view.pk")
    back = PackedList.load(tmp_path / "view.pk", allow=[Instance], rules=BOX_RULES)
    same(back[1], samples[4])
    empty = PackedList([])
    empty.save(tmp_path / "empty.pk")
    assert len(PackedList.load(tmp_path / "empty.pk")) == 0


class Secret:
    def __init__(self, v: int) -> None:
        self.v = v

    def __eq__(self, other: Any) -> bool:
        return type(other) is Secret and other.v == self.v


def test_pickled_leaves_in_a_file_find_only_allowed_classes(tmp_path: Path) -> None:
    packed = PackedList([{"s": Secret(3)}], fallback="pickle")
    packed.save(tmp_path / "s.pk")
    back = PackedList.load(tmp_path / "s.pk")
    with pytest.raises(ValueError, match="allow= does not name"):
        back[0]
    assert PackedList.load(tmp_path / "s.pk", allow=[Secret])[0] == {"s": Secret(3)}


def _read_all(packed: PackedList) -> None:
    for i in range(len(packed)):
        try:
            packed[i]
        except (ValueError, IndexError):  # damage is named; anything else fails the test
            pass
    try:  # and read together, as a DataLoader's fetcher does
        packed.__getitems__(list(range(len(packed))))
    except (ValueError, IndexError):
        pass


def test_truncated_files_raise_value_error(tmp_path: Path) -> None:
    packed = PackedList(coco(20))
    path = tmp_path / "a.pk"
    packed.save(path)
    data = path.read_bytes()
    cut = tmp_path / "cut.pk"
    for n in list(range(0, 64)) + list(range(64, len(data), max(1, len(data) // 97))):
        cut.write_bytes(data[:n])
        for mapped in (True, False):
            with pytest.raises(ValueError):
                PackedList.load(cut, mmap=mapped)
    cut.write_bytes(b"")
    with pytest.raises(ValueError, match="not a PackedList file"):
        PackedList.load(cut)


@settings(max_examples=80)
@given(st.data())
def test_flipped_bits_never_crash(tmp_path_factory: Any, data: st.DataObject) -> None:
    path = tmp_path_factory.mktemp("flip") / "a.pk"
    packed = PackedList([*coco(12), {"t": torch.arange(4), "s": "é"}])
    packed.save(path)
    raw = bytearray(path.read_bytes())
    header_end = 20 + int.from_bytes(raw[8:16], "little")
    at = data.draw(
        st.one_of(st.integers(0, header_end + 64), st.integers(0, len(raw) - 1)), label="byte"
    )
    raw[at] ^= 1 << data.draw(st.integers(0, 7), label="bit")
    path.write_bytes(bytes(raw))
    want = list(packed)
    try:  # every byte that holds data is under a checksum: an error, or no change
        back = PackedList.load(path, mmap=False)
    except ValueError:
        pass
    else:
        for got, w in zip(back, want):
            same(got, w)
    try:
        back = PackedList.load(path, mmap=True)
    except ValueError:
        return
    try:
        back.verify()
    except ValueError as e:
        assert "checksum" in str(e)
        _read_all(back)  # damaged: reading it names the damage or reads wrong values
        try:
            back.column("['height']")
        except ValueError:
            pass
    else:
        for got, w in zip(back, want):
            same(got, w)


def test_load_maps_and_reads_no_sample(tmp_path: Path) -> None:
    packed = PackedList(coco(200))
    path = tmp_path / "a.pk"
    packed.save(path)
    back = PackedList.load(path, mmap=True)
    assert back._index.untyped_storage().data_ptr() != packed._index.untyped_storage().data_ptr()
    # the mapped buffers are views of the file's mapping, copied on write only
    assert type(back._store.file.memory).__name__ == "mmap"
    same(back[199], packed[199])


def test_engine_parity_on_real_buffers() -> None:
    """The C reader and the specification agree on a real PackedList's buffers."""
    samples = [*coco(30), {"t": torch.ones(2, 2), "a": np.arange(3), "s": np.int8(3), "b": b"x"}]
    packed = PackedList(samples, fallback="pickle")
    store = packed._store
    for i in range(len(samples)):
        a = _rows.packed_sample(packed._bufs, store.specs, i, store.make)
        b = _interface.engine.packed_sample(packed._bufs, store.specs, i, store.make)
        same(a, b)
        same(a, samples[i])


def test_public_names() -> None:
    import pytree_kit.torch as pkt

    assert pkt.PackedList is PackedList and "PackedList" in pkt.__all__
    assert typing.get_type_hints(PackedList.column)["return"] is Column


def test_a_changed_dtype_is_named_as_damage() -> None:
    """An array leaf whose buffer a changed file gives a dtype numpy lacks."""
    from pytree_kit.torch._packed import _DTYPE_ID, NDARRAY

    packed = PackedList([{"a": np.zeros(3, np.float32)}])
    bf16 = _DTYPE_ID[torch.bfloat16]
    packed._store.data[bf16] = torch.zeros(3, dtype=torch.bfloat16)
    with pytest.raises(ValueError, match="cannot be rebuilt"):
        packed._store.make(NDARRAY, bf16, 0, (3,))
    with pytest.raises(ValueError, match="outside its buffer of 3"):
        packed._store.make(NDARRAY, bf16, 2, (3,))
    # a buffer cut short: read alone or together, the same damage is named
    packed = PackedList([{"t": torch.arange(4) + i} for i in range(6)])
    i64 = _DTYPE_ID[torch.int64]
    packed._store.data[i64] = packed._store.data[i64][:10]
    for read in (lambda: [packed[i] for i in range(6)], lambda: packed.__getitems__(range(6))):
        with pytest.raises(ValueError, match="outside its buffer of 10"):
            read()


def test_a_damaged_layout_number_is_named_by_column() -> None:
    """A layout number a damaged file makes huge is refused, never counted
    (torch.bincount would allocate as many counters)."""
    packed = PackedList(coco(5))
    index = packed._index.clone()
    index[2] = 2**30
    damaged = PackedList._of(packed._store, index)
    with pytest.raises(ValueError, match="layout does not exist"):
        damaged.column("['height']")
    with pytest.raises(ValueError, match="layout 1073741824 does not exist"):
        damaged[1]
