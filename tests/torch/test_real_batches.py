"""The batches users have, as the real classes make them: a tokenizer's
``BatchEncoding`` (a real fast tokenizer, its WordLevel vocabulary made here:
nothing is loaded from a hub), an image processor's ``BatchFeature``,
``ModelOutput`` subclasses built both ways and a bare ``ModelOutput``, torch's
``PackedSequence``, a ``defaultdict``, an ``OrderedDict`` subclass, a user's
dict subclass with attributes of its own, and a graph-like object with
``.to()`` and ``.pin_memory()``. Each goes through flatten/unflatten,
tree_map, to_device, pin_memory and collate, with DataLoader workers started
by spawn over two epochs and a compiled model, and the caller's objects are
read afterwards: nothing is mutated. (transformers' Trainer, with a collator
that returns a ``BatchEncoding``, is a recipe of docs/loading.md, run by
tests/torch/test_recipes.py.)"""

from __future__ import annotations

import collections
import functools
import pickle
from typing import Any

import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")
tokenizers = pytest.importorskip("tokenizers")

from transformers import BatchEncoding, BatchFeature  # noqa: E402
from transformers.modeling_outputs import SequenceClassifierOutput  # noqa: E402
from transformers.utils import ModelOutput  # noqa: E402

import pytree_kit as pk  # noqa: E402
from pytree_kit.torch import (  # noqa: E402
    _pool,
    _staging,
    collate,
    pin_memory,
    select,
    to_device,
    uncollate,
)
from scripts.corpus.trees import snapshot  # noqa: E402

CUDA = torch.cuda.is_available()
WORDS = ["[PAD]", "[UNK]", "the", "cat", "sat", "on", "mat", "a", "dog", "ran"]
TEXTS = ["the cat sat on the mat", "a dog ran", "the dog sat"]


@functools.cache
def tokenizer() -> Any:
    """A real fast tokenizer: a WordLevel vocabulary made here, split on
    whitespace, wrapped by transformers' PreTrainedTokenizerFast."""
    model = tokenizers.models.WordLevel({w: i for i, w in enumerate(WORDS)}, unk_token="[UNK]")
    tok = tokenizers.Tokenizer(model)
    tok.pre_tokenizer = tokenizers.pre_tokenizers.Whitespace()
    return transformers.PreTrainedTokenizerFast(
        tokenizer_object=tok, pad_token="[PAD]", unk_token="[UNK]"
    )


class Graph:
    """Shaped like a graph library's ``Data``: its tensors behind ``.to()`` and
    ``.pin_memory()``, each of which returns a new graph."""

    def __init__(self, x: torch.Tensor, edges: torch.Tensor, name: str = "g") -> None:
        self.x, self.edges, self.name = x, edges, name

    def to(self, device: Any, non_blocking: bool = False) -> Graph:
        move = functools.partial(torch.Tensor.to, device=device, non_blocking=non_blocking)
        return Graph(move(self.x), move(self.edges), self.name)

    def pin_memory(self) -> Graph:
        return Graph(self.x.pin_memory(), self.edges.pin_memory(), self.name)


class Features(dict):
    """A user's dict subclass whose constructor needs an argument, with
    attributes of its own."""

    def __init__(self, data: dict, split: str) -> None:
        super().__init__(data)
        self.split = split
        self.source = {"file": "train.jsonl"}


class Cells(collections.OrderedDict):
    """An OrderedDict subclass."""


def batches() -> dict[str, Any]:
    """A new batch of each kind, with new tensors."""
    g = torch.Generator().manual_seed(0)

    def rand(*shape: int) -> torch.Tensor:
        return torch.rand(*shape, generator=g)

    seqs = torch.nn.utils.rnn.pad_sequence([rand(4, 2), rand(2, 2), rand(1, 2)], batch_first=True)
    return {
        "BatchEncoding": tokenizer()(TEXTS, return_tensors="pt", padding=True),
        "BatchFeature": BatchFeature(
            {"pixel_values": rand(2, 3, 4, 4), "image_sizes": [(4, 4), (4, 4)]}
        ),
        "ModelOutput subclass": SequenceClassifierOutput(loss=rand(()), logits=rand(2, 3)),
        "ModelOutput subclass from a dict": SequenceClassifierOutput(
            {"logits": rand(2, 3), "loss": rand(())}
        ),
        "bare ModelOutput": ModelOutput({"logits": rand(2, 3), "hidden": rand(2, 4)}),
        "PackedSequence": torch.nn.utils.rnn.pack_padded_sequence(
            seqs, [4, 2, 1], batch_first=True
        ),
        "defaultdict": collections.defaultdict(list, {"a": [rand(2)], "b": [rand(1)]}),
        "OrderedDict subclass": Cells([("z", rand(2)), ("a", rand(3))]),
        "dict subclass": Features({"x": rand(3), "y": [rand(2)]}, split="train"),
        "graph": {"graph": Graph(rand(4, 2), torch.tensor([[0, 1], [1, 2]])), "y": rand(4)},
    }


NAMES = list(batches())


def tensors_in(tree: Any) -> list[torch.Tensor]:
    """Every tensor of a batch, a graph's included."""
    out = []
    for x in pk.leaves(tree):
        if isinstance(x, torch.Tensor):
            out.append(x)
        elif isinstance(x, Graph):
            out += [x.x, x.edges]
    return out


def check_same_kind(got: Any, want: Any, leaves_mapped: bool = False) -> None:
    """``got`` is ``want``'s kind of object, rebuilt: its class, its keys in
    order, and what each real class keeps beside its tensors."""
    assert type(got) is type(want) and got is not want
    if isinstance(want, collections.abc.Mapping):
        assert list(got.keys()) == list(want.keys())
    if isinstance(want, BatchEncoding):
        assert got._encodings is want._encodings and got.n_sequences == want.n_sequences
        assert got.word_ids(0) == want.word_ids(0) and got.tokens(1) == want.tokens(1)
        assert got.input_ids is got["input_ids"] and callable(got.to)
    if isinstance(want, ModelOutput):
        assert got.to_tuple()[0] is got[0] and got.logits is got["logits"]
        if type(want) is not ModelOutput:  # a dataclass: the fields
            assert got.loss is got["loss"]
    if isinstance(want, Features):
        assert got.split == "train" and got.source == want.source
    if isinstance(want, collections.defaultdict):
        assert got.default_factory is list
    if type(want) is torch.nn.utils.rnn.PackedSequence and not leaves_mapped:
        assert torch.equal(got.batch_sizes, want.batch_sizes)
        assert got.sorted_indices is want.sorted_indices


@pytest.mark.parametrize("name", NAMES)
def test_flatten_and_unflatten_rebuild_the_class(name: str) -> None:
    batch = batches()[name]
    before = snapshot(batch)
    leaves, spec = pk.flatten(batch)
    rebuilt = spec.unflatten(leaves)
    if name == "graph":  # a leaf: an object with .to()
        assert rebuilt["graph"] is batch["graph"]
    else:
        check_same_kind(rebuilt, batch)
    if name == "dict subclass":  # its attributes, by reference
        assert rebuilt.source is batch.source
    assert all(a is b for a, b in zip(pk.leaves(rebuilt), leaves))
    assert snapshot(batch) == before
    # a second batch of the structure has an equal spec, and rebuilds its own
    other = batches()[name]
    assert pk.structure(other) == spec and hash(pk.structure(other)) == hash(spec)
    # the spec pickles, with what each node carries (a pickled Encoding is a new one)
    again = pickle.loads(pickle.dumps(spec))
    assert again == spec
    if name not in ("graph", "BatchEncoding"):
        check_same_kind(again.unflatten(leaves), batch)


def test_paths_read_as_a_user_indexes_them() -> None:
    batch = batches()
    pairs, _ = pk.flatten_with_path({k: batch[k] for k in ("BatchEncoding", "bare ModelOutput")})
    paths = [pk.keystr(p) for p, _ in pairs]
    assert paths == [
        "['BatchEncoding']['attention_mask']",
        "['BatchEncoding']['input_ids']",
        "['bare ModelOutput']['logits']",
        "['bare ModelOutput']['hidden']",
    ]
    for p, x in pairs:
        assert pk.tree_get(batch, p) is x


@pytest.mark.parametrize("name", NAMES)
def test_tree_map_maps_every_tensor_and_keeps_the_class(name: str) -> None:
    batch = batches()[name]
    before = snapshot(batch)
    mapped = pk.tree_map(lambda x: x + 1 if isinstance(x, torch.Tensor) else x, batch)
    if name != "graph":
        check_same_kind(mapped, batch, leaves_mapped=True)
    for a, b in zip(pk.leaves(mapped), pk.leaves(batch)):
        if isinstance(b, torch.Tensor):
            torch.testing.assert_close(a, b + 1)
    assert snapshot(batch) == before


@pytest.mark.parametrize("coalesce", [None, True, False])
@pytest.mark.parametrize("name", NAMES)
def test_to_device_moves_every_tensor(name: str, coalesce: Any) -> None:
    batch = batches()[name]
    before = snapshot(batch)
    values = [t.clone() for t in tensors_in(batch)]
    moved = to_device(batch, "meta", coalesce=coalesce)
    if name == "graph":
        assert type(moved["graph"]) is Graph and moved["graph"].name == "g"
    elif name != "PackedSequence":  # (its sorted_indices, None here, are moved too)
        check_same_kind(moved, batch)
    got = tensors_in(moved)
    assert len(got) == len(values) and all(t.is_meta for t in got)
    assert [tuple(t.shape) for t in got] == [tuple(t.shape) for t in values]
    # the caller's batch: its containers, its tensors where they were, unchanged
    assert snapshot(batch) == before
    assert all(a.is_cpu and torch.equal(a, b) for a, b in zip(tensors_in(batch), values))


def test_a_tokenizer_batch_coalesces_with_the_rest_of_the_batch(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A BatchEncoding is walked, so its tensors are packed with the batch's
    others, in one staging copy (the graph moves by its own .to())."""
    staged: list = []
    stage = _staging.stage

    def spy(leaves: list, idx: list, *args: Any, **kwargs: Any) -> Any:
        staged.append([leaves[i] for i in idx])
        return stage(leaves, idx, *args, **kwargs)

    monkeypatch.setattr(_staging, "stage", spy)
    tok = tokenizer()(TEXTS, return_tensors="pt", padding=True)
    batch = {"text": tok, "labels": torch.arange(3), "graph": Graph(torch.ones(2), torch.ones(2))}
    moved = to_device(batch, "meta", coalesce=True)
    assert type(moved["text"]) is BatchEncoding and moved["text"].input_ids.is_meta
    assert moved["graph"].x.is_meta
    assert len(staged) == 1
    assert {id(x) for x in staged[0]} == {
        id(tok["attention_mask"]),
        id(tok["input_ids"]),
        id(batch["labels"]),
    }


@pytest.mark.parametrize("name", NAMES)
def test_pin_memory_pins_every_tensor(name: str, monkeypatch: pytest.MonkeyPatch) -> None:
    if not CUDA:  # no accelerator: pinning stood in for by a copy that marks its result
        monkeypatch.setattr(_pool, "pinning_available", lambda: True)
        pinned: set = set()

        def fake_pin(self: torch.Tensor, *args: Any) -> torch.Tensor:
            out = self.clone()
            pinned.add(id(out))
            return out

        monkeypatch.setattr(torch.Tensor, "pin_memory", fake_pin)

        def is_pinned(t: torch.Tensor) -> bool:
            return id(t) in pinned or _pool.default_pool().buffer_of(t) is not None
    else:  # pragma: no cover - a GPU job

        def is_pinned(t: torch.Tensor) -> bool:
            return t.is_pinned()

    batch = batches()[name]
    before = snapshot(batch)
    out = pin_memory(batch)
    if name == "graph":
        assert type(out["graph"]) is Graph and out["graph"] is not batch["graph"]
    elif name != "PackedSequence":
        check_same_kind(out, batch)
    assert all(is_pinned(t) for t in tensors_in(out))
    assert snapshot(batch) == before


def _sample(text: str) -> BatchEncoding:
    """One sample of a tokenized dataset: its tensors of one length, no batch dim."""
    enc = tokenizer()(text, padding="max_length", max_length=8, return_tensors="pt")
    return BatchEncoding({k: v[0] for k, v in enc.items()}, encoding=enc.encodings)


def test_collate_of_tokenizer_samples_is_a_batch_encoding() -> None:
    samples = [_sample(t) for t in TEXTS]
    before = [snapshot(s) for s in samples]
    batch = collate(samples)
    assert type(batch) is BatchEncoding and batch["input_ids"].shape == (3, 8)
    assert torch.equal(batch.input_ids[1], samples[1].input_ids)
    # what the samples agree on is kept; each sample's own encodings are not the batch's
    assert batch.n_sequences == 1 and batch._encodings is None and not batch.is_fast
    assert [snapshot(s) for s in samples] == before
    # and back: each sample's tensors, the batch's plain attributes
    back = uncollate(batch)
    assert [type(s) for s in back] == [BatchEncoding] * 3 and back[2].n_sequences == 1
    assert torch.equal(back[2]["input_ids"], samples[2]["input_ids"])
    assert select(batch, [0, 2])["input_ids"].shape == (2, 8)
    # a tokenizer's own batch: select keeps its plain attributes, not its encodings
    whole = tokenizer()(TEXTS, return_tensors="pt", padding=True)
    part = select(whole, 1)
    assert type(part) is BatchEncoding and part._encodings is None and part.n_sequences == 1
    assert whole._encodings is not None  # the caller's batch as it was


def test_collate_of_samples_of_every_kind() -> None:
    """Each kind's samples collate into a batch of its kind."""
    fields = {
        "BatchFeature": "pixel_values",
        "ModelOutput subclass": "logits",
        "ModelOutput subclass from a dict": "loss",
        "bare ModelOutput": "hidden",
        "dict subclass": "x",
        "OrderedDict subclass": "z",
    }
    for name, key in fields.items():
        samples = [batches()[name] for _ in range(3)]
        batch = collate(samples)
        assert type(batch) is type(samples[0]), name
        assert batch[key].shape == (3, *samples[0][key].shape), name
        assert torch.equal(batch[key][2], samples[2][key]), name
    feats = collate([batches()["dict subclass"] for _ in range(2)])
    assert feats.split == "train" and feats.source == {"file": "train.jsonl"}


class TextDataset(torch.utils.data.Dataset):
    """Tokenized texts, a sample each (module level: spawned workers unpickle it)."""

    def __len__(self) -> int:
        return 6

    def __getitem__(self, i: int) -> BatchEncoding:
        sample = _sample(TEXTS[i % len(TEXTS)])
        sample["labels"] = torch.tensor(i)
        return sample


@pytest.mark.timeout(240)
def test_dataloader_workers_by_spawn_over_two_epochs() -> None:
    loader = torch.utils.data.DataLoader(
        TextDataset(),
        batch_size=3,
        collate_fn=collate,
        num_workers=2,
        multiprocessing_context="spawn",
        persistent_workers=True,
    )
    want = [collate([TextDataset()[i] for i in range(k, k + 3)]) for k in (0, 3)]
    for _epoch in range(2):
        got = list(loader)
        assert len(got) == 2
        for batch, expected in zip(got, want):
            assert type(batch) is BatchEncoding
            assert list(batch.keys()) == list(expected.keys())
            for k in expected:
                assert torch.equal(batch[k], expected[k])
            # (BatchEncoding's own pickling, which takes it from the worker, keeps
            # its data and encodings only: transformers' __getstate__)
            assert batch._encodings is None
            moved = to_device(batch, "meta")
            assert type(moved) is BatchEncoding and moved.input_ids.is_meta
            assert batch.input_ids.is_cpu


class Classifier(torch.nn.Module):
    """A model that takes a tokenizer's batch whole, and answers with a
    ModelOutput subclass and the batch mapped."""

    def __init__(self) -> None:
        super().__init__()
        self.embed = torch.nn.Embedding(len(WORDS), 8)
        self.head = torch.nn.Linear(8, 2)

    def forward(self, batch: BatchEncoding) -> Any:
        leaves, spec = pk.flatten(batch)
        hidden = self.embed(batch["input_ids"]) * batch["attention_mask"].unsqueeze(-1)
        logits = self.head(hidden.mean(1))
        loss = torch.nn.functional.cross_entropy(logits, batch["labels"])
        counts = spec.unflatten([x.sum() for x in leaves])
        return SequenceClassifierOutput(loss=loss, logits=logits), counts


class CountingBackend:
    def __init__(self) -> None:
        self.graphs = 0

    def __call__(self, gm: Any, example_inputs: Any) -> Any:
        from torch._dynamo.backends.registry import lookup_backend

        self.graphs += 1
        return lookup_backend("aot_eager")(gm, example_inputs)


@pytest.mark.timeout(240)
def test_a_compiled_model_takes_tokenizer_batches_in_one_graph() -> None:
    model = Classifier()
    eager = Classifier()
    eager.load_state_dict(model.state_dict())
    torch._dynamo.reset()
    backend = CountingBackend()
    compiled = torch.compile(model, fullgraph=True, backend=backend)
    opt = torch.optim.SGD(model.parameters(), lr=0.5)
    for step in range(8):
        texts = [TEXTS[(step + i) % 3] for i in range(3)]
        batch = tokenizer()(texts, return_tensors="pt", padding="max_length", max_length=8)
        batch["labels"] = torch.tensor([step % 2, 1, 0])
        before = snapshot(batch)
        out, counts = compiled(batch)
        want, want_counts = eager(batch)
        assert type(out) is SequenceClassifierOutput and out.loss is out["loss"]
        torch.testing.assert_close(out.logits, want.logits)
        assert type(counts) is BatchEncoding and counts._encodings is batch._encodings
        assert counts.word_ids(0) == batch.word_ids(0)
        torch.testing.assert_close(counts["input_ids"], want_counts["input_ids"])
        assert snapshot(batch) == before
        opt.zero_grad()
        out.loss.backward()
        opt.step()
        eager.load_state_dict(model.state_dict())
    assert backend.graphs == 1


class Odd:
    def to(self, device: Any, non_blocking: bool = False) -> str:
        return "moved"


class Refuses:
    def to(self, device: Any, non_blocking: bool = False) -> Any:
        raise RuntimeError("no such device here")


def test_an_object_with_to_is_moved_by_it_as_the_peers_move_it() -> None:
    class InPlace:  # Lightning's test: a .to() that forgets to return self
        def __init__(self) -> None:
            self.t = torch.ones(1)

        def to(self, device: Any) -> None:  # no non_blocking: called without it
            self.t = self.t.to(device)

    obj = InPlace()
    assert to_device({"o": obj}, "meta", non_blocking=True)["o"] is obj and obj.t.is_meta

    with pytest.raises(TypeError) as e:
        to_device({"a": [1, Odd()]}, "meta")
    assert str(e.value).startswith(
        "to_device: tree['a'][1] is a tests.torch.test_real_batches.Odd whose .to() returned a "
        "str: a .to() returns the moved object, of its own class (or None, having moved it in "
        "place)"
    )

    with pytest.raises(RuntimeError, match="no such device here") as r:
        to_device({"b": {"c": Refuses()}}, "meta")
    assert r.value.__notes__ == [
        "to_device: raised by the .to() of the tests.torch.test_real_batches.Refuses at "
        "tree['b']['c']"
    ]


def test_rule_leaf_hands_a_container_with_to_to_its_own_to() -> None:
    """A tokenizer batch is walked (its tensors coalesced with the rest), but
    ``rules={cls: Rule.LEAF}`` keeps one whole, moved by its own ``.to()``: the
    way to ask for the peers' behaviour, where to_device takes no is_leaf."""
    calls = []

    class Moves(dict):
        def to(self, device: Any, non_blocking: bool = False) -> Moves:
            calls.append((str(device), non_blocking))
            out = Moves({k: v.to(device) for k, v in self.items()})
            return out

    for fresh in range(3):  # fresh batches, call after call
        batch = {"m": Moves(a=torch.ones(2) * fresh), "t": torch.zeros(1)}
        before = batch["m"]["a"]
        walked = to_device(batch, "meta")
        assert type(walked["m"]) is Moves and walked["m"]["a"].is_meta and not calls
        kept = to_device(batch, "meta", non_blocking=True, rules={Moves: pk.Rule.LEAF})
        assert calls == [("meta", True)] and kept["m"]["a"].is_meta and kept["t"].is_meta
        assert batch["m"]["a"] is before and not before.is_meta  # the caller's, as it was
        calls.clear()
