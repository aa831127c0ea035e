"""pytree_kit.torch batches: fast collate, ragged fields, uncollate/select, consolidate.

(collate's older behaviour, pin_memory and to_device are in tests/torch/test_loading.py.)
"""

from __future__ import annotations

import copy
import dataclasses
import io
import pickle
from multiprocessing.reduction import ForkingPickler
from typing import Any, NamedTuple

import pytest

torch = pytest.importorskip("torch")

from hypothesis import HealthCheck, given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

import pytree_kit as pk  # noqa: E402
from pytree_kit.torch import (  # noqa: E402
    Padded,
    PinnedPool,
    SampleList,
    _pool,
    _storage,
    _transfer,
    collate,
    consolidate,
    is_consolidated,
    select,
    to_device,
    uncollate,
)

np = pytest.importorskip("numpy")


@dataclasses.dataclass
class Target:
    boxes: Any
    labels: Any


@dataclasses.dataclass
class Sample:
    image: Any
    target: Target
    name: str


class Rec(NamedTuple):
    x: Any
    n: int


def detection(i: int) -> tuple:
    """A torchvision-style (image, target) sample: sizes differ from sample to sample."""
    g = torch.Generator().manual_seed(i)
    image = torch.rand(3, 4 + i, 5 + 2 * i, generator=g)
    target = {"boxes": torch.rand(i + 1, 4, generator=g), "labels": torch.arange(i + 1)}
    return image, target


def same(a: Any, b: Any) -> None:
    """Equal trees: the same structure and types, tensors equal in dtype, shape, values."""
    la, sa = pk.flatten(a)
    lb, sb = pk.flatten(b)
    assert sa == sb, (sa, sb)
    for x, y in zip(la, lb):
        assert type(x) is type(y), (x, y)
        if isinstance(x, torch.Tensor):
            assert x.dtype == y.dtype and x.shape == y.shape and torch.equal(x, y)
        else:
            assert x == y


# -- the fast path keeps collate's results ------------------------------------------


def test_numbers_collate_to_the_same_tensors_as_torch_tensor():
    for values in ([1, 2, -3], [0.1, 2.5, -1e30], [True, False, True], [1, True], [1, 2.5]):
        batch = collate([{"v": v} for v in values])["v"]
        want = torch.tensor(values)
        assert batch.dtype == want.dtype and torch.equal(batch, want), values
    # an int too large for int64: torch's message, with the path
    with pytest.raises(ValueError, match=r"collate: tree\['v'\]: Overflow"):
        collate([{"v": 2**70}, {"v": 1}])


def test_numbers_and_strings_mixed_are_an_error_naming_the_path():
    with pytest.raises(ValueError, match=r"collate: tree\['v'\]: the samples hold different kinds"):
        collate([{"v": 1}, {"v": "a"}])


def test_numpy_arrays_are_stacked_as_default_collate_does():
    arrays = [np.arange(6, dtype=np.int32).reshape(2, 3) + i for i in range(3)]
    batch = collate([{"a": a, "s": np.array(["x", "y"])} for a in arrays])
    assert batch["a"].dtype == torch.int32 and torch.equal(
        batch["a"], torch.as_tensor(np.stack(arrays))
    )
    assert type(batch["s"]) is SampleList and len(batch["s"]) == 3  # string arrays: a list


def test_a_listed_field_of_numpy_arrays_lists_tensors():
    """``ragged="list"`` on numeric arrays lists them as tensors (as a stacked
    field would hold them, so to_device reaches them); string arrays stay arrays."""
    for n in (1, 3, 5):  # fresh samples, each call
        samples = [
            {"pts": np.arange(i + 1, dtype=np.float32) + n, "s": np.array(["a", str(i)])}
            for i in range(n)
        ]
        before = copy.deepcopy(samples)
        batch = collate(samples, ragged="list")
        assert type(batch["pts"]) is SampleList and len(batch["pts"]) == n
        for t, sample in zip(batch["pts"], samples):
            assert type(t) is torch.Tensor and t.dtype == torch.float32
            assert torch.equal(t, torch.as_tensor(sample["pts"]))
        assert type(batch["s"]) is SampleList
        assert all(type(a) is np.ndarray for a in batch["s"])
        for sample, kept in zip(samples, before):  # the caller's samples, untouched
            assert type(sample["pts"]) is np.ndarray
            assert all(np.array_equal(sample[k], kept[k]) for k in ("pts", "s"))


def test_strings_become_a_sample_list_that_equals_a_list():
    batch = collate([{"name": "a"}, {"name": "b"}])
    assert type(batch["name"]) is SampleList and batch["name"] == ["a", "b"]


@pytest.mark.parametrize(
    "first, second, ok",
    [
        (torch.float32, torch.float64, False),  # torch.stack would promote to float64
        (torch.int32, torch.int64, False),
        (torch.bool, torch.int64, False),
        (torch.float64, torch.float32, True),  # stack keeps sample 0's dtype: float64
    ],
)
@pytest.mark.parametrize("consolidated", [False, True])
def test_a_dtype_other_than_sample_0s_is_an_error(first, second, ok, consolidated):
    samples = [{"x": torch.zeros(2, dtype=first)}, {"x": torch.ones(2, dtype=second)}]
    if ok:
        out = collate(samples, consolidate=consolidated)["x"]
        assert out.dtype == first and out.tolist() == [[0, 0], [1, 1]]
    else:
        with pytest.raises(ValueError, match=r"collate: tree\['x'\]: cannot stack tensors"):
            collate(samples, consolidate=consolidated)


def test_a_shape_mismatch_names_the_path_and_hints_at_ragged():
    with pytest.raises(ValueError, match=r"tree\[0\]: cannot stack .* pass ragged="):
        collate([detection(0), detection(1)])
    with pytest.raises(ValueError, match=r"tree\[1\]\['boxes'\]: cannot stack .* pass ragged="):
        collate([detection(0), detection(1)], ragged={"[0]": "list"})


def test_a_container_where_sample_0_has_a_tensor_is_a_structure_error():
    with pytest.raises(ValueError, match="sample 1 does not have the structure of sample 0"):
        collate([{"x": torch.zeros(2)}, {"x": {"y": torch.zeros(2)}}])


def test_collate_does_not_mutate_the_samples():
    samples = [Sample(torch.rand(2), Target(torch.rand(i + 1, 4), [i]), f"s{i}") for i in range(3)]
    before = copy.deepcopy(samples)
    collate(samples, ragged={"boxes": "pad"}, consolidate=True)
    collate(samples, ragged={"target": "list"})
    for a, b in zip(samples, before):
        same(a, b)


# -- ragged= ---------------------------------------------------------------------------


def test_torchvision_detection_batch_is_a_list_of_images_and_a_list_of_targets():
    samples = [detection(i) for i in range(3)]
    images, targets = collate(samples, ragged={"[0]": "list", "[1]": "list"})
    assert type(images) is SampleList and type(targets) is SampleList
    for (image, target), img, tgt in zip(samples, images, targets):
        assert img is image and type(tgt) is dict and tgt["boxes"] is target["boxes"]


def test_a_list_field_may_differ_in_structure_between_samples():
    samples = [{"x": torch.ones(2), "polys": [torch.rand(3, 2)] * (i + 1)} for i in range(3)]
    batch = collate(samples, ragged={"polys": "list"})
    assert batch["x"].shape == (3, 2) and [len(p) for p in batch["polys"]] == [1, 2, 3]
    same(uncollate(batch)[2]["polys"], samples[2]["polys"])


def test_pad_keeps_the_sizes_and_uncollate_is_exact():
    samples = [detection(i) for i in range(4)]
    images, target = collate(
        samples, ragged={"[0]": "pad", "boxes": "pad", "labels": "list"}, pad_value=-1.0
    )
    assert type(images) is Padded and images.data.shape == (4, 3, 7, 11)
    assert images.sizes.tolist() == [[3, 4 + i, 5 + 2 * i] for i in range(4)]
    assert target["boxes"].lengths.tolist() == [1, 2, 3, 4]
    assert float(target["boxes"].data[0, 1:].max()) == -1.0  # the padding
    assert target["boxes"].mask().sum().item() == 4 * (1 + 2 + 3 + 4)
    for sample, back in zip(samples, uncollate((images, target))):
        assert torch.equal(back[0], sample[0]) and torch.equal(back[1]["boxes"], sample[1]["boxes"])


def test_nested_makes_a_jagged_tensor():
    samples = [detection(i) for i in range(3)]
    _, target = collate(samples, ragged={"[0]": "list", "[1]": "nested"})
    boxes = target["boxes"]
    assert boxes.is_nested and boxes.size(0) == 3
    for (_, t), b in zip(samples, boxes.unbind()):
        assert torch.equal(t["boxes"], b)
    with pytest.raises(ValueError, match=r"tree\[0\]: ragged='nested' makes a jagged tensor"):
        collate(samples, ragged={"[0]": "nested", "[1]": "list"})


@pytest.mark.parametrize(
    "selector",
    [
        "['b']",
        "tree['b']",
        "['a']['b']",
        "tree['a']['b']",
        "b",
        "a.b",
        ("a", "b"),
        (pk.DictKey("a"), pk.DictKey("b")),
        lambda path: len(path) == 2 and path[-1] == pk.DictKey("b"),
    ],
)
def test_every_form_of_path_selects_the_same_field(selector):
    samples = [{"a": {"b": torch.ones(i + 1), "c": torch.ones(2)}} for i in range(2)]
    if selector in ("['b']", "tree['b']"):  # a keystr names the whole path
        with pytest.raises(ValueError, match=r"ragged= names \"(tree)?\['b'\]\", which is no path"):
            collate(samples, ragged={selector: "list"})
        return
    batch = collate(samples, ragged={selector: "list"})
    assert type(batch["a"]["b"]) is SampleList and batch["a"]["c"].shape == (2, 2)


def test_a_callable_ragged_is_asked_for_each_node_outermost_first():
    seen = []

    def ragged(path):
        seen.append(pk.keystr(path))
        return "list" if path == (pk.DictKey("a"),) else None

    batch = collate([{"a": {"b": torch.ones(i + 1)}} for i in range(2)], ragged=ragged)
    assert type(batch["a"]) is SampleList and seen == ["", "['a']"]


def test_bad_ragged_arguments_are_clear():
    samples = [{"x": torch.ones(1)}, {"x": torch.ones(2)}]
    with pytest.raises(ValueError, match="must be one of 'list', 'pad', 'nested', got 'stack'"):
        collate(samples, ragged={"x": "stack"})
    with pytest.raises(TypeError, match="ragged= takes a mode"):
        collate(samples, ragged=3)
    with pytest.raises(ValueError, match="ragged='pad' needs tensors of one dtype"):
        collate([{"x": torch.ones(1)}, {"x": torch.ones(1, 2)}], ragged="pad")


def coco(g: torch.Generator, k: int) -> dict:
    """A COCO-like sample with ``k`` annotations (0 for an image with none)."""
    ann = [
        {
            "bbox": torch.rand(4, generator=g),
            "category": int(torch.randint(0, 9, (1,), generator=g)),
        }
        for _ in range(k)
    ]
    return {
        "image": torch.rand(3, 4, generator=g),
        "ann": ann,
        "boxes": torch.rand(k, 4, generator=g),
    }


def test_a_list_selector_resolves_against_every_sample_not_the_first():
    """Images with no annotations are normal in detection data: a batch whose
    first sample has an empty list at a "list" path collates (it failed
    with "no path of the samples"), each empty list an empty entry."""
    g = torch.Generator().manual_seed(0)
    samples = [coco(g, k) for k in (0, 2, 0, 1)]
    batch = collate(samples, ragged={"['ann']": "list", "boxes": "pad"})
    assert type(batch["ann"]) is SampleList and [len(a) for a in batch["ann"]] == [0, 2, 0, 1]
    assert batch["boxes"].sizes[:, 0].tolist() == [0, 2, 0, 1]
    for a, b in zip(samples, uncollate(batch)):
        same(a, b)


@pytest.mark.parametrize("mode", ["list", "pad", "nested"])
def test_a_batch_whose_every_list_is_empty_gives_an_all_empty_entry(mode):
    g = torch.Generator().manual_seed(1)
    samples = [coco(g, 0) for _ in range(3)]
    batch = collate(samples, ragged={"['ann']": mode, "boxes": mode})
    if mode == "list":
        assert (
            list(batch["ann"]) == [[], [], []]
            and [tuple(b.shape) for b in batch["boxes"]] == [(0, 4)] * 3
        )
    else:  # no leaf under the lists: the empty list is the batch's as it is each sample's
        assert batch["ann"] == []
        boxes = batch["boxes"]
        if mode == "pad":
            assert boxes.data.shape == (3, 0, 4) and boxes.sizes.tolist() == [[0, 4]] * 3
        else:
            assert boxes.is_nested and [tuple(b.shape) for b in boxes.unbind()] == [(0, 4)] * 3
    for a, b in zip(samples, uncollate(batch)):
        same(a, b)


def test_a_selector_of_no_node_of_any_sample_still_raises():
    g = torch.Generator().manual_seed(2)
    samples = [coco(g, k) for k in (0, 1)]
    with pytest.raises(ValueError, match=r"ragged= names \"\['anns'\]\", which is no path"):
        collate(samples, ragged={"['ann']": "list", "['anns']": "list"})
    # a path only a later sample has (its list is not empty there) is a path of the samples
    batch = collate(samples, ragged={"['ann']": "list", "bbox": "list", "boxes": "list"})
    assert [len(a) for a in batch["ann"]] == [0, 1]


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    st.lists(st.integers(0, 3), min_size=1, max_size=6),
    st.sampled_from(["pad", "nested", "list"]),
    st.integers(0, 2**16),
    st.data(),
)
def test_batches_mixing_empty_and_full_lists_round_trip(counts, boxes_mode, seed, data):
    """Any mix of images with and without annotations, in any order: collate
    with ragged=, then uncollate gives every sample back, and select gives
    each the same as uncollate."""
    g = torch.Generator().manual_seed(seed)
    samples = [coco(g, k) for k in counts]
    batch = collate(samples, ragged={"['ann']": "list", "boxes": boxes_mode})
    rows = uncollate(batch)
    assert len(rows) == len(samples)
    for a, b in zip(samples, rows):
        same(a, b)
    i = data.draw(st.integers(-len(samples), len(samples) - 1))
    same(select(batch, i), rows[i])


# -- uncollate and select ---------------------------------------------------------------

shapes = st.lists(st.integers(0, 3), min_size=0, max_size=2).map(tuple)


@st.composite
def sample_lists(draw):
    n = draw(st.integers(1, 5))
    fixed = draw(shapes)
    seed = draw(st.integers(0, 2**16))
    g = torch.Generator().manual_seed(seed)
    out = []
    for _ in range(n):
        ragged_len = draw(st.integers(0, 4))
        out.append(
            Sample(
                image=torch.rand(fixed, generator=g),
                target=Target(
                    boxes=torch.rand(ragged_len, 2, generator=g),
                    labels=torch.randint(0, 9, (ragged_len,), generator=g),
                ),
                name=draw(st.text(max_size=3)),
            )
        )
    return out


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(sample_lists(), st.sampled_from(["list", "pad"]), st.booleans())
def test_uncollate_inverts_collate(samples, mode, consolidated):
    batch = collate(samples, ragged={"target": mode}, consolidate=consolidated)
    assert is_consolidated(batch) or not consolidated
    back = uncollate(batch)
    assert len(back) == len(samples)
    for a, b in zip(samples, back):
        same(a, b)


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(sample_lists(), st.data())
def test_select_agrees_with_uncollate(samples, data):
    batch = collate(samples, ragged={"boxes": "pad", "labels": "list"})
    rows = uncollate(batch)
    n = len(samples)
    i = data.draw(st.integers(-n, n - 1))
    same(select(batch, i), rows[i])
    mask = data.draw(st.lists(st.booleans(), min_size=n, max_size=n))
    picked = [k for k in range(n) if mask[k]]
    for index in (
        torch.tensor(mask),
        torch.tensor(picked, dtype=torch.int64),
        picked,
        slice(None, None, 2),
    ):
        sub = select(batch, index)
        want = [rows[k] for k in (range(n)[index] if isinstance(index, slice) else picked)]
        got = uncollate(sub) if want else []
        if want:
            assert len(got) == len(want)
            for a, b in zip(got, want):
                # padded fields of a sub-batch keep the batch's padding: compare unpadded
                same(a, b)


def test_select_and_uncollate_name_the_path_of_a_size_mismatch():
    batch = {"x": torch.zeros(4, 2), "y": {"z": torch.zeros(3)}}
    with pytest.raises(ValueError, match=r"tree\['y'\]\['z'\]: has 3 rows, but tree\['x'\] has 4"):
        select(batch, 0)
    with pytest.raises(ValueError, match=r"tree\['y'\]\['z'\]: has 3 rows"):
        uncollate(batch)
    with pytest.raises(ValueError, match=r"tree\['loss'\]: a 0-d tensor has no batch dimension"):
        uncollate({"x": torch.zeros(2), "loss": torch.tensor(1.0)})
    with pytest.raises(IndexError, match="index 4 is out of range for a batch of 4"):
        select({"x": torch.zeros(4)}, 4)
    with pytest.raises(IndexError, match="a bool index must have one entry per sample"):
        select({"x": torch.zeros(4)}, torch.tensor([True, False]))


def test_select_keeps_other_leaves_and_nested_tensors():
    samples = [detection(i) for i in range(3)]
    batch = {"t": collate(samples, ragged={"[0]": "list", "[1]": "nested"})[1], "epoch": 7}
    sub = select(batch, torch.tensor([2, 0]))
    assert sub["epoch"] == 7
    assert [b.shape[0] for b in sub["t"]["boxes"].unbind()] == [3, 1]


# -- consolidate -----------------------------------------------------------------------


def mixed(count: int = 30) -> dict:
    g = torch.Generator().manual_seed(count)
    out: dict = {}
    for i in range(count):
        out[f"t{i}"] = [
            torch.rand(3, 2, generator=g),
            torch.randint(0, 9, (i % 4,), generator=g),
            torch.rand(5, generator=g) > 0.5,
            torch.tensor(float(i), dtype=torch.float64),
        ][i % 4]
    out["meta"] = ("a", 1, None)
    out["strided"] = torch.rand(4, 6, generator=g).t()  # not contiguous
    return out


def test_consolidate_puts_every_tensor_in_one_aligned_storage():
    tree = mixed()
    before = copy.deepcopy(tree)
    out = consolidate(tree)
    same(out, tree)
    same(tree, before)  # nothing mutated
    tensors = [t for t in pk.leaves(out) if isinstance(t, torch.Tensor)]
    assert len({t.untyped_storage().data_ptr() for t in tensors}) == 1
    assert is_consolidated(out) and not is_consolidated(tree)
    base = tensors[0].untyped_storage().data_ptr()
    starts = {(t.dtype, t.shape): t.data_ptr() - base for t in tensors}
    assert min(starts.values()) == 0
    assert all(
        off % _storage.ALIGNMENT == 0
        for off in {
            min(t.data_ptr() - base for t in tensors if (t.dtype, t.shape) == k) for k in starts
        }
    )


def test_consolidated_tensors_behave_like_separate_tensors_when_written():
    out = consolidate(
        {"a": torch.zeros(3), "b": torch.zeros(3), "c": torch.zeros(2, dtype=torch.int64)}
    )
    out["a"] += 1
    out["c"].fill_(7)
    assert out["b"].tolist() == [0, 0, 0] and out["a"].tolist() == [1, 1, 1]
    assert out["c"].tolist() == [7, 7]


def test_an_in_place_change_to_one_consolidated_tensor_leaves_another_saved_for_backward():
    """Consolidated tensors share a storage, not a version counter: an
    embedding saves ``input_ids`` for its backward, and changing ``labels`` in
    place afterwards (as training code does) must not fail that backward, as
    it would if they were views of one base."""
    samples = [
        {"input_ids": torch.tensor([i, i + 1]), "labels": torch.tensor([i, 0])} for i in range(4)
    ]
    for batch in (consolidate(samples[0]), collate(samples, consolidate=True)):
        assert is_consolidated(batch)
        emb = torch.nn.Embedding(8, 3)
        loss = emb(batch["input_ids"]).sum()
        batch["labels"].masked_fill_(batch["labels"] == 0, -100)
        loss.backward()
        assert emb.weight.grad is not None and (batch["labels"] == -100).any()


@pytest.mark.parametrize(
    "bad, message",
    [
        (torch.ones(2, requires_grad=True), "requires grad"),
        (torch.nn.Parameter(torch.ones(2)), "is a Parameter; consolidate copies plain tensors"),
        (torch.ones(2).to_sparse(), "is a torch.sparse_coo tensor"),
        (torch.ones(2, device="meta"), "is on meta, and the tree's first tensor is on cpu"),
    ],
)
def test_consolidate_refuses_what_it_cannot_hold_naming_the_path(bad, message):
    with pytest.raises(TypeError, match=r"consolidate: tree\['z'\]\[1\] " + message):
        consolidate({"a": torch.zeros(2), "z": [torch.zeros(1), bad]})


def test_consolidate_under_no_grad_copies_without_history_and_handles_edge_shapes():
    with torch.no_grad():
        out = consolidate({"w": torch.ones(2, requires_grad=True)})
    assert not out["w"].requires_grad
    tree = {"empty": torch.zeros(0, 4), "scalar": torch.tensor(3), "none": None}
    same(consolidate(tree), tree)
    assert consolidate({"s": "only strings"}) == {"s": "only strings"}


def count_shared_storages(tree: Any) -> int:
    """How many storages pickling ``tree`` for another process shares (as a
    DataLoader worker's queue does)."""
    from torch.multiprocessing import reductions

    calls = []
    real = reductions.reduce_storage

    def counting(storage):
        calls.append(storage)
        return real(storage)

    ForkingPickler.register(torch.UntypedStorage, counting)
    try:
        ForkingPickler(io.BytesIO(), pickle.HIGHEST_PROTOCOL).dump(tree)
    finally:
        ForkingPickler.register(torch.UntypedStorage, real)
    return len(calls)


def test_pickling_a_consolidated_tree_shares_one_storage():
    tree = mixed(60)
    assert count_shared_storages(tree) == 61
    assert count_shared_storages(consolidate(tree)) == 1
    samples = [{"pts": torch.rand(i % 5 + 1, 2), "y": i} for i in range(20)]
    assert count_shared_storages(collate(samples, ragged="list", consolidate=True)) == 1
    assert count_shared_storages(collate(samples, ragged={"pts": "list"})) == 21
    assert count_shared_storages(collate(samples, ragged={"pts": "list"}, consolidate=True)) == 1


def test_collate_consolidate_is_the_plain_batch_in_one_storage():
    samples = [Sample(torch.rand(3, 2), Target(torch.rand(i + 1, 4), i), f"s{i}") for i in range(5)]
    for ragged in (None, {"boxes": "pad"}, {"boxes": "list"}, {"target": "list"}):
        if ragged is None:
            plain_samples = [
                dataclasses.replace(s, target=Target(s.target.boxes[:1], 1)) for s in samples
            ]
        else:
            plain_samples = samples
        plain = collate(plain_samples, ragged=ragged)
        one = collate(plain_samples, ragged=ragged, consolidate=True)
        same(one, plain)
        assert is_consolidated(one)
    with pytest.raises(TypeError, match=r"tree\.target\.boxes is a nested tensor"):
        collate(samples, ragged={"boxes": "nested"}, consolidate=True)


def test_to_device_moves_a_consolidated_tree_with_one_copy(monkeypatch):
    from torch.utils._python_dispatch import TorchDispatchMode

    class Copies(TorchDispatchMode):
        def __init__(self):
            super().__init__()
            self.ops = []

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            if "copy" in func.__name__:
                self.ops.append(func.__name__)
            return func(*args, **(kwargs or {}))

    tree = consolidate(mixed(40))
    with Copies() as plain_mode:
        to_device(mixed(40), "meta", coalesce=False)
    with Copies() as mode:
        out = to_device(tree, "meta", coalesce=False)
    # 41 tensors, to a device with a DMA engine (as meta is taken for here): staged,
    # one copy too
    monkeypatch.setattr(_transfer, "DMA_DEVICES", frozenset({"meta"}))
    with Copies() as default_mode:
        default = to_device(tree, "meta")
    assert len(mode.ops) == 1 and len(plain_mode.ops) == 41, (mode.ops, len(plain_mode.ops))
    assert default_mode.ops.count("_to_copy.default") == 1, default_mode.ops
    assert pk.structure(default) == pk.structure(tree)
    for a, b in zip(pk.leaves(tree), pk.leaves(default)):
        if isinstance(a, torch.Tensor):
            assert (b.device.type, b.dtype, b.shape) == ("meta", a.dtype, a.shape)
    assert is_consolidated(out)
    for a, b in zip(pk.leaves(tree), pk.leaves(out)):
        if isinstance(a, torch.Tensor):
            assert b.device.type == "meta" and b.shape == a.shape and b.dtype == a.dtype
            assert b.stride() == a.stride() and b.storage_offset() == a.storage_offset()


def test_pin_memory_pins_a_consolidated_tree_with_one_allocation(monkeypatch):
    # No accelerator here, so no memory can be pinned: stand a copy in for the
    # pinning call to count them (the CUDA test below pins for real).
    calls = []

    def pin(whole):
        calls.append(whole.numel())
        return whole.clone()

    monkeypatch.setattr(_pool, "pinning_available", lambda: True)
    monkeypatch.setattr(_transfer, "_pin_storage", pin)
    tree = consolidate(mixed(40))
    out = _transfer.pin_memory(tree, coalesce=False)
    assert len(calls) == 1 and is_consolidated(out)
    same(out, tree)
    assert out["t0"].untyped_storage().data_ptr() != tree["t0"].untyped_storage().data_ptr()
    # by default its 41 tensors are packed into one buffer of a pool: one allocation too
    pool = PinnedPool(allocator=lambda n, dtype: torch.empty(n, dtype=dtype))
    packed = _transfer.pin_memory(tree, pool=pool)
    assert len(calls) == 1 and pool.allocations == 1
    same(packed, tree)
    assert pool.buffer_of(packed["t0"]) is not None


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_pin_memory_and_to_device_on_cuda_with_a_consolidated_tree():  # pragma: no cover
    tree = consolidate(mixed(40))
    pinned = _transfer.pin_memory(tree, coalesce=False)
    assert is_consolidated(pinned) and all(
        t.is_pinned() for t in pk.leaves(pinned) if isinstance(t, torch.Tensor)
    )
    moved = to_device(pinned, "cuda", non_blocking=True)
    assert is_consolidated(moved)
    same(to_device(moved, "cpu"), tree)


def test_a_dataloader_with_workers_sends_consolidated_batches():
    from torch.utils.data import DataLoader

    data = [{"pts": torch.rand(i % 5 + 1, 2), "y": i, "name": f"n{i}"} for i in range(16)]
    loader = DataLoader(
        data,
        batch_size=4,
        num_workers=2,
        multiprocessing_context="spawn",
        collate_fn=_consolidated_list_collate,
    )
    batches = list(loader)
    assert len(batches) == 4 and all(is_consolidated(b) for b in batches)
    for k, batch in enumerate(batches):
        same(batch, collate(data[4 * k : 4 * k + 4], ragged={"pts": "list"}))


def _consolidated_list_collate(samples):
    return collate(samples, ragged={"pts": "list"}, consolidate=True)


def _collate_saying_what_is_shared(samples):
    batch = collate(samples, ragged={"pts": "list"})
    return batch, {k: batch[k].is_shared() for k in ("x", "y", "meta")}


def test_in_a_worker_collate_stacks_each_column_into_shared_memory():
    """In a DataLoader worker (spawned), each stacked column is written into
    shared memory, as default_collate writes it, so sending the batch copies
    nothing more; in this process it is not."""
    from torch.utils.data import DataLoader

    data = [
        {"x": torch.rand(3) + i, "pts": torch.rand(i % 3 + 1, 2), "y": i, "meta": torch.tensor(i)}
        for i in range(12)
    ]
    loader = DataLoader(
        data,
        batch_size=4,
        num_workers=2,
        multiprocessing_context="spawn",
        collate_fn=_collate_saying_what_is_shared,
    )
    before = copy.deepcopy(data)
    for epoch in range(2):
        got = list(loader)
        assert len(got) == 3
        for k, (batch, shared) in enumerate(got):
            assert shared == {"x": True, "y": False, "meta": True}, (epoch, k)  # y: numbers
            expected, _ = _collate_saying_what_is_shared(data[4 * k : 4 * k + 4])
            same(batch, expected)
    batch, here = _collate_saying_what_is_shared(data[:4])
    assert here == {"x": False, "y": False, "meta": False}
    batch["x"].add_(1)  # the batch is its own: the caller's samples do not move
    same(data, before)


def test_views_a_moved_storage_cannot_rebuild_faithfully_move_one_by_one(monkeypatch):
    """A conjugate view, a view that requires grad, or a Parameter would lose
    its bit, its history or its type if rebuilt on a moved storage: such
    tensors move one by one, even when their storage is shared and covered."""
    whole_moves = []

    def pin(whole):
        whole_moves.append(whole.numel())
        return whole.clone()

    monkeypatch.setattr(_pool, "pinning_available", lambda: True)
    monkeypatch.setattr(_transfer, "_pin_storage", pin)
    monkeypatch.setattr(torch.Tensor, "pin_memory", lambda self: self.clone())  # no accelerator
    c = torch.rand(4, dtype=torch.complex64)
    w = torch.rand(4, requires_grad=True)
    p = torch.nn.Parameter(torch.rand(4))
    tree = {"c": c, "conj": c.conj(), "w0": w[:2], "w1": w[2:], "p": p, "pv": p[:2]}
    out = _transfer.pin_memory(tree)
    assert whole_moves == []
    assert torch.equal(out["conj"], c.conj()) and torch.equal(out["c"], c)
    assert out["w0"].requires_grad and out["w1"].grad_fn is not None
    assert torch.equal(out["p"], p) and torch.equal(out["pv"], p[:2].detach())
    # the same tree without them is one storage moved whole
    plain = {"a": c.real.clone(), "b": c.imag.clone()}
    one = consolidate(plain)
    _transfer.pin_memory(one)
    assert len(whole_moves) == 1


def test_numpy_scalars_become_a_tensor_of_their_dtype():
    batch = collate([{"i": np.int64(i), "f": np.float32(i / 2)} for i in range(3)])
    assert batch["i"].dtype == torch.int64 and batch["i"].tolist() == [0, 1, 2]
    assert batch["f"].dtype == torch.float32 and batch["f"].tolist() == [0.0, 0.5, 1.0]


def test_ragged_answers_are_remembered_per_structure_and_never_stale():
    """collate remembers how ragged= applies to a structure; a batch whose
    sample 0 lacks the node (it is looked for in the others), a batch of
    another structure, and a batch where it names nothing are each still
    answered on their own."""
    ragged = {"ann": "list"}
    with_ann = {"x": torch.ones(2), "ann": [torch.ones(1), torch.ones(2)]}
    empty = {"x": torch.ones(2), "ann": []}
    for _ in range(3):  # asked again and again, as a DataLoader does
        batch = collate([with_ann, with_ann], ragged=ragged)
        assert type(batch["ann"]) is SampleList and len(batch["ann"][1]) == 2
    batch = collate([empty, with_ann], ragged=ragged)
    assert list(map(len, batch["ann"])) == [0, 2]
    other = {"x": torch.ones(2), "ann": torch.ones(3)}
    assert type(collate([other, other], ragged=ragged)["ann"]) is SampleList
    with pytest.raises(ValueError, match="names 'ann', which is no path"):
        collate([{"x": torch.ones(2)}] * 2, ragged=ragged)
